"""`ckptscan watch RUN_DIR`: follow a live run, judge each checkpoint as it completes.

When the first alert comes, the rollback candidate and the resume plan are
printed as `trend` prints them (again if a later checkpoint changes them).

Exit codes, as every command: 1 as soon as the verdict reaches --fail-on
(unless --keep-going), 130 on Ctrl-C. After --timeout seconds without a new
checkpoint: the gate's code for the run so far (0 or 1), or 2 when no pair
was judged at all. The JSON report (--json) is rewritten atomically after
each new pair, so it always holds the whole series judged so far.
"""

from __future__ import annotations

from contextlib import closing
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from ckptscan.cli.app import EXIT_INTERRUPT, command, err, head_overrides, note, out, scan_options, side_file, \
    user_errors
from ckptscan.cli.destinations.json_file import JSON
from ckptscan.cli.options import Base, FailOn, LiveRunDir
from ckptscan.cli.gate import fails, gate
from ckptscan.cli.outputs import WatchOutputs
from ckptscan.cli.process import load_library

if TYPE_CHECKING:
    from ckptscan.pipeline.watch import WatchEvent


@command
def watch(
    run_dir: LiveRunDir,
    *,  # the options, in --help order; a bare name is a shared option (cli.options)
    interval: Annotated[float, typer.Option(
        "--interval", metavar="SECONDS", help="Seconds between looks at the run directory (with inotify: a safety "
        "look, in case an event is missed).")] = 2.0,
    timeout: Annotated[Optional[float], typer.Option(
        "--timeout", metavar="SECONDS", help="Stop after this many seconds without a new complete checkpoint; exit "
        "with the gate's code for the run so far (2 when no pair was judged). Default: watch until Ctrl-C.")] = None,
    keep_going: Annotated[bool, typer.Option("--keep-going", help="Do not stop at the first failed gate: keep "
                                             "judging new checkpoints.")] = False,
    settle: Annotated[float, typer.Option(
        "--settle", metavar="SECONDS", help="Seconds a checkpoint's files must stay unchanged before it counts as "
        "complete (when the run has no framework pointer file such as DeepSpeed's 'latest').")] = 0.5,
    poll: Annotated[bool, typer.Option("--poll", help="Poll every --interval seconds even when watchdog "
                                       "(inotify) is installed.")] = False,
    stride, base, reference,
    live_loss_log, no_loss_log, outputs: WatchOutputs, fail_on, config, set_, cache_dir, no_disk_cache, quiet,
    num_heads, num_kv_heads, head_dim, layers, precision, probe, no_probe, device, heads, full_spectrum, tensor_map,
    model_config,
) -> None:
    """Follow a live run: print each new checkpoint's row as soon as it is complete; exit 1 at the first alert."""
    with user_errors():
        load_library()
        from ckptscan.system import collector

        # A watch outlives what each look rebuilds: frozen, its garbage cycles would never be freed.
        collector.freeze_rebuilt = False
        from ckptscan.caches.pair_cache import PairCache
        from ckptscan.system.paths import default_cache_dir
        from ckptscan.errors import CkptScanError
        from ckptscan.report.destinations import Delivery
        from ckptscan.pipeline.watch import watch_run

        if timeout is not None and timeout <= 0:
            raise CkptScanError(f"--timeout must be > 0 seconds, not {timeout:g}")
        outputs.check()
        from ckptscan.pipeline.request import ScanRequest

        options = scan_options(precision, overrides=head_overrides(num_heads, num_kv_heads, head_dim, model_config),
                               layers=layers, device=device, heads=heads, full_spectrum=full_spectrum,
                               tensor_map=tensor_map)
        request = ScanRequest(options, stride=stride, base=Base(base).value, probe=side_file(probe, no_probe),
                              loss_log=side_file(live_loss_log, no_loss_log), references=tuple(reference or ()),
                              config=side_file(config), settings=tuple(set_ or ()),
                              cache=None if no_disk_cache else PairCache(cache_dir or default_cache_dir()))
        events = watch_run(
            run_dir, request, timeout=timeout, events=False if poll else None, interval=interval, settle=settle,
            notify=lambda message: note(message, "yellow" if message.startswith("ignoring") else "dim", quiet),
            on_start=lambda mode: note(f"watching {run_dir} ({mode}); Ctrl-C to stop", quiet=quiet))
        last: WatchEvent | None = None
        planned: list[str] = []  # the resume plan's lines as last printed
        # The metrics endpoint lives as long as the watch, however it ends.
        with closing(events), closing(outputs.open(quiet)) as destinations:
            try:
                for event in events:
                    first = last is None
                    gate_on = fail_on or event.spec.config.fail_on
                    destinations.write(Delivery(event.report, FailOn(gate_on).value, quiet, new=event.new))
                    last = event  # the reports hold it now, whatever interrupts the printing
                    _print(event, first)
                    planned = _print_plan(event, planned)
                    # A run not judged yet may be judged at the next checkpoint: only a verdict stops the watch.
                    # ("not_judged" is results.NOT_JUDGED, spelled out: results imports torch, --help must not.)
                    if not keep_going and event.report.summary.status != "not_judged" and fails(event.report, gate_on):
                        raise typer.Exit(gate(event.report, gate_on))
            except KeyboardInterrupt:
                kept = (f"; {outputs[JSON]} holds the series judged so far"
                        if outputs[JSON] is not None and last else "")
                err().print(f"interrupted: stopped watching{kept}", highlight=False)
                raise typer.Exit(EXIT_INTERRUPT) from None
        note(f"no new checkpoint for {timeout:g} s: stopped watching", quiet=quiet)
        if last is None:
            raise CkptScanError(f"no checkpoint pair was complete within --timeout {timeout:g} s", path=run_dir)
        code = gate(last.report, fail_on or last.spec.config.fail_on)
    raise typer.Exit(code)


def _print_plan(event: WatchEvent, printed: list[str]) -> list[str]:
    """The rollback candidate and resume plan (report/resume.py), as `trend`
    prints them, when the watch first alerts and whenever they change; the
    lines now printed."""
    from ckptscan.report.resume import terminal_lines

    lines = terminal_lines(event.report.summary) if event.report.summary.resume is not None else []
    if lines and lines != printed:
        console = out()
        for line in lines:
            console.print(line, highlight=False)
        console.file.flush()
    return lines or printed


def _print(event: WatchEvent, first: bool) -> None:
    """The new rows on stdout (the model and the column names first)."""
    from ckptscan.report.table import print_model
    from ckptscan.report.watch_rows import print_rows

    console = out()
    if first:
        print_model(console, event.report)
    print_rows(console, event.report, event.new, header=first)
    console.file.flush()  # a pipe (CI log, `tee`) gets each row when it is judged
