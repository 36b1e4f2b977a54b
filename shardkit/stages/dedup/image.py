"""Image duplicates: exact by a hash of decoded pixels, near by a 64-bit perceptual hash."""

from __future__ import annotations

import hashlib
import io

import numpy as np

from shardkit.errors import RejectedInput

HASHES = ("dhash", "phash")


def decode(data: bytes, spec: dict | None = None):
    """Encoded image bytes (or a raw HxWx3 uint8 buffer when spec says so) → RGB PIL image."""
    from PIL import Image, UnidentifiedImageError

    if spec is not None and spec.get("encoding") == "raw":
        shape = tuple(spec["shape"])
        arr = np.frombuffer(data, np.uint8)
        if arr.size != int(np.prod(shape)):
            raise RejectedInput(f"raw image of {arr.size} bytes does not match shape {list(shape)}")
        return Image.fromarray(arr.reshape(shape), "RGB")
    try:
        with Image.open(io.BytesIO(data)) as img:
            img.load()
            return img.convert("RGB")
    except (UnidentifiedImageError, OSError, ValueError, Image.DecompressionBombError) as e:
        raise RejectedInput(f"undecodable image: {e}") from None


def pixel_hash(img) -> bytes:
    """16-byte digest of the decoded RGB pixels and size: same picture, any container or metadata."""
    h = hashlib.blake2b(digest_size=16)
    h.update(f"{img.width}x{img.height}".encode())
    h.update(img.tobytes())
    return h.digest()


def _bits_to_int(bits: np.ndarray) -> int:
    return int.from_bytes(np.packbits(bits.astype(np.uint8).ravel()).tobytes(), "big")


def dhash(img) -> int:
    """64-bit difference hash: is each pixel of a 9x8 grey thumbnail brighter than its right neighbour."""
    from PIL import Image

    small = np.asarray(img.convert("L").resize((9, 8), Image.Resampling.LANCZOS), dtype=np.int16)
    return _bits_to_int(small[:, 1:] > small[:, :-1])


def _dct_matrix(n: int) -> np.ndarray:
    k = np.arange(n)
    m = np.cos(np.pi * (2 * k[None, :] + 1) * k[:, None] / (2 * n)) * np.sqrt(2 / n)
    m[0] /= np.sqrt(2)
    return m


_DCT32 = _dct_matrix(32)


def phash(img) -> int:
    """64-bit perceptual hash: signs of the 8x8 lowest DCT frequencies of a 32x32 grey thumbnail vs their median."""
    from PIL import Image

    small = np.asarray(img.convert("L").resize((32, 32), Image.Resampling.LANCZOS), dtype=np.float64)
    low = (_DCT32 @ small @ _DCT32.T)[:8, :8]
    return _bits_to_int(low > np.median(low.ravel()[1:]))  # DC left out of the median: it is the mean


PERCEPTUAL = {"dhash": dhash, "phash": phash}


def perceptual_hash(img, kind: str = "dhash") -> int:
    if kind not in PERCEPTUAL:
        raise ValueError(f"unknown image hash {kind!r}; choose one of {', '.join(HASHES)} (--image-hash)")
    return PERCEPTUAL[kind](img)


def hamming(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Bits that differ between uint64 hashes, element-wise."""
    return np.bitwise_count(np.bitwise_xor(a, b)).astype(np.int64)


def band_masks(distance: int) -> list[tuple[int, int]]:
    """(shift, width) of distance+1 bands covering 64 bits: two hashes within `distance` bits
    differ in at most `distance` bands, so they agree on at least one (pigeonhole)."""
    n = distance + 1
    if not 1 <= n <= 64:
        raise ValueError(f"image distance {distance} must be within 0..63 bits (--image-distance)")
    widths = [64 // n + (1 if i < 64 % n else 0) for i in range(n)]
    shifts = np.concatenate([[0], np.cumsum(widths)[:-1]]).tolist()
    return list(zip(shifts, widths))


def _close_in_runs(hashes: np.ndarray, order: np.ndarray, keys: np.ndarray, distance: int):
    """All pairs inside each run of equal keys (sorted by `order`) within `distance` bits."""
    sk = keys[order]
    starts = np.flatnonzero(np.concatenate([[True], sk[1:] != sk[:-1]]))
    lens = np.diff(np.concatenate([starts, [len(sk)]]))
    out = []
    for s, ln in zip(starts[lens > 1].tolist(), lens[lens > 1].tolist()):
        members = order[s:s + ln]
        for lo in range(0, ln, 1024):  # blocks of rows bound memory on a crowded bucket
            block = members[lo:lo + 1024]
            d = hamming(hashes[block][:, None], hashes[members][None, :])
            i, j = np.nonzero(d <= distance)
            keep = lo + i < j
            out.append(np.stack([block[i[keep]], members[j[keep]]], axis=1))
    return out


def near_pairs(hashes: np.ndarray, distance: int) -> np.ndarray:
    """(m, 2) unique pairs (i < j) whose 64-bit hashes differ in at most `distance` bits.

    Only pairs that share a band value are compared, never all pairs.
    """
    hashes = np.asarray(hashes, dtype=np.uint64)
    out = [np.empty((0, 2), np.int64)]
    for shift, width in band_masks(distance):
        keys = (hashes >> np.uint64(shift)) & np.uint64((1 << width) - 1)
        out += _close_in_runs(hashes, np.argsort(keys, kind="stable"), keys, distance)
    pairs = np.concatenate(out).astype(np.int64)
    pairs = np.sort(pairs, axis=1)
    return np.unique(pairs, axis=0) if len(pairs) else pairs
