"""Build at the speed of the machine: the default build vs multiprocessing.Pool on the same images.

    .venv/bin/python bench/build_pool_bench.py [--images 2000,12000] [--reps 2] [--scheduler]

Photo-like JPEGs of about 450 x 340 → raw uint8 224² (center crop), `shardkit build` with every other
option at its default (--workers: one per core; --worker-pool auto, which probes the GIL), each
build in a fresh process timed end to end around `build()` (cluster start and close included,
imports excluded). The reference is a `multiprocessing.Pool(cores)` mapping the same per-image work
(read, decode, orient, RGB, resize, crop, raw bytes: `process_image`) over the same files, timed
around its start, map and close, in its own fresh process. Interleaved per repetition.

  incremental rate = extra images / extra seconds between the two sizes (what a large build gets);
  ratio            = build's incremental rate / the Pool's (target >= 0.9);
  fixed start      = build seconds at the small size - images / its incremental rate (target <= 1.5 s);
  GIL share        = the probe's measure (jobs/pool.gil_share) of the GIL-held share of a worker
                     thread's time on this work, and the thread cap it implies (1 / GIL-held s per image).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

CHILD = r"""
import json, logging, sys, time
from shardkit.config import BuildConfig
from shardkit.jobs.build import build
lines = []
class Keep(logging.Handler):
    def emit(self, record):
        lines.append(record.getMessage())
logging.getLogger("shardkit").addHandler(Keep())
logging.getLogger("shardkit").setLevel(logging.INFO)
cfg = BuildConfig(**json.loads(sys.argv[1]))
start = time.perf_counter()
result = build(cfg)
print(json.dumps({"seconds": time.perf_counter() - start, "samples": result.samples,
                  "pool": next((l for l in lines if l.startswith("worker pool")), "")}))
"""

POOL = r"""
import json, multiprocessing, sys, time
from pathlib import Path
from shardkit.config import BuildConfig
from shardkit.stages.image import process_image
cfg = BuildConfig(**json.loads(sys.argv[1]))
files = sorted(Path(cfg.src).rglob("*.jpg"))
def one(path):
    return len(process_image(path.read_bytes(), cfg))
if __name__ == "__main__":
    start = time.perf_counter()
    with multiprocessing.Pool(int(sys.argv[2])) as pool:
        n = len(pool.map(one, files, chunksize=16))
    print(json.dumps({"seconds": time.perf_counter() - start, "samples": n}))
