"""Client CPU to list an S3 folder tree: shardkit's walk of SRC (one stream of keys through
store.listing.Keys: obstore's, or s3fs's pages with SHARDKIT_OBJECT_CLIENT=fsspec), the walk of a
baseline revision (--baseline REV: its code exported with git archive, run in the same rounds), and
obstore's streamed recursive list alone (the floor of the client's part).

The objects sit in the memory of a local S3 server (moto, a process of its own, answered from its
sorted names: object_store_bench.serve), as `cls{i % 10}/{i:07d}.jpg`. Each client lists in a
fresh process; the figure is that process's user+system CPU around the listing (imports and the
client's session included, as a job pays them), per object. Clients alternate round by round.

    PYTHONPATH=$PWD python bench/listing_cpu_bench.py [--objects 30000] [--rounds 2] [--baseline REV]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import object_store_bench  # noqa: E402  (bench/ is not a package)
from remote_bench import checkout  # noqa: E402

TIMED = """
import json, resource, time
r0 = resource.getrusage(resource.RUSAGE_SELF); t = time.perf_counter()
{body}
r1 = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({{"n": n, "cpu": r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime, "wall": time.perf_counter() - t}}))
"""
WALK = "from shardkit.sources.walk import walk\nn = len(walk('s3://listing').files)"
CLIENTS = {
    "walk, obstore": WALK,
    "walk, s3fs pages": "import os\nos.environ['SHARDKIT_OBJECT_CLIENT'] = 'fsspec'\n" + WALK,
    "obstore.list alone (recursive, streamed)": (
        "import os, obstore\nfrom obstore.store import S3Store\n"
        "store = S3Store('listing', endpoint=os.environ['AWS_ENDPOINT_URL'], region='us-east-1',\n"
        "                client_options={'allow_http': True})\n"
        "n = sum(len(chunk) for chunk in obstore.list(store, chunk_size=1000))"),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--objects", type=int, default=30000)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--baseline", metavar="REV", help="also time the walk of this revision (e.g. the last main)")
    ap.add_argument("--work", default="/tmp/shardkit-listing-bench", help="where a baseline's code is exported")
    a = ap.parse_args()
    os.makedirs(a.work, exist_ok=True)
    clients = {name: (body, None) for name, body in CLIENTS.items()}
    if a.baseline:
        clients[f"walk at {a.baseline}"] = (WALK, checkout(a.baseline, a.work))
    server, endpoint = object_store_bench.serve(a.objects, object_store_bench._env())
    env = object_store_bench._env(endpoint)
    try:
        for r in range(a.rounds):
            for name, (body, code) in clients.items():
                run_env = env if code is None else {**env, "PYTHONPATH": code}
                # run outside the repository: `-c` puts the working folder first on sys.path
                done = subprocess.run([sys.executable, "-c", TIMED.format(body=body)], capture_output=True,
                                      text=True, env=run_env, cwd=a.work)
                if done.returncode:
                    print(f"round {r + 1} {name}: failed: {done.stderr.strip().splitlines()[-1]}", flush=True)
                    continue
                got = json.loads(done.stdout.strip().splitlines()[-1])
                print(f"round {r + 1} {name}: {got['n']} objects, CPU {got['cpu']:.2f} s "
                      f"({1e6 * got['cpu'] / got['n']:.0f} us per object), wall {got['wall']:.2f} s", flush=True)
    finally:
        server.kill()
        server.wait()


if __name__ == "__main__":
    main()
