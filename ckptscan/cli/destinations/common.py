"""What the command line's destinations share: the kind of destination a
command's group asks for (`Asked`: its options, declared beside its write, and
how it is made from their values), and the checks of a report file before
any long scan."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from ckptscan.errors import CkptScanError
from ckptscan.report.destinations import Destination

if TYPE_CHECKING:
    from ckptscan.cli.options import Group, Option


class Asked(Destination):
    """A destination of the command line: `options`, the flags that ask for it
    (in --help order; a command lists them where its group names the
    destination), and `asked`, the destination those values ask for, or None
    (its flag not given). `asked` reads its own options by themselves
    (`given[JSON]`), another's only with a value for a group without it
    (`given.get(PER_HEAD, "all")`)."""

    options: ClassVar[tuple[Option[Any], ...]] = ()

    @classmethod
    def asked(cls, given: Group) -> Asked | None:
        raise NotImplementedError(cls.__name__)


def json_to_stdout(json_path: Path | None) -> bool:
    """`--json -`: the JSON report alone on stdout, for a pipe."""
    from ckptscan.system.output import own_descriptor

    return json_path is not None and own_descriptor(str(json_path)) == 1


def check_file_outputs(files: dict[str, Path | None]) -> None:
    """Before any long scan: a file destination ({flag: path}) that is a directory, or whose
    folder does not exist, cannot be written; found now, not after the scan has printed its
    verdict (exit 2). No folder is created for a report file: a typo in its path is the
    user's to see, not a tree of folders made where they did not look."""
    from ckptscan.system.output import own_descriptor

    for flag, path in files.items():
        if path is None or own_descriptor(str(path)) is not None:
            continue
        if Path(path).is_dir():
            raise CkptScanError(f"{flag} needs a file, and this is a directory", path=path)
        folder = Path(path).parent
        if not folder.is_dir():
            raise CkptScanError(f"{flag}: the folder {folder} does not exist (ckptscan creates no folder for a "
                                "report file: create it first)", path=path)
