"""The numbers README.md and docs/ quote about the sample runs are what the tool prints today.

docs/figures.json holds the facts (scripts/docs_figures.py runs ckptscan on
sample_checkpoints/ and writes them); a page binds a number to a fact with
`<!-- fig: KEY -->` right before it (tests/docs/figures.py). The committed
figures (docs/*.png) each carry a JSON of the numbers they show, written by
the same script. When one of these tests fails after a change to the rules,
rerun `python scripts/docs_figures.py --png` and update the prose it names.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import re

import pytest

from docs.examples import ROOT, SHELL, blocks, documents
from docs.figures import ABOUT_SAMPLE_RUNS, NOT_A_FIGURE, STEP, Unit, agrees, all_units, bindings, unbound_steps

# The pages whose tables are measurements of other runs (benchmarks, the calibration corpus), not the
# tool's output on the sample runs: each table's section says where its figures come from.
MEASURED_ELSEWHERE = ("docs/performance.md", "docs/performance-gpu.md", "docs/calibration.md")
# The data blocks (not run, no markers possible) that quote step numbers about a sample run: the tool's
# output, checked by a test of its own below, or why not; a new one must join them.
DATA_BLOCKS = {
    ("docs/guides/alerts.md", "json"): "the --notify body of attention_fault's alert",
    ("docs/development.md", "text"): "how a marker is written (its numbers are a marker's, bound in README.md)",
}
SOURCE = re.compile(r"\b20\d\d-\d\d-\d\d\b|make bench|bench/\w+\.py|experiments[./]\w+|scripts/\w+|python -m \w+")


def load_script():
    spec = importlib.util.spec_from_file_location("docs_figures", ROOT / "scripts" / "docs_figures.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def script():
    return load_script()


@pytest.fixture(scope="module")
def reports(script):
    """The sample runs' reports, as the script computes them (a few seconds a run)."""
    return script.scan_sample_runs()


@pytest.fixture(scope="module")
def committed() -> dict:
    return json.loads((ROOT / "docs" / "figures.json").read_text())


def test_the_committed_facts_are_what_the_tool_says_today(script, reports, committed):
    today = script.facts(reports)
    changed = {key: (committed.get(key), today.get(key)) for key in sorted(set(today) | set(committed))
               if committed.get(key, "absent") != today.get(key, "absent")}
    assert not changed, f"docs/figures.json is stale (committed, today): {changed}; run python scripts/docs_figures.py"


def test_every_bound_number_is_its_fact(committed):
    bound = [(unit, key, number) for unit in all_units() for key, number in bindings(unit)]
    assert len(bound) >= 40  # README, the sample-runs page, the home page, guides, calibration
    wrong = [f"{unit.where}: {number} is bound to {key}, which is {committed.get(key, 'not a fact')!r}"
             for unit, key, number in bound if not agrees(number, committed.get(key))]
    assert not wrong, "\n".join(wrong)


def test_every_step_quoted_about_the_sample_runs_is_bound():
    unbound = [f"{unit.where}: {', '.join(steps)} in {' '.join(unit.text.split())[:100]!r}"
               for unit in all_units() if (steps := unbound_steps(unit))]
    assert not unbound, ("bind each to a fact of docs/figures.json with <!-- fig: KEY --> (or mark the sentence "
                         "<!-- not a figure: WHY -->):\n" + "\n".join(unbound))


def test_a_sentence_that_is_not_the_tools_output_says_why():
    for unit in all_units():
        for marker in NOT_A_FIGURE.finditer(unit.text):
            assert len(marker["why"].split()) >= 2, f"{unit.where}: say where its numbers come from"


@pytest.mark.parametrize("name", ["attention_fault_overview", "report-screenshot"])
def test_each_committed_figure_shows_what_the_tool_draws_today(script, reports, name):
    png = ROOT / "docs" / f"{name}.png"
    record = json.loads(script.sidecar(png).read_text())
    assert record.pop("sha256") == hashlib.sha256(png.read_bytes()).hexdigest(), (
        f"{png.name} is not the figure its JSON describes: run python scripts/docs_figures.py --png")
    record.pop("drawn_by")
    assert record == script.drawn(reports["attention_fault"]), (
        f"{png.name} shows what the tool no longer says: run python scripts/docs_figures.py --png")


