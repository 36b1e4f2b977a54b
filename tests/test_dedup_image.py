"""Image dedup: pixel-exact hashes, perceptual near duplicates through banded buckets, bad images."""

import io
from types import SimpleNamespace

import numpy as np
import pytest
from PIL import Image

from shardkit.config import DedupConfig
from shardkit.jobs.dedup_tasks import find_duplicates
from shardkit.errors import RejectedInput
from shardkit.sample import Sample
from shardkit.duplicates.phash import (band_masks, decode, dhash, grey, hamming, image_signature, near_pairs,
                                         phash)


def textured_photo(seed: int, size=(320, 240)) -> Image.Image:
    """Photo-like: smooth noise at four scales (sky, objects, texture) plus sensor noise."""
    rng = np.random.default_rng(seed)
    w, h = size
    img = np.full((h, w, 3), 128.0)
    for cells, amplitude in ((3, 90), (6, 60), (12, 35), (24, 20)):
        coarse = rng.uniform(-1, 1, (cells, cells * 4 // 3 + 1, 3)).astype(np.float32)
        img += amplitude * np.stack([np.asarray(Image.fromarray(coarse[..., c], "F").resize(
            (w, h), Image.Resampling.BICUBIC)) for c in range(3)], axis=-1)
    img += rng.normal(0, 4, img.shape)
    return Image.fromarray(np.clip(img, 0, 255).astype(np.uint8))


def encode(im: Image.Image, fmt="JPEG", **kw) -> bytes:
    buf = io.BytesIO()
    im.save(buf, fmt, **kw)
    return buf.getvalue()


def altered_copy(im: Image.Image) -> bytes:
    """Cropped by 2% on each side, resized to 2/3, re-encoded at JPEG quality 60."""
    w, h = im.size
    dx, dy = int(w * 0.02), int(h * 0.02)
    return encode(im.crop((dx, dy, w - dx, h - dy)).resize((w * 2 // 3, h * 2 // 3)), quality=60)


def test_pigeonhole_bands_find_exactly_the_pairs_within_distance():
    rng = np.random.default_rng(0)
    base = rng.integers(0, 2**63, 60, dtype=np.uint64)
    # Each base hash gets copies with 0..12 random bits flipped, so every distance occurs.
    flips = [np.bitwise_or.reduce(np.uint64(1) << rng.choice(64, k, replace=False).astype(np.uint64))
             if k else np.uint64(0) for k in rng.integers(0, 13, 60)]
    hashes = np.concatenate([base, base ^ np.array(flips, np.uint64)])
    for distance in (0, 4, 10):
        assert sum(w for _, w in band_masks(distance)) == 64 and len(band_masks(distance)) == distance + 1
        d = hamming(hashes[:, None], hashes[None, :])
        i, j = np.nonzero(np.triu(d <= distance, k=1))
        assert near_pairs(hashes, distance).tolist() == sorted(map(list, zip(i.tolist(), j.tolist())))


def test_perceptual_hash_is_close_for_an_altered_copy_and_far_for_others():
    a, b = textured_photo(1), textured_photo(2)
    copy = decode(altered_copy(a))
    for fn in (dhash, phash):
        assert bin(fn(a) ^ fn(copy)).count("1") <= 10
        assert bin(fn(a) ^ fn(b)).count("1") > 16


def test_exact_means_identical_bytes_and_a_new_container_is_a_zero_distance_near_copy():
    im = textured_photo(3)
    png, bmp = encode(im, "PNG"), encode(im, "BMP")
    assert image_signature(png, None, "phash")[0] == image_signature(bytes(png), None, "phash")[0]
    assert image_signature(png, None, "phash")[0] != image_signature(bmp, None, "phash")[0]
    assert image_signature(png, None, "phash")[1] == image_signature(bmp, None, "phash")[1]


def test_reduced_jpeg_decode_hashes_like_the_full_decode_and_still_rejects_truncation():
    for seed in range(6):
        im = textured_photo(20 + seed, size=(1600, 1200))
        data = encode(im, quality=90)
        assert grey(data).size[0] < 1600  # decoded at a reduced scale
        assert bin(phash(grey(data)) ^ phash(decode(data))).count("1") <= 4
    with pytest.raises(RejectedInput, match="undecodable image"):
        grey(data[: len(data) // 2])


def test_decode_raw_field_and_reject_bad_bytes():
    arr = np.arange(4 * 5 * 3, dtype=np.uint8).reshape(4, 5, 3)
    spec = {"kind": "image", "encoding": "raw", "dtype": "uint8", "shape": [4, 5, 3]}
    assert np.array_equal(np.asarray(decode(arr.tobytes(), spec)), arr)
    with pytest.raises(RejectedInput, match="does not match shape"):
        decode(arr.tobytes()[:-1], spec)
    with pytest.raises(RejectedInput, match="undecodable image"):
        decode(b"not an image at all")


def test_image_dedup_finds_altered_copies_and_keeps_unrelated(tmp_path):
    originals = {f"img{i:02d}": textured_photo(10 + i) for i in range(8)}
    samples = [Sample(k, {"jpg": encode(im, quality=90)}) for k, im in originals.items()]
    samples += [Sample(f"zcopy{i:02d}", {"jpg": altered_copy(originals[f"img{i:02d}"])}) for i in range(0, 8, 2)]
    samples.append(Sample("img00_png", {"png": encode(originals["img00"], "PNG")}))  # JPEG-free pixels: near
    other = textured_photo(99)
    samples.append(Sample("exact-png", {"png": encode(other, "PNG")}))
    samples.append(Sample("exact-bmp", {"image": encode(other, "BMP")}))
    samples.append(Sample("same-bytes", {"image": encode(other, "BMP")}))
    samples.append(Sample("broken", {"jpg": b"\xff\xd8 truncated"}))
    samples.sort(key=lambda s: s.key)
    result = find_duplicates(samples, DedupConfig(progress=False), None, str(tmp_path), per_partition=5)
    by_key = {r["key"]: SimpleNamespace(**r) for r in result.rows if not r["kept"]}
    for i in range(0, 8, 2):
        assert by_key[f"zcopy{i:02d}"].duplicate_of == f"img{i:02d}"
        assert by_key[f"zcopy{i:02d}"].reason == "near"
    assert by_key["exact-png"].duplicate_of == "exact-bmp" and by_key["exact-png"].reason == "near"
    assert by_key["exact-png"].similarity == 1.0  # same pixels, another container: hash distance 0
    assert by_key["same-bytes"].duplicate_of == "exact-bmp" and by_key["same-bytes"].reason == "exact"
    assert by_key["img00_png"].duplicate_of == "img00" and by_key["img00_png"].reason == "near"
    assert set(by_key) == {"zcopy00", "zcopy02", "zcopy04", "zcopy06", "img00_png", "exact-png", "same-bytes"}, \
        "unrelated images must not be linked"
    assert [r.path for r in result.rejections] == ["broken"]
    assert result.kept + len(result.removed_ids) + len(result.rejections) == len(samples)
    assert result.summary["image"]["bands"] == 11
