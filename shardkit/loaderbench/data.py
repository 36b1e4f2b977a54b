"""The data every variant reads: a raw folder (given or generated) and its shard builds, cached between runs."""

from __future__ import annotations

import hashlib
import json
import math
import os
from dataclasses import dataclass

from shardkit.loaderbench.settings import BenchConfig
from shardkit.errors import ConfigError

SHARDS = 16  # enough shards for WebDataset to split evenly over any worker count a user tries here
GENERATED_VERSION = 1  # bump when the generated folder's content changes


@dataclass(frozen=True)
class BenchData:
    """Paths, the raw-folder sample list and bytes on disk per variant; the same samples everywhere."""

    raw_folder: str
    items: tuple[tuple[str, int], ...]  # (path relative to raw_folder, label), the built samples' sources
    classes: tuple[str, ...]
    jpeg_root: str  # built with --format both: tar (WebDataset, shardkit) and Parquet
    raw_root: str  # uint8 HxWx3, tar
    image_size: int
    bytes: dict  # variant name -> bytes read per epoch
    reused_shards: int

    @property
    def samples(self) -> int:
        return len(self.items)


def _generate_one(args) -> None:
    """One photo-like JPEG, seeded by (seed, index) so the folder does not depend on the process count."""
    import numpy as np

    from shardkit.demo.datagen import photo_like

    root, i, classes, seed = args
    rng = np.random.default_rng([seed, i])
    w, h = int(500 * rng.uniform(0.9, 1.1)), int(375 * rng.uniform(0.9, 1.1))
    path = os.path.join(root, f"class_{i % classes:02d}", f"{i:06d}.jpg")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    photo_like(rng, w, h).save(path + ".tmp", "JPEG", quality=90)
    os.replace(path + ".tmp", path)


def generated_folder(cfg: BenchConfig) -> str:
    """A folder of cfg.images photo-like ~500x375 JPEGs in cfg.classes class folders (made once)."""
    from concurrent.futures import ProcessPoolExecutor

    from tqdm.auto import tqdm

    root = os.path.join(cfg.cache_dir, f"generated-v{GENERATED_VERSION}-n{cfg.images}-c{cfg.classes}-s{cfg.seed}")
    done = os.path.join(root, ".done")
    if os.path.exists(done):
        return os.path.join(root, "raw")
    raw = os.path.join(root, "raw")
    jobs = [(raw, i, cfg.classes, cfg.seed) for i in range(cfg.images)]
    with ProcessPoolExecutor(max_workers=os.cpu_count() or 1) as pool, \
            tqdm(total=len(jobs), desc="generate", unit="image", disable=None if cfg.progress else True) as bar:
        for _ in pool.map(_generate_one, jobs, chunksize=16):
            bar.update(1)
    with open(done, "w", encoding="utf-8") as f:
        json.dump({"images": cfg.images, "classes": cfg.classes, "seed": cfg.seed}, f)
    return raw


def _build(src: str, out: str, cfg: BenchConfig, n: int, encode: str, fmt: str):
    from shardkit.config import BuildConfig
    from shardkit.jobs.build import build

    per_shard = max(1, min(10_000, math.ceil(n / SHARDS)))
    return build(BuildConfig(src=src, out=out, format=fmt, max_samples_per_shard=per_shard,
                             image_size=cfg.image_size, resize_mode="center-crop", encode=encode, quality=90,
                             workers=cfg.build_workers, progress=cfg.progress))


def _image_items(src: str) -> tuple[list[tuple[str, int]], list[str]]:
    """(image path, label) of each image sample, in key order, and the class names."""
    from shardkit.config import BuildConfig
    from shardkit.sources import IMAGE_EXTS, scan

    scanned = scan(BuildConfig(src=src, out=src))
    items, textual = [], []
    for rec in scanned.records:
        images = [f for f in rec.files if os.path.splitext(f)[1].lower() in IMAGE_EXTS]
        if not images:
            textual.append(rec.source)
        else:
            items.append((images[0], -1 if rec.label is None else rec.label))
    if textual:
        raise ConfigError(f"{src} holds {len(textual)} samples without an image (e.g. {textual[0]}); the bench "
                          "measures image loading: point it at a folder of class subfolders of images")
    if not items:
        raise ConfigError(f"{src} holds no images; give a folder of class subfolders of images "
                          "(or no RAW_FOLDER for a generated one)")
    return items, list(scanned.classes or [])


def prepare(cfg: BenchConfig) -> BenchData:
    """Generate (if needed) and build the shard variants into the cache; a rerun reuses both."""
    if cfg.raw_folder is None:
        src = generated_folder(cfg)
    else:
        src = os.path.abspath(cfg.raw_folder)
        if not os.path.isdir(src):
            raise ConfigError(f"RAW_FOLDER {cfg.raw_folder!r} is not a folder; give a folder of class "
                              "subfolders of images, or none for a generated one")
    tag = hashlib.sha256(src.encode("utf-8", "surrogatepass")).hexdigest()[:12]
    base = os.path.join(cfg.cache_dir, f"built-{tag}-{cfg.image_size}")
    jpeg_root, raw_root = os.path.join(base, "jpeg"), os.path.join(base, "raw-uint8")
    items, classes = _image_items(src)
    jpeg = _build(src, jpeg_root, cfg, len(items), "jpeg", "both")
    raw = _build(src, raw_root, cfg, len(items), "raw", "tar")
    # The raw-folder loader reads what the builds kept: an image the build rejected (truncated,
    # undecodable) would otherwise crash it or make it read other samples than the shards hold.
    rejected = {r.path for r in jpeg.rejections}
    items = [it for it in items if it[0] not in rejected]
    if not items:
        raise ConfigError(f"the build rejected every image of {src} (see {jpeg_root}/errors.jsonl)")
    if not (len(items) == jpeg.samples == raw.samples):
        raise ConfigError(f"the builds of {src} kept {jpeg.samples} (JPEG) and {raw.samples} (raw) samples of "
                          f"{len(items)} images; delete {base} and run again")
    shard_bytes = {fmt: sum(s.bytes for s in jpeg.manifest.shards_of(fmt)) for fmt in ("tar", "parquet")}
    sizes = {
        "raw-folder": sum(os.path.getsize(os.path.join(src, p)) for p, _ in items),
        "webdataset-tar": shard_bytes["tar"], "shardkit-tar": shard_bytes["tar"],
        "shardkit-parquet": shard_bytes["parquet"], "shardkit-mix": (shard_bytes["tar"] + shard_bytes["parquet"]) / 2,
        "shardkit-raw": sum(s.bytes for s in raw.manifest.shards_of("tar")),
    }
    return BenchData(src, tuple(items), tuple(classes), jpeg_root, raw_root, cfg.image_size, sizes,
                     jpeg.reused_shards + raw.reused_shards)
