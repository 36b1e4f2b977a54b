"""Dedup at scale: memory of the largest process between 100k and 1M documents, and speed vs the
datasketch loop, on a built dataset (Parquet shards of 10,000 documents x 120 words, 1% planted pairs).

Each run is `shardkit dedup DATASET OUT` in a fresh process: in-process (`--workers 0`, one process
does everything) and on a 2-worker cluster (the client and each worker measured). Peak RSS is
the process's own high-water mark (ru_maxrss). Speed: documents per second of the dedup stages
(signatures, buckets, clusters; from summary.json) and end to end, vs the plain datasketch loop
(`MinHash(num_perm=128).update_batch` + `MinHashLSH` query/insert) over 10,000 of the same documents
(one shard) in one process, run before and after.

    .venv/bin/python bench/dedup_scale_bench.py [--sizes 100000,1000000]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

DOCS_PER_SHARD, WORDS = 10_000, 120
# In the dataset folders' names: a dataset kept from before a change of the shard layout (here the
# per-value checksums) would measure a reader and writer path that users no longer get.
LAYOUT = "v2"
TARGET_BYTES_PER_DOC, TARGET_SPEEDUP = 150, 8.0

CHILD = r'''
import json, resource, sys, time
from shardkit.config import DedupConfig
from shardkit.jobs.dedup import dedup
src, out, workers = sys.argv[1], sys.argv[2], int(sys.argv[3])
peak = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
start = time.perf_counter()
if workers:
    from distributed import Client, LocalCluster
    with LocalCluster(n_workers=workers, threads_per_worker=1, dashboard_address=":0") as cluster, Client(cluster) as c:
        result = dedup(DedupConfig(src, out, scheduler=cluster.scheduler_address, progress=False))
        workers_peak = list(c.run(peak).values())
else:
    result = dedup(DedupConfig(src, out, workers=0, progress=False))
    workers_peak = []
use = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"seconds": time.perf_counter() - start, "cpu": use.ru_utime + use.ru_stime,
                  "client": peak(), "workers": workers_peak,
                  "stages": result.summary["execution"]["seconds"], "removed": result.summary["removed"],
                  "buckets": result.summary["execution"]["bucket_tasks"]}))
'''

LOOP = r'''
import json, sys, time
import pyarrow.parquet as pq
from datasketch import MinHash, MinHashLSH
from shardkit.duplicates.text import normalise, shingles
docs = pq.read_table(sys.argv[1], columns=["txt"]).column(0).to_pylist()[: int(sys.argv[2])]
start, cpu = time.perf_counter(), time.process_time()
lsh = MinHashLSH(threshold=0.8, num_perm=128)
for i, doc in enumerate(docs):
    m = MinHash(num_perm=128)
    m.update_batch([s.encode("utf-8") for s in shingles(normalise(doc), 5)])
    lsh.query(m)
    lsh.insert(i, m)
print(len(docs) / (time.perf_counter() - start), len(docs) / (time.process_time() - cpu))
'''


def make_dataset(root: str, n_docs: int, seed: int = 0) -> None:
    """n_docs documents in Parquet shards of DOCS_PER_SHARD, key order, 1% planted near-duplicate pairs."""
    from shardkit.contract import ShardInfo
    from shardkit.manifest import Manifest, write_manifest
    from shardkit.sample import Sample
    from shardkit.writers.parquet import write_parquet

    rng = np.random.default_rng(seed)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    vocab = np.array(["".join(w) for w in letters[rng.integers(0, 26, (50000, 7))]])
    fields = {"txt": {"kind": "text"}}
    shards: list[ShardInfo] = []
    for sid, start in enumerate(range(0, n_docs, DOCS_PER_SHARD)):
        idx = rng.integers(0, len(vocab), (min(DOCS_PER_SHARD, n_docs - start), WORDS))
        for i in range(0, len(idx) - 1, 200):  # one pair per 200 documents: J 0.8-1.0 (a prefix shared)
            keep = int(rng.integers(WORDS * 9 // 10, WORDS))
            idx[i + 1, :keep] = idx[i, :keep]
        samples = [Sample(f"doc/{start + i:09d}", {"txt": " ".join(vocab[row])}) for i, row in enumerate(idx)]
        shards.append(write_parquet(samples, root, sid, fields))
    write_manifest(root, Manifest(samples=n_docs, fields=fields, shards=shards))


def dataset(size: int, largest: str) -> str:
    """The first `size` documents of the largest dataset, as a dataset of their own (hard links)."""
    from shardkit.manifest import Manifest, load_manifest, write_manifest

    root = os.path.join(tempfile.gettempdir(), f"shardkit-bench-dedup-{LAYOUT}-{size}")
    if not os.path.exists(os.path.join(root, "manifest.json")):
        m = load_manifest(largest)
        shards = m.shards_of()[: size // DOCS_PER_SHARD]
        os.makedirs(os.path.join(root, "shards"), exist_ok=True)
        for s in shards:
            if not os.path.exists(os.path.join(root, s.path)):
                os.link(os.path.join(largest, s.path), os.path.join(root, s.path))
        write_manifest(root, Manifest(samples=size, fields=m.fields, shards=shards))
    return root


def run(src: str, workers: int, child: str = CHILD) -> dict:
    """The last JSON line `child` (a script: SRC OUT WORKERS) prints, run in a fresh process on a temp OUT."""
    out = tempfile.mkdtemp(prefix="shardkit-dedup-bench-")
    try:
        done = subprocess.run([sys.executable, "-c", child, src, out, str(workers)], check=True,
                              capture_output=True, text=True)
    finally:
        shutil.rmtree(out)
    return json.loads(done.stdout.strip().splitlines()[-1])


def loop_rate(src: str) -> tuple[float, float]:
    from shardkit.manifest import load_manifest

    first = os.path.join(src, load_manifest(src).shards_of()[0].path)
    out = subprocess.run([sys.executable, "-c", LOOP, first, str(DOCS_PER_SHARD)], check=True, capture_output=True,
                         text=True)
    wall, cpu = out.stdout.split()
    return float(wall), float(cpu)


def main() -> int:
    from shardkit.demo.datagen import generated

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="100000,1000000")
    args = ap.parse_args()
    sizes = sorted(int(s) for s in args.sizes.split(","))
    largest = os.path.join(tempfile.gettempdir(), f"shardkit-bench-dedup-{LAYOUT}-{sizes[-1]}")
    generated(largest, lambda p: make_dataset(p, sizes[-1]), f"a dataset of {sizes[-1]} documents")
    results = {}
    rates = [loop_rate(largest)]
    for size in sizes:
        for workers in (0, 2):
            results[(size, workers)] = r = run(dataset(size, largest) if size != sizes[-1] else largest, workers)
            stages = sum(r["stages"].values())
            peak = max([r["client"]] + r["workers"])
            print(f"  {size:>9,} docs, {'in-process' if not workers else f'{workers} workers'}: "
                  f"{r['seconds']:6.1f} s end to end ({size / r['seconds']:,.0f} docs/s), dedup stages {stages:.1f} s "
                  f"({size / stages:,.0f} docs/s) {r['stages']}; {r['buckets']} bucket tasks; peak RSS client "
                  f"{r['client'] / 1e6:.0f} MB, workers {[round(w / 1e6) for w in r['workers']]} MB, "
                  f"largest {peak / 1e6:.0f} MB; {r['removed']} removed", flush=True)
    rates.append(loop_rate(largest))
    loop, loop_cpu = (sum(r[k] for r in rates) / len(rates) for k in (0, 1))
    print(f"datasketch loop, one process: {loop:,.0f} docs/s wall, {loop_cpu:,.0f} docs per CPU-second "
          f"({', '.join(f'{r[0]:,.0f}' for r in rates)} before/after)")
    ok = True
    small, big = sizes[0], sizes[-1]
    for workers in (0, 2):
        a, b = results[(small, workers)], results[(big, workers)]
        growth = (max([b["client"]] + b["workers"]) - max([a["client"]] + a["workers"])) / (big - small)
        label = "in-process" if not workers else f"{workers} workers"
        line = f"{label}: largest process grows {growth:.0f} B/document from {small:,} to {big:,} (target <= " \
               f"{TARGET_BYTES_PER_DOC}); end to end {big / b['seconds'] / loop:.1f}x the loop's wall rate"
        if not workers:  # one process each: wall and CPU time compare like for like
            stages = big / sum(b["stages"].values()) / loop
            cpu = big / b["cpu"] / loop_cpu
            line += f"; dedup stages {stages:.1f}x wall; end to end {cpu:.1f}x by CPU time"
            ok &= cpu >= TARGET_SPEEDUP  # end to end; CPU time, which other work on the machine distorts least
        print(line)
        ok &= growth <= TARGET_BYTES_PER_DOC
    print(f"speed target: `shardkit dedup DATASET OUT` end to end >= {TARGET_SPEEDUP}x the datasketch loop, one "
          "process each, by CPU time")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
