"""The one error type: a message naming the file and tensor, one printable
line, with the credentials of any URL in it replaced by ***."""

import pytest

from ckptscan.errors import CkptScanError, redacted


def test_the_message_names_the_path_and_the_tensor():
    error = CkptScanError("shape [4, 4] is not [4, 8]", path="run/model.safetensors", tensor="q_proj.weight")
    assert str(error) == "run/model.safetensors: tensor 'q_proj.weight': shape [4, 4] is not [4, 8]"


@pytest.mark.parametrize("text, want", [
    ("GET http://user:pa55@host:9000/bucket failed", "GET http://***@host:9000/bucket failed"),
    ("https://token@huggingface.co/x", "https://***@huggingface.co/x"),
    ("https://a.blob.core.windows.net/c/b?sv=2021-08&sig=AbC%2Fd&se=1", "https://a.blob.core.windows.net/c/b?sv=2021-08&sig=***&se=1"),
    ("http://h/b/k?X-Amz-Credential=AKIA%2F1&X-Amz-Signature=ff00", "http://h/b/k?X-Amz-Credential=***&X-Amz-Signature=***"),
    ("https://h/f?token=abc def", "https://h/f?token=*** def"),
])
def test_credentials_in_urls_are_replaced(text, want):
    assert redacted(text) == want
    assert str(CkptScanError(text)) == want


@pytest.mark.parametrize("text", [
    "s3://bucket/run/checkpoint-100: not found",
    "hf://datasets/org/run@main/checkpoint-1",  # a revision, not credentials: no "//" before it
    "s3://bucket/a@b/c",
    "gs://b/run?generation=3&keyed=1",
    "the tensor 'model.layers.0.self_attn.q_proj.weight' is missing",
])
def test_what_carries_no_credentials_is_unchanged(text):
    assert redacted(text) == text
