"""Stored field values -> tensors: one tensor per field per batch, decoding done in the workers."""

from __future__ import annotations

import io

import numpy as np
from PIL import Image  # ~10 ms; a module global so that tests can hide a private name from this module alone


class DecodeFailed(Exception):
    """Sample `index` of a batch could not be decoded; the dataset adds the shard and key."""

    def __init__(self, index: int, cause: Exception):
        super().__init__(f"{type(cause).__name__}: {cause}")
        self.index = index


def decode_image(data) -> np.ndarray:
    """JPEG/PNG/WebP bytes -> HWC uint8 RGB array (full size: no draft-mode shortcut).

    RGB JPEGs take a fast path over PIL's private calls (Image._getdecoder, Image._getencoder,
    Image._decompression_bomb_check, Image.core.new); when any of them is missing or behaves
    differently, the public path gives the same pixels: Image.open + load, then np.asarray(im).
    """
    size = _jpeg_rgb_size(data)
    if size is not None:
        arr = _decode_jpeg(data, size)
        if arr is not None:
            return arr
    im = Image.open(io.BytesIO(data))
    if im.mode != "RGB":
        im = im.convert("RGB")
    im.load()
    return np.asarray(im)


_SOF = (0xC0, 0xC1, 0xC2)  # baseline, extended, progressive Huffman: what libjpeg always decodes


def _jpeg_rgb_size(data) -> tuple[int, int] | None:
    """(width, height) of an 8-bit, 3-component baseline/progressive JPEG; None for anything else."""
    if bytes(data[:2]) != b"\xff\xd8":
        return None
    i, n = 2, len(data)
    while i + 4 <= n and data[i] == 0xFF:
        marker = data[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        if marker in _SOF:
            if i + 10 > n:
                return None
            bits, comps = data[i + 4], data[i + 9]
            h, w = (data[i + 5] << 8) | data[i + 6], (data[i + 7] << 8) | data[i + 8]
            return (w, h) if bits == 8 and comps == 3 and w and h else None
        if 0xC3 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC) or marker in (0xDA, 0xD9):
            return None  # other frame types, or scan data before any frame header
        i += 2 + ((data[i + 2] << 8) | data[i + 3])
    return None


def _decode_jpeg(data, size: tuple[int, int]) -> np.ndarray | None:
    """Decode with PIL's JPEG decoder straight away, as Image.open + load would (same decoder,
    same arguments for an RGB JPEG) minus its Python header parsing: ~25% of a 224x224 decode.
    None when anything is off; the caller then takes the public path, which raises properly."""
    if getattr(Image, "_getencoder", None) is None:
        return None  # the result could not be packed: decoding here would be wasted work
    try:
        Image._decompression_bomb_check(size)
        decoder = Image._getdecoder("RGB", "jpeg", ("RGB", ""))
        core = Image.core.new("RGB", size)
        try:
            decoder.setimage(core, (0, 0, *size))
            status, err = decoder.decode(bytes(data))
        finally:
            decoder.cleanup()
    except (AttributeError, TypeError, ValueError, OSError):
        return None
    if status >= 0 or err < 0:  # wanted more data (truncated) or failed
        return None
    return _pack(core, size)


def _pack(core, size: tuple[int, int]) -> np.ndarray | None:
    """A decoded PIL core image (RGB) -> HWC array over one bytes object; None when PIL's private
    encoder call is missing or misbehaves (the caller then decodes through the public path).

    np.asarray(im) goes through tobytes(), which packs 64 KiB chunks and joins them: one more
    copy of every image. Packing the whole image in one encoder call skips it (~7% of a
    224x224 JPEG decode, measured).
    """
    w, h = size
    try:
        encoder = Image._getencoder("RGB", "raw", ("RGB",))
        try:
            encoder.setimage(core, (0, 0, w, h))
            _, status, packed = encoder.encode(w * h * 3)
        finally:
            encoder.cleanup()
    except (AttributeError, TypeError, ValueError, OSError, RuntimeError):
        return None
    if status == 1 and len(packed) == w * h * 3:  # 1: all of it in this one call
        return np.frombuffer(packed, np.uint8).reshape(h, w, 3)
    return None


_MALLOC_TUNED = False


def tune_worker_malloc() -> bool:
    """In a DataLoader worker process: let glibc keep freed memory for reuse.

    Every decoded image passes through a ~150 KB bytes object; by default glibc serves those
    with mmap or trims them off the heap top again, so each image paid ~40 page faults: ~30%
    of a 224x224 JPEG decode here (measured). Only the worker's own allocator changes; returns
    whether it did (glibc only).
    """
    global _MALLOC_TUNED
    if _MALLOC_TUNED:
        return True
    import ctypes
    import platform

    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3  # <malloc.h>
    _MALLOC_TUNED = bool(libc.mallopt(m_mmap_threshold, 32 << 20) and libc.mallopt(m_trim_threshold, 256 << 20))
    return _MALLOC_TUNED


def np_empty(shape) -> np.ndarray:
    """Default batch allocator; make_loader swaps in one that reuses shared-memory slots."""
    return np.empty(shape, np.uint8)


def to_chw(batch: np.ndarray):
    """(B,H,W,3) uint8 array -> (B,3,H,W) tensor view (channels-last memory, no copy)."""
    import torch

    return torch.from_numpy(batch).permute(0, 3, 1, 2)


