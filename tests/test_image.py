"""The image stage: every PIL mode to RGB deliberately, EXIF orientation, resize modes, bad bytes."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from shardkit.config import BuildConfig
from shardkit.errors import RejectedInput
from shardkit.stages.image import decode, encode, process_image, resize, to_rgb


def _png(im) -> bytes:
    buf = io.BytesIO()
    im.save(buf, "PNG")
    return buf.getvalue()


def _jpeg(im, **kw) -> bytes:
    buf = io.BytesIO()
    im.save(buf, "JPEG", quality=95, **kw)
    return buf.getvalue()


def _cfg(**kw) -> BuildConfig:
    return BuildConfig(src="s", out="o", **kw)


def test_cmyk_jpeg_becomes_rgb_with_the_same_colours():
    rgb = Image.new("RGB", (64, 48), (200, 40, 90))
    im = to_rgb(decode(_jpeg(rgb.convert("CMYK"))))
    assert im.mode == "RGB"
    assert np.abs(np.asarray(im, dtype=int) - (200, 40, 90)).max() < 20


def test_16bit_png_is_scaled_not_clipped():
    arr = np.linspace(0, 65535, 100 * 10).reshape(10, 100).astype(np.uint16)
    im = to_rgb(decode(_png(Image.fromarray(arr))))
    out = np.asarray(im)
    assert im.mode == "RGB" and out.shape == (10, 100, 3)
    assert out.min() == 0 and out.max() == 255
    # mid-grey 32768 → 128, where clipping would give 255
    assert abs(int(out[5, 50, 0]) - round(arr[5, 50] / 257)) <= 1


def test_palette_with_transparency_is_composited_on_white():
    pal = Image.new("P", (20, 20), 0)
    pal.putpalette([0, 0, 0] + [255, 0, 0] * 255)
    pal.paste(1, (10, 0, 20, 20))
    buf = io.BytesIO()
    pal.save(buf, "PNG", transparency=0)
    out = np.asarray(to_rgb(decode(buf.getvalue())))
    assert tuple(out[5, 2]) == (255, 255, 255)  # transparent black → white
    assert tuple(out[5, 15]) == (255, 0, 0)


@pytest.mark.parametrize("mode", ["L", "LA", "RGBA", "1", "I;16", "P"])
def test_every_mode_converts_to_rgb(mode):
    if mode == "I;16":  # Pillow < 11 cannot convert RGB to I;16; a 16-bit array is the same image kind
        im = Image.fromarray(np.full((12, 16), 30000, np.uint16))
    else:
        im = Image.new("RGB", (16, 12), (10, 120, 240)).convert(mode)
    assert im.mode == mode
    out = to_rgb(decode(_png(im)))
    assert out.mode == "RGB" and out.size == (16, 12)


@pytest.mark.parametrize("mode", ["I", "F", "CMYK", "YCbCr", "HSV"])
def test_in_memory_modes_convert_to_rgb(mode):
    im = Image.new("L", (8, 6), 100).convert(mode) if mode in ("I", "F") else Image.new("RGB", (8, 6)).convert(mode)
    out = to_rgb(im)
    assert out.mode == "RGB" and out.size == (8, 6)


def test_exif_orientation_is_applied():
    im = Image.new("RGB", (60, 30), (0, 0, 255))
    im.paste((255, 0, 0), (0, 0, 10, 30))  # red stripe on the left
    exif = Image.Exif()
    exif[0x0112] = 6  # display rotated 90° clockwise
    out = decode(_jpeg(im, exif=exif.tobytes()))
    assert out.size == (30, 60)
    top = np.asarray(out)[2, 15]
    assert top[0] > 200 and top[2] < 60  # the left stripe is now on top


@pytest.mark.parametrize("data,kind", [
    (b"", "empty file"),
    (b"plain text, not an image\n", "undecodable image"),
])
def test_bad_bytes_are_rejected_with_a_reason(data, kind):
    with pytest.raises(RejectedInput) as e:
        decode(data)
    assert e.value.reason.startswith(kind)
    assert "0x" not in e.value.reason  # reproducible: no object addresses


def test_truncated_jpeg_is_rejected():
    rng = np.random.default_rng(0)
    data = _jpeg(Image.fromarray(rng.integers(0, 255, (64, 64, 3), dtype=np.uint8)))
    with pytest.raises(RejectedInput) as e:
        decode(data[: len(data) // 2])
    assert e.value.reason.startswith("truncated image")


@pytest.mark.parametrize("mode,expected", [
    ("shorter", (150, 100)), ("center-crop", (100, 100)), ("pad", (100, 100)), ("none", (300, 200)),
])
def test_resize_modes(mode, expected):
    im = resize(Image.new("RGB", (300, 200), (9, 9, 9)), 100, mode)
    assert im.size == expected


def test_pad_keeps_the_whole_image_and_pads_black():
    im = resize(Image.new("RGB", (300, 150), (200, 200, 200)), 100, "pad")
    a = np.asarray(im)
    assert tuple(a[0, 50]) == (0, 0, 0) and tuple(a[50, 50]) == (200, 200, 200)


def test_raw_encoding_is_hwc_uint8():
    data = process_image(_png(Image.new("RGB", (80, 40), (1, 2, 3))),
                         _cfg(image_size=32, resize_mode="center-crop", encode="raw"))
    arr = np.frombuffer(data, np.uint8).reshape(32, 32, 3)
    assert tuple(arr[10, 10]) == (1, 2, 3)


@pytest.mark.parametrize("encoding", ["jpeg", "png", "webp"])
def test_encodings_are_deterministic_and_decodable(encoding):
    im = Image.new("RGB", (50, 40), (30, 60, 90))
    a, b = encode(im, encoding, 80), encode(im, encoding, 80)
    assert a == b
    assert Image.open(io.BytesIO(a)).size == (50, 40)
