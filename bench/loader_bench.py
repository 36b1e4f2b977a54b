"""Loader benchmark: StreamingDataset vs. webdataset vs. a raw-folder Dataset, interleaved in one run.

    .venv/bin/python bench/loader_bench.py            # 3,000 images, 5 rounds (~5 min on 2 cores)
    .venv/bin/python bench/loader_bench.py --n 600 --rounds 2   # quick check

Generated data is kept in $TMPDIR/shardkit-loader-bench-N and reused by the next run (--work).
Prints samples/s per path (median of the rounds) and the ratios its targets name, each the median
of its per-round ratios.
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import sys
import tempfile
import time
from multiprocessing import Pool

import numpy as np

SIZE = 224


def _source_image(args):
    root, i, classes = args
    from shardkit.demo.datagen import _jpeg, photo_like

    rng = np.random.default_rng([0, i])
    w, h = int(500 * rng.uniform(0.9, 1.1)), int(375 * rng.uniform(0.9, 1.1))
    path = os.path.join(root, f"class_{i % classes:02d}", f"{i:06d}.jpg")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(_jpeg(photo_like(rng, w, h), 90))
    return path


def resize_crop(im, size: int = SIZE, shorter: int = SIZE):
    """Resize the shorter side to `shorter`, then center-crop size x size."""
    from PIL import Image

    w, h = im.size
    s = shorter / min(w, h)
    im = im.resize((max(size, round(w * s)), max(size, round(h * s))), Image.BILINEAR)
    w, h = im.size
    left, top = (w - size) // 2, (h - size) // 2
    return im.crop((left, top, left + size, top + size))


def _prepared(path: str):
    from PIL import Image

    from shardkit.demo.datagen import _jpeg

    im = resize_crop(Image.open(path).convert("RGB"))
    return _jpeg(im, 90), np.asarray(im).tobytes()


def prepare(work: str, n: int, shard: int = 500) -> tuple[str, str, str]:
    """Raw folder of n ~500x375 JPEGs, and 224^2 JPEG and raw-uint8 datasets (tar + Parquet)."""
    from shardkit.manifest import Manifest, write_manifest
    from shardkit.sample import Sample
    from shardkit.writers import get_writer

    folder, jpeg_root, raw_root = (os.path.join(work, d) for d in ("folder", "jpeg", "raw"))
    with Pool(2) as pool:
        paths = sorted(pool.map(_source_image, [(folder, i, 10) for i in range(n)], chunksize=16))
        prepared = pool.map(_prepared, paths, chunksize=16)
    keys = [os.path.relpath(p, folder)[:-4] for p in paths]
    labels = [int(k.split("/")[0][-2:]) for k in keys]
    specs = {"jpeg": {"jpg": {"kind": "image", "encoding": "jpeg"}, "cls": {"kind": "int", "dtype": "int64"}},
             "raw": {"raw": {"kind": "image", "encoding": "raw", "dtype": "uint8", "shape": [SIZE, SIZE, 3]},
                     "cls": {"kind": "int", "dtype": "int64"}}}
    for root, name, col in ((jpeg_root, "jpg", 0), (raw_root, "raw", 1)):
        fields, infos = specs["jpeg" if name == "jpg" else "raw"], []
        for sid, lo in enumerate(range(0, n, shard)):
            samples = [Sample(keys[i], {name: prepared[i][col], "cls": labels[i]})
                       for i in range(lo, min(n, lo + shard))]
            infos += [get_writer(fmt)(samples, root, sid, fields) for fmt in ("tar", "parquet")]
        write_manifest(root, Manifest(samples=n, fields=fields, shards=infos,
                                      classes=[f"class_{c:02d}" for c in range(10)]))
    return folder, jpeg_root, raw_root


class FolderDataset:
    """The baseline: a map-style Dataset over the raw folder (open + resize + crop every time)."""

    def __init__(self, folder: str):
        self.paths = sorted(os.path.join(d, f) for d, _, fs in os.walk(folder) for f in fs)

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, i):
        import torch
        from PIL import Image

        im = resize_crop(Image.open(self.paths[i]).convert("RGB"), SIZE, 256)
        label = int(os.path.basename(os.path.dirname(self.paths[i]))[-2:])
        return torch.from_numpy(np.asarray(im).copy()).permute(2, 0, 1), label


def _wds_jpeg(sample):
    import torch
    from PIL import Image

    arr = np.asarray(Image.open(io.BytesIO(sample["jpg"])).convert("RGB"))
    return torch.from_numpy(arr.copy()).permute(2, 0, 1), int(sample["cls"])


def _wds_raw(sample):
    import torch

    arr = torch.frombuffer(bytearray(sample["raw"]), dtype=torch.uint8).reshape(SIZE, SIZE, 3)
    return arr.permute(2, 0, 1), int(sample["cls"])


def loaders(folder, jpeg_root, raw_root, workers: int, batch: int, checksums: bool = True) -> dict:
    """name -> iterable of batches (one epoch per iter); every loader keeps its workers alive."""
    import torch
    import webdataset as wds

    from shardkit.loader import make_loader
    from shardkit.reader.dataset import StreamingDataset

    def tars(root):
        return sorted(os.path.join(root, "shards", f) for f in os.listdir(os.path.join(root, "shards"))
                      if f.endswith(".tar"))

    def wds_loader(root, fn):
        ds = wds.WebDataset(tars(root), shardshuffle=False, empty_check=False).map(fn).batched(batch)
        return torch.utils.data.DataLoader(ds, batch_size=None, num_workers=workers, persistent_workers=True)

    def ours(root, fmt):
        options = {} if checksums else {"checksums": False}  # (also runs the reader of versions without them)
        return make_loader(StreamingDataset(root, format=fmt, seed=0, **options), batch_size=batch,
                           num_workers=workers)

    return {
        "folder (map-style, PIL open+resize+crop)": torch.utils.data.DataLoader(
            FolderDataset(folder), batch_size=batch, shuffle=True, num_workers=workers, persistent_workers=True),
        "webdataset jpeg tar": wds_loader(jpeg_root, _wds_jpeg),
        "webdataset raw tar": wds_loader(raw_root, _wds_raw),
        "shardkit jpeg tar": ours(jpeg_root, "tar"),
        "shardkit jpeg parquet": ours(jpeg_root, "parquet"),
        "shardkit raw tar": ours(raw_root, "tar"),
        "shardkit raw parquet": ours(raw_root, "parquet"),
    }


def count(batch) -> int:
    if isinstance(batch, dict):
        return len(batch["__key__"])
    return len(batch[0])


def timed(loader, min_seconds: float, max_samples: int) -> float:
    """Samples/s over whole epochs, until min_seconds passed or max_samples were read."""
    n, t0 = 0, time.perf_counter()
    while True:
        for batch in loader:
            n += count(batch)
            if n >= max_samples:
                break
        elapsed = time.perf_counter() - t0
        if elapsed >= min_seconds or n >= max_samples:
            return n / elapsed


def warm_then_timed(loader, seconds: float) -> float:
    """Samples/s over whole epochs for at least `seconds`, after one untimed epoch (workers
    started, page cache filled)."""
    for _ in loader:
        pass
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for batch in loader:
            n += count(batch)
    return n / (time.perf_counter() - t0)


_BLOBS: list = []


def _decode_loop(seconds: float) -> int:
    """PIL decode of the same 224^2 JPEG bytes to an array, as a user's decode would: count."""
    from PIL import Image

    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for b in _BLOBS:
            np.asarray(Image.open(io.BytesIO(b)).convert("RGB"))
            n += 1
    return n


