"""`ckptscan compare RUN RUN ...`: a sweep's runs, each judged against the
others, ranked by health; `ckptscan trend SWEEP/` is the same for a directory
whose subdirectories are the runs (`ckptscan.sweep`)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Sequence

import typer

from ckptscan.cli.app import EXIT_GATE, EXIT_OK, command, err, note, out, report_console, scan_options, user_errors, \
    wrote
from ckptscan.cli.options import FailOn
from ckptscan.cli.process import load_library

if TYPE_CHECKING:
    from ckptscan.cache import PairCache
    from ckptscan.executors import Executor
    from ckptscan.scan import ScanOptions
    from ckptscan.storage import RemotePath
    from ckptscan.results import SweepReport

AllowCorrupt = Annotated[bool, typer.Option(
    "--allow-corrupt", help="Judge the runs without their corrupt checkpoints (they fail the gate otherwise); they "
    "are still listed.")]


@command
def compare(
    # str, not Path: a URL prefix (s3://bucket/sweep/run1/) must keep its "//".
    run_dirs: Annotated[list[str], typer.Argument(
        metavar="RUN_DIR", help="Two or more runs of one model (directories or URL prefixes), e.g. the members of "
        "a sweep or several seeds.")],
    *,  # the options, in --help order; a bare name is a shared option (cli.options)
    stride, base, json_path, per_head, html, fail_on, config, set_, cache_dir, no_cache, quiet, num_heads, num_kv_heads,
    head_dim, model_config, layers, precision, device, heads, full_spectrum, tensor_map, no_probe, no_loss_log,
    allow_corrupt: AllowCorrupt = False,
) -> None:
    """Judge each run of a sweep against the others and rank them, healthiest first; exit by the worst run.

    Leave-one-out: each run against the band of all the others (against the other run alone when there are two).
    Each run is scanned once with its own probe and loss log (cached like trend's pairs); the ranking is by status
    (ok, warn, alert), then the later first alert. --json writes the ranking with every run's whole report.
    """
    with user_errors():
        load_library()
        from ckptscan.storage import as_path

        # A shell glob (sweep/*) names the sweep's files too (a README): a file is never a run.
        files = [run for run in run_dirs if as_path(run).is_file()]
        for name in files:
            note(f"ignoring {name}: a file, not a run directory", quiet=quiet)
        run_dirs = [run for run in run_dirs if run not in files]
        from ckptscan.cli.outputs import check_file_outputs

        check_file_outputs({"--json": json_path, "--html": html})
        options = scan_options(precision, num_heads, num_kv_heads, head_dim, layers, device, heads, full_spectrum,
                               tensor_map, model_config)
        code = judge_sweep(run_dirs, options, stride=stride, base=base, config=config, settings=set_ or (),
                           cache=_cache(cache_dir, no_cache), json_path=json_path, per_head=per_head, html=html,
                           fail_on=fail_on, quiet=quiet,
                           allow_corrupt=allow_corrupt, probes=not no_probe, loss_logs=not no_loss_log)
    raise typer.Exit(code)


def judge_sweep(run_dirs: Sequence[str | Path | RemotePath], options: ScanOptions, *, stride: int, base: str,
                config: Path | None, settings: Sequence[str], cache: PairCache | None, json_path: Path | None,
                fail_on: FailOn | str | None, html: Path | None = None, quiet: bool, allow_corrupt: bool,
                as_json: bool = False, executor: Executor | None = None, probes: bool = True, loss_logs: bool = True,
                per_head: str = "all") -> int:
    """Compare the runs, print the ranking (stdout; stderr when the JSON
    report goes to stdout), write --json and --html, and return the gate's exit code.
    `per_head`: which layers of each run's report keep their per-head
    results, as `trend --json` writes that run's."""
    from ckptscan.cli.options import Base
    from ckptscan.output import STDOUT, own_descriptor, write_output
    from ckptscan.report.json import check_per_head, sweep_dict, write_sweep_json
    from ckptscan.report.sweep_table import print_sweep
    from ckptscan.run import AUTO
    from ckptscan.sweep import compare_runs

    check_per_head(per_head)  # before any scan
    sweep = compare_runs(run_dirs, options, stride=stride, base=Base(base).value,
                         config=config if config is not None else AUTO, settings=settings, cache=cache,
                         executor=executor, scanning=lambda run: note(f"scanning {run}", quiet=quiet),
                         probes=probes, loss_logs=loss_logs)
    if cache is not None:
        note(f"cache: {cache.hits} pair(s) reused, {cache.misses} computed ({cache.directory})", quiet=quiet)
    json_to_stdout = json_path is not None and own_descriptor(str(json_path)) == 1
    if as_json and not json_to_stdout:
        import json

        write_output(STDOUT, json.dumps(sweep_dict(sweep, per_head), indent=2, allow_nan=False) + "\n")
    elif not as_json:
        console = report_console(stderr=True) if json_to_stdout else out()
        print_sweep(console, sweep)
        console.file.flush()
    if json_path is not None:
        write_sweep_json(sweep, json_path, per_head)
        if not json_to_stdout:
            wrote(json_path)
    if html is not None:
        from ckptscan.report.load import as_json_values
        from ckptscan.report.sweep_html import write_sweep_html

        # Through a JSON round trip: the page `ckptscan report SWEEP.json --html` makes of the file.
        write_sweep_html(as_json_values(sweep_dict(sweep)), html)
        wrote(html)
    return sweep_gate(sweep, fail_on or sweep.fail_on, allow_corrupt)


def sweep_gate(sweep: SweepReport, fail_on: FailOn | str, allow_corrupt: bool = False) -> int:
    """The worst run's exit code, with the reason on stderr: 1 when a run's
    verdict reaches `fail_on`, or a run has a corrupt checkpoint (unless
    `allow_corrupt`); else 0."""
    from ckptscan.cli.outputs import fails
    from ckptscan.discovery import CORRUPT
    from ckptscan.report.json import sweep_message

    flags = f"--fail-on {FailOn(fail_on).value}"
    corrupt = [(run, item) for run in sweep.runs for item in run.report.skipped if item.get("kind") == CORRUPT]
    if corrupt and not allow_corrupt:
        run, item = corrupt[0]
        err().print(f"gate failed ({flags}): corrupt checkpoint skipped in {run.path}: {item['reason']} "
                    "(--allow-corrupt passes over it)", highlight=False)
        return EXIT_GATE
    failed = any(fails(run.report, fail_on) for run in sweep.runs)
    err().print(f"gate {'failed' if failed else 'passed'} ({flags}): {sweep_message(sweep)}", highlight=False)
    return EXIT_GATE if failed else EXIT_OK


def _cache(cache_dir: Path | None, no_cache: bool) -> PairCache | None:
    from ckptscan.cache import PairCache, default_cache_dir

    return None if no_cache else PairCache(cache_dir or default_cache_dir())
