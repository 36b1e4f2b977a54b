"""Build benchmark: `shardkit build` resize/re-encode throughput vs a single-process PIL loop × cores,
and a rerun with nothing changed vs the full build. Ratios are measured in one run, interleaved.

    .venv/bin/python bench/build_bench.py [--n 3000] [--reps 2]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

from shardkit.config import BuildConfig
from shardkit.datagen import image_folder
from shardkit.executor import build, dask_client
from shardkit.stages.image import process_image


def loop_rate(files: list[Path], cfg: BuildConfig) -> float:
    """The same per-image work as the build (decode, orient, RGB, resize, encode), one process."""
    start = time.perf_counter()
    for path in files:
        process_image(path.read_bytes(), cfg)
    return len(files) / (time.perf_counter() - start)


def build_once(cfg: BuildConfig) -> float:
    shutil.rmtree(cfg.out, ignore_errors=True)
    start = time.perf_counter()
    result = build(cfg)
    assert result.samples == result.inputs, "the benchmark folder holds only good images"
    return time.perf_counter() - start


def cluster_start(workers: int) -> float:
    """Seconds to start and close the embedded cluster: paid once per build, whatever its size."""
    start = time.perf_counter()
    with dask_client(None, workers):
        pass
    return time.perf_counter() - start


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=3000, help="photo-like JPEGs ~500x375 (default 3000)")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--shard-samples", type=int, default=300, help="samples per shard: 10 tasks for 3000 images")
    ap.add_argument("--workdir", default="bench/out/build")
    args = ap.parse_args()
    cores = os.cpu_count() or 1
    work = Path(args.workdir)
    raw = work / f"raw-{args.n}"
    if not raw.exists():
        print(f"generating {args.n} images in {raw} …", file=sys.stderr)
        image_folder(str(raw), n=args.n, classes=10, size=(500, 375), seed=0)
    files = sorted(raw.rglob("*.jpg"))
    cfg = BuildConfig(src=str(raw), out=str(work / "out"), image_size=224, resize_mode="center-crop",
                      encode="jpeg", quality=90, workers=cores, progress=False,
                      max_samples_per_shard=args.shard_samples)
    loop_rate(files[:50], cfg)  # warm-up: imports, codec tables, page cache
    loops, builds, starts = [], [], []
    for _ in range(args.reps):  # interleaved repetitions
        loops.append(loop_rate(files, cfg))
        builds.append(len(files) / build_once(cfg))
        starts.append(cluster_start(cores))
    start = time.perf_counter()
    rerun = build(cfg)
    rerun_s = time.perf_counter() - start
    full_s = len(files) / statistics.median(builds)
    limit = statistics.median(loops) * cores
    print(f"machine: {cores} cores; {len(files)} JPEGs ~500x375 → 224x224 JPEG q90, {args.reps} interleaved reps")
    print(f"single-process PIL loop (same transform): {statistics.median(loops):8.0f} images/s "
          f"(min {min(loops):.0f}, max {max(loops):.0f})")
    print(f"loop × {cores} cores (the target's limit):  {limit:8.0f} images/s")
    print(f"shardkit build, embedded Dask, end to end: {statistics.median(builds):8.0f} images/s "
          f"(min {min(builds):.0f}, max {max(builds):.0f})")
    print(f"build / (loop × cores) = {statistics.median(builds) / limit:.2f}   (target ≥ 0.85)")
    start_s = statistics.median(starts)
    steady = len(files) / (full_s - start_s)
    print(f"embedded cluster start-up: {start_s:.2f} s per build; without it: {steady:.0f} images/s "
          f"= {steady / limit:.2f} of loop × cores")
    print(f"rerun, nothing changed: {rerun_s:.2f} s = {rerun_s / full_s:.1%} of the full build "
          f"({rerun.reused_shards} shards reused; target ≤ 5%)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
