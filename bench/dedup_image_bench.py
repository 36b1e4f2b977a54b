"""Image dedup benchmark: `shardkit dedup RAW OUT` end to end vs a one-process PHash loop (imagededup's
method: decode, 32x32 grey, DCT, median; then every pair within 10 bits) over the same folder.

The folder: ~300 camera-size photo-like JPEGs (180 originals 2400-4000 px wide, 40 copies each
resized to half, re-encoded at q60, cropped 2%), generated once. Each run is a fresh process,
variants interleaved, so imports and cluster start count as a user would pay them. Also prints
the pairs each finds of the planted copies, and runs imagededup's own PHash when it is installed.

    .venv/bin/python bench/dedup_image_bench.py [--reps 3] [--folder /tmp/shardkit-bench-photos]
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

import pyarrow.parquet as pq

HERE = os.path.dirname(os.path.abspath(__file__))
TARGET = 0.8

LOOP = r'''
import json, os, sys, time
import numpy as np
from PIL import Image
try:
    from scipy.fftpack import dct
except ImportError:  # the same DCT-II (unnormalised, as scipy.fftpack's default) by matrix
    k = np.arange(32)
    M = 2 * np.cos(np.pi * (2 * k[None, :] + 1) * k[:, None] / 64)
    dct = lambda a, axis: np.moveaxis(np.tensordot(M, np.moveaxis(a, axis, 0), axes=1), 0, axis)
folder = sys.argv[1]
names = sorted(n for n in os.listdir(folder) if n.endswith(".jpg"))
hashes = []
for n in names:  # imagededup's PHash: load_image(target_size=(32, 32), grayscale=True), then DCT
    img = Image.open(os.path.join(folder, n))
    if img.mode != "RGB":
        img = img.convert("RGBA").convert("RGB")
    a = np.asarray(img.resize((32, 32), Image.Resampling.LANCZOS).convert("L"), dtype=np.float64)
    low = dct(dct(a, axis=0), axis=1)[:8, :8]
    bits = (low >= np.median(low.ravel()[1:])).ravel()
    hashes.append(int("".join("1" if b else "0" for b in bits), 2))
h = np.array(hashes, dtype=np.uint64)
d = np.bitwise_count(h[:, None] ^ h[None, :])
i, j = np.nonzero(np.triu(d <= 10, k=1))
print(json.dumps([[names[a], names[b]] for a, b in zip(i.tolist(), j.tolist())]))
'''

IMAGEDEDUP = r'''
import json, sys
from imagededup.methods import PHash
dups = PHash().find_duplicates(image_dir=sys.argv[1], max_distance_threshold=10)
print(json.dumps(sorted({tuple(sorted((a, b))) for a, bs in dups.items() for b in bs})))
'''


def make_folder(folder: str) -> dict:
    from shardkit.demo.datagen import generated, near_duplicate_photos

    truth_path = folder.rstrip("/") + ".truth.json"

    def make(path):
        truth = near_duplicate_photos(path)
        with open(truth_path, "w") as f:
            json.dump(truth, f)
    generated(folder, make, "~300 camera-size photos with planted near-duplicate copies")
    with open(truth_path) as f:
        return json.load(f)


def run_loop(folder: str, script: str) -> tuple[float, set]:
    start = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", script, folder], check=True, capture_output=True, text=True).stdout
    return time.perf_counter() - start, {tuple(sorted(p)) for p in json.loads(out.strip().splitlines()[-1])}


def run_shardkit(folder: str, workers: str | None) -> tuple[float, set, dict]:
    out = tempfile.mkdtemp(prefix="shardkit-dedup-bench-")
    cmd = [os.path.join(os.path.dirname(sys.executable), "shardkit"), "dedup", folder, out, "--no-progress"]
    if workers is not None:
        cmd += ["--workers", workers]
    start = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True)
    seconds = time.perf_counter() - start
    rows = pq.read_table(os.path.join(out, "dedup", "clusters.parquet")).to_pylist()
    with open(os.path.join(out, "dedup", "summary.json")) as f:
        summary = json.load(f)
    shutil.rmtree(out)
    return seconds, {tuple(sorted((r["source"], r["duplicate_of_source"]))) for r in rows if not r["kept"]}, summary


def found(pairs: set, truth: dict) -> str:
    """Planted copies found, per kind: a copy counts when it is linked to its original, directly or
    through the cluster (shardkit reports each removed sample against the kept one)."""
    parent: dict = {}

    def root(x):
        while parent.get(x, x) != x:
            x = parent[x]
        return x
    for a, b in pairs:
        ra, rb = root(a), root(b)
        if ra != rb:
            parent[max(ra, rb)] = min(ra, rb)
    return ", ".join(f"{kind} {sum(root(o) == root(c) for o, c in copies)}/{len(copies)}"
                     for kind, copies in truth.items())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--folder", default=os.path.join(tempfile.gettempdir(), "shardkit-bench-photos"))
    args = ap.parse_args()
    truth = make_folder(args.folder)
    files = [n for n in os.listdir(args.folder) if n.endswith(".jpg")]
    mb = sum(os.path.getsize(os.path.join(args.folder, n)) for n in files) / 1e6
    variants = {"phash loop, 1 process": lambda: run_loop(args.folder, LOOP),
                "shardkit dedup (default)": lambda: run_shardkit(args.folder, None),
                "shardkit dedup --workers 0": lambda: run_shardkit(args.folder, "0"),
                "shardkit dedup --workers 2": lambda: run_shardkit(args.folder, "2")}
    try:
        import imagededup  # noqa: F401
        variants["imagededup PHash"] = lambda: run_loop(args.folder, IMAGEDEDUP)
    except ImportError:
        pass
    times: dict = {k: [] for k in variants}
    pairs, modes = {}, {}
    for _ in range(args.reps):  # interleaved: machine noise hits every variant alike
        for name, fn in variants.items():
            got = fn()
            times[name].append(got[0])
            pairs[name] = got[1]
            if len(got) > 2:
                modes[name] = got[2]["execution"]
    loop = statistics.median(times["phash loop, 1 process"])
    print(f"folder: {len(files)} JPEGs, {mb:.0f} MB; {args.reps} interleaved repetitions, each a fresh process")
    for name, t in times.items():
        ratio = statistics.median(t) / loop
        how = f"  [{modes[name]['mode']}: {modes[name]['reason']}]" if name in modes else ""
        print(f"  {name:<28} {statistics.median(t):6.2f} s  ({min(t):.2f}-{max(t):.2f})  {ratio:.2f}x the loop; "
              f"found {found(pairs[name], truth)}{how}")
    ratio = statistics.median(times["shardkit dedup (default)"]) / loop
    print(f"  shardkit dedup (default) / phash loop = {ratio:.2f} (target <= {TARGET})")
    return 0 if ratio <= TARGET else 1


if __name__ == "__main__":
    sys.exit(main())
