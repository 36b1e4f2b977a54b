"""ShardWriter vs webdataset.ShardWriter: samples/s writing the same samples, one process, in one run.

    .venv/bin/python bench/writer_bench.py [--raw 1500] [--jpeg 5000] [--rounds 3]

Raw: a 224x224x3 uint8 array + an int label per sample (shardkit: an array field; webdataset: .npy
through its default encoder). JPEG: the same 224² JPEG bytes (~15 KB, photo-like) + label for both.
Shards of 1,000 samples. shardkit's time includes what webdataset does not do: per-value xxh3,
sha256 of every file, the tar index sidecar, an fsync per file, key bounds and the manifest
(close()). Variants alternate within each round; the ratio is the median of per-round ratios.
"""

from __future__ import annotations

import argparse
import io
import os
import shutil
import statistics
import tempfile
import time

import numpy as np


def samples(kind: str, n: int) -> list[dict]:
    from shardkit.datagen import photo_like

    rng = np.random.default_rng(0)
    base = [np.asarray(photo_like(rng, 224, 224).convert("RGB")) for _ in range(32)]
    out = []
    for i in range(n):
        arr = base[i % len(base)]
        if kind == "raw":
            out.append({"__key__": f"{i:08d}", "raw": arr, "cls": i % 10})
        else:
            buf = io.BytesIO()
            from PIL import Image
            Image.fromarray(arr).save(buf, "JPEG", quality=90 - i % 7)
            out.append({"__key__": f"{i:08d}", "jpg": buf.getvalue(), "cls": i % 10})
    return out


def write_wds(rows: list[dict], out: str) -> None:
    import webdataset as wds

    os.makedirs(out)
    with wds.ShardWriter(os.path.join(out, "data-%05d.tar"), maxcount=1000, maxsize=2**40, verbose=0) as w:
        for r in rows:
            w.write({"__key__": r["__key__"], "npy" if "raw" in r else "jpg": r.get("raw", r.get("jpg")),
                     "cls": r["cls"]})


def write_shardkit(rows: list[dict], out: str) -> None:
    from shardkit import ShardWriter

    with ShardWriter(out, max_samples_per_shard=1000, shard_size=2**40) as w:
        for r in rows:
            w.write(r)


def timed(fn, rows, root: str) -> float:
    out = os.path.join(root, "out")
    shutil.rmtree(out, ignore_errors=True)
    start = time.perf_counter()
    fn(rows, out)
    return len(rows) / (time.perf_counter() - start)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--raw", type=int, default=1500)
    p.add_argument("--jpeg", type=int, default=5000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--tmp", default=None, help="folder for the shards [default: a temp folder on /tmp]")
    a = p.parse_args()
    root = tempfile.mkdtemp(dir=a.tmp)
    try:
        for kind, n in (("raw", a.raw), ("jpeg", a.jpeg)):
            rows = samples(kind, n)
            timed(write_shardkit, rows[:200], root), timed(write_wds, rows[:200], root)  # warm both
            rates = {"webdataset": [], "shardkit": []}
            for r in range(a.rounds):
                order = [("webdataset", write_wds), ("shardkit", write_shardkit)]
                for name, fn in order if r % 2 == 0 else order[::-1]:
                    rates[name].append(timed(fn, rows, root))
            ratios = [s / w for s, w in zip(rates["shardkit"], rates["webdataset"])]
            print(f"{kind:5s} n={n}: webdataset {statistics.median(rates['webdataset']):,.0f}/s "
                  f"{[round(x) for x in rates['webdataset']]}  shardkit {statistics.median(rates['shardkit']):,.0f}/s "
                  f"{[round(x) for x in rates['shardkit']]}  ratio {statistics.median(ratios):.2f} "
                  f"(rounds {min(ratios):.2f}-{max(ratios):.2f})", flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
