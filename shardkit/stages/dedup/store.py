"""Partition files of the dedup stages: named numpy arrays behind a JSON header, memory-mapped on read.

A later stage reads a slice of a partition (the bucket range it owns, the signature rows of its
candidate pairs) without loading the rest, so a task holds its own share of the corpus only.
Layout: 8-byte little-endian header length, the JSON header {name: [dtype, shape, offset], "_meta": …},
then each array's bytes at a 64-byte aligned offset. Written to a temp name and renamed.
"""

from __future__ import annotations

import json

import numpy as np

from shardkit.fs import atomic_writer

ALIGN = 64
MAGIC = b"SKDEDUP1"


def _dtype_spec(dtype: np.dtype):
    return dtype.descr if dtype.names else dtype.str


def save_arrays(path: str, arrays: dict[str, np.ndarray], meta: dict | None = None) -> None:
    """Write `arrays` (and a small JSON-able `meta`) to `path` atomically."""
    arrays = {k: np.ascontiguousarray(v) for k, v in arrays.items()}
    header, offset = {"_meta": meta or {}}, 0
    for name, a in arrays.items():
        header[name] = [_dtype_spec(a.dtype), list(a.shape), offset]
        offset += -(-a.nbytes // ALIGN) * ALIGN
    blob = json.dumps(header, sort_keys=True).encode()
    start = -(-(len(MAGIC) + 8 + len(blob)) // ALIGN) * ALIGN
    with atomic_writer(path) as f:
        f.write(MAGIC + len(blob).to_bytes(8, "little") + blob + b"\0" * (start - len(MAGIC) - 8 - len(blob)))
        for a in arrays.values():
            f.write(a.tobytes())
            f.write(b"\0" * (-a.nbytes % ALIGN))


class ArrayFile:
    """The arrays of one partition file, each memory-mapped on first access."""

    def __init__(self, path: str):
        with open(path, "rb") as f:
            head = f.read(len(MAGIC) + 8)
            if head[:len(MAGIC)] != MAGIC:
                raise ValueError(f"{path} is not a dedup partition file; delete the folder and rerun")
            size = int.from_bytes(head[len(MAGIC):], "little")
            self.header = json.loads(f.read(size))
        self.path, self.meta = path, self.header.pop("_meta")
        self.start = -(-(len(MAGIC) + 8 + size) // ALIGN) * ALIGN
        self._cache: dict[str, np.ndarray] = {}

    def __contains__(self, name: str) -> bool:
        return name in self.header

    def __getitem__(self, name: str) -> np.ndarray:
        if name not in self._cache:
            spec, shape, offset = self.header[name]
            dtype = np.dtype([tuple(f) for f in spec] if isinstance(spec, list) else spec)
            if int(np.prod(shape)) == 0:
                self._cache[name] = np.empty(shape, dtype)
            else:
                self._cache[name] = np.memmap(self.path, dtype, "r", self.start + offset, tuple(shape))
        return self._cache[name]


def pack_strings(values: list[str]) -> dict[str, np.ndarray]:
    """Strings as one UTF-8 buffer + offsets (compact, memory-mappable)."""
    encoded = [v.encode("utf-8", "surrogatepass") for v in values]
    offsets = np.zeros(len(encoded) + 1, np.int64)
    np.cumsum([len(e) for e in encoded], out=offsets[1:])
    return {"data": np.frombuffer(b"".join(encoded), np.uint8), "offsets": offsets}


def unpack_strings(data: np.ndarray, offsets: np.ndarray, rows) -> list[str]:
    """The strings at `rows` of a packed buffer."""
    rows = np.asarray(rows, np.int64)
    lo, hi = offsets[rows].tolist(), offsets[rows + 1].tolist()
    return [bytes(data[a:b]).decode("utf-8", "surrogatepass") for a, b in zip(lo, hi)]
