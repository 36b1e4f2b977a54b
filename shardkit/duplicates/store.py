"""Partition files of the dedup stages: named numpy arrays behind a JSON header, read in parts.

A later stage reads a slice of a partition (the bucket range it owns, the signature rows of its
candidate pairs) without loading the rest, so a task holds its own share of the corpus only.
Layout: 8-byte little-endian header length, the JSON header {name: [dtype, shape, offset], "_meta": …},
then each array's bytes at a 64-byte aligned offset. Written to a temp name and renamed.
"""

from __future__ import annotations

import json
import math
import os

import numpy as np

import shardkit.store as store

ALIGN = 64
STRING_SPAN = 1 << 20  # strings this close together are read with one read of the span between them
MAGIC = b"SKDEDUP1"


def _columns(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Structured arrays stored field by field (`name.field`): a reader binary-searches or slices
    one contiguous column without touching, or copying, the others."""
    out = {}
    for k, v in arrays.items():
        if v.dtype.names:
            out.update({f"{k}.{f}": np.ascontiguousarray(v[f]) for f in v.dtype.names})
        else:
            out[k] = np.ascontiguousarray(v)
    return out


def save_arrays(path: str, arrays: dict[str, np.ndarray], meta: dict | None = None, policy=None) -> None:
    """Write `arrays` (and a small JSON-able `meta`) to `path` atomically (`policy`: the job's
    RemotePolicy, for a path on a store)."""
    arrays = _columns(arrays)
    header, offset = {"_meta": meta or {}}, 0
    for name, a in arrays.items():
        header[name] = [a.dtype.str, list(a.shape), offset]
        offset += -(-a.nbytes // ALIGN) * ALIGN
    blob = json.dumps(header, sort_keys=True).encode()
    start = -(-(len(MAGIC) + 8 + len(blob)) // ALIGN) * ALIGN
    with store.writer(path, policy=policy) as f:  # a local disk, or a store (one upload)
        f.write(MAGIC + len(blob).to_bytes(8, "little") + blob + b"\0" * (start - len(MAGIC) - 8 - len(blob)))
        for a in arrays.values():
            f.write(a.tobytes())
            f.write(b"\0" * (-a.nbytes % ALIGN))


class ArrayFile:
    """The arrays of one partition file, read on demand: whole (`f[name]`, cached), a slice, given
    rows, or a binary search. Reads are positioned reads into private memory, never a memory map:
    a mapped file's read-around would make a task resident in megabytes it never asked for."""

    def __init__(self, path: str, policy=None):
        # a file on a store is read from a copy on this machine (named by content)
        path = store.local_copy(path, policy=policy)
        with open(path, "rb") as f:
            head = f.read(len(MAGIC) + 8)
            if head[:len(MAGIC)] != MAGIC:
                raise ValueError(f"{path} is not a dedup partition file; delete the folder and rerun")
            size = int.from_bytes(head[len(MAGIC):], "little")
            self.header = json.loads(f.read(size))
        self.path, self.meta = path, self.header.pop("_meta")
        self.start = -(-(len(MAGIC) + 8 + size) // ALIGN) * ALIGN
        self._cache: dict[str, np.ndarray] = {}
        self._specs: dict[str, tuple] = {}

    def __contains__(self, name: str) -> bool:
        return name in self.header

    def _spec(self, name: str) -> tuple[np.dtype, tuple, int, int]:
        """(dtype, shape, file offset, bytes per row) of an array."""
        if name not in self._specs:
            spec, shape, offset = self.header[name]
            dtype = np.dtype(spec)
            self._specs[name] = dtype, tuple(shape), self.start + offset, dtype.itemsize * math.prod(shape[1:])
        return self._specs[name]

    def rows(self, name: str) -> int:
        return self.header[name][1][0]

    def __getitem__(self, name: str) -> np.ndarray:
        if name not in self._cache:
            self._cache[name] = self.slice(name, 0, self.rows(name))
        return self._cache[name]

    def slice(self, name: str, a: int, b: int) -> np.ndarray:
        """Rows a..b-1 of an array."""
        dtype, shape, offset, row = self._spec(name)
        out = np.empty((max(0, b - a),) + shape[1:], dtype)
        if b > a:
            with open(self.path, "rb", buffering=0) as f:
                f.seek(offset + a * row)
                f.readinto(memoryview(out).cast("B"))
        return out

    def take(self, name: str, rows) -> np.ndarray:
        """The given rows of an array (one read per row, or one of the whole array when most are wanted)."""
        rows = np.asarray(rows, np.int64)
        dtype, shape, offset, row = self._spec(name)
        if name in self._cache or len(rows) * 8 >= shape[0]:
            return self[name][rows]
        out = np.empty((len(rows),) + shape[1:], dtype)
        view = memoryview(out).cast("B")
        fd = os.open(self.path, os.O_RDONLY)
        try:
            for k, r in enumerate(rows.tolist()):
                view[k * row:(k + 1) * row] = os.pread(fd, row, offset + r * row)
        finally:
            os.close(fd)
        return out

    def searchsorted(self, name: str, value: int) -> int:
        """Where `value` would go in a sorted 1-D array (left side), reading ~log2(n) items."""
        dtype, shape, offset, row = self._spec(name)
        lo, hi = 0, shape[0]
        fd = os.open(self.path, os.O_RDONLY)
        try:
            while lo < hi:
                mid = (lo + hi) // 2
                if int(np.frombuffer(os.pread(fd, row, offset + mid * row), dtype)[0]) < value:
                    lo = mid + 1
                else:
                    hi = mid
        finally:
            os.close(fd)
        return lo


def read_strings(f: ArrayFile, name: str, rows) -> list[str]:
    """The strings at `rows` of a packed column `name` (name.data + name.offsets) of a file."""
    rows = np.asarray(rows, np.int64)
    lo, hi = f.take(f"{name}.offsets", rows).tolist(), f.take(f"{name}.offsets", rows + 1).tolist()
    if not lo:
        return []
    first, last = min(lo), max(hi)
    if last - first <= STRING_SPAN or len(rows) * 8 >= f.rows(f"{name}.offsets"):
        data = f.slice(f"{name}.data", first, last).tobytes()  # one read covers them all
        return [data[a - first:b - first].decode("utf-8", "surrogatepass") for a, b in zip(lo, hi)]
    return [f.slice(f"{name}.data", a, b).tobytes().decode("utf-8", "surrogatepass") for a, b in zip(lo, hi)]


def pack_strings(values: list[str]) -> dict[str, np.ndarray]:
    """Strings as one UTF-8 buffer + offsets (compact; rows readable alone)."""
    encoded = [v.encode("utf-8", "surrogatepass") for v in values]
    offsets = np.zeros(len(encoded) + 1, np.int64)
    np.cumsum([len(e) for e in encoded], out=offsets[1:])
    return {"data": np.frombuffer(b"".join(encoded), np.uint8), "offsets": offsets}
