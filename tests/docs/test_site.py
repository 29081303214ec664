"""The documentation site builds with `mkdocs build --strict` (as CI runs it):
a broken link, a page missing from the nav or a nav entry without a page fails."""

import os
import subprocess
import sys

from docs.examples import ROOT


def test_the_site_builds_strict(tmp_path):
    env = os.environ | {"NO_MKDOCS_2_WARNING": "1"}  # Material's end-of-life banner, not about this site
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "site" / "cli" / "index.html").is_file()
