"""Recipe: detection images + boxes -> a shardkit dataset, boxes scaled with the resize.

    python pipelines/byo_detection.py annotations.json OUT --size 512 --workers 2

annotations.json is a list of {"image": path relative to the file, "boxes": [[x0, y0, x1, y1], ...]
in pixels, "labels": [int, ...]}. Each image is resized so its shorter side is --size, and its boxes
are scaled by the same factors in x and y, so they keep framing their objects. Stored: the image
as JPEG under `jpg`, and under `json` the boxes, labels and the stored size (width, height).
"""

from __future__ import annotations

import argparse
import functools
import json
import os

from shardkit import build_map
from shardkit.sample import make_key


def scale_boxes(boxes, sx: float, sy: float, width: int, height: int) -> list[list[float]]:
    """Boxes scaled by (sx, sy) and clipped to the new image; a box must have x0 < x1 and y0 < y1."""
    out = []
    for x0, y0, x1, y1 in boxes:
        if not (x0 < x1 and y0 < y1):
            raise ValueError(f"box {[x0, y0, x1, y1]} is empty or inverted; expected [x0, y0, x1, y1], x0 < x1, y0 < y1")
        out.append([round(min(max(x0 * sx, 0), width), 3), round(min(max(y0 * sy, 0), height), 3),
                    round(min(max(x1 * sx, 0), width), 3), round(min(max(y1 * sy, 0), height), 3)])
    return out


def load_example(ann: dict, *, root: str, size: int) -> dict:
    from PIL import Image

    labels = [int(v) for v in ann.get("labels", [])]
    if len(labels) != len(ann["boxes"]):
        raise ValueError(f"{len(ann['boxes'])} boxes but {len(labels)} labels")
    with Image.open(os.path.join(root, ann["image"])) as im:
        im = im.convert("RGB")
    scale = size / min(im.size)
    w, h = max(1, round(im.width * scale)), max(1, round(im.height * scale))
    boxes = scale_boxes(ann["boxes"], w / im.width, h / im.height, w, h)  # the exact factors the resize used
    return {"__key__": make_key(os.path.splitext(ann["image"])[0]), "jpg": im.resize((w, h), Image.BILINEAR),
            "json": {"boxes": boxes, "labels": labels, "size": [w, h]}}


def build(annotations: str, out: str, *, size: int = 512, workers: int | None = None,
          worker_pool: str = "auto", progress: bool = True):
    with open(annotations, encoding="utf-8") as f:
        anns = json.load(f)
    fn = functools.partial(load_example, root=os.path.dirname(os.path.abspath(annotations)), size=size)
    return build_map(fn, anns, out, workers=workers, worker_pool=worker_pool, encode="jpeg", quality=95,
                     progress=progress)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("annotations")
    p.add_argument("out")
    p.add_argument("--size", type=int, default=512)
    p.add_argument("--workers", type=int, default=None)
    p.add_argument("--worker-pool", default="auto", choices=["auto", "threads", "processes"])
    a = p.parse_args(argv)
    r = build(a.annotations, a.out, size=a.size, workers=a.workers, worker_pool=a.worker_pool)
    print(f"{r.samples} images written to {r.out}, {len(r.rejections)} rejected (see errors.jsonl)")


if __name__ == "__main__":
    main()
