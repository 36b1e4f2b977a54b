"""Image stage: decode, apply EXIF orientation, convert every mode to RGB, resize, encode."""

from __future__ import annotations

import io
import re
from typing import Iterable, Iterator

from shardkit.config import BuildConfig
from shardkit.errors import RejectedInput, RejectionLog
from shardkit.sample import Sample
from shardkit.stages import map_samples


def decode(data: bytes, draft_size: int | None = None):
    """Bytes → a loaded PIL image; anything PIL cannot decode becomes a RejectedInput with the reason."""
    from PIL import Image, ImageOps

    if not data:
        raise RejectedInput("empty file: zero bytes")
    # Decoding untrusted bytes: PIL raises OSError, SyntaxError, ValueError, struct.error, zlib.error,
    # EOFError … depending on the codec. Every one of them means "this input is bad", never "stop the build".
    try:
        im = Image.open(io.BytesIO(data))
        if draft_size and im.format == "JPEG":
            # Decode at 1/2, 1/4 or 1/8 scale in the DCT domain when the target is that much smaller:
            # the result is still >= draft_size on both sides, and decoding is several times faster.
            im.draft("RGB", (draft_size, draft_size))
        im.load()
        return ImageOps.exif_transpose(im)
    except Image.DecompressionBombError as e:
        raise RejectedInput(f"image too large: {e}") from None
    except Exception as e:  # noqa: BLE001 — see the comment above
        # PIL names the in-memory file by its address; drop it so errors.jsonl is reproducible.
        msg = re.sub(r"\s*<[^>]* at 0x[0-9a-fA-F]+>", "", str(e)) or type(e).__name__
        kind = "truncated image" if "truncated" in msg else "undecodable image"
        raise RejectedInput(f"{kind}: {msg}") from None


def to_rgb(im):
    """Convert any PIL mode to 8-bit RGB deliberately: alpha on white, 16-bit scaled, CMYK via PIL."""
    import numpy as np
    from PIL import Image

    mode = im.mode
    if mode == "RGB":
        return im
    if mode.startswith("I;16") or mode == "I":
        a = np.clip(np.asarray(im).astype(np.int64), 0, 65535)
        return Image.fromarray(((a * 255 + 32767) // 65535).astype(np.uint8), "L").convert("RGB")
    if mode == "F":
        return Image.fromarray(np.clip(np.asarray(im), 0, 255).round().astype(np.uint8), "L").convert("RGB")
    has_alpha = mode in ("RGBA", "LA", "PA", "RGBa", "La") or "transparency" in im.info
    if has_alpha:
        # Transparent pixels have arbitrary colour underneath; composite on white, as viewers show them.
        rgba = im.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        background.alpha_composite(rgba)
        return background.convert("RGB")
    return im.convert("RGB")  # L, 1, P without transparency, CMYK, YCbCr, LAB, HSV


def resize(im, size: int | None, mode: str, resample: str = "bicubic"):
    """shorter: shorter side → size; center-crop: then crop size×size; pad: longer side → size, pad to square.
    `resample` names PIL's filter (config.RESAMPLE_FILTERS); reducing_gap=3 lets PIL shrink large images
    in two passes."""
    from PIL import Image

    if size is None or mode == "none":
        return im
    w, h = im.size
    scale = size / (max(w, h) if mode == "pad" else min(w, h))
    nw, nh = max(1, round(w * scale)), max(1, round(h * scale))
    if (nw, nh) != (w, h):
        im = im.resize((nw, nh), getattr(Image.Resampling, resample.upper()), reducing_gap=3.0)
    if mode == "center-crop":
        im = center_crop(im, size)
    elif mode == "pad":
        canvas = Image.new("RGB", (size, size))
        canvas.paste(im, ((size - nw) // 2, (size - nh) // 2))
        im = canvas
    return im


def center_crop(im, size: int):
    """The centre size×size of an image at least that large on both sides."""
    w, h = im.size
    left, top = (w - size) // 2, (h - size) // 2
    return im.crop((left, top, left + size, top + size))


def prepare(data: bytes, cfg: BuildConfig):
    """Bytes → the image the build stores, before encoding: decode (JPEG draft-scaled when the target is
    much smaller), orient, RGB, resize (--image-size, --resize-mode, --resample), crop (--crop-size)."""
    draft = cfg.image_size if cfg.resize_mode != "none" else None
    im = resize(to_rgb(decode(data, draft)), cfg.image_size, cfg.resize_mode, cfg.resample)
    return center_crop(im, cfg.crop_size) if cfg.crop_size else im


def encode(im, encoding: str, quality: int) -> bytes:
    """Deterministic encoding (no timestamps, no optimiser passes); raw = C-order HWC uint8 bytes."""
    import numpy as np

    if encoding == "raw":
        if im.mode == "RGB":  # PIL's own bytes are already C-order HWC uint8: no copy through numpy
            return im.tobytes()
        return np.asarray(im, dtype=np.uint8).tobytes()
    buf = io.BytesIO()
    if encoding == "jpeg":
        # Baseline (not progressive), 4:2:0 chroma: what GPUs' hardware JPEG engines take
        # (decode="nvjpeg"); PIL's defaults, spelled out so a PIL change cannot move them.
        im.save(buf, "JPEG", quality=quality, subsampling="4:2:0", progressive=False, optimize=False)
    elif encoding == "png":
        im.save(buf, "PNG", compress_level=6)
    elif encoding == "webp":
        im.save(buf, "WEBP", quality=quality, method=4)
    else:
        raise ValueError(f"unknown encoding {encoding!r}; expected jpeg, png, webp or raw")
    return buf.getvalue()


def process_image(data: bytes, cfg: BuildConfig) -> bytes:
    """The whole per-image transform of the build: decode → orient → RGB → resize → crop → encode."""
    return encode(prepare(data, cfg), cfg.encode, cfg.quality)


def keep_image(data: bytes) -> bytes:
    """`--encode keep`: the input's own bytes, once they are known to decode (JPEG checked at 1/8
    scale: every coefficient is still read, so truncation is caught at a fraction of the cost)."""
    decode(data, draft_size=1)
    return data


def images(samples: Iterable[Sample], *, cfg: BuildConfig, log: RejectionLog) -> Iterator[Sample]:
    """Stage: replace the original bytes under 'image' with the processed image under
    cfg.output_image_field (`--encode keep`: the original bytes, under the input's own extension)."""

    def one(sample: Sample) -> Sample:
        data = sample.fields.pop("image", None)
        if data is not None and cfg.encode == "keep":
            sample.fields[sample.meta["image_ext"]] = keep_image(data)
        elif data is not None:
            sample.fields[cfg.output_image_field] = process_image(data, cfg)
        return sample

    return map_samples(samples, one, stage="image", log=log)
