"""Build at scale: throughput under default shard settings, and the client's memory as jsonl grows.

    .venv/bin/python bench/build_scale_bench.py [--images 2000,6000] [--reps 3] [--pools auto,processes]
        [--lines 200000,2000000]

Throughput: photo-like JPEGs ~500×375 → raw uint8 224² (center crop), `--workers 2`, every other
option at its default (--shard-size 256MB, --worker-pool auto: threads for a folder of images;
`--pools auto,processes` measures worker processes too, interleaved). Each build runs in a fresh process, timed end to end
around `build()` (cluster start-up and close included, imports excluded), interleaved with the
one-process loop of the same per-image work (`process_image`); ratio = build rate / (loop × 2).

Memory: `shardkit build` of 20 jsonl files holding N lines in all, `--workers 2`, defaults; the
peak RSS of the build process (the client; workers are other processes) minus its RSS after
imports, at two sizes. Target: the growth between them ≤ 150 MB.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from shardkit.config import BuildConfig
from shardkit.demo.datagen import generated, image_folder, words
from shardkit.stages.image import process_image

WORKERS = 2
CHILD = """
import json, os, resource, sys, time
import psutil
import shardkit.jobs.cluster
from shardkit.config import BuildConfig
from shardkit.jobs.build import build
cfg = BuildConfig(**json.loads(sys.argv[1]))
me = psutil.Process()
others = {}
close = shardkit.jobs.cluster.PendingClient.close
def counted_close(self):  # CPU of the cluster's processes, read just before they exit
    for p in me.children(recursive=True):
        try:
            others[p.pid] = sum(p.cpu_times()[:4])
        except psutil.Error:
            pass
    close(self)
shardkit.jobs.cluster.PendingClient.close = counted_close
base, cpu = me.memory_info().rss, sum(me.cpu_times()[:2])
start = time.perf_counter()
result = build(cfg)
seconds = time.perf_counter() - start
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps({"seconds": seconds, "samples": result.samples, "inputs": result.inputs,
                  "shards": len({s.id for s in result.shards}), "base": base, "peak": peak,
                  "cpu": sum(me.cpu_times()[:2]) - cpu + sum(others.values())}))
"""


def build_in_child(cfg: BuildConfig) -> dict:
    """Build in a fresh interpreter (a cold cluster start, as `shardkit build` pays it)."""
    import shutil
    from dataclasses import asdict

    shutil.rmtree(cfg.out, ignore_errors=True)
    out = subprocess.run([sys.executable, "-c", CHILD, json.dumps(asdict(cfg))], capture_output=True, text=True)
    if out.returncode:
        raise RuntimeError(f"build failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def loop_rate(files: list[Path], cfg: BuildConfig) -> tuple[float, float]:
    """(images/s, CPU seconds) of the build's per-image work (decode, orient, RGB, resize, encode) in
    one process."""
    start, cpu = time.perf_counter(), time.process_time()
    for path in files:
        process_image(path.read_bytes(), cfg)
    return len(files) / (time.perf_counter() - start), time.process_time() - cpu


def throughput(n: int, reps: int, work: Path, pools: list[str]) -> None:
    raw = work / f"raw-{n}"
    generated(raw, lambda root: image_folder(root, n=n, classes=10, size=(500, 375), seed=0), f"{n} images")
    files = sorted(raw.rglob("*.jpg"))
    cfgs = {pool: BuildConfig(src=str(raw), out=str(work / f"out-{n}"), image_size=224, resize_mode="center-crop",
                              encode="raw", workers=WORKERS, progress=False, worker_pool=pool) for pool in pools}
    loop_rate(files[:50], cfgs[pools[0]])  # warm-up: imports, codec tables, page cache
    loops = []
    ratios, builds, cpu = ({pool: [] for pool in pools} for _ in range(3))
    for _ in range(reps):
        rate, loop_cpu = loop_rate(files, cfgs[pools[0]])
        loops.append(rate)
        for pool in pools:  # interleaved: each build is compared with the loop of its repetition
            run = build_in_child(cfgs[pool])
            assert run["samples"] == n, run
            builds[pool].append(n / run["seconds"])
            ratios[pool].append(builds[pool][-1] / (loops[-1] * WORKERS))
            cpu[pool].append(loop_cpu / run["cpu"])
    print(f"{n} JPEGs → raw 224², --workers {WORKERS}, defaults ({run['shards']} shards): "
          f"loop {statistics.median(loops):.0f} images/s")
    for pool in pools:
        print(f"  --worker-pool {pool}: build {statistics.median(builds[pool]):.0f} images/s "
              f"({n / statistics.median(builds[pool]):.2f} s end to end)")
        print(f"    build / (loop × {WORKERS}) per rep: {' '.join(f'{r:.2f}' for r in ratios[pool])}; "
              f"median {statistics.median(ratios[pool]):.2f}   (target ≥ 0.85)")
        print(f"    CPU: loop / build (all its processes) per rep: {' '.join(f'{r:.2f}' for r in cpu[pool])} — "
              "the ratio's ceiling with no idle core")


def jsonl_folder(root: str, lines: int, files: int = 20) -> None:
    import numpy as np

    rng = np.random.default_rng(0)
    vocab = [words(rng, 1) for _ in range(2000)]
    os.makedirs(root)
    per = lines // files
    for f in range(files):
        with open(os.path.join(root, f"part-{f:03d}.jsonl"), "w", encoding="utf-8") as out:
            for i in range(per):
                n = int(rng.integers(10, 60))
                text = " ".join(vocab[j] for j in rng.integers(0, len(vocab), n))
                out.write(json.dumps({"text": text, "id": f * per + i, "source": "bench"}) + "\n")


def memory(sizes: list[int], work: Path) -> None:
    peaks = {}
    for lines in sizes:
        raw = work / f"jsonl-{lines}"
        generated(raw, lambda root, lines=lines: jsonl_folder(root, lines), f"{lines} jsonl lines")
        run = build_in_child(BuildConfig(src=str(raw), out=str(work / f"jsonl-out-{lines}"), workers=WORKERS,
                                         progress=False))
        assert run["samples"] == lines, run
        peaks[lines] = run["peak"] - run["base"]
        print(f"{lines:>9,} jsonl lines in 20 files: build {run['seconds']:.1f} s, {run['shards']} shards; client "
              f"peak RSS {run['peak'] / 1e6:.0f} MB = {run['base'] / 1e6:.0f} MB after imports + "
              f"{peaks[lines] / 1e6:.0f} MB")
    lo, hi = min(sizes), max(sizes)
    grow = (peaks[hi] - peaks[lo]) / 1e6
    print(f"client peak RSS growth {lo:,} → {hi:,} lines: {grow:+.0f} MB "
          f"({(peaks[hi] - peaks[lo]) / (hi - lo):.1f} B per line)   (target ≤ 150 MB)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", default="2000,6000", help="image counts for the throughput runs ('' skips)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--pools", default="auto", help="--worker-pool values to compare, e.g. auto,processes "
                    "(auto: threads for these images)")
    ap.add_argument("--lines", default="200000,2000000", help="two jsonl sizes for the memory run ('' skips)")
    ap.add_argument("--workdir", default="bench/out/build-scale")
    args = ap.parse_args()
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    print(f"machine: {os.cpu_count()} cores; load average {os.getloadavg()[0]:.1f}")
    for n in [int(x) for x in args.images.split(",") if x]:
        throughput(n, args.reps, work, args.pools.split(","))
    if args.lines:
        memory([int(x) for x in args.lines.split(",")], work)
    return 0


if __name__ == "__main__":
    sys.exit(main())
