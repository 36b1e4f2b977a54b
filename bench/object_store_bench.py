"""Build where the data lives: s3 -> s3 against local -> local, and the client's memory while listing a store.

    .venv/bin/python bench/object_store_bench.py [--images 6000] [--rounds 2] [--objects 200000]
    .venv/bin/python bench/object_store_bench.py --images 1500 --rounds 3 --skip-listing --pools auto,processes
    PYTHONPATH=$PWD .venv/bin/python bench/object_store_bench.py --images 1500 --rounds 2 --skip-listing \
        --pools processes --baseline 612231e   # the previous main's code built in the same rounds

The store is a local S3 server (moto's server mode) in a process of its own on 127.0.0.1.

Build: photo-like JPEGs of ~480 x 360 (bench/build_pool_bench.py's kind), each build `shardkit build
SRC OUT --image-size 224 --resize-mode center-crop` (JPEG 224², every other option at its default:
the embedded cluster, one worker per core) in a fresh process, timed end to end (cluster start and
close included). Local -> local reads and writes this machine's disk; s3 -> s3 lists SRC on the
server, the workers read each object from it and upload each shard to it. Interleaved per round:
local, s3, local, s3, ...; ratio = s3 rate / local rate of the same round (target >= 0.8). The store
runs on the same cores as the build: its own CPU time during each s3 build is reported beside it.
Beside the rates, the CPU seconds of shardkit's processes (the build's process and every descendant:
nannies, workers, sampled from /proc every 0.1 s; the store's process is not one of them) per build, and local / s3 of them (target >= 0.8: s3 costs <= 1.25x local's CPU). `--pools`: the
--worker-pool of both builds, each pool in turn within a round (`auto`, the default, lets each build
probe; `processes` is the issue's own comparison, worker processes on both sides).

Listing: `objects` objects (in 10 folders, keys like `cls3/0123456.jpg`) put into the server's
memory directly; a fresh process lists them with shardkit's walk (sources/walk.py through
store/listing.py) and reports its resident memory before and after (and at its peak), per object
(target: growth <= 150 B per object). Arrow's own allocation is reported beside it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

SERVE = r"""
import bisect, hashlib, sys, time, logging
from moto.server import ThreadedMotoServer
from moto.s3.models import S3Backend
logging.getLogger("werkzeug").setLevel(logging.ERROR)
server = ThreadedMotoServer(ip_address="127.0.0.1", port=int(sys.argv[1]), verbose=False)
server.start()
objects = int(sys.argv[2])
if objects:
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.s3.models import s3_backends
    backend = s3_backends[DEFAULT_ACCOUNT_ID]["global"]
    bucket = backend.create_bucket("listing", "us-east-1")
    for i in range(objects):  # straight into the server's memory: no 200,000 PUTs to wait for
        backend.put_object("listing", f"cls{i % 10}/{i:07d}.jpg", b"x")
    names = sorted(bucket.keys.keys())
    moto_list = S3Backend.list_objects_v2

    def listed(self, bucket, prefix, delimiter, continuation_token, start_after, max_keys):
        # moto scans every key of the bucket for each page (O(N) a page, hours for 200,000 keys): the
        # static bucket is answered from its sorted names instead, with moto's own result types
        if bucket.name != "listing":
            return moto_list(self, bucket, prefix, delimiter, continuation_token, start_after, max_keys)
        prefix = prefix or ""
        after = self._pagination_tokens.get(continuation_token) if continuation_token else start_after
        if after and delimiter and after.endswith(delimiter):
            i = bisect.bisect_left(names, after[:-1] + chr(ord(delimiter) + 1))
        else:
            i = bisect.bisect_right(names, after) if after else bisect.bisect_left(names, prefix)
        out = []
        while i < len(names) and names[i].startswith(prefix) and len(out) < max_keys:
            rest = names[i][len(prefix):]
            if delimiter and delimiter in rest:
                folder = prefix + rest.split(delimiter)[0] + delimiter
                out.append(folder)
                i = bisect.bisect_left(names, folder[:-1] + chr(ord(delimiter) + 1))
            else:
                out.append(bucket.keys[names[i]])
                i += 1
        truncated = i < len(names) and names[i].startswith(prefix)
        token = None
        if truncated:
            last = out[-1] if isinstance(out[-1], str) else out[-1].name
            token = hashlib.md5(last.encode()).hexdigest()
            self._pagination_tokens[token] = last
        return out, truncated, token

    S3Backend.list_objects_v2 = listed