def test_the_committed_figures_alt_texts_quote_no_number():
    """What an image shows is checked through its JSON; its alt text describes it without numbers, which
    the prose around it binds."""
    images = [(unit, alt) for unit in all_units()
              for alt in re.findall(r"!\[([^\]]*)\]\((?:docs/)?(?:attention_fault_overview|report-screenshot)\.png\)",
                                    unit.text)]
    assert {str(unit.path.relative_to(ROOT)) for unit, _ in images} == {"README.md", "docs/index.md"}
    assert [(unit.where, alt) for unit, alt in images if re.search(r"\d{3}", alt)] == []


@pytest.mark.parametrize("page", MEASURED_ELSEWHERE)
def test_tables_measured_elsewhere_say_where_they_come_from(page):
    """A benchmark's or the corpus's table names its script or its date in its section, above it (in the
    prose or in the command that made it)."""
    lines = (ROOT / page).read_text().splitlines()
    section, fenced, missing = 0, False, []
    for i, line in enumerate(lines):
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced and line.startswith("#"):
            section = i
        elif not fenced and line.startswith("|") and not lines[i - 1].startswith("|"):
            if not SOURCE.search("\n".join(lines[section:i])):
                missing.append(f"{page}:{i + 1}: {line[:80]}")
    assert not missing, "tables with no script or date above them in their section:\n" + "\n".join(missing)


def test_every_data_block_about_the_sample_runs_is_checked():
    found = {(str(b.path.relative_to(ROOT)), b.lang) for page in documents() if page.name != "cli.md"
             for b in blocks(page) if b.lang not in {"console", "python", "pycon", *SHELL}
             and ABOUT_SAMPLE_RUNS.search(b.text) and STEP.search(b.text)}
    assert found == set(DATA_BLOCKS), "a data block quotes the tool on a sample run: check it here"


def test_the_notify_body_shown_is_the_one_sent_for_the_attention_fault(reports):
    from ckptscan.report.notify import notice_payload, notices

    page = ROOT / "docs" / "guides" / "alerts.md"
    shown = json.loads(next(b.text for b in blocks(page) if b.lang == "json"))
    report = reports["attention_fault"]
    sent = json.loads(json.dumps(notice_payload(report, notices(report)[-1])))
    facts = ("kind", "step", "family", "status", "layers", "heads", "rollback_candidate")
    assert {key: shown["ckptscan"][key] for key in facts} == {key: sent["ckptscan"][key] for key in facts}
    assert shown["text"].split(" in ")[0] == sent["text"].split(" in ")[0]  # "ckptscan ALERT: attention at step N"


# The scan itself, on made-up sentences.

def unit(text: str, page: str = "docs/guides/example.md") -> Unit:
    return Unit(ROOT / page, 1, text)


def test_the_scan_finds_a_step_quoted_about_a_sample_run_and_no_other_number():
    assert unbound_steps(unit("`attention_fault` alerts at step 1400, 599 steps before the loss")) == ["1400", "599"]
    assert unbound_steps(unit("The sample runs are 31 checkpoints, 23 MB, saved in 2026 at 0.25–0.29")) == []
    assert unbound_steps(unit("A corpus run alerts at step 1400")) == []  # not about the sample runs
    assert unbound_steps(unit("on the attention fault, 1400", page="docs/sample-runs.md")) == ["1400"]


def test_a_marker_binds_the_number_right_after_it_and_no_other():
    text = "`silent_fault` alerts at <!-- fig: silent_fault.first_alert -->500 and at 700"
    assert bindings(unit(text)) == [("silent_fault.first_alert", "500")]
    assert unbound_steps(unit(text)) == ["700"]
    assert unbound_steps(unit("`silent_fault` at 700 <!-- not a figure: before issue #13 -->")) == []


def test_a_number_agrees_with_its_fact_as_the_page_rounds_it():
    assert agrees("1400", 1400) and not agrees("1500", 1400)
    assert agrees("0.80", 0.8047) and agrees("0.14", 0.1391) and not agrees("0.81", 0.8047)
    assert not agrees("1400", None) and not agrees("1400", 1400.0) and not agrees("1", True)