"""


def _image(args) -> None:
    """Image i of a generated folder: photo-like, ~450 x 340 (±10%), its own seed (any core makes it)."""
    import numpy as np

    from shardkit.demo.datagen import _jpeg, _write, photo_like

    root, i = args
    rng = np.random.default_rng(i)
    w, h = int(450 * rng.uniform(0.9, 1.1)), int(340 * rng.uniform(0.9, 1.1))
    _write(os.path.join(root, f"class_{i % 10:02d}", f"{i:06d}.jpg"), _jpeg(photo_like(rng, w, h), 90))


def _images(root: str, n: int) -> None:
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(os.cpu_count()) as pool:  # 12,000 images: ~30 s on 16 cores, not minutes on one
        list(pool.map(_image, [(root, i) for i in range(n)], chunksize=64))


def folder(work: Path, n: int, largest: int) -> Path:
    """The first n images of the largest folder (hard links), so both sizes hold the same images."""
    from shardkit.demo.datagen import generated

    big = work / f"raw-{largest}"
    generated(big, lambda root: _images(root, largest), f"{largest} images")
    if n == largest:
        return big
    root = work / f"raw-{n}"
    if not root.exists():
        for path in sorted(big.rglob("*.jpg"))[:n]:
            target = root / path.relative_to(big)
            target.parent.mkdir(parents=True, exist_ok=True)
            os.link(path, target)
    return root


def child(code: str, *args: str) -> dict:
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True)
    if out.returncode:
        raise RuntimeError(out.stderr[-3000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


class RealCluster:
    """`dask scheduler` + one `dask worker --nthreads 1` per core, with docker/dask's configuration
    (as docker/compose.yml runs them): what `--scheduler` builds run on."""

    def __init__(self, workers: int):
        import socket
        import time

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.address = f"tcp://127.0.0.1:{port}"
        env = {k: v for k, v in os.environ.items() if k != "MALLOC_TRIM_THRESHOLD_"}
        env["DASK_CONFIG"] = str(Path(__file__).resolve().parent.parent / "docker" / "dask")
        dask = str(Path(sys.executable).parent / "dask")
        quiet = dict(stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True, env=env)
        self.procs = [subprocess.Popen([dask, "scheduler", "--host", "127.0.0.1", "--port", str(port),
                                        "--no-dashboard"], **quiet)]
        self.procs += [subprocess.Popen([dask, "worker", self.address, "--nthreads", "1", "--nworkers", "1",
                                         "--no-dashboard", "--host", "127.0.0.1"], **quiet) for _ in range(workers)]
        from distributed import Client

        deadline = time.time() + 120
        while True:
            try:
                with Client(self.address, timeout="5s") as client:
                    client.wait_for_workers(workers, timeout=120)
                return
            except OSError:
                if time.time() > deadline:
                    raise
                time.sleep(0.5)

    def close(self) -> None:
        import signal

        for p in self.procs:
            os.killpg(p.pid, signal.SIGTERM)
        for p in self.procs:
            p.wait(timeout=30)


def probe(cfg) -> tuple[float, float]:
    from shardkit.jobs.pool import gil_share_median
    from shardkit.stages.image import process_image

    datas = [p.read_bytes() for p in sorted(Path(cfg.src).rglob("*.jpg"))[:8]]
    turn = iter(range(1 << 62))
    return gil_share_median(lambda: process_image(datas[next(turn) % len(datas)], cfg), rounds=5, seconds=1.0)


def main() -> int:
    import shutil
    from dataclasses import asdict, replace

    from shardkit.config import BuildConfig

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", default="2000,12000")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--workdir", default="bench/out/build-pool")
    ap.add_argument("--scheduler", action="store_true",
                    help="also build with --scheduler on `dask scheduler` + one `dask worker` per core")
    args = ap.parse_args()
    small, big = sorted(int(x) for x in args.images.split(","))
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    cores = os.cpu_count() or 1
    print(f"machine: {cores} cores; load average {os.getloadavg()[0]:.1f}")
    cfgs = {n: BuildConfig(src=str(folder(work, n, big)), out=str(work / f"out-{n}"), image_size=224,
                           resize_mode="center-crop", encode="raw", progress=False) for n in (small, big)}
    share, seconds = probe(cfgs[small])
    print(f"GIL probe: {seconds * 1e3:.2f} ms per image on a worker thread, {share:.0%} of it holding the GIL: "
          f"threads cap near {1 / max(share * seconds, 1e-6):,.0f} images/s; {cores} processes do ~{cores / seconds:,.0f}/s")
    kinds = ("build", "pool") + (("scheduler",) if args.scheduler else ())
    runs = {(kind, n): [] for kind in kinds for n in (small, big)}
    pool_line = ""
    real = RealCluster(cores) if args.scheduler else None
    try:
        for rep in range(args.reps):
            for n in (small, big):
                shutil.rmtree(cfgs[n].out, ignore_errors=True)
                b = child(CHILD, json.dumps(asdict(cfgs[n])))
                assert b["samples"] == n, b
                p = child(POOL, json.dumps(asdict(cfgs[n])), str(cores))
                assert p["samples"] == n, p
                runs[("build", n)].append(b["seconds"])
                runs[("pool", n)].append(p["seconds"])
                pool_line = b["pool"] or pool_line
                line = (f"  rep {rep}, {n:>6,} images: build {b['seconds']:6.2f} s ({n / b['seconds']:5.0f}/s), "
                        f"Pool({cores}) {p['seconds']:6.2f} s ({n / p['seconds']:5.0f}/s)")
                if real is not None:
                    shutil.rmtree(cfgs[n].out, ignore_errors=True)
                    r = child(CHILD, json.dumps(asdict(replace(cfgs[n], scheduler=real.address))))
                    assert r["samples"] == n, r
                    runs[("scheduler", n)].append(r["seconds"])
                    line += f", --scheduler {r['seconds']:6.2f} s ({n / r['seconds']:5.0f}/s)"
                print(line, flush=True)
    finally:
        if real is not None:
            real.close()
    med = {k: statistics.median(v) for k, v in runs.items()}
    inc = {kind: (big - small) / (med[(kind, big)] - med[(kind, small)]) for kind in kinds}
    fixed = med[("build", small)] - small / inc["build"]
    pool_fixed = med[("pool", small)] - small / inc["pool"]
    print(f"{pool_line}")
    print(f"incremental rate {small:,} → {big:,} images (medians): build {inc['build']:,.0f}/s, "
          f"Pool({cores}) {inc['pool']:,.0f}/s: ratio {inc['build'] / inc['pool']:.2f} (target >= 0.9)")
    print(f"fixed start: build {fixed:.2f} s (target <= 1.5 s), Pool({cores}) {pool_fixed:.2f} s; "
          f"at {big:,} images build / Pool = {med[('pool', big)] / med[('build', big)]:.2f}")
    if args.scheduler:
        print(f"--scheduler ({cores} `dask worker` processes): incremental {inc['scheduler']:,.0f}/s = "
              f"{inc['scheduler'] / inc['pool']:.2f} of the Pool's, {inc['scheduler'] / inc['build']:.2f} of the "
              f"embedded default's")
    return 0


if __name__ == "__main__":
    sys.exit(main())
