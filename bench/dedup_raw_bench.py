"""Dedup of a raw jsonl folder at scale: how the largest process grows from 100k to 1M documents.

`shardkit dedup RAW OUT --workers 2` (20 .jsonl files of short documents, 1% planted near-duplicate
pairs) in a fresh process per size. Peak RSS is each process's own high-water mark (ru_maxrss): the
`shardkit dedup` process, and each worker (read just before the cluster closes). The growth per
document of the largest of them is what issue 24 bounds (target <= 150 B; 1,255 B before the raw
path listed in compact columns and signed partitions of pieces on the workers).

    .venv/bin/python bench/dedup_raw_bench.py [--sizes 100000,1000000] [--workers 2]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dedup_scale_bench  # noqa: E402  (its run(): one child process per measurement)

FILES, WORDS = 20, 30
TARGET_BYTES_PER_DOC = 150

CHILD = r'''
import json, resource, sys, time
import shardkit.jobs.cluster as cluster
from shardkit.config import DedupConfig
from shardkit.jobs.dedup import dedup
src, out, workers = sys.argv[1], sys.argv[2], int(sys.argv[3])
peak = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
seen = []
close = cluster.PendingClient.close
def measured(self):  # the workers' peaks, read while they are still up
    client = self._box.get("client")
    if client is not None and not seen:
        seen.extend(client.run(peak).values())
    close(self)
cluster.PendingClient.close = measured
start = time.perf_counter()
result = dedup(DedupConfig(src, out, workers=workers, progress=False))
print(json.dumps({"seconds": time.perf_counter() - start, "client": peak(), "workers": seen,
                  "removed": result.summary["removed"], "stages": result.summary["execution"]["seconds"],
                  "mode": result.summary["execution"].get("mode")}))
'''


def make_raw(root: str, n_docs: int, seed: int = 0) -> None:
    """n_docs short documents in FILES jsonl files, one planted near-duplicate pair per 200 documents."""
    rng = np.random.default_rng(seed)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    vocab = np.array(["".join(w) for w in letters[rng.integers(0, 26, (50000, 7))]])
    os.makedirs(root, exist_ok=True)
    per_file = -(-n_docs // FILES)
    for f in range(FILES):
        n = min(per_file, n_docs - f * per_file)
        idx = rng.integers(0, len(vocab), (n, WORDS))
        for i in range(0, n - 1, 200):
            keep = int(rng.integers(WORDS * 9 // 10, WORDS))
            idx[i + 1, :keep] = idx[i, :keep]
        with open(os.path.join(root, f"part-{f:02d}.jsonl"), "w") as fh:
            fh.writelines(json.dumps({"text": " ".join(vocab[row]), "id": f * per_file + i}) + "\n"
                          for i, row in enumerate(idx))


def run(src: str, workers: int) -> dict:
    return dedup_scale_bench.run(src, workers, CHILD)  # the same fresh-process run, this bench's child


def main() -> int:
    from shardkit.demo.datagen import generated

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="100000,1000000")
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    sizes = sorted(int(s) for s in args.sizes.split(","))
    results = {}
    for size in sizes:
        raw = os.path.join(tempfile.gettempdir(), f"shardkit-bench-dedup-raw-{size}")
        generated(raw, lambda p, size=size: make_raw(p, size), f"a raw jsonl folder of {size} documents")
        results[size] = r = run(raw, args.workers)
        largest = max([r["client"]] + r["workers"])
        print(f"  {size:>9,} docs, --workers {args.workers} ({r['mode']}): {r['seconds']:.1f} s, stages {r['stages']}; "
              f"peak RSS dedup process {r['client'] / 1e6:.0f} MB, workers {[round(w / 1e6) for w in r['workers']]} MB, "
              f"largest {largest / 1e6:.0f} MB; {r['removed']} removed", flush=True)
    small, big = sizes[0], sizes[-1]
    a, b = results[small], results[big]
    client = (b["client"] - a["client"]) / (big - small)
    growth = (max([b["client"]] + b["workers"]) - max([a["client"]] + a["workers"])) / (big - small)
    print(f"dedup process grows {client:.0f} B/document, the largest process {growth:.0f} B/document from "
          f"{small:,} to {big:,} (target <= {TARGET_BYTES_PER_DOC})")
    return 0 if growth <= TARGET_BYTES_PER_DOC else 1


if __name__ == "__main__":
    sys.exit(main())
