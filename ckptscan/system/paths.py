"""Local paths as the user meant them: `~` and `$VAR` expanded.

A shell expands `~` only at the start of an unquoted word: `--cache-dir '~/c'`,
`--cache-dir=~/c`, a path in a config file or in Python code reaches ckptscan
as is, and taken literally it names a folder called `~` in the current
directory (one `rm -rf ~` away from a disaster). So every path ckptscan is
given goes through `expand_path` first: the CLI's path options, `--config`,
and the library's path arguments (checkpoints and run directories through
`storage.as_path`, `PairCache`, `load_report`, `load_probe`,
`read_loss_log`, `load_config`, `LiveMonitor(out=...)`). A URL (s3://, gs://,
...) is never expanded: it is not a path on this machine.
"""

from __future__ import annotations

import os
from pathlib import Path


def expand_path(path: str | Path) -> Path:
    """`path` with a leading `~` (or `~user`) and `$VAR` / `${VAR}` expanded
    (an unset variable stays as written)."""
    return Path(os.path.expandvars(os.path.expanduser(os.fspath(path))))


def default_cache_dir() -> Path:
    """The user cache directory's ckptscan folder (`$XDG_CACHE_HOME/ckptscan`, else `~/.cache/ckptscan`):
    the caches' default home, and the notifier's."""
    base = os.environ.get("XDG_CACHE_HOME")
    return (Path(base) if base else Path.home() / ".cache") / "ckptscan"
