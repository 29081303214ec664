"""A saved JSON report, read back for rendering without the checkpoints.

`ckptscan report REPORT.json --html` and `ckptscan trend --html` render the
same thing: the dict that the JSON file holds. `trend` passes its
`report_dict(report)` through a JSON round trip first, so a value reaches
the renderer exactly as a reader of the file would see it, and both paths
give the same bytes.
"""

from __future__ import annotations

import gc
import gzip
import json
import zlib
from pathlib import Path
from typing import Any, Callable

from ckptscan.errors import CkptScanError
from ckptscan.document.parts import PARTS_SCHEMA_VERSION, expand, pair_columns
from ckptscan.document.rebuild import build
from ckptscan.schema.results import ADDED_SUMMARY_KEYS, WRITTEN_WITHOUT, PairResult, ScanReport, from_dict
from ckptscan.storage import RemotePath, as_path

GZIP_MAGIC = b"\x1f\x8b"
REQUIRED = ("command", "model", "checkpoints", "pairs", "summary")
# Every schema version ckptscan has written: 1 (one document), 2 (a long
# report's pairs in a file beside it, `parts.py`).
READS = (1, PARTS_SCHEMA_VERSION)


def read_report(path: str | Path | RemotePath) -> dict[str, Any]:
    """The dict of a ckptscan JSON report file (`--json` of diff or trend),
    gzip-compressed or not, local or at a URL (s3://bucket/run/report.json)."""
    data = read_json_file(path)
    check_report(data, path)
    return data


def read_json_file(path: str | Path | RemotePath) -> Any:
    """The JSON a report file holds, unchecked (a sweep's report, too), gzip-compressed
    or not; a schema-2 report with its pairs read back from the file beside it,
    as the dict its schema-1 file would hold (`parts.expand`)."""
    path = as_path(path)
    return _expand(_read_document(path), path, again=True)


def _has_parts(data: Any) -> bool:
    return isinstance(data, dict) and data.get("schema_version") == PARTS_SCHEMA_VERSION \
        and isinstance(data.get("pairs"), dict)


def _expand(data: Any, path: Path | RemotePath, again: bool) -> Any:
    """`data` with its pairs read back if it is a schema-2 document; `again`:
    read the document once more if its pairs file is gone (the report was
    replaced whole between the two reads, its old pairs file removed)."""
    if not _has_parts(data):
        return data
    return _reading_parts(lambda document: expand(document, path), data, path, again)


def _reading_parts(read: Callable[[dict[str, Any]], Any], data: dict[str, Any], path: Path | RemotePath,
                   again: bool) -> Any:
    """read(data), its errors as one clear line each (see `_expand` for `again`)."""
    try:
        return read(data)
    except FileNotFoundError:
        if again:
            document = _read_document(path)
            if _has_parts(document):
                return _reading_parts(read, document, path, again=False)
        raise CkptScanError(f"the file of the report's pairs, {data['pairs']['parts']['file']}, is missing",
                            path=path) from None
    except (ValueError, KeyError, TypeError, EOFError, zlib.error) as e:
        raise CkptScanError(f"the report's pairs cannot be read: {e}", path=path) from None
    except OSError as e:
        raise CkptScanError(f"cannot read the report's pairs: {e.strerror or e}", path=path) from None


def _read_document(path: Path | RemotePath) -> Any:
    try:
        raw = path.read_bytes()
        return json.loads(gzip.decompress(raw) if raw[:2] == GZIP_MAGIC else raw.decode("utf-8"))
    except (gzip.BadGzipFile, EOFError, UnicodeDecodeError, json.JSONDecodeError) as e:  # EOFError: a cut .gz
        raise CkptScanError(f"the report is not valid JSON ({e or 'truncated'})", path=path) from None
    except OSError as e:
        raise CkptScanError(f"cannot read the report: {e.strerror or e}", path=path) from None


def load_report(path: str | Path | RemotePath) -> ScanReport:
    """A ckptscan JSON report file as result objects, its schema version checked:
    what `--reference` compares with and what `ckptscan report` renders."""
    path = as_path(path)
    document = _read_document(path)
    if not _has_parts(document):
        return report_from_dict(document, path)
    # Schema 2: the pairs built from their columns (`rebuild.build`), not from a dict each.
    check_report({**document, "pairs": []}, path)

    def pairs_of(document: dict[str, Any]) -> list[PairResult]:
        return [pair for column in pair_columns(document, path) for pair in build(PairResult, column)]

    # ~10⁶ objects made in a row: the cyclic collector would walk the growing heap again and again.
    collecting = gc.isenabled()
    gc.disable()
    try:
        pairs = _reading_parts(pairs_of, document, path, again=True)
    finally:
        if collecting:
            gc.enable()
    report = report_from_dict({**document, "pairs": []}, path)
    report.pairs = pairs
    return report


def as_json_values(data: dict[str, Any]) -> dict[str, Any]:
    """`data` as a JSON file gives it back (lists for tuples, str keys)."""
    return json.loads(json.dumps(data, allow_nan=False))


def check_report(data: Any, path: str | Path | RemotePath | None = None) -> None:
    if not isinstance(data, dict) or any(key not in data for key in REQUIRED):
        raise CkptScanError(f"not a ckptscan JSON report (needs the keys {list(REQUIRED)})", path=path)
    version = data.get("schema_version")
    if not isinstance(version, int) or version < 1:
        raise CkptScanError(f"not a ckptscan JSON report (schema_version {version!r})", path=path)
    if version > max(READS):
        raise CkptScanError(f"the report has schema version {version}, newer than this ckptscan reads "
                            f"({max(READS)}): upgrade ckptscan", path=path)
    if not isinstance(data["pairs"], list):
        raise CkptScanError("not a ckptscan JSON report (its pairs are not a list: a schema-2 document "
                            "read without the file of its pairs)", path=path)


def report_from_dict(data: dict[str, Any], path: str | Path | RemotePath | None = None) -> ScanReport:
    """Rebuild the result objects (`results.py` is the schema); keys this
    version does not know are ignored, missing optional ones take defaults."""
    check_report(data, path)
    try:
        report: ScanReport = from_dict(ScanReport, data)
    except (TypeError, ValueError, KeyError, AttributeError) as e:
        raise CkptScanError(f"the report's contents cannot be read ({e})", path=path) from None
    summary = data["summary"]
    absent = tuple(key for key in ADDED_SUMMARY_KEYS if isinstance(summary, dict) and key not in summary)
    if absent:  # written again without them (results.ADDED_SUMMARY_KEYS)
        setattr(report.summary, WRITTEN_WITHOUT, absent)
    return report
