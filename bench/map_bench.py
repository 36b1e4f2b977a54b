"""build_map vs multiprocessing.Pool(2) mapping the same user resize over photo-like JPEGs.

    .venv/bin/python bench/map_bench.py [--n 6000] [--small 2000] [--rounds 2] [--pools processes,threads]

The user function opens a JPEG (~500x375), resizes its shorter side to 224, center-crops 224² and
returns it (build_map stores it as JPEG q90 in tar shards, with checksums, index, manifest; the
Pool variant returns the JPEG bytes to the parent and stores nothing). Incremental rate: the extra
images over the extra seconds between a run of --small and one of --n images, so start-up (the
cluster's, the pool's) cancels out. Variants alternate; the ratio is the median of per-round ratios.
"""

from __future__ import annotations

import argparse
import io
import multiprocessing
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # so worker processes import user_resize


def user_resize(path: str) -> dict:
    from PIL import Image

    with Image.open(path) as im:
        im.draft("RGB", (224, 224))  # what a careful user does: JPEG decodes at 1/2-1/8 scale
        im = im.convert("RGB")
    s = 224 / min(im.size)
    im = im.resize((max(224, round(im.width * s)), max(224, round(im.height * s))), Image.BICUBIC)
    left, top = (im.width - 224) // 2, (im.height - 224) // 2
    return {"__key__": Path(path).stem, "jpg": im.crop((left, top, left + 224, top + 224))}


def pool_fn(path: str) -> bytes:
    buf = io.BytesIO()
    user_resize(path)["jpg"].save(buf, "JPEG", quality=90)
    return buf.getvalue()


def run_pool(paths, out) -> None:
    with multiprocessing.get_context("fork").Pool(2) as pool:
        for _ in pool.imap(pool_fn, paths, chunksize=16):
            pass


def run_map(pool: str):
    def run(paths, out) -> None:
        from shardkit import build_map

        shutil.rmtree(out, ignore_errors=True)
        r = build_map(user_resize, paths, out, workers=2, worker_pool=pool, encode="jpeg", progress=False)
        assert r.samples == len(paths), r.rejections[:3]
    return run


def seconds(fn, paths, out) -> float:
    start = time.perf_counter()
    fn(paths, out)
    return time.perf_counter() - start


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--n", type=int, default=6000)
    p.add_argument("--small", type=int, default=2000)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--pools", default="processes,threads")
    p.add_argument("--data", default=os.path.expanduser("~/.cache/shardkit-bench/photos-6000"))
    a = p.parse_args()
    from shardkit.demo.datagen import generated, image_folder

    generated(a.data, lambda root: image_folder(root, n=6000), "6,000 photo-like JPEGs")
    paths = sorted(str(x) for x in Path(a.data).rglob("*.jpg"))[:a.n]
    out = tempfile.mkdtemp()
    variants = {"Pool(2)": run_pool} | {f"build_map {pool}": run_map(pool) for pool in a.pools.split(",")}
    rates = {name: [] for name in variants}
    try:
        for r in range(a.rounds):  # sizes interleaved too: every variant's small and large runs share the load
            names = list(variants) if r % 2 == 0 else list(variants)[::-1]
            took = {}
            for size in (a.small, len(paths)):
                for name in names:
                    took[name, size] = seconds(variants[name], paths[:size], os.path.join(out, "o"))
            expected = (len(paths) - a.small) / len(paths)  # the share of the large run the extra images take
            for name in names:
                small, large = took[name, a.small], took[name, len(paths)]
                if (large - small) / large < expected / 3:  # the load changed between the two runs: no rate
                    print(f"round {r} {name}: {a.small} in {small:.1f} s, {len(paths)} in {large:.1f} s -> "
                          "not comparable (the machine's load changed between them): round left out", flush=True)
                    rates[name].append(None)
                    continue
                rates[name].append((len(paths) - a.small) / (large - small))
                print(f"round {r} {name}: {a.small} in {small:.1f} s, {len(paths)} in {large:.1f} s -> "
                      f"incremental {rates[name][-1]:,.0f} images/s, whole run {len(paths) / large:,.0f}/s", flush=True)
    finally:
        shutil.rmtree(out, ignore_errors=True)
    base = rates["Pool(2)"]
    for name in variants:
        ratios = [x / b for x, b in zip(rates[name], base) if x is not None and b is not None]
        kept = [x for x in rates[name] if x is not None]
        if not ratios:
            print(f"{name:24s} no comparable round")
            continue
        print(f"{name:24s} {statistics.median(kept):7,.0f} images/s  ratio to Pool(2) "
              f"{statistics.median(ratios):.2f} (rounds {min(ratios):.2f}-{max(ratios):.2f}, {len(ratios)} comparable)")


if __name__ == "__main__":
    main()
