"""Image duplicates: exact by identical bytes, near by a 64-bit perceptual hash of a reduced decode."""

from __future__ import annotations

import hashlib
import io
import re

import numpy as np

from shardkit.errors import RejectedInput

HASHES = ("dhash", "phash")
THUMB = {"dhash": (9, 8), "phash": (32, 32)}  # the grey thumbnail each hash is computed from
_DECODE_ERRORS = (OSError, ValueError, SyntaxError)  # what PIL raises on bad or truncated data


def _rejected(e: Exception) -> RejectedInput:
    # PIL names the in-memory file by its address; drop it so errors.jsonl is reproducible.
    msg = re.sub(r"\s*<[^>]* at 0x[0-9a-fA-F]+>", "", str(e)) or type(e).__name__
    return RejectedInput(f"undecodable image: {msg}")


def _raw_array(data: bytes, spec: dict) -> np.ndarray:
    shape = tuple(spec["shape"])
    arr = np.frombuffer(data, np.uint8)
    if arr.size != int(np.prod(shape)):
        raise RejectedInput(f"raw image of {arr.size} bytes does not match shape {list(shape)}")
    return arr.reshape(shape)


def decode(data: bytes, spec: dict | None = None):
    """Encoded image bytes (or a raw HxWx3 uint8 buffer when spec says so) → RGB PIL image."""
    from PIL import Image

    if spec is not None and spec.get("encoding") == "raw":
        return Image.fromarray(_raw_array(data, spec), "RGB")
    try:
        with Image.open(io.BytesIO(data)) as img:
            img.load()
            return img.convert("RGB")
    except (*_DECODE_ERRORS, Image.DecompressionBombError) as e:
        raise _rejected(e) from None


def grey(data: bytes, spec: dict | None = None, size: tuple[int, int] = THUMB["phash"]):
    """A grey PIL image at least `size`, decoded as cheaply as the format allows.

    JPEG decodes at 1/2, 1/4 or 1/8 scale in the DCT domain (PIL `draft`), luminance only: a
    12-megapixel photo costs ~6x less than a full decode, and the hash sees a 32x32 thumbnail
    either way. Other formats decode whole. Truncated data is rejected as by a full decode.
    """
    from PIL import Image

    if spec is not None and spec.get("encoding") == "raw":
        return Image.fromarray(_raw_array(data, spec), "RGB").convert("L")
    try:
        with Image.open(io.BytesIO(data)) as img:
            if img.format == "JPEG":
                img.draft("L", size)
            img.load()
            return img.convert("L")
    except (*_DECODE_ERRORS, Image.DecompressionBombError) as e:
        raise _rejected(e) from None


def bytes_digest(data: bytes) -> bytes:
    """16-byte digest of the stored bytes: equal digests are exact duplicates (same file content)."""
    return hashlib.blake2b(data, digest_size=16, person=b"image").digest()


def image_signature(data: bytes, spec: dict | None, kind: str) -> tuple[bytes, int]:
    """(exact digest, perceptual hash) of one stored image; undecodable data raises RejectedInput."""
    if kind not in PERCEPTUAL:
        raise ValueError(f"unknown image hash {kind!r}; choose one of {', '.join(HASHES)} (--image-hash)")
    return bytes_digest(bytes(data)), PERCEPTUAL[kind](grey(data, spec, THUMB[kind]))


def _bits_to_int(bits: np.ndarray) -> int:
    return int.from_bytes(np.packbits(bits.astype(np.uint8).ravel()).tobytes(), "big")


def _grey_float(img):
    return (img if img.mode == "L" else img.convert("L")).convert("F")


def dhash(img) -> int:
    """64-bit difference hash: is each pixel of a 9x8 grey thumbnail brighter than its right neighbour."""
    from PIL import Image

    small = np.asarray(_grey_float(img).resize((9, 8), Image.Resampling.LANCZOS), dtype=np.float64)
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

    # Resized in float ("F"): a thumbnail rounded to 8 bits moves coefficients near the median
    # across it, 1-2 bits of distance for a re-encoded or cropped copy.
    small = np.asarray(_grey_float(img).resize((32, 32), Image.Resampling.LANCZOS), dtype=np.float64)
    low = (_DCT32 @ small @ _DCT32.T)[:8, :8]
    return _bits_to_int(low > np.median(low.ravel()[1:]))  # DC left out of the median: it is the mean


PERCEPTUAL = {"dhash": dhash, "phash": phash}


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


def close_in_runs(keys: np.ndarray, hashes: np.ndarray, ids: np.ndarray, distance: int) -> np.ndarray:
    """(m, 2) pairs (id_a < id_b) inside each run of equal `keys` whose hashes differ in at most
    `distance` bits; the three arrays are sorted by (key, id)."""
    starts = np.flatnonzero(np.concatenate([[True], keys[1:] != keys[:-1]])) if len(keys) else np.empty(0, np.int64)
    lens = np.diff(np.concatenate([starts, [len(keys)]]))
    out = [np.empty((0, 2), np.int64)]
    for s, ln in zip(starts[lens > 1].tolist(), lens[lens > 1].tolist()):
        members, member_ids = hashes[s:s + ln], ids[s:s + ln]
        for lo in range(0, ln, 1024):  # blocks of rows bound memory on a crowded bucket
            d = hamming(members[lo:lo + 1024][:, None], members[None, :])
            i, j = np.nonzero(d <= distance)
            keep = lo + i < j
            out.append(np.stack([member_ids[lo + i[keep]], member_ids[j[keep]]], axis=1))
    return np.concatenate(out).astype(np.int64)


def near_pairs(hashes: np.ndarray, distance: int) -> np.ndarray:
    """(m, 2) unique pairs (i < j) whose 64-bit hashes differ in at most `distance` bits.

    Only pairs that share a band value are compared, never all pairs.
    """
    hashes = np.asarray(hashes, dtype=np.uint64)
    ids = np.arange(len(hashes), dtype=np.int64)
    out = [np.empty((0, 2), np.int64)]
    for shift, width in band_masks(distance):
        keys = (hashes >> np.uint64(shift)) & np.uint64((1 << width) - 1)
        order = np.argsort(keys, kind="stable")
        out.append(close_in_runs(keys[order], hashes[order], ids[order], distance))
    pairs = np.concatenate(out)
    return np.unique(pairs, axis=0) if len(pairs) else pairs
