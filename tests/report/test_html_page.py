"""The HTML report: well-formed, self-contained, every section, images that
decode; the same bytes from `trend --html` and from `report REPORT.json`;
without matplotlib, a clear exit 2 and everything else still working."""

import base64
import io
import re
import subprocess
import sys
from html.parser import HTMLParser

import pytest
from typer.testing import CliRunner

from ckptscan.cli import app
from ckptscan.document.plain import report_dict
from ckptscan.document.writing import write_json

runner = CliRunner()
VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
INSTALL = "pip install 'ckptscan[report]'"


class Structure(HTMLParser):
    """Checks that every element is closed in order; collects ids, images, text."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.stack, self.ids, self.images, self.tags, self.text = [], [], [], [], []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.tags.append(tag)
        if "id" in attrs:
            self.ids.append(attrs["id"])
        if tag == "img":
            self.images.append(attrs)
        if tag not in VOID:
            self.stack.append(tag)

    def handle_startendtag(self, tag, attrs):
        raise AssertionError(f"self-closing <{tag}/> in HTML5")

    def handle_endtag(self, tag):
        assert tag not in VOID, f"</{tag}> closes a void element"
        assert self.stack and self.stack[-1] == tag, f"</{tag}> closes <{self.stack[-1] if self.stack else None}>"
        self.stack.pop()

    def handle_data(self, data):
        self.text.append(data)


def parse(page: str) -> Structure:
    parser = Structure()
    parser.feed(page)
    parser.close()
    assert parser.stack == [], f"unclosed: {parser.stack}"
    return parser


def render(report, tmp_path, name="report.html", png=None):
    from ckptscan.report.html_page import write_report_files

    path = tmp_path / name
    write_report_files(report_dict(report), path, png)
    return path.read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def page(reports, tmp_path_factory):
    pytest.importorskip("matplotlib")
    return render(reports["loss"], tmp_path_factory.mktemp("html"))


def test_page_is_well_formed_and_self_contained(page):
    assert page.startswith("<!DOCTYPE html>\n")
    structure = parse(page)
    assert structure.tags.count("html") == structure.tags.count("head") == structure.tags.count("body") == 1
    lowered = page.lower()
    for forbidden in ("http", "<script", "<link", "url(", "@import", "<iframe", "<object"):
        assert forbidden not in lowered, forbidden
    assert all(img["src"].startswith("data:image/png;base64,") for img in structure.images)


def test_page_has_every_section_in_order(page):
    from ckptscan.report.html_page import SECTIONS

    ids = [i for i in parse(page).ids if i in SECTIONS]
    assert ids == list(SECTIONS)


def test_verdict_thresholds_and_facts_are_on_the_page(page, reports):
    report = reports["loss"]
    s = report.summary
    text = " ".join(parse(page).text)
    assert s.message in text
    assert f"primary family {s.primary_family} ({s.primary_family_reason})" in text
    assert f"also alerted {', '.join(s.secondary_families) or '–'}" in text
    assert f"{s.rollback_candidate.path} (step {s.rollback_candidate.step})" in text
    assert f"diverged at step {s.loss_divergence_step}" in text
    assert f"{s.lead_steps} steps: the first alert came before the loss diverged" in text
    thresholds = text[text.index("Effective thresholds"):text.index("Model and run")]
    for name in report.thresholds:
        assert name in thresholds
    assert "mixtral" in text and "4 / 2" in text  # query / KV heads
    assert str(report.settings["loss_log"]) in text
    first_finding = next(f for p in report.pairs for layer in p.layers for f in layer.findings
                         if f.severity == "alert")
    assert first_finding.message in text


def test_what_to_do_follows_the_rollback_candidate(page, reports):
    from ckptscan.monitors.interventions import intervention_lines

    text = " ".join(parse(page).text)
    lines = intervention_lines(reports["loss"].summary)
    assert lines and all(line in text for line in lines)
    assert text.index("rollback candidate") < text.index("what to do") < text.index(lines[0])


def test_embedded_images_decode(page):
    from PIL import Image

    structure = parse(page)
    images = structure.images
    figures = [i for i in structure.ids if i.startswith("figure-")]
    assert figures == ["figure-timeline", "figure-heatmap_delta2_entropy_norm", "figure-heatmap_dwq_entropy_norm",
                       "figure-heatmap_epsilon", "figure-heatmap_routing_entropy_norm"]
    assert len(images) == len(figures)
    for img in images:
        png = base64.b64decode(img["src"].removeprefix("data:image/png;base64,"), validate=True)
        assert png.startswith(PNG_SIGNATURE)
        with Image.open(io.BytesIO(png)) as image:
            image.load()
            assert image.size[0] > 500 and image.size[1] > 200
        assert img["alt"]


def test_report_without_a_loss_log_and_a_healthy_one_render(reports, tmp_path):
    pytest.importorskip("matplotlib")
    no_loss = render(reports["no_loss"], tmp_path, "no_loss.html")
    assert "no loss log in the report" in " ".join(parse(no_loss).text)
    healthy = " ".join(parse(render(reports["healthy"], tmp_path, "healthy.html")).text)
    assert "HEALTHY" in healthy and "No layer was flagged." in healthy and "none: no alert" in healthy


def test_text_from_files_is_escaped(reports, tmp_path):
    pytest.importorskip("matplotlib")
    data = report_dict(reports["healthy"])
    data["settings"]["run"] = "/runs/<script>alert(1)</script>&x"
    from ckptscan.report.html_page import write_report_files

    write_report_files(data, tmp_path / "escaped.html")
    page = (tmp_path / "escaped.html").read_text()
    structure = parse(page)
    assert "script" not in structure.tags
    assert "/runs/<script>alert(1)</script>&x" in " ".join(structure.text)


def test_trend_html_and_report_of_its_json_are_the_same_bytes(runs, tmp_path):
    pytest.importorskip("matplotlib")
    run = runs["collapse"]
    cache = ["--cache-dir", str(tmp_path / "cache")]
    result = runner.invoke(app, ["trend", str(run), "--json", str(tmp_path / "r.json"), "--html",
                                 str(tmp_path / "trend.html"), "--png", str(tmp_path / "png"), *cache])
    assert result.exit_code == 1, result.output  # the gate fails on the planted collapse; the files are written
    assert f"wrote {tmp_path / 'trend.html'}" in result.stderr
    result = runner.invoke(app, ["report", str(tmp_path / "r.json"), "--html", str(tmp_path / "again.html")])
    assert result.exit_code == 0, result.output
    page = (tmp_path / "trend.html").read_bytes()
    assert page == (tmp_path / "again.html").read_bytes()
    # --png writes the embedded figures, byte for byte.
    embedded = [base64.b64decode(m) for m in re.findall(rb"data:image/png;base64,([A-Za-z0-9+/=]+)", page)]
    written = sorted((tmp_path / "png").iterdir())
    assert sorted(p.name for p in written) == ["heatmap_delta2_entropy_norm.png", "heatmap_dwq_entropy_norm.png",
                                               "heatmap_epsilon.png", "heatmap_routing_entropy_norm.png",
                                               "timeline.png"]
    assert sorted(embedded) == sorted(p.read_bytes() for p in written)


def test_library_report_and_its_json_file_give_the_same_page(reports, tmp_path):
    pytest.importorskip("matplotlib")
    from ckptscan.report.html_page import write_report_files
    from ckptscan.document.reading import read_report

    write_json(reports["no_loss"], tmp_path / "r.json")
    write_report_files(read_report(tmp_path / "r.json"), tmp_path / "from_file.html")
    assert render(reports["no_loss"], tmp_path, "direct.html") == (tmp_path / "from_file.html").read_text()


def test_report_command_input_errors(tmp_path):
    (tmp_path / "bad.json").write_text("{not json")
    (tmp_path / "other.json").write_text('{"hello": 1}')
    (tmp_path / "future.json").write_text('{"schema_version": 99, "command": "trend", "model": {}, '
                                          '"checkpoints": [], "pairs": [], "summary": {}}')
    cases = [
        (["report", str(tmp_path / "bad.json"), "--html", "x.html"], "not valid JSON"),
        (["report", str(tmp_path / "other.json"), "--html", "x.html"], "not a ckptscan JSON report"),
        (["report", str(tmp_path / "future.json"), "--html", "x.html"], "upgrade ckptscan"),
        (["report", str(tmp_path / "missing.json"), "--html", "x.html"], "cannot read the report"),
        (["report", str(tmp_path / "other.json")], "give --html FILE and/or --png DIR"),
    ]
    for args, message in cases:
        result = runner.invoke(app, args)
        assert result.exit_code == 2, (args, result.output)
        assert message in result.stderr and "Traceback" not in result.output


def test_without_matplotlib_figures_exit_2_with_the_fix_and_the_rest_works(runs, reports, tmp_path, monkeypatch):
    write_json(reports["loss"], tmp_path / "r.json")
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` now raises ImportError
    result = runner.invoke(app, ["report", str(tmp_path / "r.json"), "--html", str(tmp_path / "r.html")])
    assert result.exit_code == 2 and INSTALL in result.stderr and "Traceback" not in result.output
    assert not (tmp_path / "r.html").exists()
    cache = ["--cache-dir", str(tmp_path / "cache")]
    result = runner.invoke(app, ["trend", str(runs["collapse"]), "--png", str(tmp_path / "png"), *cache])
    assert result.exit_code == 2 and INSTALL in result.stderr
    assert result.stdout == "" and not (tmp_path / "png").exists()  # refused before scanning
    result = runner.invoke(app, ["trend", str(runs["collapse"]), "--json", str(tmp_path / "t.json"), *cache])
    assert result.exit_code == 1 and "ALERT" in result.stdout and (tmp_path / "t.json").exists()


def test_importing_the_cli_does_not_import_matplotlib():
    code = "import sys, ckptscan.cli, ckptscan.report.html_page; print('matplotlib' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_a_single_pair_report_gets_a_per_layer_figure(runs, tmp_path):
    pytest.importorskip("matplotlib")
    from ckptscan.report.html_page import SECTIONS
    from ckptscan import scan_pair

    run = runs["collapse"]
    report = scan_pair(run / "checkpoint-900", run / "checkpoint-1000")
    structure = parse(render(report, tmp_path, "diff.html", png=tmp_path / "png"))
    assert [i for i in structure.ids if i in SECTIONS] == list(SECTIONS)
    assert [i for i in structure.ids if i.startswith("figure-")] == ["figure-layers"]
    assert [p.name for p in (tmp_path / "png").iterdir()] == ["layers.png"]
    assert "One pair of checkpoints: no time axis" in " ".join(structure.text)


def test_words_break_only_where_a_line_would_overflow(page):
    # break-all split "Gemma 2" and "which" mid-word in the verdict's rows.
    assert "break-all" not in page and "overflow-wrap: break-word" in page


def test_a_run_not_judged_says_so_never_ok(reports, tmp_path):
    from ckptscan.detection.judge import judge
    from ckptscan.pipeline.metrics import Metrics

    pytest.importorskip("matplotlib")
    young = reports["healthy"]
    metrics = Metrics("run", young.model, young.checkpoints[:3], young.pairs[:2])
    text = render(judge(metrics), tmp_path)
    assert '<span class="badge not_judged">NOT JUDGED</span>' in text
    assert "<dt>judged</dt><dd>0 of 2 pairs; not judged: 2 pairs: warm-up (the first 2 pairs" in text
    assert "OK" not in text.split("<body>")[1].split("</header>")[0]


def test_the_warm_up_steps_say_what_they_are(page, reports):
    """Issue 52: `warmup end step 99` and `lr warmup end step` stood on the page unexplained."""
    report = reports["loss"]
    text = " ".join(parse(page).text)
    run_facts = text[text.index("Model and run"):]
    warmup = report.settings["warmup_end_step"]
    assert f"warmup end step {warmup} the older step of the first pair judged against the run's own history" \
        in run_facts
    assert "pairs before it are the warm-up (the first 2 pairs" in run_facts
    if "lr_warmup_end_step" in report.settings:
        assert "lr warmup end step" in run_facts and "where the learning rate's initial ramp ends" in run_facts
    assert '<dt title="the older step of the first pair judged' in page
