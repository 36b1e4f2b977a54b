"""Random access: ds[i] and ds.get(key) lookups/s on local tar and Parquet shards, interleaved in one run.

    flock /tmp/shardkit-bench.lock .venv/bin/python bench/lookup_bench.py            # 3,000 images, 3 rounds
    .venv/bin/python bench/lookup_bench.py --n 1200 --rounds 1                        # quick check

Data: photo-like images at 224^2 as raw uint8 and as JPEG q90, tar and Parquet shards of 500
(bench/loader_bench.py prepares them into --work, reused). One process, one StreamingDataset per
variant (shards opened once and kept, as a user's dataset would); each round times --lookups
lookups at uniformly random indices (ds[i]) or keys (ds.get), the same ones for every variant,
after --warm untimed lookups. Target: >= 2,000 lookups/s for raw uint8 224^2 on local tar.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time


def timed(ds, how: str, picks: list[int], keys: list[str]) -> float:
    """Lookups/s of ds[i] (how="index") or ds.get(key) over the samples `picks`."""
    todo = picks if how == "index" else [keys[i] for i in picks]
    t0 = time.perf_counter()
    for x in todo:
        sample = ds[x] if how == "index" else ds.get(x)
    rate = len(todo) / (time.perf_counter() - t0)
    assert sample["__key__"] == keys[picks[-1]]
    return rate


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=3000, help="images (default 3000)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--lookups", type=int, default=3000, help="timed lookups per variant per round")
    p.add_argument("--warm", type=int, default=500, help="untimed lookups first (shards opened, pages cached)")
    p.add_argument("--work", default=None, help="data folder (default: $TMPDIR/shardkit-mix-bench-N, "
                                                "shared with mix_bench.py)")
    args = p.parse_args(argv)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import numpy as np
    from mix_bench import prepared

    from shardkit import StreamingDataset

    work = prepared(args.work, args.n)
    datasets = {f"{kind} {fmt}": StreamingDataset(os.path.join(work, kind), format=fmt)
                for kind in ("raw", "jpeg") for fmt in ("tar", "parquet")}
    keys = [s["__key__"] for s in StreamingDataset(os.path.join(work, "raw"), fields=["cls"], shuffle=False)]
    rng = np.random.default_rng(0)
    variants = {}
    for name, ds in datasets.items():
        variants[f"{name} ds[i]"] = (ds, "index")
        variants[f"{name} get(key)"] = (ds, "key")
    for ds, _ in variants.values():  # warm: every shard opened once, its pages read
        for i in rng.integers(0, args.n, args.warm).tolist():
            ds[i]
    results = {name: [] for name in variants}
    for r in range(args.rounds):
        picks = rng.integers(0, args.n, args.lookups).tolist()
        names = list(variants)[r % len(variants):] + list(variants)[:r % len(variants)]  # rotate the first
        for name in names:
            results[name].append(timed(*variants[name], picks, keys))
        print(f"round {r + 1}/{args.rounds} done", flush=True)
    print(f"\n{args.n} images at 224^2, shards of 500, one process, uniformly random lookups; median of "
          f"{args.rounds} rounds of {args.lookups}")
    for name, rates in results.items():
        target = "  target >= 2,000" if name.startswith("raw tar") else ""
        print(f"  {name:26s} {statistics.median(rates):8,.0f} lookups/s  (rounds {min(rates):,.0f}-{max(rates):,.0f})"
              f"{target}")
    print("\nratios (median of per-round ratios):")
    for name in datasets:
        per = [k / i for k, i in zip(results[f"{name} get(key)"], results[f"{name} ds[i]"])]
        print(f"  {name}: get(key) / ds[i] = {statistics.median(per):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
