"""An Orbax checkpoint in object storage is refused with the one-line error:
its arrays are read by tensorstore from a file:// URI, so only a local copy
can be read (it used to end in an AttributeError on the RemotePath)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ckptscan.errors import CkptScanError
from ckptscan.readers import open_checkpoint

ORBAX_STEPS = Path(__file__).parent.parent / "golden" / "orbax" / "checkpoints"


def test_an_orbax_checkpoint_in_object_storage_is_refused_by_name(s3):
    url = s3.upload(ORBAX_STEPS, "run")
    with pytest.raises(CkptScanError) as caught:
        open_checkpoint(f"{url}/2")
    message = str(caught.value)
    assert "Orbax checkpoints are read from local disk only" in message
    assert message.startswith(f"{url}/2/items: ") and "\n" not in message
