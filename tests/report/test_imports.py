"""The reports render the results in the monitor registry's words; they never
reach into detection, which judges. Read from the source, not imported:
an import anywhere in a report module (at the top, in a function, under
TYPE_CHECKING) counts."""

import ast
from pathlib import Path

import ckptscan

REPORT = Path(ckptscan.__file__).parent / "report"


def imported_modules(source: str, package: list[str]) -> list[tuple[int, str]]:
    """(line, absolute name) of every import in a module of `package`: each
    module named, and for `from M import a` also M.a (a may be a module)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            found += [(node.lineno, module)] + [(node.lineno, f"{module}.{alias.name}") for alias in node.names]
    return found


def naming_detection(names: list[tuple[int, str]]) -> list[tuple[int, str]]:
    return [(line, name) for line, name in names
            if name == "ckptscan.detection" or name.startswith("ckptscan.detection.")]


def test_no_report_module_imports_detection():
    modules = sorted(REPORT.rglob("*.py"))
    assert REPORT / "html_page.py" in modules and REPORT / "figures" / "timeline.py" in modules  # subpackages too
    offending = [f"{path.relative_to(REPORT.parent)}:{line}: {name}" for path in modules
                 for line, name in naming_detection(imported_modules(
                     path.read_text(), ["ckptscan", *path.relative_to(REPORT.parent).parent.parts]))]
    assert offending == []


def test_every_way_of_naming_detection_is_caught():
    spellings = ["import ckptscan.detection.rules", "from ckptscan.detection import rules",
                 "from ckptscan import detection", "from ...detection.catalog import BY_NAME",
                 "from ... import detection"]
    source = "\n".join(f"def f{i}():\n    {s}" for i, s in enumerate(spellings))
    caught = {line for line, _ in naming_detection(imported_modules(source, ["ckptscan", "report", "figures"]))}
    assert caught == {2 * i + 2 for i in range(len(spellings))}
    assert naming_detection(imported_modules("from ckptscan.monitors import registry", ["ckptscan", "report"])) == []
