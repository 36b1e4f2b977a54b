"""Recipe: image + caption pairs listed in a CSV -> a shardkit dataset, with your own preprocessing.

    python pipelines/byo_caption_csv.py pairs.csv OUT --size 256 --workers 2

pairs.csv has a header with columns `image` (a path relative to the CSV's folder) and `caption`.
Each pair becomes one sample: the image resized (shorter side -> --size) and stored as JPEG under
`jpg`, the caption under `txt`, keyed by the image's path. A row whose image is missing or does not
decode is recorded in OUT/errors.jsonl with the row and the reason; the rest is written.
"""

from __future__ import annotations

import argparse
import csv
import functools
import os

from shardkit import build_map
from shardkit.sample import make_key


def read_pairs(csv_path: str) -> list[tuple[int, str, str]]:
    """(line, image path, caption) per data row, in file order."""
    with open(csv_path, newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        missing = {"image", "caption"} - set(reader.fieldnames or ())
        if missing:
            raise SystemExit(f"{csv_path}: no column(s) {sorted(missing)}; expected a header with image,caption")
        return [(n, row["image"], row["caption"]) for n, row in enumerate(reader, start=2)]


def load_pair(pair: tuple[int, str, str], *, root: str, size: int) -> dict:
    """One CSV row -> one sample; raises (and the row is recorded) when its image cannot be read."""
    from PIL import Image, ImageOps

    _, rel, caption = pair
    with Image.open(os.path.join(root, rel)) as im:
        im = ImageOps.exif_transpose(im).convert("RGB")
    scale = size / min(im.size)
    im = im.resize((max(1, round(im.width * scale)), max(1, round(im.height * scale))), Image.BICUBIC)
    return {"__key__": make_key(os.path.splitext(rel)[0]), "jpg": im, "txt": caption}


def build(csv_path: str, out: str, *, size: int = 256, workers: int | None = None,
          worker_pool: str = "auto", progress: bool = True):
    fn = functools.partial(load_pair, root=os.path.dirname(os.path.abspath(csv_path)), size=size)
    return build_map(fn, read_pairs(csv_path), out, workers=workers, worker_pool=worker_pool, encode="jpeg",
                     quality=90, format="tar", progress=progress)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("csv")
    p.add_argument("out")
    p.add_argument("--size", type=int, default=256)
    p.add_argument("--workers", type=int, default=None)
    p.add_argument("--worker-pool", default="auto", choices=["auto", "threads", "processes"])
    a = p.parse_args(argv)
    r = build(a.csv, a.out, size=a.size, workers=a.workers, worker_pool=a.worker_pool)
    print(f"{r.samples} pairs written to {r.out}, {len(r.rejections)} rejected (see errors.jsonl)")


if __name__ == "__main__":
    main()
