"""What it costs to refuse a replaced Parquet shard: the manifest's `sums` checked when a shard opens
(its keys and checksum columns read) vs a whole-file sha256 of it, and vs opening it unchecked.

    .venv/bin/python bench/parquet_sums_bench.py              # 500 samples of 224x224x3 (75 MB), 7 rounds
    .venv/bin/python bench/parquet_sums_bench.py --rounds 3   # quick check

One shard of raw images (what shardkit writes for media: the checksum columns are a small part of
the file), opened in the same run, interleaved (unchecked, sums, sha256, ...), so each round's
ratios share that moment's machine load. Prints the median time per open and the ratios. Data is
kept in $TMPDIR/shardkit-sums-bench.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import numpy as np

SIZE = 224


def make_shard(root: str, n: int):
    from shardkit.sample import Sample
    from shardkit.writers import get_writer

    fields = {"raw": {"kind": "image", "encoding": "raw", "dtype": "uint8", "shape": [SIZE, SIZE, 3]},
              "cls": {"kind": "int", "dtype": "int64"}}
    rng = np.random.default_rng(0)
    samples = [Sample(f"s{i:07d}", {"raw": rng.integers(0, 256, SIZE * SIZE * 3, np.uint8).tobytes(), "cls": i % 10})
               for i in range(n)]
    return get_writer("parquet")(samples, root, 0, fields), fields


def main() -> None:
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from shardkit.store.local import sha256_file
    from shardkit.reader.shards import ParquetShard
    from shardkit.reader.values import ByteLRU

    p = argparse.ArgumentParser()
    p.add_argument("--samples", type=int, default=500)
    p.add_argument("--rounds", type=int, default=7)
    args = p.parse_args()
    root = os.path.join(tempfile.gettempdir(), "shardkit-sums-bench")
    shard, fields = make_shard(root, args.samples)
    path = os.path.join(root, shard.path)
    plain = type(shard)(**{**shard.__dict__, "sums": None})

    def unchecked():
        ParquetShard(path, plain, fields, path, ByteLRU(1 << 20), checks=True)

    def sums():
        ParquetShard(path, shard, fields, path, ByteLRU(1 << 20), checks=True)

    def sha256():
        assert sha256_file(path) == shard.sha256
        ParquetShard(path, plain, fields, path, ByteLRU(1 << 20), checks=True)

    times = {"unchecked": [], "sums": [], "sha256": []}
    for r in range(args.rounds):
        order = [unchecked, sums, sha256] if r % 2 == 0 else [sha256, sums, unchecked]
        for fn in order:
            start = time.perf_counter()
            fn()
            times[fn.__name__].append(time.perf_counter() - start)
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"one Parquet shard of {args.samples} samples, {shard.bytes / 1e6:.1f} MB, {args.rounds} rounds (median):")
    for k, v in med.items():
        print(f"  open {k:9s} {v * 1e3:8.2f} ms")
    print(f"  sums check adds {(med['sums'] - med['unchecked']) * 1e3:.2f} ms per open; "
          f"a sha256 pass adds {(med['sha256'] - med['unchecked']) * 1e3:.2f} ms "
          f"({(med['sha256'] - med['unchecked']) / max(1e-9, med['sums'] - med['unchecked']):.0f}x the sums check)")


if __name__ == "__main__":
    main()
