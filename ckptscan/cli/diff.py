"""`ckptscan diff CKPT_A CKPT_B`: the per-layer health table of one update."""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from ckptscan.cli.app import command, head_overrides, note, scan_options, side_file, user_errors
from ckptscan.cli.outputs import ReportOutputs
from ckptscan.cli.process import load_library

if TYPE_CHECKING:
    from rich.console import Console

    from ckptscan.schema.results import ScanReport


@command
def diff(
    # str, not Path: a URL (s3://bucket/run/checkpoint-1000) must keep its "//".
    ckpt_a: Annotated[str, typer.Argument(metavar="CKPT_A", help="Older checkpoint (directory, file or URL: s3://, "
                                          "gs://, ...).")],
    ckpt_b: Annotated[str, typer.Argument(metavar="CKPT_B", help="Newer checkpoint.")],
    *,  # the options, in --help order; a bare name is a shared option (cli.options)
    outputs: ReportOutputs, fail_on, config, set_, quiet, wide, num_heads, num_kv_heads, head_dim, model_config, layers,
    precision,
    probe: Annotated[Optional[str], typer.Option(  # str: a URL keeps its "//"
        "--probe", metavar="FILE", help="Router inputs (safetensors, keys layers.{i}.router_input [T, d]): adds "
        "routing entropy and expert load per MoE layer (default: the probe.safetensors of the run directory both "
        "checkpoints sit in, when present).")] = None,
    no_probe,
    loss_log: Annotated[Optional[str], typer.Option(
        "--loss-log", metavar="FILE", help="Loss log (JSON Lines or CSV with step, loss; default: the "
        "train_log.jsonl of the run directory both checkpoints sit in, when present).")] = None,
    no_loss_log, reference, device, heads, full_spectrum, tensor_map,
) -> None:
    """Per-layer health table of the update from CKPT_A to CKPT_B.

    When both sit in one run directory, its probe and loss log are used as by ckptscan trend.
    """
    with user_errors():
        load_library()
        from ckptscan.pipeline.api import resolve_references, scan
        from ckptscan.pipeline.request import ScanRequest
        from ckptscan.pipeline.run import resolve_pair

        outputs.check()
        options = scan_options(precision, overrides=head_overrides(num_heads, num_kv_heads, head_dim, model_config),
                               layers=layers, device=device, heads=heads, full_spectrum=full_spectrum,
                               tensor_map=tensor_map)
        request = resolve_references(ScanRequest(
            options, probe=side_file(probe, no_probe), loss_log=side_file(loss_log, no_loss_log),
            references=tuple(reference or ()), config=side_file(config), settings=tuple(set_ or ())))
        spec = resolve_pair(ckpt_a, ckpt_b, request)
        report = scan(spec, request)
        # Before the verdict, as trend prints them; after the scan, so that input that does not open
        # gets its one error line alone.
        for message in spec.notes:
            note(message, "yellow" if message.startswith(("ignoring", "note:")) else "dim", quiet)
        code = outputs.write(report, fail_on or spec.config.fail_on, partial(_print_table, wide=wide), quiet)
    raise typer.Exit(code)


def _print_table(console: Console, report: ScanReport, wide: bool = False) -> None:
    from ckptscan.report.table import print_model, print_pair, print_reference_notes, print_summary

    print_model(console, report)
    print_pair(console, report, report.pairs[0], wide)
    print_reference_notes(console, report)
    print_summary(console, report)
    rests_on = warmup_note(report)
    if rests_on is not None:
        console.print(rests_on, highlight=False, style="dim")


def warmup_note(report: ScanReport) -> str | None:
    """What a diff's verdict rests on when its pair is in the run's warm-up,
    where `trend` judges no pair (the first `warmup_pairs` intervals, and
    the steps before the LR warm-up ends): the pair alone, by the rules that
    need no history. None for a pair after the warm-up, or without steps."""
    pair = report.pairs[0]
    if pair.from_step is None or pair.to_step is None or pair.to_step <= pair.from_step:
        return None
    pairs = int(report.thresholds.get("warmup_pairs", 2))
    interval = pair.to_step - pair.from_step
    lr_end = report.settings.get("lr_warmup_end_step")
    reasons = []
    if pair.from_step < pairs * interval:
        reasons.append(f"step {pair.from_step} is within the run's first {pairs} intervals of {interval} steps")
    if isinstance(lr_end, int) and pair.from_step < lr_end:
        reasons.append(f"before the learning rate's warm-up ends at step {lr_end}")
    if not reasons:
        return None
    return (f"rests on: this pair alone, by the floors, the ceilings, the non-finite check and the cross-layer rule; "
            f"a trend of its run does not judge it ({' and '.join(reasons)}: the warm-up), and neither the update's "
            "size nor any baseline is judged here")
