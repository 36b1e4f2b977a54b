"""A training script's epoch over S3: StreamingDataset on s3:// read by make_loader(num_workers=2),
this checkout against another revision, alternating, each epoch a fresh process and a fresh cache.

    .venv/bin/python bench/s3_reader_bench.py --baseline ef7b98b --rounds 4

The store is moto's S3 server in a process of its own on 127.0.0.1 (its CPU is not counted, but it
shares the machine's cores); the data is remote_bench's 6,000 photo-like JPEGs 224^2 in 16 MB tar
shards (made once under --work). Per epoch: seconds to open the dataset, to the first batch and to
the end, and the CPU seconds of the main process and of the DataLoader workers (what the client
costs: the workers' GETs are the hot path of a run of 1e8 samples).
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
sys.path[:0] = [HERE]
BUCKET = "reader-bench"

EPOCH = """
import json, resource, shutil, sys, time
url, cache = sys.argv[1:3]
shutil.rmtree(cache, ignore_errors=True)
from shardkit.loader import make_loader
from shardkit.reader.dataset import StreamingDataset
t0, c0 = time.perf_counter(), time.process_time()
ds = StreamingDataset(url, cache_dir=cache, seed=0)
opened, n, first = time.perf_counter() - t0, 0, None
for batch in make_loader(ds, batch_size=64, num_workers=2):
    n += len(batch["__key__"])
    first = first or time.perf_counter() - t0
wall = time.perf_counter() - t0
workers = resource.getrusage(resource.RUSAGE_CHILDREN)
print(json.dumps({"samples": n, "open_s": opened, "first_s": first, "epoch_s": wall,
                  "main_cpu_s": time.process_time() - c0, "workers_cpu_s": workers.ru_utime + workers.ru_stime}))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--baseline", required=True, metavar="REV", help="the revision to compare with")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--work", default=os.path.join(tempfile.gettempdir(), "shardkit-remote-bench2"))
    args = ap.parse_args()
    import boto3
    from remote_bench import checkout, prepare
    from store_client_bench import start_server

    root = prepare(args.work, 0, 6000, ["16MB"])[("jpeg", "16MB")]
    codes = {"current": os.path.abspath(os.path.join(HERE, "..")), args.baseline: checkout(args.baseline, args.work)}
    server, endpoint = start_server(tempfile.mkdtemp(prefix="s3-reader-bench-"))  # sets this process's AWS_*
    env = dict(os.environ, TOKENIZERS_PARALLELISM="false")
    try:
        client = boto3.client("s3", endpoint_url=endpoint)
        client.create_bucket(Bucket=BUCKET)
        for folder, _, names in os.walk(root):
            for name in names:
                path = os.path.join(folder, name)
                client.upload_file(path, BUCKET, "jpeg/" + os.path.relpath(path, root))
        runs: dict = {name: [] for name in codes}
        for r in range(args.rounds):
            for name in (list(codes) if r % 2 == 0 else list(codes)[::-1]):  # alternate which goes first
                out = subprocess.run([sys.executable, "-c", EPOCH, f"s3://{BUCKET}/jpeg",
                                      os.path.join(args.work, "s3-cache")], env=env | {"PYTHONPATH": codes[name]},
                                     cwd=codes[name], capture_output=True, text=True, check=True)
                got = json.loads(out.stdout.strip().splitlines()[-1])
                runs[name].append(got)
                print(f"round {r}: {name:10s} " + "  ".join(f"{k} {v:.2f}" for k, v in got.items() if k != "samples"),
                      flush=True)
    finally:
        server.stdin.close()
        server.kill()
        server.wait()
    print(f"\nmedian of {args.rounds} rounds (6,000 JPEGs 224^2 in 16 MB shards on moto's S3, 2 workers, batch 64)")
    med = {name: {k: statistics.median(x[k] for x in v) for k in v[0]} for name, v in runs.items()}
    for name, m in med.items():
        print(f"  {name:10s} " + "  ".join(f"{k} {v:.2f}" for k, v in m.items() if k != "samples"))
    base = med[args.baseline]
    print(f"  workers' CPU current / {args.baseline}: {med['current']['workers_cpu_s'] / base['workers_cpu_s']:.2f}")


if __name__ == "__main__":
    main()