class Encoded:
    """A batch's encoded images, still encoded, in one buffer: what workers ship when the main
    process decodes on the GPU (make_loader(decode="cuda")). One array pickles as one copy;
    a list of bytes objects would cost one object per image."""

    def __init__(self, blobs: list):
        sizes = np.array([0 if b is None else len(b) for b in blobs], np.int64)
        self.offsets = np.concatenate([[0], np.cumsum(sizes)])
        self.missing = [i for i, b in enumerate(blobs) if b is None]
        self.data = np.frombuffer(bytearray(b"".join(bytes(b) for b in blobs if b is not None)), np.uint8)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def blobs(self) -> list:
        """The images' bytes, as numpy views (None where a sample lacks the field)."""
        missing = set(self.missing)
        return [None if i in missing else self.data[self.offsets[i]:self.offsets[i + 1]] for i in range(len(self))]


def ships_encoded(alloc) -> bool:
    """Whether the batch memory comes from a loader transport that decodes images in the main
    process (on the GPU): then the workers leave them encoded."""
    return bool(getattr(getattr(alloc, "__self__", None), "ship_encoded", False))


def images(blobs: list, alloc=np_empty) -> object:
    """Encoded images -> one (B,3,H,W) uint8 tensor; a list of (3,H,W) tensors (None where a
    sample lacks the field) when shapes differ or some are missing. Left Encoded for a transport
    that decodes them on the GPU."""
    import torch

    if ships_encoded(alloc):
        return Encoded(blobs)
    out = None
    arrays = []
    for i, data in enumerate(blobs):
        if data is None:
            arrays.append(None)
            continue
        try:
            arr = decode_image(data)
        except Exception as e:  # PIL raises OSError, SyntaxError, ValueError, DecompressionBomb...
            raise DecodeFailed(i, e) from e
        if out is None and not arrays:
            out = alloc((len(blobs),) + arr.shape)
        if out is not None and arr.shape == out.shape[1:]:
            out[i] = arr
        else:
            out = None
        arrays.append(arr)
    if out is not None and all(a is not None for a in arrays):
        return to_chw(out)
    return [None if a is None else torch.from_numpy(np.array(a)).permute(2, 0, 1) for a in arrays]


def fixed_batch(n: int, spec: dict, alloc=np_empty) -> np.ndarray:
    """A (n, nbytes) uint8 array for a fixed-shape field, to be filled by the shard readers."""
    nbytes = int(np.prod(spec["shape"])) * np.dtype(spec["dtype"]).itemsize
    return alloc((n, nbytes))


def stored_as_is(spec: dict, dtype: str | None) -> bool:
    """Whether a fixed-shape field's batch tensor is its stored bytes (no widening, no cast)."""
    return spec.get("kind") != "tokens" and not _casts(spec, dtype)


def _casts(spec: dict, dtype: str | None) -> bool:
    return (dtype is not None and spec.get("kind") == "array"
            and np.dtype(spec["dtype"]).kind == "f" and spec["dtype"] != dtype)


def arrays(flat: np.ndarray, present: np.ndarray, spec: dict, alloc=np_empty, dtype: str | None = None):
    """Filled fixed-shape rows -> (B,3,H,W) uint8 tensor for HWC images, else (B,*shape) tensor
    (float arrays cast to `dtype` when given, into memory from `alloc`); a list with None where
    rows are missing."""
    import torch

    if spec.get("kind") == "tokens":  # packed token rows: int64 for embedding lookups
        from shardkit.reader.tokens import rows
        return rows(flat, present, spec, alloc)
    shape = tuple(spec["shape"])
    data = torch.from_numpy(flat.view(np.dtype(spec["dtype"])).reshape((len(flat),) + shape))
    image = spec.get("kind") == "image" and len(shape) == 3
    if _casts(spec, dtype):
        target = getattr(torch, dtype)
        if present.all():
            itemsize = torch.empty(0, dtype=target).element_size()
            out = torch.from_numpy(alloc((len(flat), int(np.prod(shape)) * itemsize))).view(target)
            return out.view((len(flat),) + shape).copy_(data)
        return [d.to(target) if p else None for d, p in zip(data, present)]
    if present.all():
        return to_chw(data.numpy()) if image else data
    rows = [d.clone() if p else None for d, p in zip(data, present)]
    return [r.permute(2, 0, 1) if image and r is not None else r for r in rows]


def ints(values: list):
    """Ints -> int64 tensor; a list with None where samples lack the field (mixed datasets)."""
    import torch

    if any(v is None for v in values):
        return list(values)
    return torch.tensor(values, dtype=torch.int64)


def column(spec: dict, values: list, alloc=np_empty):
    """A batch column from stored values of a variable-size field."""
    kind = spec["kind"]
    if kind == "image":
        return images(values, alloc)
    if kind == "int":
        return ints(values)
    if kind in ("text", "json"):
        return values
    if kind in ("tokens", "array"):  # one document's ids / a variable-length 1-D array per sample
        from shardkit.reader.tokens import sequences, variable_arrays
        return (sequences if kind == "tokens" else variable_arrays)(values, spec)
    return [None if v is None else bytes(v) for v in values]


def unbatch(batch: dict, i: int) -> dict:
    """Sample i of a batch: tensors indexed, lists picked; absent fields left out."""
    out = {}
    for name, col in batch.items():
        v = col[i]
        if v is None:
            continue
        out[name] = v.item() if getattr(v, "ndim", None) == 0 else v
    return out


def collate(samples: list[dict]) -> dict:
    """Per-sample dicts (after a user transform) -> a batch: stack same-shape tensors, list the rest."""
    import torch

    names = sorted({n for s in samples for n in s}, key=lambda n: (n != "__key__", n))
    batch = {}
    for name in names:
        col = [s.get(name) for s in samples]
        if all(isinstance(v, torch.Tensor) for v in col) and len({tuple(v.shape) for v in col}) == 1:
            batch[name] = torch.stack(col)
        elif all(isinstance(v, int) and not isinstance(v, bool) for v in col):
            batch[name] = torch.tensor(col, dtype=torch.int64)
        else:
            batch[name] = col
    return batch
