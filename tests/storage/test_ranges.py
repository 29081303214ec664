"""How byte ranges become requests, and the path arithmetic of URLs."""

from __future__ import annotations

from pathlib import Path

from ckptscan.storage import RemotePath, as_path
from ckptscan.storage.errors import reason
from ckptscan.storage.ranged import MIN_PART_BYTES, PART_BYTES, SPREAD, plan_parts


def test_adjacent_and_overlapping_ranges_are_merged_but_never_across_a_gap():
    assert plan_parts([(10, 20), (20, 30), (25, 28), (31, 40)]) == [(10, 30), (31, 40)]
    assert plan_parts([(5, 5), (0, 0)]) == []


def test_a_small_read_is_spread_over_several_requests_of_at_least_the_minimum_part():
    ten_mb = plan_parts([(0, 8 << 20), (9 << 20, 11 << 20)])  # a layer's q and k, 10 MB
    assert all(MIN_PART_BYTES <= e - s <= PART_BYTES for s, e in ten_mb[:-1])
    assert SPREAD <= len(ten_mb) <= SPREAD + 2
    assert plan_parts([(0, 1000)]) == [(0, 1000)]  # a header: one request


def test_a_large_range_is_cut_into_equal_parts_no_larger_than_part_bytes():
    end = 100 + 3 * PART_BYTES * SPREAD + 1
    parts = plan_parts([(100, end)])
    assert len(parts) == 3 * SPREAD + 1 and parts[0][0] == 100 and parts[-1][1] == end
    assert all(e - s <= PART_BYTES for s, e in parts)
    assert all(a[1] == b[0] for a, b in zip(parts, parts[1:]))  # contiguous: every byte once


def test_urls_become_remote_paths_and_local_paths_stay_paths(tmp_path):
    assert as_path(str(tmp_path)) == tmp_path and isinstance(as_path(tmp_path), Path)
    assert as_path(f"file://{tmp_path}") == tmp_path
    assert isinstance(as_path("/data/run"), Path) and isinstance(as_path("C:\\run"), Path)


def test_remote_path_arithmetic_keeps_the_double_slash():
    path = as_path("s3://bucket/run/checkpoint-100/")
    assert isinstance(path, RemotePath) and str(path) == "s3://bucket/run/checkpoint-100"
    shard = path / "model-00001-of-00002.safetensors"
    assert (shard.name, shard.suffix, str(shard.parent)) == ("model-00001-of-00002.safetensors", ".safetensors",
                                                             "s3://bucket/run/checkpoint-100")
    assert str(path.parent.parent) == "s3://bucket" and path.parent.parent.is_dir()


def test_a_client_error_is_reported_as_status_and_store_code():
    error = Exception("Error performing GET http://h/b/k in 5ms, after 3 retries - Server returned non-2xx "
                      "status code: 503 Service Unavailable: <Error><Code>SlowDown</Code></Error>")
    assert reason(error) == "503 Service Unavailable, SlowDown"
    assert reason(Exception("connection reset\nmore")) == "connection reset"
