"""Offline augmentation: K seeded variants per image, computed once at build time (PIL only)."""

from __future__ import annotations

from typing import Iterable, Iterator

import numpy as np

from shardkit.config import BuildConfig
from shardkit.contract import key_hash
from shardkit.errors import RejectionLog
from shardkit.sample import Sample
from shardkit.stages import map_samples
from shardkit.stages.image import encode, prepare

# Op parameters (shown in `shardkit build --help`), torchvision's usual defaults where they exist.
CROP_SCALE = (0.35, 1.0)  # random resized crop: area fraction kept, then resized back to the input size
CROP_RATIO = (3 / 4, 4 / 3)  # … and its aspect ratio range
FLIP_P = 0.5  # horizontal flip probability
ROTATE_DEGREES = 15.0  # rotation uniform in ±15°, same size, black corners
COLOR_JITTER = 0.4  # brightness, contrast, saturation factors uniform in 1 ± 0.4
BLUR_P, BLUR_RADIUS = 0.5, (0.1, 2.0)  # Gaussian blur probability and radius range
OP_ORDER = ("crop", "flip", "rotate", "color", "blur")


def variant_rng(seed: int, key: str, k: int) -> np.random.Generator:
    """The generator of variant k of `key`: the same bytes on every build, any worker count."""
    return np.random.default_rng([seed, key_hash(key), k])


def variant_name(field: str, k: int) -> str:
    """Variant 0 keeps the plain field name (what WebDataset users read); variant k is `{k}.{field}`,
    so WebDataset still decodes it by its last extension."""
    return field if k == 0 else f"{k}.{field}"


def variant_fields(field: str, spec: dict, cfg: BuildConfig) -> dict:
    """Field specs of K variants: the base field records K and the ops; the others point to it."""
    base = dict(spec, variants=cfg.augment,
                augment={"ops": list(parse_ops(cfg.augment_ops)), "keep_original": cfg.augment_keep_original,
                         "seed": cfg.augment_seed})
    out = {field: base}
    for k in range(1, cfg.augment):
        out[variant_name(field, k)] = dict(spec, variant_of=field, variant=k)
    return out


def parse_ops(text: str) -> tuple[str, ...]:
    """'flip,crop' -> ('crop', 'flip'): ops always run in OP_ORDER, whatever order they were given."""
    ops = {op.strip() for op in text.split(",") if op.strip()}
    return tuple(op for op in OP_ORDER if op in ops)


def _crop(im, rng):
    from PIL import Image

    w, h = im.size
    for _ in range(10):
        area = w * h * rng.uniform(*CROP_SCALE)
        ratio = np.exp(rng.uniform(np.log(CROP_RATIO[0]), np.log(CROP_RATIO[1])))
        cw, ch = round((area * ratio) ** 0.5), round((area / ratio) ** 0.5)
        if 0 < cw <= w and 0 < ch <= h:
            x, y = int(rng.integers(0, w - cw + 1)), int(rng.integers(0, h - ch + 1))
            return im.resize((w, h), Image.Resampling.BILINEAR, box=(x, y, x + cw, y + ch))
    return im


def _color(im, rng):
    from PIL import ImageEnhance

    lo, hi = 1 - COLOR_JITTER, 1 + COLOR_JITTER
    for enhancer in (ImageEnhance.Brightness, ImageEnhance.Contrast, ImageEnhance.Color):
        im = enhancer(im).enhance(rng.uniform(lo, hi))
    return im


def apply_ops(im, ops: tuple[str, ...], rng: np.random.Generator):
    """One augmented copy of an RGB PIL image, same size (so raw fixed-shape storage still fits)."""
    from PIL import Image, ImageFilter

    if "crop" in ops:
        im = _crop(im, rng)
    if "flip" in ops and rng.uniform() < FLIP_P:
        im = im.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    if "rotate" in ops:
        im = im.rotate(rng.uniform(-ROTATE_DEGREES, ROTATE_DEGREES), Image.Resampling.BILINEAR)
    if "color" in ops:
        im = _color(im, rng)
    if "blur" in ops and rng.uniform() < BLUR_P:
        im = im.filter(ImageFilter.GaussianBlur(rng.uniform(*BLUR_RADIUS)))
    return im


def variants(data: bytes, key: str, cfg: BuildConfig) -> list[bytes]:
    """The K encoded variants of one input image (variant 0 unaugmented with keep_original)."""
    im = prepare(data, cfg)
    ops = parse_ops(cfg.augment_ops)
    out = []
    for k in range(cfg.augment):
        keep = k == 0 and cfg.augment_keep_original
        aug = im if keep else apply_ops(im, ops, variant_rng(cfg.augment_seed, key, k))
        out.append(encode(aug, cfg.encode, cfg.quality))
    return out


def augmented_images(samples: Iterable[Sample], *, cfg: BuildConfig, log: RejectionLog) -> Iterator[Sample]:
    """Stage (replaces `images` under --augment K): the original bytes under 'image' -> K variant fields."""

    def one(sample: Sample) -> Sample:
        data = sample.fields.pop("image", None)
        if data is not None:
            for k, blob in enumerate(variants(data, sample.key, cfg)):
                sample.fields[variant_name(cfg.output_image_field, k)] = blob
        return sample

    return map_samples(samples, one, stage="image", log=log)
