"""Reader start-up at a billion samples, simulated: one real shard linked N times, a manifest to match.

    flock /tmp/shardkit-bench.lock .venv/bin/python bench/scale_bench.py
    .venv/bin/python bench/scale_bench.py --sizes 1000,10000 --rank 0 --world 8    # quick check

For each size (shards x --per-shard samples) the dataset is made once in --work (
symbolic links, so it costs one shard of disk) and then read in fresh processes as rank --rank of --world:
StreamingDataset + make_loader + the first batch, in-process and with 2 DataLoader workers.
Prints time and memory above the RSS after imports; memory growth between the two sizes shows
what a process pays per shard of the whole dataset. The largest size is also read with every
shard record inline in manifest.json (what the shard table replaces above 10,000 shards). Targets: at 1e9 samples / 100k shards,
in-process <= 3 s and <= 200 MB above the imports; with 2 workers, first batch <= 5 s.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

CHILD = r"""
import json, os, sys, time
import psutil
import numpy, pyarrow, pyarrow.parquet, torch  # what any loader imports
from shardkit.loader import make_loader
from shardkit.reader.dataset import StreamingDataset
root, workers = sys.argv[1], int(sys.argv[2])
me = psutil.Process()
def status():  # resident anonymous and file-backed (mapped shard files) memory, bytes
    fields = dict(line.split(":", 1) for line in open("/proc/self/status").read().splitlines() if ":" in line)
    return {k: int(fields[k].split()[0]) * 1024 for k in ("RssAnon", "RssFile", "RssShmem")}
base, base_parts = me.memory_info().rss, status()
t0 = time.perf_counter()
ds = StreamingDataset(root)
t1 = time.perf_counter()
loader = make_loader(ds, batch_size=64, num_workers=workers, pin_memory=False)
batch = next(iter(loader))
t2 = time.perf_counter()
# VmHWM: this process's own peak (ru_maxrss would carry the parent's peak over the exec).
peak = int(dict(line.split(":", 1) for line in open("/proc/self/status").read().splitlines()
                if ":" in line)["VmHWM"].split()[0]) * 1024
kids = [p.memory_full_info() for p in me.children()]
parts = {k: (v - base_parts[k]) / 1e6 for k, v in status().items()}
print(json.dumps({"anon_growth_mb": parts["RssAnon"], "file_growth_mb": parts["RssFile"],
                  "shmem_growth_mb": parts["RssShmem"],"init_s": t1 - t0, "first_batch_s": t2 - t1, "total_s": t2 - t0,
                  "rss_growth_mb": (me.memory_info().rss - base) / 1e6, "peak_growth_mb": (peak - base) / 1e6,
                  "imports_rss_mb": base / 1e6, "batch": len(batch["__key__"]),
                  "worker_uss_mb": [k.uss / 1e6 for k in kids], "worker_rss_mb": [k.rss / 1e6 for k in kids]}))
