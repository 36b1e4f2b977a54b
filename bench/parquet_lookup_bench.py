"""One sample of a remote Parquet-only dataset by range: round trips and bytes per `ds[i]` on a cold
cache, over the throttled store on 127.0.0.1 (tests/throttled.py: 50 ms to the first byte, 25 MB/s
per connection), against the whole shard a lookup fetched before.

    .venv/bin/python bench/parquet_lookup_bench.py [--work DIR] [--lookups 10]

Data: bench/remote_bench.py's 6,000 photo-like JPEG 224^2 crops (made there, or here through it),
rewritten as Parquet shards of ~16 MB by shardkit's Parquet writer.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.join(HERE, "..", "tests")]

SHARD_BYTES = 16_000_000


def parquet_copy(tar_root: str, root: str) -> str:
    """The tar dataset `tar_root` rewritten as Parquet shards of ~SHARD_BYTES (once)."""
    from shardkit.manifest import Manifest, load_manifest, write_manifest
    from shardkit.reader.shards import read_shard_samples
    from shardkit.writers import get_writer

    if os.path.exists(os.path.join(root, "manifest.json")):
        return root
    m = load_manifest(tar_root)
    samples = [x for s in m.shards for x in read_shard_samples(tar_root, m, s)]
    infos, shard, held = [], [], 0
    for x in samples:
        if shard and held + len(x.fields["jpg"]) > SHARD_BYTES:
            infos.append(get_writer("parquet")(shard, root, len(infos), m.fields))
            shard, held = [], 0
        shard.append(x)
        held += len(x.fields["jpg"])
    infos.append(get_writer("parquet")(shard, root, len(infos), m.fields))
    write_manifest(root, Manifest(samples=len(samples), fields=m.fields, shards=infos, classes=m.classes))
    return root


def round_trips(spans) -> int:
    """The longest chain of GETs each sent after the one before it was answered."""
    depth = {}
    for received, answered, path, _ in sorted(spans):
        depth[(received, answered, path)] = 1 + max((d for (r, a, _), d in depth.items() if a <= received), default=0)
    return max(depth.values(), default=0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", default=os.path.join(tempfile.gettempdir(), "shardkit-remote-bench2"))
    ap.add_argument("--lookups", type=int, default=10)
    args = ap.parse_args()
    import remote_bench
    from throttled import Store

    from shardkit.manifest import load_manifest
    from shardkit.reader.dataset import StreamingDataset

    tar_root = remote_bench.prepare(args.work, 0, 6000, ["16MB"])[("jpeg", "16MB")]
    root = parquet_copy(tar_root, os.path.join(args.work, "parquet-jpeg-6000-16MB"))
    m = load_manifest(root)
    store = Store(root, latency=0.05, rate=25e6)
    try:
        rows = []
        for i in random.Random(0).sample(range(m.samples), args.lookups):
            cache = os.path.join(args.work, "cache-lookup")
            shutil.rmtree(cache, ignore_errors=True)
            ds = StreamingDataset(store.url, cache_dir=cache)
            len(ds)
            store.spans.clear()
            store.sent.clear()
            t0 = time.perf_counter()
            ds[i]
            rows.append((round_trips(store.spans), store.shard_bytes(), time.perf_counter() - t0))
    finally:
        store.close()
    shard = statistics.median(s.bytes for s in m.shards)
    print(f"{m.samples} JPEG 224^2 in {len(m.shards)} Parquet shards (median {shard / 1e6:.1f} MB); "
          f"{args.lookups} cold ds[i]:")
    print(f"  round trips: {sorted(r for r, _, _ in rows)} (target <= 3)")
    nbytes = [b for _, b, _ in rows]
    print(f"  bytes: median {statistics.median(nbytes) / 1e6:.2f} MB, most {max(nbytes) / 1e6:.2f} MB "
          f"(target < 2 MB; the whole shard before: {shard / 1e6:.1f} MB)")
    print(f"  seconds: median {statistics.median(t for _, _, t in rows):.2f}")


if __name__ == "__main__":
    main()
