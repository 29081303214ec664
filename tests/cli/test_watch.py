"""`ckptscan watch RUN_DIR` against a real writer process adding checkpoints.

The command runs as its own process (Ctrl-C is a real SIGINT); the writer
(tests/live_writer.py) copies the files of a prepared run into the watched
directory one command at a time, including a checkpoint whose second shard
appears late and then grows. Every wait is for a printed line or the
writer's answer: no sleeps.
"""

import json
import re
import signal
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from ckptscan.cli import app
from ckptscan.report.resume import terminal_lines
from ckptscan.schema.results import Summary, from_dict

from writer_process import GUARD_S, Lines, Writer, environment
from run_factory import write_run

STEPS = list(range(0, 1000, 100))
COLLAPSE = 800  # the first checkpoint whose q_proj update in layer 1 has collapsed


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    root = tmp_path_factory.mktemp("watch-sources")
    return {
        "collapse": write_run(root / "collapse", count=len(STEPS), collapse_layer=1, collapse_from=COLLAPSE,
                              shards=2),
        "healthy": write_run(root / "healthy", count=6),
    }


# The console script with SIGINT's usual handler, as from a terminal. A shell
# starts a non-interactive script's background jobs (`make test &`, nohup ...
# &) with SIGINT ignored; pytest's children inherit that, Python leaves it
# ignored, and the Ctrl-C test waited out its guard (seen: /proc's SigIgn of
# the watch process had SIGINT). tests/hostile/test_interrupts.py does the same.
TERMINAL_COMMAND = """
import signal; signal.signal(signal.SIGINT, signal.default_int_handler)
import sys
sys.argv = ["ckptscan", *sys.argv[1:]]
from ckptscan.cli.console import main
main()
"""


class Watch:
    """`ckptscan watch` as a process, its stdout and stderr read as they come."""

    def __init__(self, *args):
        self.process = subprocess.Popen([sys.executable, "-c", TERMINAL_COMMAND, "watch", *map(str, args)],
                                        text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                        env=environment())
        self.out, self.err = Lines(self.process.stdout), Lines(self.process.stderr)

    def wait(self) -> int:
        code = self.process.wait(GUARD_S)
        self.out.rest(), self.err.rest()
        return code


def row(step):
    """A pair's row: the newer step, right-aligned, then the pair."""
    return rf"^\s*{step} \d+→{step}\s"


def rows(lines):
    return [int(m.group(1)) for line in lines if (m := re.match(r"^\s*(\d+) \d+→\d+\s", line))]