def load_blobs(jpeg_root: str) -> None:
    from shardkit.manifest import load_manifest
    from shardkit.reader.shards import read_shard_samples

    m = load_manifest(jpeg_root)
    _BLOBS[:] = [s.fields["jpg"] for s in read_shard_samples(jpeg_root, m, m.shards_of("tar")[0])][:100]


def decode_limit(seconds: float, procs: int = 1) -> float:
    """Decode-only images/s: one loop in this process, or `procs` loops at once (forked)."""
    t0 = time.perf_counter()
    if procs == 1:
        return _decode_loop(seconds) / (time.perf_counter() - t0)
    import multiprocessing

    with multiprocessing.get_context("fork").Pool(procs) as pool:
        counts = pool.map(_decode_loop, [seconds] * procs)
    return sum(counts) / (time.perf_counter() - t0)


def prepared(work: str | None, n: int, name: str = "shardkit-loader-bench") -> str:
    """The data folder (default $TMPDIR/<name>-N) holding the n images and datasets of prepare(),
    made on the first run and reused after."""
    work = work or os.path.join(tempfile.gettempdir(), f"{name}-{n}")
    if _existing(os.path.join(work, "raw")) != n:
        prepare(work, n)
    return work


def run_child(code: str, *args) -> dict:
    """Run `code` in a fresh interpreter with `args` as its argv; its last line of output is JSON."""
    import json
    import subprocess

    here = os.path.dirname(os.path.abspath(__file__))  # the child may import this module
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")]))}
    out = subprocess.run([sys.executable, "-c", code, *map(str, args)], check=True, capture_output=True, text=True,
                         env=env)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _existing(root: str) -> int | None:
    """Samples of a dataset left by an earlier run with the same --work (reused), else None."""
    import json

    try:
        with open(os.path.join(root, "manifest.json")) as f:
            return json.load(f)["samples"]
    except (OSError, ValueError, KeyError):
        return None


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=3000, help="source images (default 3000)")
    p.add_argument("--rounds", type=int, default=5, help="interleaved repetitions (default 5)")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--seconds", type=float, default=1.0, help="minimum timed seconds per path per round")
    p.add_argument("--no-checksums", dest="checksums", action="store_false",
                   help="read without checking values against their checksums (StreamingDataset(checksums=False))")
    p.add_argument("--work", default=None,
                   help="folder for generated data, reused when it already holds --n images "
                        "(default: $TMPDIR/shardkit-loader-bench-N)")
    args = p.parse_args(argv)
    work = args.work or os.path.join(tempfile.gettempdir(), f"shardkit-loader-bench-{args.n}")
    t0 = time.perf_counter()
    folder, jpeg_root, raw_root = (os.path.join(work, d) for d in ("folder", "jpeg", "raw"))
    if _existing(raw_root) != args.n:
        prepare(work, args.n)
    print(f"data: {args.n} images in {work} ({time.perf_counter() - t0:.0f}s to prepare)", flush=True)
    runs = loaders(folder, jpeg_root, raw_root, args.workers, args.batch, args.checksums)
    for loader in runs.values():  # warm-up: start workers, fill the page cache
        timed(loader, 0, 2 * args.batch)
    load_blobs(jpeg_root)
    concurrent = f"decode-only, {args.workers} loops at once"
    steps = {name: (lambda lo=loader: timed(lo, args.seconds, 10**9)) for name, loader in runs.items()}
    folder_name = next(n for n in runs if n.startswith("folder"))
    steps[folder_name] = lambda: timed(runs[folder_name], args.seconds, 4 * args.batch)  # slow: fewer
    steps["decode-only limit (1 core)"] = lambda: decode_limit(args.seconds / 2)
    steps[concurrent] = lambda: decode_limit(args.seconds, args.workers)
    # Each ratio's two sides run next to each other, so they see about the same machine load.
    order = ["decode-only limit (1 core)", "shardkit jpeg tar", concurrent, "shardkit jpeg parquet",
             "webdataset jpeg tar", folder_name, "shardkit raw tar", "webdataset raw tar", "shardkit raw parquet"]
    rates = {name: [] for name in order}
    for r in range(args.rounds):
        for name in order:
            rates[name].append(steps[name]())
        print(f"round {r + 1}/{args.rounds} done", flush=True)
    report(rates, args.workers)
    return 0