"""


def base_shard(work: str, per_shard: int) -> tuple[str, dict]:
    """One real tar shard (+ index) of `per_shard` samples: raw 16x16 uint8 images and a label."""
    from shardkit.sample import Sample
    from shardkit.writers import get_writer

    folder = os.path.join(work, f"base-{per_shard}")
    fields = {"raw": {"kind": "image", "encoding": "raw", "dtype": "uint8", "shape": [16, 16, 3]},
              "cls": {"kind": "int", "dtype": "int64"}}
    info_path = os.path.join(folder, "info.json")
    if not os.path.exists(info_path):
        rng = np.random.default_rng(0)
        samples = [Sample(f"s{i:07d}", {"raw": rng.integers(0, 256, 768, dtype=np.uint8).tobytes(), "cls": i % 10})
                   for i in range(per_shard)]
        info = get_writer("tar")(samples, folder, 0, fields).to_dict()
        with open(info_path, "w") as f:
            json.dump(info, f)
    with open(info_path) as f:
        return folder, {"info": json.load(f), "fields": fields}


def linked_dataset(work: str, shards: int, per_shard: int, inline: bool = False) -> str:
    """A dataset of `shards` links to the base shard, with a manifest that names them all (with
    `inline`, every shard record inline in manifest.json too, as version 1 keeps small datasets)."""
    import shardkit.manifest as manifest_module
    from shardkit.contract import ShardInfo
    from shardkit.manifest import Manifest, load_manifest, write_manifest

    root = os.path.join(work, f"linked-{shards}x{per_shard}" + ("-inline" if inline else ""))
    if os.path.exists(os.path.join(root, "manifest.json")):
        return root
    folder, base = base_shard(work, per_shard)
    info = base["info"]
    os.makedirs(os.path.join(root, "shards"), exist_ok=True)
    infos = []
    for i in range(shards):
        rel = f"shards/data-{i:06d}.tar"
        for src, dst in ((info["path"], rel), (info["index"]["path"], rel + ".idx.parquet")):
            if not os.path.lexists(os.path.join(root, dst)):  # symlinks: ext4 allows 65,000 hard links
                os.symlink(os.path.abspath(os.path.join(folder, src)), os.path.join(root, dst))
        infos.append(ShardInfo(i, "tar", rel, info["samples"], info["bytes"], info["sha256"],
                               dict(info["index"], path=rel + ".idx.parquet")))
    if inline:
        manifest_module.INLINE_SHARDS = shards
    write_manifest(root, Manifest(samples=shards * per_shard, fields=base["fields"], shards=infos))
    load_manifest(root)  # fails here, not in the timed child, if anything is off
    return root


def measure(root: str, workers: int, rank: int, world: int) -> dict:
    env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world))
    out = subprocess.run([sys.executable, "-c", CHILD, root, str(workers)], env=env, check=True,
                         capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="10000,100000", help="shard counts to compare (default 10000,100000)")
    p.add_argument("--per-shard", type=int, default=10_000)
    p.add_argument("--rank", type=int, default=5)
    p.add_argument("--world", type=int, default=64)
    p.add_argument("--repeat", type=int, default=3, help="fresh processes per variant; the median is shown")
    p.add_argument("--work", default=os.path.join(tempfile.gettempdir(), "shardkit-scale-bench"))
    p.add_argument("--no-inline", dest="inline", action="store_false",
                   help="skip the comparison with the largest size's shards listed inline in manifest.json")
    args = p.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    roots = {}
    for n in sizes:
        t0 = time.perf_counter()
        roots[n] = linked_dataset(args.work, n, args.per_shard)
        print(f"dataset: {n:,} shards x {args.per_shard:,} = {n * args.per_shard:,} samples in {roots[n]} "
              f"({time.perf_counter() - t0:.0f}s to make)", flush=True)
    big = max(sizes)
    if args.inline:
        roots["inline"] = linked_dataset(args.work, big, args.per_shard, inline=True)
    results = {}
    for _ in range(args.repeat):  # sizes and variants interleaved
        for n in roots:
            for workers in (0, 2) if n != "inline" else (0,):
                results.setdefault((n, workers), []).append(measure(roots[n], workers, args.rank, args.world))
    print(f"\nrank {args.rank} of {args.world}, batch 64, median of {args.repeat} fresh processes")
    print(f"{'samples':>15} {'shards':>8} {'workers':>7} {'init s':>7} {'1st batch s':>11} {'total s':>7} "
          f"{'RSS +MB':>8} {'(anon':>6} {'file)':>6} {'peak +MB':>8} {'worker USS MB':>14}")
    med = {}
    for (key, workers), runs in results.items():
        n = big if key == "inline" else key
        m = {k: float(np.median([r[k] for r in runs])) for k in ("init_s", "first_batch_s", "total_s",
                                                                   "rss_growth_mb", "peak_growth_mb",
                                                                   "anon_growth_mb", "file_growth_mb")}
        uss = max((max(r["worker_uss_mb"], default=0) for r in runs), default=0)
        med[(key, workers)] = m
        label = f"{n * args.per_shard:,}" + (" (v1 JSON)" if key == "inline" else "")
        print(f"{label:>15} {n:>8,} {workers:>7} {m['init_s']:>7.2f} {m['first_batch_s']:>11.2f} "
              f"{m['total_s']:>7.2f} {m['rss_growth_mb']:>8.0f} {m['anon_growth_mb']:>6.0f} "
              f"{m['file_growth_mb']:>6.0f} {m['peak_growth_mb']:>8.0f} {uss:>14.0f}")
    small = min(sizes)
    if args.inline:
        print(f"the same {big:,} shards listed inline in manifest.json (version 1): "
              f"init {med[('inline', 0)]['init_s']:.2f} s vs {med[(big, 0)]['init_s']:.2f} s with the shard table, "
              f"peak {med[('inline', 0)]['peak_growth_mb']:.0f} vs {med[(big, 0)]['peak_growth_mb']:.0f} MB")
    print(f"\nimports alone: {results[(big, 0)][0]['imports_rss_mb']:.0f} MB RSS")
    b0, b2 = med[(big, 0)], med[(big, 2)]
    print(f"at {big * args.per_shard:,} samples: in-process {b0['total_s']:.2f} s (target <= 3), "
          f"peak {b0['peak_growth_mb']:.0f} MB above imports (target <= 200); "
          f"2 workers, first batch {b2['total_s']:.2f} s (target <= 5)")
    if big != small:
        grow = b0["peak_growth_mb"] - med[(small, 0)]["peak_growth_mb"]
        print(f"peak growth from {small:,} to {big:,} shards: {grow:+.0f} MB "
              f"({grow * 1e6 / (big - small):.0f} B per shard of the whole dataset)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
