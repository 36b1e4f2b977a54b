"""Stored field values -> tensors: one tensor per field per batch, decoding done in the workers."""

from __future__ import annotations

import io

import numpy as np


class DecodeFailed(Exception):
    """Sample `index` of a batch could not be decoded; the dataset adds the shard and key."""

    def __init__(self, index: int, cause: Exception):
        super().__init__(f"{type(cause).__name__}: {cause}")
        self.index = index


def decode_image(data) -> np.ndarray:
    """JPEG/PNG/WebP bytes -> HWC uint8 RGB array (full size: no draft-mode shortcut)."""
    from PIL import Image

    im = Image.open(io.BytesIO(data))
    if im.mode != "RGB":
        im = im.convert("RGB")
    return np.asarray(im)


def np_empty(shape) -> np.ndarray:
    """Default batch allocator; make_loader swaps in one that reuses shared-memory slots."""
    return np.empty(shape, np.uint8)


def to_chw(batch: np.ndarray):
    """(B,H,W,3) uint8 array -> (B,3,H,W) tensor view (channels-last memory, no copy)."""
    import torch

    return torch.from_numpy(batch).permute(0, 3, 1, 2)


def images(blobs: list, alloc=np_empty) -> object:
    """Encoded images -> one (B,3,H,W) uint8 tensor; a list of (3,H,W) tensors (None where a
    sample lacks the field) when shapes differ or some are missing."""
    import torch

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


def arrays(flat: np.ndarray, present: np.ndarray, spec: dict):
    """Filled fixed-shape rows -> (B,3,H,W) uint8 tensor for HWC images, else (B,*shape) tensor;
    a list with None where rows are missing."""
    import torch

    if spec.get("kind") == "tokens":  # packed token rows: int64 for embedding lookups
        from shardkit.reader.tokens import rows
        return rows(flat, present, spec)
    shape = tuple(spec["shape"])
    data = flat.view(np.dtype(spec["dtype"])).reshape((len(flat),) + shape)
    image = spec.get("kind") == "image" and len(shape) == 3
    if present.all():
        return to_chw(data) if image else torch.from_numpy(data)
    rows = [torch.from_numpy(d.copy()) if p else None for d, p in zip(data, present)]
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