def covered(lines):
    """The steps of the rows printed and of the pairs counted between them ('… 3 pairs, steps 200–400')."""
    steps = []
    for line in lines:
        if m := re.match(r"^\s*(\d+) \d+→\d+\s", line):
            steps.append(int(m.group(1)))
        elif m := re.match(r"^\s*… (\d+) pairs?, steps? (\d+)(?:–(\d+))?: ", line):
            count, first, last = int(m.group(1)), int(m.group(2)), int(m.group(3) or m.group(2))
            steps += list(range(first, last + 1, (last - first) // max(1, count - 1) or 1))
    return steps


@pytest.fixture
def writer(sources, tmp_path):
    writer = Writer(sources["collapse"], tmp_path / "run")
    yield writer
    writer.close()


@pytest.mark.parametrize("mode", [[], ["--poll", "--interval", "0.05"]], ids=["inotify", "polling"])
def test_follows_a_live_run_and_exits_at_the_first_alert(writer, tmp_path, mode):
    for step in STEPS[:3]:
        writer.publish(f"checkpoint-{step}")
    report = tmp_path / "report.json"
    summary = tmp_path / "summary.md"
    watch = Watch(writer.target, *mode, "--settle", "0.05", "--json", report, "--markdown-summary", summary,
                  "--no-cache")
    watch.err.expect("^watching .* Ctrl-C to stop$")
    watch.out.expect(row(100)), watch.out.expect(row(200))

    # checkpoint-300 saved slowly: the index and shard 1, shard 2 late, then growing.
    writer.send("copy checkpoint-300/config.json")
    writer.send("copy checkpoint-300/model-00001-of-00002.safetensors")
    writer.send("copy checkpoint-300/model.safetensors.index.json")
    watch.err.expect("^waiting for checkpoint-300: .*names shard 'model-00002-of-00002.safetensors', which does "
                     "not exist")
    size = (writer.source / "checkpoint-300/model-00002-of-00002.safetensors").stat().st_size
    writer.send(f"head checkpoint-300/model-00002-of-00002.safetensors {size // 2}")
    watch.err.expect("^waiting for checkpoint-300: .*truncated: the header declares")
    assert rows(watch.out.lines) == [100, 200], "the partial checkpoint was not read"
    writer.send("rest checkpoint-300/model-00002-of-00002.safetensors")
    watch.out.expect(row(300))
    assert json.loads(report.read_text())["pairs"][-1]["to_step"] == 300  # rewritten after each new pair

    for step in STEPS[4:]:
        writer.publish(f"checkpoint-{step}")
        if step < COLLAPSE:
            watch.out.expect(row(step))
            assert watch.process.poll() is None
        else:
            break
    assert watch.wait() == 1
    assert rows(watch.out.lines) == STEPS[1:STEPS.index(COLLAPSE) + 1], "each row printed once, in order"
    assert "layer 1 [attention] alert:" in "\n".join(watch.out.lines)
    assert any(line.startswith("gate failed (--fail-on alert): ALERT") for line in watch.err.lines)
    assert not any("Traceback" in line for line in watch.err.lines)

    # The JSON report is the run so far, judged as `ckptscan trend` judges it.
    trend = tmp_path / "trend.json"
    assert CliRunner().invoke(app, ["trend", str(writer.target), "--json", str(trend), "--no-cache"]).exit_code == 1
    watched, judged = json.loads(report.read_text()), json.loads(trend.read_text())
    assert watched["pairs"] == judged["pairs"] and watched["summary"] == judged["summary"]
    # The Markdown summary grew by one section per new batch of pairs.
    sections = re.findall(r"^#### .* at step (\d+) — ([A-Z ]+)$", summary.read_text(), re.M)
    assert [int(s) for s, _ in sections][-6:] == [300, 400, 500, 600, 700, 800]
    # Before step 800 every pair was the warm-up or a baseline pair: the run was not judged, never OK.
    assert sections[-1][1] == "ALERT" and {status for _, status in sections[:-1]} == {"NOT JUDGED"}


def invoke(*args):
    """A watch whose checkpoints are all there at the start: run in this process."""
    return CliRunner().invoke(app, ["watch", *map(str, args)])


def test_keep_going_judges_past_the_alert_until_the_timeout(writer):
    for step in STEPS:
        writer.publish(f"checkpoint-{step}")
    result = invoke(writer.target, "--keep-going", "--timeout", "1", "--poll", "--interval", "0.05", "--no-cache")
    assert result.exit_code == 1, "the gate's code for the run so far"
    # One batch (every checkpoint was there): a row where the status changes or a finding starts, and the newest;
    # the pairs between them counted.
    assert covered(result.stdout.splitlines()) == STEPS[1:]
    assert rows(result.stdout.splitlines()) == [100, COLLAPSE, 900]  # not judged until the alert at COLLAPSE
    assert "no new checkpoint for 1 s: stopped watching" in result.stderr.splitlines()


def test_timeout_on_a_healthy_run_too_young_to_judge_fails_at_not_judged(sources):
    """Five pairs: the warm-up and the baselines. The watch goes on through them (a run not judged
    yet is no verdict to stop at), and at the timeout the gate says so."""
    args = (sources["healthy"], "--timeout", "1", "--poll", "--interval", "0.05", "--no-cache")
    result = invoke(*args, "--fail-on", "not_judged")
    assert result.exit_code == 1
    assert rows(result.stdout.splitlines()) == [100, 500]  # nothing changed in between
    assert "         … 3 pairs, steps 200–400: not_judged, nothing new" in result.stdout.splitlines()
    assert covered(result.stdout.splitlines()) == [100, 200, 300, 400, 500]
    assert result.stderr.splitlines()[-1].startswith("gate failed (--fail-on not_judged): NOT JUDGED: none of the "
                                                      "5 pairs could be judged yet")
    passed = invoke(*args, "--fail-on", "alert")
    assert passed.exit_code == 0
    assert passed.stderr.splitlines()[-1].startswith("gate passed (--fail-on alert): NOT JUDGED")


def test_timeout_without_any_pair_is_an_input_error(tmp_path):
    (tmp_path / "run").mkdir()
    result = invoke(tmp_path / "run", "--timeout", "0.5", "--poll", "--interval", "0.05")
    assert result.exit_code == 2
    assert result.stderr.splitlines()[-1] == (f"error: {tmp_path / 'run'}: no checkpoint pair was complete within "
                                              "--timeout 0.5 s")


def test_ctrl_c_exits_130_with_the_report_kept(writer, tmp_path):
    for step in STEPS[:3]:
        writer.publish(f"checkpoint-{step}")
    report = tmp_path / "report.json"
    watch = Watch(writer.target, "--json", report, "--no-cache")
    watch.out.expect(row(200))
    watch.process.send_signal(signal.SIGINT)
    assert watch.wait() == 130
    assert watch.err.lines[-1] == f"interrupted: stopped watching; {report} holds the series judged so far"
    assert not any("Traceback" in line for line in watch.err.lines)
    assert [p["to_step"] for p in json.loads(report.read_text())["pairs"]] == [100, 200]


@pytest.mark.parametrize("args, message", [
    (["--interval", "0"], "--interval must be > 0"),
    (["--timeout", "-1"], "--timeout must be > 0"),
    (["--stride", "0"], "--stride must be"),
])
def test_bad_flags_are_one_line_and_exit_2(sources, args, message):
    result = invoke(sources["healthy"], *args)
    assert result.exit_code == 2
    assert result.stderr.startswith("error: ") and message in result.stderr and len(result.stderr.splitlines()) == 1


def test_a_missing_run_directory_is_an_input_error_saying_it_does_not_exist(tmp_path):
    result = invoke(tmp_path / "missing")
    assert result.exit_code == 2 and result.stderr == f"error: {tmp_path / 'missing'}: does not exist\n"


def test_tensorboard_events_follow_the_watched_run(sources, tmp_path):
    """--tensorboard: each judged pair's monitors reach the event files once."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events, report = tmp_path / "tb", tmp_path / "r.json"
    result = invoke(sources["healthy"], "--timeout", "1", "--poll", "--interval", "0.05", "--no-cache",
                    "--tensorboard", events, "--json", report, "--fail-on", "alert")  # too young to judge
    assert result.exit_code == 0, result.output
    acc = EventAccumulator(str(events), size_guidance={"tensors": 0})
    acc.Reload()
    steps = [e.step for e in acc.Tensors("delta2_entropy_norm/layer_0")]
    assert steps == [pair["to_step"] for pair in json.loads(report.read_text())["pairs"]]


SAMPLES = __import__("pathlib").Path(__file__).resolve().parents[2] / "sample_checkpoints"


@pytest.mark.skipif(not (SAMPLES / "attention_fault").is_dir(), reason="sample_checkpoints/ not present")
def test_a_finding_is_printed_when_it_starts_not_at_every_pair(tmp_path):
    """On the attention-fault sample (one batch: the run is finished) the watch prints no more lines than
    `trend` plus one per new finding; the ceiling alert that stands from step 1400 to the end is printed once."""
    run = SAMPLES / "attention_fault"
    watched = invoke(run, "--keep-going", "--timeout", "1", "--poll", "--interval", "0.05", "--quiet",
                     "--cache-dir", tmp_path)
    trend = CliRunner().invoke(app, ["trend", str(run), "--quiet", "--cache-dir", str(tmp_path)])
    assert watched.exit_code == trend.exit_code == 1
    lines = watched.output.splitlines()
    findings = [line for line in lines if line.startswith("    layer ")]
    assert len(set(findings)) == len(findings), "no finding printed twice"
    assert len(lines) <= len(trend.output.splitlines()) + len(findings)
    ceiling = [line for line in findings if "attention logit scale" in line and "above the ceiling" in line]
    assert len(ceiling) == 1 and ceiling[0].startswith("    layer 1 [attention] alert: attention logit scale 2.15")
    assert covered(lines) == list(range(100, 3001, 100)), "every pair is a row or counted"


def test_the_watch_prints_the_resume_plan_trend_prints_when_it_alerts(writer, tmp_path):
    """The rollback candidate and the resume plan (report/resume.py) come once, when the first alert does, and say
    what `ckptscan trend` of the same checkpoints says."""
    for step in STEPS:
        writer.publish(f"checkpoint-{step}")
    result = invoke(writer.target, "--timeout", "1", "--poll", "--interval", "0.05", "--no-cache", "--json",
                    tmp_path / "watch.json")
    assert result.exit_code == 1
    trend = CliRunner().invoke(app, ["trend", str(writer.target), "--no-cache"])
    plan = terminal_lines(from_dict(Summary, json.loads((tmp_path / "watch.json").read_text())["summary"]))
    assert plan[0].startswith("rollback candidate: ") and len(plan) > 1
    watched, trended = (" ".join(text.split()) for text in (result.stdout, trend.stdout))
    block = " ".join(" ".join(plan).split())
    assert watched.count(block) == 1 and block in trended
