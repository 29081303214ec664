"""Benchmark: `ckptscan diff` of s3:// URLs, next to the remote I/O floor.

    .venv/bin/python bench/remote.py        # make bench-remote

Generates (once, under --root) a pair of Llama-3.2-1B-shaped checkpoints
(16 layers, hidden 2048, 32 heads / 8 KV heads, vocab 128256; every tensor,
bf16, ~2.9 GB each in 1 GiB shards) and serves them over S3 from loopback,
then measures side by side, each figure the minimum of --rounds:

* bytes: what ckptscan fetched (tensor data, headers, index, config) over the
  monitored bytes (q_proj and k_proj of every layer of both checkpoints),
  and its number of GET requests; the same with `--heads 0-3`;
* time: the remote diff's wall time; ckptscan's read path alone (the same
  opens, read-ahead, prefetches and reads on two layer workers, without the
  math; also with 0, 1 and 4 layer-loads read ahead per worker); the
  remote I/O floor, the fastest plain
  concurrent ranged reads of exactly the monitored bytes we could write
  (every tensor cut into 8 MB parts on 32 threads of obstore `get_range`,
  and obstore's own `get_ranges` per file, the faster counts); sequential
  ranged reads (one GET per tensor, one after another); s3fs `cat_ranges`
  of the same ranges (the client we did not keep); and the local diff of
  the same files (the compute the remote diff overlaps its reads with).

Then, on each profile but moto, `trend` of a run of --trend checkpoints
(symlinks to the pair, alternating, so no more disk; each checkpoint is
listed, opened and read as its own objects): its wall time, bytes fetched
over its monitored bytes, and its own I/O floor (the same concurrent 8 MB
parts over the monitored bytes of all its checkpoints).

Five servers: `static` (bench/s3_static.py: sendfile from the files, so
the client is what is timed; in a process of its own, as a real store is), `s3like` (the same, with 20 ms to first byte
and 100 MB/s per response, roughly one S3 GET from a machine in the same
region: where concurrency matters), `link1g` (s3like behind a 1 Gbit/s link
shared by all responses, a CI runner outside the cluster: the network, not
the CPU, sets the pace, so the remote diff is judged against its I/O floor),
`ttfb80` (s3like with 80 ms to first byte: a bucket in another region, where
each dependent round trip of an open costs 80 ms)
and `moto` (the server of the test suite, which
copies the whole object on every ranged GET and serialises the reads of one
object: its times measure moto, its bytes and request counts are still
exact, so only those and the diff's time are measured there: 32 concurrent
GETs of 1 GB objects time out on moto). The machine is shared: the load
average is printed.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import synthetic  # noqa: E402
from measure import load_average, monitored_entries  # noqa: E402
from s3_static import StaticS3Process  # noqa: E402
from synthetic import ModelSpec, ensure_run  # noqa: E402

from ckptscan import readahead, scan_pair  # noqa: E402
from ckptscan.scan import ScanOptions  # noqa: E402
from ckptscan.storage import ranged  # noqa: E402

LLAMA_32_1B = ModelSpec("llama-3.2-1b", "llama", 16, 2048, 32, 8, 8192, 128256)
STEPS = [1000, 1100]
PART = 8 << 20
# The loopback fixtures: as fast as it can; one S3 GET's pace (20 ms to first
# byte, 100 MB/s each, many in flight); the same behind a 1 Gbit/s link.
SERVERS = {"static": {}, "s3like": {"latency_s": 0.02, "rate": 100e6},
           "link1g": {"latency_s": 0.02, "rate": 100e6, "link_rate": 125e6},
           "ttfb80": {"latency_s": 0.08, "rate": 100e6}}
TREND_STEP = 100  # steps between the trend run's checkpoints
HEADS = [0, 1, 2, 3]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--root", type=Path, default=Path("/tmp/ckptscan-bench-remote"))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--servers", default="static,s3like,link1g,ttfb80,moto")
    parser.add_argument("--trend", type=int, default=20, help="checkpoints in the trend run (0: no trend row)")
    args = parser.parse_args()

    synthetic.SHARD_BYTES = 1 << 30  # sharded, as the issue asks (HF would write one 2.9 GB file)
    paths = ensure_run(LLAMA_32_1B, args.root / "run", STEPS)
    # The trend run: --trend checkpoint folders, symlinks to the pair's two in turn.
    trend_dir = args.root / "trend"
    if trend_dir.exists():
        shutil.rmtree(trend_dir)
    trend_dir.mkdir()
    for k in range(args.trend):
        (trend_dir / f"step-{(k + 1) * TREND_STEP}").symlink_to(paths[k % 2])
    names = {f"model.layers.{i}.self_attn.{p}_proj.weight" for i in range(LLAMA_32_1B.layers) for p in "qk"}
    ranges = [r for path in paths for r in monitored_entries(path, names)]
    monitored = sum(hi - lo for _, lo, hi in ranges)
    r = LLAMA_32_1B.head_dim
    kv_rows = (max(HEADS) // (LLAMA_32_1B.heads // LLAMA_32_1B.kv_heads) + 1) * r
    head_ranges = [(f, lo, lo + (len(HEADS) * r if "q_proj" in _name(f, lo) else kv_rows) * LLAMA_32_1B.hidden * 2)
                   for f, lo, hi in ranges]
    head_monitored = sum(hi - lo for _, lo, hi in head_ranges)
    print(f"pair: {LLAMA_32_1B.name}, {sum(f.stat().st_size for p in paths for f in p.iterdir()) / 1e9:.2f} GB "
          f"on disk; monitored {monitored / 1e6:.1f} MB (q_proj + k_proj, both checkpoints), with --heads 0-3 "
          f"{head_monitored / 1e6:.1f} MB; load average {load_average()}")
    os.environ.update(AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench", AWS_DEFAULT_REGION="us-east-1")

    local = best(args.rounds, lambda: scan_pair(paths[0], paths[1]))
    print(f"local diff (files on disk, warm): {local:.2f} s", flush=True)
    local_trend = None
    if args.trend:
        from ckptscan import scan_run

        local_trend = best(args.rounds, lambda: scan_run(trend_dir))
        print(f"local trend of {args.trend} checkpoints (files on disk, warm): {local_trend:.2f} s", flush=True)
    for server in args.servers.split(","):
        if server in SERVERS:
            static = StaticS3Process(args.root, **SERVERS[server])
            os.environ["AWS_ENDPOINT_URL"] = static.url
            measure_server(server, "s3://bucket/run", paths, ranges, head_ranges, monitored, head_monitored, local,
                           args.rounds)
            if args.trend:
                measure_trend(server, "s3://bucket/trend", trend_dir, names, args.rounds, local_trend)
            static.close()
        elif server == "moto":
            from moto.server import ThreadedMotoServer
            import logging
            logging.getLogger("werkzeug").setLevel(logging.WARNING)
            moto = ThreadedMotoServer(ip_address="127.0.0.1", port=_free_port(), verbose=False)
            moto.start()
            host, port = moto.get_host_and_port()
            os.environ["AWS_ENDPOINT_URL"] = f"http://{host}:{port}"
            started = time.perf_counter()
            _upload(paths, os.environ["AWS_ENDPOINT_URL"])
            print(f"[moto] uploaded the pair in {time.perf_counter() - started:.0f} s")
            measure_server("moto", "s3://bench/run", paths, ranges, head_ranges, monitored, head_monitored, local,
                           args.rounds, floors=False)
            moto.stop()


def measure_server(server, url, paths, ranges, head_ranges, monitored, head_monitored, local, rounds,
                   floors=True) -> None:
    a, b = (f"{url}/{p.name}" for p in paths)

    def counted(options_fn):
        before = dict(ranged.stats)
        seconds = best(rounds, lambda: scan_pair(a, b, options_fn()), per_round=lambda: ranged.stats.update(
            requests=before["requests"], bytes=before["bytes"]))
        return seconds, ranged.stats["bytes"] - before["bytes"], ranged.stats["requests"] - before["requests"]

    diff_s, diff_bytes, diff_requests = counted(ScanOptions)
    reads_s = best(rounds, lambda: _ckptscan_reads(a, b))
    by_depth = {}
    for depth in (0, 1, 4):  # layer-loads read ahead per worker: none (as before it existed), fewer, more
        by_depth[depth] = best(rounds, lambda: _ckptscan_reads(a, b, depth))
    heads_s, heads_bytes, heads_requests = counted(lambda: ScanOptions(heads=HEADS))
    print(f"[{server}] remote diff: {diff_s:.2f} s, {diff_requests} GETs, {diff_bytes / 1e6:.1f} MB fetched = "
          f"{diff_bytes / monitored:.4f} x monitored (headers, index and config included)")
    print(f"[{server}] remote diff --heads 0-3: {heads_s:.2f} s, {heads_requests} GETs, {heads_bytes / 1e6:.1f} MB "
          f"= {heads_bytes / head_monitored:.4f} x its monitored bytes, {heads_bytes / diff_bytes:.3f} x the full "
          f"diff's (selected fraction {head_monitored / monitored:.3f})", flush=True)
    if not floors:
        return
    store = _obstore(url)
    keys = {f: f"{url.split('/', 3)[3]}/{f.parent.name}/{f.name}" if url.count("/") > 2 else
            f"{f.parent.name}/{f.name}" for f, _, _ in ranges}
    floor_parts = best(rounds, lambda: _concurrent_parts(store, keys, ranges))
    floor_ranges = best(rounds, lambda: _get_ranges_per_file(store, keys, ranges))
    floor = min(floor_parts, floor_ranges)
    sequential = best(rounds, lambda: _sequential(store, keys, ranges))
    heads_floor = best(rounds, lambda: _concurrent_parts(store, keys, head_ranges))
    s3fs_s = _s3fs(url, keys, ranges, rounds)
    print(f"[{server}] I/O floor: concurrent 8 MB parts on 32 threads {floor_parts:.2f} s "
          f"({monitored / floor_parts / 1e9:.2f} GB/s), obstore get_ranges per file {floor_ranges:.2f} s; "
          f"sequential (one GET per tensor) {sequential:.2f} s; s3fs cat_ranges "
          + (f"{s3fs_s:.2f} s" if s3fs_s is not None else "(s3fs not installed)"))
    print(f"[{server}] ckptscan's read path alone (open both, then every layer's prefetch + reads on 2 workers, "
          f"no math): {reads_s:.2f} s reading {readahead.DEPTH} layer-loads ahead per worker; with "
          + ", ".join(f"{depth} ahead {t:.2f} s" for depth, t in by_depth.items()))
    print(f"[{server}] ratios: remote diff / I/O floor {diff_s / floor:.2f}; remote diff / max(I/O floor, local "
          f"diff) {diff_s / max(floor, local):.2f}; read path / I/O floor {reads_s / floor:.2f}; --heads 0-3 diff "
          f"/ its floor {heads_s / heads_floor:.2f}; sequential / concurrent reads {sequential / floor:.2f}")


def measure_trend(server: str, url: str, run: Path, names: set[str], rounds: int, local: float) -> None:
    """`trend` of the run at `url` (no cache), next to the I/O floor of its
    monitored bytes and to the same trend of the files on disk (its compute)."""
    from ckptscan import scan_run

    checkpoints = sorted((p for p in run.iterdir()), key=lambda p: int(p.name.split("-")[1]))
    ranges = [r for path in checkpoints for r in monitored_entries(path, names)]
    monitored = sum(hi - lo for _, lo, hi in ranges)
    before = dict(ranged.stats)
    trend_s = best(rounds, lambda: scan_run(url), per_round=lambda: ranged.stats.update(
        requests=before["requests"], bytes=before["bytes"]))
    fetched, requests = ranged.stats["bytes"] - before["bytes"], ranged.stats["requests"] - before["requests"]
    store = _obstore(url)
    keys = {f: f"{run.name}/{f.parent.name}/{f.name}" for f, _, _ in ranges}
    floor = best(rounds, lambda: _concurrent_parts(store, keys, ranges))
    print(f"[{server}] remote trend of {len(checkpoints)} checkpoints: {trend_s:.2f} s, {requests} GETs, "
          f"{fetched / 1e6:.1f} MB = {fetched / monitored:.4f} x monitored; its I/O floor {floor:.2f} s "
          f"({monitored / 1e6:.0f} MB); trend / I/O floor {trend_s / floor:.2f}; trend / max(I/O floor, local "
          f"trend) {trend_s / max(floor, local):.2f}", flush=True)


def _ckptscan_reads(a: str, b: str, depth: int = readahead.DEPTH) -> None:
    """What the remote diff reads, through its own code path (opens, the scan
    loop's read-ahead, prefetches, reads), without the math."""
    from ckptscan.readers import open_checkpoints
    from ckptscan.scan import LayerTask
    from ckptscan.scan.reading import read_layer

    checkpoints = open_checkpoints([a, b])
    task = LayerTask(checkpoints, [(0, 1)], ScanOptions())
    layers = [plan.layer for plan in task.layouts[0].layers]
    ahead = readahead.ReadAhead(layers, task.used, task.prefetch_load, depth)

    def layer(plan) -> None:
        for i, checkpoint in enumerate(checkpoints):
            ahead.reach(plan.layer, i)
            read_layer(checkpoint, plan, None, "cpu")

    try:
        with ThreadPoolExecutor(2) as pool:
            list(pool.map(layer, task.layouts[0].layers))
    finally:
        ahead.close()


def best(rounds: int, fn, per_round=None) -> float:
    times = []
    for _ in range(rounds):
        if per_round is not None:
            per_round()
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def _parts(ranges):
    for f, lo, hi in ranges:
        for start in range(lo, hi, PART):
            yield f, start, min(hi, start + PART)


def _concurrent_parts(store, keys, ranges) -> None:
    import obstore
    with ThreadPoolExecutor(32) as pool:
        total = sum(pool.map(lambda p: len(obstore.get_range(store, keys[p[0]], start=p[1], end=p[2])),
                             list(_parts(ranges))))
    assert total == sum(hi - lo for _, lo, hi in ranges)


def _get_ranges_per_file(store, keys, ranges) -> None:
    import obstore
    by_file = {}
    for f, lo, hi in ranges:
        by_file.setdefault(f, []).append((lo, hi))
    with ThreadPoolExecutor(len(by_file)) as pool:
        list(pool.map(lambda item: obstore.get_ranges(store, keys[item[0]], starts=[s for s, _ in item[1]],
                                                      ends=[e for _, e in item[1]], coalesce=0), by_file.items()))


def _sequential(store, keys, ranges) -> None:
    import obstore
    for f, lo, hi in ranges:
        obstore.get_range(store, keys[f], start=lo, end=hi)


def _s3fs(url, keys, ranges, rounds) -> float | None:
    try:
        import s3fs
    except ImportError:
        return None
    fs = s3fs.S3FileSystem(endpoint_url=os.environ["AWS_ENDPOINT_URL"], skip_instance_cache=True)
    bucket = url.split("/")[2]
    paths = [f"{bucket}/{keys[f]}" for f, _, _ in ranges]
    return best(rounds, lambda: fs.cat_ranges(paths, [lo for _, lo, _ in ranges], [hi for _, _, hi in ranges]))


def _obstore(url):
    from obstore.store import from_url
    return from_url(f"s3://{url.split('/')[2]}", client_options={"allow_http": True},
                    virtual_hosted_style_request=False)


def _name(file: Path, start: int) -> str:
    from ckptscan.readers.safetensors import read_header
    entries, _ = read_header(file)
    return next(n for n, e in entries.items() if e.start == start)


def _upload(paths, endpoint) -> None:
    import boto3
    client = boto3.client("s3", endpoint_url=endpoint)
    client.create_bucket(Bucket="bench")
    for path in paths:
        for file in sorted(path.iterdir()):
            client.upload_file(str(file), "bench", f"run/{path.name}/{file.name}")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


if __name__ == "__main__":
    main()
