"""What to do about an alert (ckptscan/monitors/interventions.py): the families that
alerted get their interventions, the first family's first, each with its
source; the judged report's summary carries them, the JSON lists them."""

import re
from pathlib import Path

import pytest

from ckptscan import scan_run
from ckptscan.monitors.interventions import INTERVENTIONS, RESTART, family_lines, intervention_lines, interventions_for
from ckptscan.monitors import registry
from ckptscan.document.plain import report_dict
from ckptscan.schema.results import Summary

SAMPLES = Path(__file__).resolve().parent.parent / "sample_checkpoints"


def summary(first_family=None, **alerts):
    return Summary(status="alert" if alerts else "ok", flagged_layers=[], first_family=first_family,
                   first_alert_step={family: alerts.get(family) for family in registry.finding_families()})


def test_every_family_has_cited_interventions():
    assert set(INTERVENTIONS) == set(registry.finding_families())
    for family, interventions in INTERVENTIONS.items():
        assert interventions and all(i.family == family and i.action for i in interventions)
        assert all(re.search(r"arXiv:\d{4}\.\d{4,5}", i.source) for i in interventions), family


def test_no_alert_nothing_to_do():
    assert interventions_for(summary()) == []


def test_the_first_family_comes_first_and_the_shared_restart_once():
    listed = interventions_for(summary("router", attention=1700, router=1100))
    families = [i["family"] for i in listed]
    assert families == sorted(families, key=lambda f: f != "router")  # router's, then attention's
    assert families[0] == "router" and "attention" in families
    assert [i["action"] for i in listed].count(RESTART[1]) == 1
    assert set(listed[0]) == {"family", "short", "action", "source"}
    assert intervention_lines(Summary("alert", [], {}, interventions=listed))[0] == \
        f"router: {listed[0]['action']} [{listed[0]['source']}]"


def test_the_terminal_gets_one_short_line_per_family_first_family_first():
    listed = interventions_for(summary("router", attention=1700, router=1100))
    lines = family_lines(Summary("alert", [], {}, interventions=listed))
    assert [line.split(":")[0] for line in lines] == ["router", "attention"]
    assert lines[0] == "router: " + " · ".join(i.short for i in INTERVENTIONS["router"])
    # the restart is listed once, under the first family
    assert lines[1] == "attention: " + " · ".join(i.short for i in INTERVENTIONS["attention"] if i.short != RESTART[0])


def test_no_first_family_nothing_to_do():
    assert interventions_for(Summary("alert", [0], {"attention": None, "router": None, "numeric": None, "update": None})) == []


def test_only_alerting_families():
    listed = interventions_for(summary("numeric", numeric=500))
    assert {i["family"] for i in listed} == {"numeric"}


@pytest.mark.skipif(not (SAMPLES / "router_fault").is_dir(), reason="sample_checkpoints/ not present")
def test_the_judged_report_lists_them_in_its_json():
    report = scan_run(SAMPLES / "router_fault")  # router alerts first (1100), attention later
    listed = report_dict(report)["summary"]["interventions"]
    assert listed == interventions_for(report.summary) and listed[0]["family"] == "router"
    assert {i["family"] for i in listed} == {f for f, step in report.summary.first_alert_step.items() if step}
