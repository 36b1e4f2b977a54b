"""The embedded cluster's fixed start: seconds from asking for it to every worker having run a task,
and to its close, in a fresh interpreter each time (as `shardkit build` pays it), Dask imported first.

    .venv/bin/python bench/build_start_bench.py [--workers 2] [--reps 3]

Processes: forked from the fork server, which imports Dask, numpy, pyarrow, PIL and the build's
modules once (cluster.FORKSERVER_PRELOAD); threads: one worker of n threads in this process.
The build's head start runs units meanwhile, so this is an upper bound of what it costs a build.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

CHILD = r"""
import json, sys, time
import distributed  # imported while the build lists SRC (cluster.import_in_background)
from shardkit.jobs.cluster import dask_client
n, threads = int(sys.argv[1]), sys.argv[2] == "threads"
start = time.perf_counter()
with dask_client(None, n, threads) as client:
    client.wait_for_workers(1 if threads else n)
    first = time.perf_counter() - start
    client.gather(client.map(lambda i: i, range(n * 4), pure=False))
    up = time.perf_counter() - start
    closing = time.perf_counter()
print(json.dumps({"first": first, "up": up, "close": time.perf_counter() - closing}))
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    runs = {"processes": [], "threads": []}
    for _ in range(args.reps):
        for kind in runs:  # interleaved
            out = subprocess.run([sys.executable, "-c", CHILD, str(args.workers), kind], capture_output=True,
                                 text=True, check=True)
            runs[kind].append(json.loads(out.stdout.strip().splitlines()[-1]))
    for kind, rs in runs.items():
        med = {k: statistics.median(r[k] for r in rs) for k in ("first", "up", "close")}
        print(f"{args.workers} workers as {kind}: all workers registered {med['first']:.2f} s, "
              f"a task run on each {med['up']:.2f} s, close {med['close']:.2f} s (medians of {args.reps}; "
              f"up: {' '.join(format(r['up'], '.2f') for r in rs)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
