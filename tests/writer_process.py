"""Drive a live run in tests: the writer process, and lines read from a process.

Synchronisation is by answers and printed lines, never by sleeping: the
writer answers "ok" after each command, and `Lines.expect` waits for a line.
Timeouts are guards only (a hung test fails instead of hanging).
"""

import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

GUARD_S = 120  # generous: the machine may be busy; a passing test never waits this long
WRITER = Path(__file__).with_name("live_writer.py")
REPO = Path(__file__).parent.parent


def environment() -> dict[str, str]:
    """The test's environment, with this checkout first on the import path."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [env.get("PYTHONPATH")])])
    return env


class Writer:
    """tests/live_writer.py copying a prepared run into the watched one."""

    def __init__(self, source: Path, target: Path):
        self.source, self.target = source, target
        self.process = subprocess.Popen([sys.executable, str(WRITER), str(source), str(target)], text=True,
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=environment())
        self.answers = Lines(self.process.stdout)

    def send(self, command: str) -> None:
        self.process.stdin.write(command + "\n")
        self.process.stdin.flush()
        self.answers.expect("^ok$")

    def publish(self, checkpoint: str) -> None:
        """Every file of a checkpoint as a trainer saves it: config, shards, the index last."""
        files = sorted((self.source / checkpoint).iterdir(), key=lambda f: (f.name.endswith(".index.json"), f.name))
        for file in files:
            self.send(f"copy {checkpoint}/{file.name}")

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait(GUARD_S)


class Lines:
    """The lines a stream prints, collected by a thread as they come."""

    def __init__(self, stream):
        self.lines: list[str] = []
        self.ended = False
        self._seen = 0  # lines already passed by expect()
        self._changed = threading.Condition()
        self._thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._thread.start()

    def _read(self, stream) -> None:
        for line in stream:
            with self._changed:
                self.lines.append(line.rstrip("\n"))
                self._changed.notify_all()
        with self._changed:
            self.ended = True
            self._changed.notify_all()

    def expect(self, pattern: str, guard: float = GUARD_S) -> re.Match:
        """Wait for the next line matching `pattern` after the last one matched."""
        regex = re.compile(pattern)
        deadline = time.monotonic() + guard
        with self._changed:
            while True:
                while self._seen < len(self.lines):
                    self._seen += 1
                    if match := regex.search(self.lines[self._seen - 1]):
                        return match
                if self.ended or not self._changed.wait(max(0.0, deadline - time.monotonic())):
                    why = "the stream ended" if self.ended else f"none within {guard} s"
                    raise AssertionError(f"no line matching {pattern!r}: {why}; got:\n" + "\n".join(self.lines))

    def rest(self) -> list[str]:
        """Every line, once the stream has ended."""
        self._thread.join(GUARD_S)
        return self.lines