def report(rates: dict, workers: int) -> None:
    """Median rates, and each ratio as the median of its per-round ratios: A and B of a ratio
    ran back to back in every round, so a round's ratio shares that moment's machine load."""
    for name, values in rates.items():
        spread = f"{min(values):,.0f}-{max(values):,.0f}"
        print(f"{name:44s} {statistics.median(values):10,.0f} samples/s  (rounds: {spread})")

    def ratio(a: str, b: str, scale: float = 1.0) -> str:
        per_round = [x / (y * scale) for x, y in zip(rates[a], rates[b])]
        return f"{statistics.median(per_round):6.2f}  (rounds {min(per_round):.2f}-{max(per_round):.2f})"

    folder, single = "folder (map-style, PIL open+resize+crop)", "decode-only limit (1 core)"
    both = f"decode-only, {workers} loops at once"
    print(f"\nratios (median of per-round ratios, {workers} workers):")
    for fmt in ("tar", "parquet"):
        raw, jpeg = f"shardkit raw {fmt}", f"shardkit jpeg {fmt}"
        print(f"  raw {fmt:7s} / webdataset raw tar        = {ratio(raw, 'webdataset raw tar')}  target >= 6")
        print(f"  raw {fmt:7s} / folder loader             = {ratio(raw, folder)}  target >= 40")
        print(f"  raw {fmt:7s} samples/s                   = {statistics.median(rates[raw]):8,.0f}  target >= 10,000")
        print(f"  jpeg {fmt:7s} / decode limit x {workers}        = {ratio(jpeg, single, workers)}  target >= 0.90")
        print(f"  jpeg {fmt:7s} / {workers} decode loops at once = {ratio(jpeg, both)}")
        print(f"  jpeg {fmt:7s} / folder loader            = {ratio(jpeg, folder)}  target >= 6")
    print(f"  webdataset jpeg / decode limit x {workers}     = {ratio('webdataset jpeg tar', single, workers)}")
    print(f"  webdataset raw  / folder loader        = {ratio('webdataset raw tar', folder)}")


if __name__ == "__main__":
    sys.exit(main())
