"""Augmentation benchmark: per-epoch loader cost with offline variants (`build --augment K`) vs the
same PIL ops on the fly in the loader, interleaved epochs in one run; plus the storage multiplier
and the epochs after which the one-time build cost is paid back.

    .venv/bin/python bench/augment_bench.py [--n 1500] [--k 4] [--epochs 3] [--workers 2]
"""

from __future__ import annotations

import argparse
import itertools
import shutil
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from shardkit.config import BuildConfig
from shardkit.demo.datagen import generated, image_folder
from shardkit.jobs.build import build
from shardkit.contract import key_hash
from shardkit.stages.augment import apply_ops, parse_ops


def on_the_fly(ops: tuple[str, ...], seed: int):
    """A batch_transform doing what a training script would: decoded image -> PIL ops -> tensor."""
    calls = itertools.count()  # a fresh draw per batch and epoch; seeded, never from time or pid

    def transform(batch: dict) -> dict:
        import torch
        from PIL import Image

        images, call = batch["jpg"], next(calls)
        out = torch.empty_like(images)
        for i, key in enumerate(batch["__key__"]):
            im = Image.fromarray(images[i].permute(1, 2, 0).numpy())
            rng = np.random.default_rng([seed, key_hash(key), call])
            out[i] = torch.from_numpy(np.array(apply_ops(im, ops, rng))).permute(2, 0, 1)
        batch["jpg"] = out
        return batch

    return transform


def epoch_seconds(loader) -> float:
    start, n = time.perf_counter(), 0
    for batch in loader:
        n += len(batch["__key__"])
    assert n == len(loader.source)
    return time.perf_counter() - start


def timed_build(cfg: BuildConfig) -> tuple[float, int]:
    shutil.rmtree(cfg.out, ignore_errors=True)
    start = time.perf_counter()
    result = build(cfg)
    return time.perf_counter() - start, sum(s.bytes for s in result.shards)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=1500, help="photo-like JPEGs ~500x375")
    ap.add_argument("--k", type=int, default=4, help="variants per image")
    ap.add_argument("--ops", default="crop,flip,color")
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--workdir", default="bench/out/augment")
    args = ap.parse_args()
    from shardkit.loader import make_loader
    from shardkit.reader.dataset import StreamingDataset

    work = Path(args.workdir)
    raw = work / f"raw-{args.n}"
    generated(raw, lambda root: image_folder(root, n=args.n, classes=10, size=(500, 375), seed=0),
              f"{args.n} images")
    common = dict(src=str(raw), format="tar", image_size=args.size, resize_mode="center-crop",
                  workers=args.workers, progress=False, max_samples_per_shard=250)
    plain_s, plain_b = timed_build(BuildConfig(out=str(work / "plain"), **common))
    aug_s, aug_b = timed_build(BuildConfig(out=str(work / "offline"), augment=args.k, augment_ops=args.ops, **common))
    print(f"{args.n} images -> {args.size}² JPEG q90, ops {args.ops}, K={args.k}, {args.workers} loader workers")
    print(f"build: plain {plain_s:.1f} s, offline K={args.k} {aug_s:.1f} s; storage {plain_b / 1e6:.1f} MB -> "
          f"{aug_b / 1e6:.1f} MB (multiplier {aug_b / plain_b:.2f}x)")
    offline = make_loader(StreamingDataset(str(work / "offline"), seed=0), batch_size=args.batch_size,
                          num_workers=args.workers, pin_memory=False)
    fly = make_loader(StreamingDataset(str(work / "plain"), seed=0, batch_transform=on_the_fly(parse_ops(args.ops), 0)),
                      batch_size=args.batch_size, num_workers=args.workers, pin_memory=False)
    epoch_seconds(offline), epoch_seconds(fly)  # warm-up: workers started, page cache filled
    off, on = [], []
    for epoch in range(args.epochs):  # interleaved epochs, same data, same workers
        off.append(epoch_seconds(offline))
        on.append(epoch_seconds(fly))
        print(f"epoch {epoch}: offline {args.n / off[-1]:,.0f} samples/s, on the fly {args.n / on[-1]:,.0f} samples/s")
    mo, mf = statistics.median(off), statistics.median(on)
    print(f"per-epoch loader cost: offline {mo:.2f} s vs on the fly {mf:.2f} s -> on-the-fly / offline = "
          f"{mf / mo:.2f}x (offline saves {100 * (1 - mo / mf):.0f}% of each epoch's loader time)")
    if mf > mo:
        print(f"extra build time {aug_s - plain_s:.1f} s paid back after {(aug_s - plain_s) / (mf - mo):.1f} epochs "
              f"(note: with K={args.k}, epochs repeat variants every {args.k} epochs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
