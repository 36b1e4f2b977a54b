"""A build task's batch of small source objects (`store.read_sources`, 50 at once) on obstore: client
CPU per object, this checkout against another revision, alternating, on moto's S3 and on
fake-gcs-server (each in a process of its own: their CPU is not counted).

    PYTHONPATH=$PWD .venv/bin/python bench/batch_fetch_bench.py --baseline 245c528 --rounds 4

Each measurement is a fresh process (the code under test on its PYTHONPATH) that reads the same
300 objects of 40 KB in 6 batches, 5 times, and prints the median CPU (user+system, all threads)
per object, with the wall time per batch.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.join(HERE, "..", "tests")]
N, BATCH, SIZE = 300, 50, 40_000

MEASURE = """
import json, sys, time
from shardkit import store
urls = [f"{sys.argv[1]}://batch/o/{i}" for i in range(%(n)d)]
def batches():
    for i in range(0, len(urls), %(batch)d):
        got = store.read_sources(urls[i:i + %(batch)d])
        assert all(isinstance(v, bytes) and len(v) == %(size)d for v in got), got
batches()  # imports, connections, credentials
cpu, wall = [], []
for _ in range(5):
    t, c = time.perf_counter(), time.process_time()
    batches()
    cpu.append((time.process_time() - c) * 1000 / len(urls))
    wall.append((time.perf_counter() - t) * 1000 * %(batch)d / len(urls))
cpu.sort(); wall.sort()
print(json.dumps({"cpu_ms": cpu[2], "batch_ms": wall[2]}))
""" % {"batch": BATCH, "size": SIZE, "n": N}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--baseline", required=True, metavar="REV", help="the revision to compare with")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--work", default=os.path.join(tempfile.gettempdir(), "shardkit-batch-bench"))
    args = ap.parse_args()
    import boto3
    import gcs_store
    from remote_bench import checkout
    from store_client_bench import start_server

    codes = {"current": os.path.abspath(os.path.join(HERE, "..")), args.baseline: checkout(args.baseline, args.work)}
    s3_server, endpoint = start_server(tempfile.mkdtemp(prefix="batch-bench-"))  # sets this process's AWS_*
    gcs_server = gcs_store.start_fake_gcs()
    data = os.urandom(SIZE)
    try:
        boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket="batch")
        s3 = boto3.client("s3", endpoint_url=endpoint)
        gcs_store.new_bucket(gcs_server.endpoint, "batch")
        gcs = gcs_store.GCS(gcs_server.endpoint, "batch")
        for i in range(N):
            s3.put_object(Bucket="batch", Key=f"o/{i}", Body=data)
            gcs.put(f"o/{i}", data)
        env = dict(os.environ, STORAGE_EMULATOR_HOST=gcs_server.endpoint, TOKENIZERS_PARALLELISM="false")
        runs: dict = {}
        for r in range(args.rounds):
            for name in (list(codes) if r % 2 == 0 else list(codes)[::-1]):  # alternate which goes first
                for scheme in ("s3", "gs"):
                    out = subprocess.run([sys.executable, "-c", MEASURE, scheme], env=env | {"PYTHONPATH": codes[name]},
                                         cwd=codes[name], capture_output=True, text=True)
                    if out.returncode:
                        sys.exit(f"{scheme} {name}: exit {out.returncode}\n{out.stderr[-3000:]}")
                    got = json.loads(out.stdout.strip().splitlines()[-1])
                    runs.setdefault((scheme, name), []).append(got)
                    print(f"round {r}: {scheme} {name:10s} CPU {got['cpu_ms']:.3f} ms/object, "
                          f"{got['batch_ms']:.1f} ms/batch", flush=True)
    finally:
        s3_server.stdin.close()
        s3_server.kill()
        s3_server.wait()
        gcs_store.stop_process(gcs_server)
    print(f"\nmedian of {args.rounds} rounds ({N} objects of {SIZE // 1000} KB, {BATCH} a batch)")
    for scheme in ("s3", "gs"):
        med = {name: statistics.median(x["cpu_ms"] for x in runs[(scheme, name)]) for name in codes}
        wall = {name: statistics.median(x["batch_ms"] for x in runs[(scheme, name)]) for name in codes}
        print(f"  {scheme}: " + ", ".join(f"{name} {med[name]:.3f} ms/object ({wall[name]:.0f} ms/batch)"
                                         for name in codes)
              + f"; current / {args.baseline}: {med['current'] / med[args.baseline]:.2f}")


if __name__ == "__main__":
    main()
