"""One background thread for live mode's scans, one job at a time.

A monitored training step hands its job (scan the newest pair, judge,
write the report) to this thread and goes on training. Back-pressure is the
caller's: it collects the job before handing over the next one, waiting if
the job is still running, so at most one job exists and memory stays at the
two snapshots that job reads. Nothing is queued, and no pair is skipped
(skipped pairs would make the report differ from `ckptscan trend`).

A job's exception is kept and raised to the caller at its next `collect`,
and again at every later one, and by `run`: the job's work is lost and the
series it belonged to cannot go on without it, so the error is never
swallowed.

`inline`: each job runs at once on the calling thread (the same path,
synchronously).
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable

THREAD_NAME = "ckptscan-live"


class Background:
    def __init__(self, inline: bool = False) -> None:
        self.inline = inline
        self._pool: ThreadPoolExecutor | None = None
        self._job: Future[Any] | None = None
        self._error: BaseException | None = None  # a job's exception, raised at every later call

    def run(self, job: Callable[[], Any]) -> None:
        """Start `job`; the previous one must have been collected."""
        self._raise()
        if self._job is not None:
            raise RuntimeError("the previous job was not collected")  # a bug of the caller, not of the input
        if self.inline:
            self._job = Future()
            try:
                self._job.set_result(job())
            except BaseException as e:  # kept for `collect`, like a thread's
                self._job.set_exception(e)
            return
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=THREAD_NAME)
        self._job = self._pool.submit(job)

    def running(self) -> bool:
        """Whether a job has been handed over and has not ended yet."""
        return self._job is not None and not self._job.done()

    def collect(self, wait: bool) -> tuple[bool, Any]:
        """(True, the job's result) once it has ended, and the job is gone;
        (False, None) when there is none, or it still runs and `wait` is
        False. Raises the job's exception (see the module docstring)."""
        self._raise()
        job = self._job
        if job is None or not (wait or job.done()):
            return False, None
        self._job = None
        error = job.exception()  # blocks until the job ends
        if error is not None:
            self._error = error
            self._raise()
        return True, job.result()

    def close(self) -> None:
        """End the thread (a job not collected is waited for and dropped:
        collect it first). A later `run` starts a new thread."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    def _raise(self) -> None:
        if self._error is not None:
            raise self._error