print("ready", flush=True)
while True:
    time.sleep(3600)
"""

LIST = r"""
import json, os, sys, time
import pyarrow as pa
from shardkit.sources.walk import walk
def rss():
    with open("/proc/self/status") as f:
        fields = dict(line.split(":", 1) for line in f)
    return int(fields["VmRSS"].split()[0]) * 1024, int(fields["VmHWM"].split()[0]) * 1024
walk("s3://listing/cls0")  # imports, the filesystem and its connections: before the first figure
before, _ = rss()
arrow_before = pa.total_allocated_bytes()
start = time.perf_counter()
listing = walk("s3://listing")
seconds = time.perf_counter() - start
after, peak = rss()
print(json.dumps({"objects": len(listing.files), "seconds": seconds, "rss_before": before, "rss_after": after,
                  "rss_peak": peak, "arrow": pa.total_allocated_bytes() - arrow_before,
                  "table_bytes": listing.files.nbytes}))
"""


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(objects: int, env: dict):
    """The local S3 server, in a process of its own (as a store is): (process, endpoint)."""
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-c", SERVE, str(port), str(objects)], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True, env=env)
    assert proc.stdout.readline().strip() == "ready"
    return proc, f"http://127.0.0.1:{port}"


def _env(endpoint: str | None = None) -> dict:
    env = dict(os.environ, AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench", AWS_DEFAULT_REGION="us-east-1")
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL_S3"):
        env.pop(name, None)
    if endpoint:
        env["AWS_ENDPOINT_URL"] = endpoint
    return env


def _build(src: str, out: str, env: dict, server, pool: str = "auto") -> dict:
    """Seconds of one `shardkit build` in a fresh process (imports excluded: timed around build()), and the
    CPU seconds the store's process spent meanwhile (the store shares this machine's cores)."""
    import psutil

    store = psutil.Process(server.pid)
    before = store.cpu_times()
    result = _run_build(src, out, env, pool)
    after = store.cpu_times()
    result["store_cpu_seconds"] = after.user + after.system - before.user - before.system
    return result


def _run_build(src: str, out: str, env: dict, pool: str = "auto") -> dict:
    child = ("import json, sys, time\nfrom shardkit.config import BuildConfig\nfrom shardkit.jobs.build import build\n"
             "cfg = BuildConfig(sys.argv[1], sys.argv[2], image_size=224, resize_mode='center-crop', progress=False,\n"
             "                  worker_pool=sys.argv[3])\n"
             "t = time.perf_counter(); r = build(cfg)\n"
             "print(json.dumps({'seconds': time.perf_counter() - t, 'samples': r.samples}))")
    import psutil

    logs = tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")  # not pipes: a full pipe would stall it
    # cwd outside the repository: `python -c` puts the working folder first on sys.path, ahead of PYTHONPATH
    proc = subprocess.Popen([sys.executable, "-c", child, src, out, pool], stdout=logs[0], stderr=logs[1], text=True,
                            env=env, cwd=tempfile.gettempdir())
    cpu: dict = {}  # pid -> its last user+system seconds, sampled from /proc every 0.1 s (the measure)
    root = psutil.Process(proc.pid)
    while proc.poll() is None:
        try:
            tree = [root] + root.children(recursive=True)
        except psutil.NoSuchProcess:
            break
        for p in tree:
            try:
                t = p.cpu_times()
                cpu[p.pid] = t.user + t.system
            except psutil.Error:
                pass
        time.sleep(0.1)
    proc.wait()
    for f in logs:
        f.seek(0)
    stdout, stderr = (f.read() for f in logs)
    if proc.returncode != 0:
        raise RuntimeError(f"build failed ({proc.returncode}): {stderr[-2000:]}")
    return json.loads(stdout.strip().splitlines()[-1]) | {"cpu_seconds": sum(cpu.values())}


def bench_build(images: int, rounds: int, work: str, pools=("auto",), codes: dict | None = None) -> dict:
    """`codes`: {name: the folder to put on PYTHONPATH (None: this process's)}, each built in turn
    within a round (the previous main beside this one, in the same run)."""
    import s3fs

    from shardkit.demo.datagen import image_folder

    raw = os.path.join(work, "raw")
    image_folder(raw, n=images, classes=10, size=(480, 360), seed=1)
    server, endpoint = serve(0, _env())
    codes = codes or {"this checkout": None}
    try:
        fs = s3fs.S3FileSystem(client_kwargs={"endpoint_url": endpoint}, key="bench", secret="bench")
        fs.mkdir("bench")
        start = time.perf_counter()
        fs.put(raw + "/", "bench/raw/", recursive=True)
        upload = time.perf_counter() - start
        runs: dict = {(code, pool): [] for code in codes for pool in pools}
        for r in range(rounds):
            for (code, pool), got in runs.items():
                env = _env(endpoint) | ({"PYTHONPATH": codes[code]} if codes[code] else {})
                shutil.rmtree(os.path.join(work, "out"), ignore_errors=True)
                fs.rm("bench/out", recursive=True) if fs.exists("bench/out") else None
                local = _build(raw, os.path.join(work, "out"), env, server, pool)
                remote = _build("s3://bench/raw", "s3://bench/out", env, server, pool)
                got.append({"local": local, "s3": remote, "ratio": (remote["samples"] / remote["seconds"])
                            / (local["samples"] / local["seconds"]),
                            "cpu_ratio": local["cpu_seconds"] / remote["cpu_seconds"]})
                print(f"round {r}, {code}, --worker-pool {pool}: local {local['samples'] / local['seconds']:.0f} "
                      f"images/s, s3 {remote['samples'] / remote['seconds']:.0f} images/s, ratio {got[-1]['ratio']:.2f}; "
                      f"shardkit's CPU (the build's process and every descendant) local {local['cpu_seconds']:.1f} s, "
                      f"s3 {remote['cpu_seconds']:.1f} s, local/s3 {got[-1]['cpu_ratio']:.2f} (target >= 0.8); "
                      f"the store's CPU during the s3 build: {1000 * remote['store_cpu_seconds'] / images:.1f} ms per "
                      "image", flush=True)
        out = {"images": images, "upload_seconds": upload, "runs": {f"{c} {p}": got for (c, p), got in runs.items()}}
        for (code, pool), got in runs.items():
            out[f"{code} {pool}"] = {"median_ratio": statistics.median(r["ratio"] for r in got),
                                     "median_cpu_ratio": statistics.median(r["cpu_ratio"] for r in got)}
            print(f"{code}, --worker-pool {pool}: median rate ratio {out[f'{code} {pool}']['median_ratio']:.2f}, "
                  f"median CPU local/s3 {out[f'{code} {pool}']['median_cpu_ratio']:.2f}", flush=True)
        return out
    finally:
        server.kill()
        server.wait()


def bench_listing(objects: int) -> dict:
    server, endpoint = serve(objects, _env())
    try:
        done = subprocess.run([sys.executable, "-c", LIST], capture_output=True, text=True, env=_env(endpoint),
                              check=True, cwd=tempfile.gettempdir())
        got = json.loads(done.stdout.strip().splitlines()[-1])
    finally:
        server.kill()
        server.wait()
    n = got["objects"]
    got.update(growth_per_object=(got["rss_after"] - got["rss_before"]) / n,
               peak_per_object=(got["rss_peak"] - got["rss_before"]) / n, arrow_per_object=got["arrow"] / n,
               table_per_object=got["table_bytes"] / n)
    print(f"listing {n} objects: {got['seconds']:.1f} s, client +{got['growth_per_object']:.0f} B per object "
          f"(peak +{got['peak_per_object']:.0f}; Arrow {got['arrow_per_object']:.0f}, the table "
          f"{got['table_per_object']:.0f})", flush=True)
    return got


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--images", type=int, default=6000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--objects", type=int, default=200_000)
    parser.add_argument("--skip-build", action="store_true")
    parser.add_argument("--skip-listing", action="store_true")
    parser.add_argument("--pools", default="auto", help="--worker-pool of both builds, comma-separated: auto, "
                        "processes (the issue's comparison), threads")
    parser.add_argument("--baseline", metavar="REV", help="build with this revision's code too, in the same rounds")
    args = parser.parse_args()
    result = {"load_before": os.getloadavg()}
    if not args.skip_listing:
        result["listing"] = bench_listing(args.objects)
    if not args.skip_build:
        with tempfile.TemporaryDirectory(prefix="shardkit-osbench-") as work:
            codes = None
            if args.baseline:
                from remote_bench import checkout

                codes = {"HEAD": None, args.baseline: checkout(args.baseline, work)}
            result["build"] = bench_build(args.images, args.rounds, work, args.pools.split(","), codes)
    result["load_after"] = os.getloadavg()
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
