"""Mixture throughput: a 3-source Mixture against one dataset of the same samples, interleaved in one run.

    flock /tmp/shardkit-bench.lock .venv/bin/python bench/mix_bench.py            # 3,000 images, 3 rounds
    .venv/bin/python bench/mix_bench.py --n 1200 --rounds 1                        # quick check

Data: photo-like images at 224^2 as raw uint8 and as JPEG q90 in tar shards of 500 (prepared by
bench/loader_bench.py into --work, reused). Their shards are split into three source datasets of
1/6, 1/3 and 1/2 of the samples (hard links and a manifest each), mixed at weights 1/6, 1/3, 1/2
with samples = the total: every source gives exactly one pass, so the mixture reads the very
bytes the single dataset reads. Every run is a fresh process: make_loader, 2 workers, batch 64,
shuffle on, one warm-up epoch, then whole epochs for at least --seconds. Target: mixture >= 0.9x
the single dataset, raw and JPEG.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

CHILD = r"""
from loader_bench import warm_then_timed
import json, sys, time
from shardkit import Mixture, StreamingDataset, make_loader
kind, roots, seconds = sys.argv[1], json.loads(sys.argv[2]), float(sys.argv[3])
if kind == "single":
    ds = StreamingDataset(roots[0], format="tar", seed=0)
else:
    sizes = [StreamingDataset(r, format="tar").counts.sum() for r in roots]
    ds = Mixture({f"s{i}": (r, float(n)) for i, (r, n) in enumerate(zip(roots, sizes))}, format="tar", seed=0,
                 samples=int(sum(sizes)))
loader = make_loader(ds, batch_size=64, num_workers=2, pin_memory=False)
rate = warm_then_timed(loader, seconds)
shares = loader.proportions()
print(json.dumps({"rate": rate, "shares": shares}))
"""

SPLIT = (1, 2, 3)  # sixths of the shards in each source


def split_sources(root: str, out: str) -> list[str]:
    """Three datasets holding SPLIT sixths of `root`'s tar shards (hard-linked), in shard order."""
    from shardkit.manifest import Manifest, load_manifest, write_manifest

    manifest = load_manifest(root)
    shards = list(manifest.shards_of("tar"))
    cuts = [0]
    for part in SPLIT:
        cuts.append(cuts[-1] + max(1, round(len(shards) * part / sum(SPLIT))))
    cuts[-1] = len(shards)
    roots = []
    for i, (lo, hi) in enumerate(zip(cuts, cuts[1:])):
        dst = os.path.join(out, f"source{i}")
        roots.append(dst)
        if os.path.exists(os.path.join(dst, "manifest.json")):
            continue
        os.makedirs(os.path.join(dst, "shards"), exist_ok=True)
        for s in shards[lo:hi]:
            for rel in (s.path, s.index["path"]):
                if not os.path.exists(os.path.join(dst, rel)):
                    os.link(os.path.join(root, rel), os.path.join(dst, rel))
        write_manifest(dst, Manifest(samples=sum(s.samples for s in shards[lo:hi]), fields=manifest.fields,
                                     shards=shards[lo:hi], classes=manifest.classes))
    return roots


def prepared(work: str | None, n: int) -> str:
    """The data folder (default $TMPDIR/shardkit-mix-bench-N) with n images prepared by loader_bench."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from loader_bench import prepared as loader_data

    return loader_data(work, n, "shardkit-mix-bench")


def run(kind: str, roots: list[str], seconds: float) -> dict:
    from loader_bench import run_child

    return run_child(CHILD, kind, json.dumps(roots), seconds)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=3000, help="images (default 3000)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--seconds", type=float, default=4.0, help="minimum timed seconds per variant per round")
    p.add_argument("--work", default=None, help="data folder (default: $TMPDIR/shardkit-mix-bench-N)")
    args = p.parse_args(argv)
    if args.n < 1500:
        p.error(f"--n {args.n}: at least 1500 images, so that each of the 3 sources gets a whole shard of 500")
    work = prepared(args.work, args.n)
    data = {kind: os.path.join(work, kind) for kind in ("raw", "jpeg")}
    variants = {}
    for kind, root in data.items():
        variants[f"{kind} single"] = ("single", [root])
        variants[f"{kind} mixture"] = ("mixture", split_sources(root, os.path.join(work, f"{kind}-sources")))
    results = {name: [] for name in variants}
    for r in range(args.rounds):
        names = list(variants)[r % len(variants):] + list(variants)[:r % len(variants)]  # rotate the first
        for name in names:
            results[name].append(run(*variants[name], args.seconds))
        print(f"round {r + 1}/{args.rounds} done", flush=True)
    print(f"\n{args.n} images at 224^2, tar, 2 workers, batch 64, shuffle on; sources of "
          f"{'/'.join(str(s) for s in SPLIT)} sixths at matching weights; median of {args.rounds} rounds")
    for name, runs in results.items():
        rates = [x["rate"] for x in runs]
        print(f"  {name:16s} {statistics.median(rates):10,.0f} samples/s  (rounds {min(rates):,.0f}-{max(rates):,.0f})")
        if runs[0]["shares"]:
            print("    observed / target: " + ", ".join(f"{k} {v['observed']:.3f} / {v['target']:.3f}"
                                                     for k, v in runs[-1]["shares"].items()))
    print("\nratios (median of per-round ratios):")
    for kind in data:
        per = [m["rate"] / s["rate"] for m, s in zip(results[f"{kind} mixture"], results[f"{kind} single"])]
        print(f"  {kind} mixture / {kind} single = {statistics.median(per):.2f} "
              f"(rounds {min(per):.2f}-{max(per):.2f})  target >= 0.9")
    return 0


if __name__ == "__main__":
    sys.exit(main())
