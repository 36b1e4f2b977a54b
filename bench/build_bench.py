"""Build benchmark: `shardkit build` resize/re-encode throughput vs a single-process PIL loop × cores,
and a rerun with nothing changed vs the full build. Ratios are measured in one run, interleaved.

    .venv/bin/python bench/build_bench.py [--n 10000] [--reps 3] [--malloc-check]
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
from shardkit.demo.datagen import generated, image_folder
from shardkit.jobs.build import build
from shardkit.jobs.cluster import dask_client
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


def _loop_in_child(files: list[Path], cfg: BuildConfig, queue) -> None:
    loop_rate(files[:50], cfg)
    queue.put(loop_rate(files, cfg))


def malloc_check(files: list[Path], cfg: BuildConfig) -> None:
    """The loop in fresh processes with and without the Dask nanny's default MALLOC_TRIM_THRESHOLD_:
    why `dask_client` unsets it for the embedded cluster."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")  # glibc reads MALLOC_* once, when the process starts
    rates: dict[str, list[float]] = {"unset": [], "65536": []}
    for _ in range(2):
        for setting in rates:
            saved = os.environ.pop("MALLOC_TRIM_THRESHOLD_", None)
            if setting != "unset":
                os.environ["MALLOC_TRIM_THRESHOLD_"] = setting
            try:
                queue = ctx.Queue()
                proc = ctx.Process(target=_loop_in_child, args=(files, cfg, queue))
                proc.start()
                rates[setting].append(queue.get())
                proc.join()
            finally:
                os.environ.pop("MALLOC_TRIM_THRESHOLD_", None)
                if saved is not None:
                    os.environ["MALLOC_TRIM_THRESHOLD_"] = saved
    unset, trimmed = statistics.median(rates["unset"]), statistics.median(rates["65536"])
    print(f"loop in a fresh process, MALLOC_TRIM_THRESHOLD_ unset: {unset:.0f} images/s; "
          f"=65536 (the Dask nanny default): {trimmed:.0f} images/s = {trimmed / unset:.2f}×")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=10000, help="photo-like JPEGs ~500x375 (default 10000)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--shard-samples", type=int, default=300, help="samples per shard (default 300)")
    ap.add_argument("--workdir", default="bench/out/build")
    ap.add_argument("--malloc-check", action="store_true",
                    help="also time the loop with and without the Dask nanny's MALLOC_TRIM_THRESHOLD_")
    args = ap.parse_args()
    cores = os.cpu_count() or 1
    work = Path(args.workdir)
    raw = work / f"raw-{args.n}"
    generated(raw, lambda root: image_folder(root, n=args.n, classes=10, size=(500, 375), seed=0),
              f"{args.n} images")
    files = sorted(raw.rglob("*.jpg"))
    cfg = BuildConfig(src=str(raw), out=str(work / "out"), image_size=224, resize_mode="center-crop",
                      encode="jpeg", quality=90, workers=cores, progress=False,
                      max_samples_per_shard=args.shard_samples)
    loop_rate(files[:50], cfg)  # warm-up: imports, codec tables, page cache
    loops, builds, starts = [], [], []
    for _ in range(args.reps):  # interleaved repetitions: each build is compared with its own loop
        loops.append(loop_rate(files, cfg))
        builds.append(len(files) / build_once(cfg))
        starts.append(cluster_start(cores))
    start = time.perf_counter()
    rerun = build(cfg)
    rerun_s = time.perf_counter() - start
    full_s = len(files) / statistics.median(builds)
    limit = statistics.median(loops) * cores
    ratios = [b / (lo * cores) for b, lo in zip(builds, loops)]
    steady = [len(files) / (len(files) / b - s) / (lo * cores) for b, lo, s in zip(builds, loops, starts)]
    print(f"machine: {cores} cores; {len(files)} JPEGs ~500x375 → 224x224 JPEG q90, {args.reps} interleaved reps")
    print(f"single-process PIL loop (same transform): {statistics.median(loops):8.0f} images/s "
          f"(min {min(loops):.0f}, max {max(loops):.0f})")
    print(f"loop × {cores} cores (the target's limit):  {limit:8.0f} images/s")
    print(f"shardkit build, embedded Dask, end to end: {statistics.median(builds):8.0f} images/s "
          f"(min {min(builds):.0f}, max {max(builds):.0f})")
    print(f"build / (loop × cores), per rep: {' '.join(f'{r:.2f}' for r in ratios)}; "
          f"median {statistics.median(ratios):.2f}   (target ≥ 0.85)")
    print(f"embedded cluster start-up + close: {statistics.median(starts):.2f} s per build; without it: "
          f"median {statistics.median(steady):.2f} of loop × cores")
    print(f"rerun, nothing changed: {rerun_s:.2f} s = {rerun_s / full_s:.1%} of the full build "
          f"({rerun.reused_shards} shards reused; target ≤ 5%)")
    if args.malloc_check:
        malloc_check(files[:1000], cfg)
    return 0


if __name__ == "__main__":
    sys.exit(main())
