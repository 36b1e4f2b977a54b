"""Parquet vs tar under shuffle, same data, same run: samples/s and peak memory of the whole loader.

    flock /tmp/shardkit-bench.lock .venv/bin/python bench/parquet_bench.py            # 6,000 images, 3 rounds
    .venv/bin/python bench/parquet_bench.py --n 1200 --rounds 1                       # quick check

Data: photo-like images at 224^2 as raw uint8 and as JPEG q90, each in tar and Parquet shards
of 500 (bench/loader_bench.py prepares them; reused from --work), and 60,000 text documents of
150 words with a label in 12 shards of each format (what the default format is chosen on). Every variant runs in a fresh
process (make_loader, 2 workers, batch 64, shuffle on): one warm-up epoch, then whole epochs
for at least --seconds; a thread samples the RSS of the process and its workers, summed.
Variants are interleaved round by round. "parquet, row groups" is the path Parquet took before
values were sliced by offset (a whole row group decoded per sample under shuffle), forced by
switching the offset path off in that process. Targets: raw Parquet >= 0.8x raw tar with peak
RSS <= 1.2x; JPEG Parquet >= 0.9x JPEG tar.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

CHILD = r"""
from loader_bench import warm_then_timed
import json, sys, threading, time
import psutil
root, fmt, rowgroups, seconds = sys.argv[1], sys.argv[2], sys.argv[3] == "1", float(sys.argv[4])
if rowgroups:
    from shardkit.reader.shards import ParquetShard
    ParquetShard.direct = lambda self, field: None
from shardkit.loader import make_loader
from shardkit.reader.dataset import StreamingDataset
me, peak, stop = psutil.Process(), [0], threading.Event()
def watch():
    while not stop.is_set():
        try:
            peak[0] = max(peak[0], sum(p.memory_info().rss for p in [me] + me.children()))
        except psutil.NoSuchProcess:
            pass
        time.sleep(0.02)
threading.Thread(target=watch, daemon=True).start()
loader = make_loader(StreamingDataset(root, format=fmt, seed=0), batch_size=64, num_workers=2, pin_memory=False)
rate = warm_then_timed(loader, seconds)
stop.set()
print(json.dumps({"rate": rate, "peak_rss_mb": peak[0] / 1e6}))
"""

VARIANTS = {  # name -> (dataset, format, row groups forced)
    "raw tar": ("raw", "tar", False),
    "raw parquet": ("raw", "parquet", False),
    "raw parquet, row groups": ("raw", "parquet", True),
    "jpeg tar": ("jpeg", "tar", False),
    "jpeg parquet": ("jpeg", "parquet", False),
    "jpeg parquet, row groups": ("jpeg", "parquet", True),
    "text tar": ("text", "tar", False),
    "text parquet": ("text", "parquet", False),
}


def text_dataset(root: str, docs: int = 60_000, shards: int = 12) -> None:
    """Documents of 150 words from a 5,000-word vocabulary, with a label; tar and Parquet shards."""
    import numpy as np

    from shardkit.manifest import Manifest, write_manifest
    from shardkit.sample import Sample
    from shardkit.writers import get_writer

    if os.path.exists(os.path.join(root, "manifest.json")):
        return
    rng = np.random.default_rng(0)
    words = np.array([f"w{i}" for i in range(5000)])
    samples = [Sample(f"d{i:06d}", {"txt": " ".join(rng.choice(words, 150)), "cls": i % 7}) for i in range(docs)]
    fields = {"txt": {"kind": "text"}, "cls": {"kind": "int", "dtype": "int64"}}
    per = -(-docs // shards)
    infos = [get_writer(fmt)(samples[lo:lo + per], root, sid, fields)
             for sid, lo in enumerate(range(0, docs, per)) for fmt in ("tar", "parquet")]
    write_manifest(root, Manifest(samples=docs, fields=fields, shards=infos))


def run(root: str, fmt: str, rowgroups: bool, seconds: float) -> dict:
    from loader_bench import run_child

    return run_child(CHILD, root, fmt, "1" if rowgroups else "0", seconds)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=6000, help="images (default 6000)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--seconds", type=float, default=3.0, help="minimum timed seconds per variant per round")
    p.add_argument("--work", default=None, help="data folder, shared with loader_bench.py "
                                                "(default: $TMPDIR/shardkit-loader-bench-N)")
    args = p.parse_args(argv)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from loader_bench import prepared

    work = prepared(args.work, args.n)
    text_dataset(os.path.join(work, "text"))
    results = {name: [] for name in VARIANTS}
    for r in range(args.rounds):
        for name, (data, fmt, rowgroups) in VARIANTS.items():
            results[name].append(run(os.path.join(work, data), fmt, rowgroups, args.seconds))
        print(f"round {r + 1}/{args.rounds} done", flush=True)
    print(f"\n{args.n} images at 224^2, 2 workers, batch 64, shuffle on; median of {args.rounds} rounds")
    print(f"{'variant':28s} {'samples/s':>10} {'(rounds)':>17} {'peak RSS MB':>12}")
    for name, runs in results.items():
        rates = [x["rate"] for x in runs]
        print(f"{name:28s} {statistics.median(rates):10,.0f} {min(rates):8,.0f}-{max(rates):<8,.0f} "
              f"{statistics.median(x['peak_rss_mb'] for x in runs):12,.0f}")

    def ratio(a: str, b: str, key: str) -> str:
        per = [x[key] / y[key] for x, y in zip(results[a], results[b])]
        return f"{statistics.median(per):5.2f} (rounds {min(per):.2f}-{max(per):.2f})"

    print("\nratios (median of per-round ratios):")
    print(f"  raw parquet / raw tar, samples/s        = {ratio('raw parquet', 'raw tar', 'rate')}  target >= 0.8")
    print(f"  raw parquet / raw tar, peak RSS         = {ratio('raw parquet', 'raw tar', 'peak_rss_mb')}  "
          "target <= 1.2")
    print(f"  jpeg parquet / jpeg tar, samples/s      = {ratio('jpeg parquet', 'jpeg tar', 'rate')}  target >= 0.9")
    print(f"  raw parquet, row groups / raw tar       = {ratio('raw parquet, row groups', 'raw tar', 'rate')}  "
          "(the previous Parquet path)")
    print(f"  jpeg parquet, row groups / jpeg tar     = {ratio('jpeg parquet, row groups', 'jpeg tar', 'rate')}")
    print(f"  text parquet / text tar, samples/s      = {ratio('text parquet', 'text tar', 'rate')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
