"""ShardWriter vs webdataset.ShardWriter: samples/s writing the same samples, one process, in one run.

    .venv/bin/python bench/writer_bench.py [--raw 1500] [--jpeg 5000] [--rounds 3]

Raw: a 224x224x3 uint8 array + an int label per sample (shardkit: an array field; webdataset: .npy
through its default encoder). JPEG: the same 224² JPEG bytes (~15 KB, photo-like) + label for both.
Shards of 1,000 samples. shardkit's time includes what webdataset does not do: per-value xxh3,
sha256 of every file, the tar index sidecar, an fsync per file, key bounds and the manifest
(close()). Variants alternate within each round; the ratio is the median of per-round ratios, of
wall-clock rates and of rates per CPU second of the writing process (all threads: steadier than the
wall clock on a shared machine; it leaves out the kernel's write-back of dirty pages, which
`os.sync()` before each variant keeps from spilling into the next one's time).
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
    from shardkit.demo.datagen import photo_like

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


def write_wds_fsync(rows: list[dict], out: str) -> None:
    """webdataset, then each shard fsynced: what shardkit does before its manifest names a shard."""
    write_wds(rows, out)
    for name in sorted(os.listdir(out)):
        fd = os.open(os.path.join(out, name), os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)


def write_shardkit(rows: list[dict], out: str) -> None:
    from shardkit import ShardWriter

    with ShardWriter(out, max_samples_per_shard=1000, shard_size=2**40) as w:
        for r in rows:
            w.write(r)


def timed(fn, rows, root: str) -> tuple[float, float]:
    """(samples per wall second, samples per CPU second of this process, all its threads)."""
    out = os.path.join(root, "out")
    shutil.rmtree(out, ignore_errors=True)
    os.sync()  # the previous variant's dirty pages are not this one's to write back
    start, cpu = time.perf_counter(), time.process_time()
    fn(rows, out)
    return len(rows) / (time.perf_counter() - start), len(rows) / (time.process_time() - cpu)


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
            order = [("webdataset", write_wds), ("shardkit", write_shardkit), ("webdataset+fsync", write_wds_fsync)]
            rates = {name: [] for name, _ in order}
            for r in range(a.rounds):
                for name, fn in order if r % 2 == 0 else order[::-1]:
                    rates[name].append(timed(fn, rows, root))
            for j, what in ((0, "wall"), (1, "CPU")):
                sk_r = [x[j] for x in rates["shardkit"]]
                line = f"{kind:5s} n={n} per {what} s: shardkit {statistics.median(sk_r):,.0f}/s {[round(x) for x in sk_r]}"
                for base in ("webdataset", "webdataset+fsync"):
                    b_r = [x[j] for x in rates[base]]
                    ratios = [s / w for s, w in zip(sk_r, b_r)]
                    line += (f" | {base} {statistics.median(b_r):,.0f}/s {[round(x) for x in b_r]} ratio "
                             f"{statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f})")
                print(line, flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
