"""Array stage: .npy inputs -> fixed-shape little-endian arrays (float16 with --half)."""

from __future__ import annotations

import io
import os
from typing import Iterator

import numpy as np

from shardkit.errors import RejectedInput, RejectionLog
from shardkit.store.remote import RemoteError
from shardkit.stages import map_samples
from shardkit.store import join

ARRAY_FIELD = "array"
ARRAY_EXT = ".npy"


def read_npy(data: bytes) -> np.ndarray:
    """.npy bytes -> array; pickled object arrays and broken files are rejected inputs."""
    try:
        return np.load(io.BytesIO(data), allow_pickle=False)
    except (ValueError, OSError, EOFError) as e:  # numpy's errors for bad magic, header, truncation, pickles
        raise RejectedInput(f"unreadable .npy array: {e}") from None


def _header(path: str, policy=None) -> tuple[tuple, np.dtype]:
    from numpy.lib import format as npf

    from shardkit.store import open_source

    with open_source(path, policy) as f:
        version = npf.read_magic(f)
        shape, _, dtype = (npf.read_array_header_1_0(f) if version == (1, 0) else npf.read_array_header_2_0(f))
    return tuple(shape), np.dtype(dtype)


def store_dtype(dtype: np.dtype, half: bool) -> np.dtype:
    """The stored dtype: float16 for floating arrays under --half, else the input's; little-endian."""
    if half and np.issubdtype(dtype, np.floating):
        return np.dtype("<f2")
    return dtype.newbyteorder("<")


def array_spec(root: str, records, half: bool, policy=None) -> dict | None:
    """The field spec of the arrays, from the first readable .npy header in key order (the other
    arrays must have its shape): decided before any task runs, so every shard has one schema.
    `policy`: the job's RemotePolicy, for a root on a store."""
    for rec in records:
        rel = next((f for f in rec.files if os.path.splitext(f)[1].lower() == ARRAY_EXT), None)
        if rel is None:
            continue
        try:
            shape, dtype = _header(join(root, rel), policy)
        except (OSError, ValueError, SyntaxError, RemoteError):  # a bad file is rejected later, by its task
            continue
        return {"kind": "array", "dtype": store_dtype(dtype, half).name, "shape": list(shape),
                "source_dtype": dtype.name}
    return None


def convert(data: bytes, spec: dict) -> bytes:
    """One .npy file -> the stored bytes (C order, little-endian, spec dtype)."""
    arr = read_npy(data)
    if list(arr.shape) != spec["shape"]:
        raise RejectedInput(f"array shape {list(arr.shape)} differs from the dataset's {spec['shape']} (the first "
                            "array's shape, in key order): every array of a dataset has one shape")
    target = np.dtype(spec["dtype"]).newbyteorder("<")
    if not np.can_cast(arr.dtype, target, "same_kind") and not (target.kind == "f" and arr.dtype.kind in "iu"):
        raise RejectedInput(f"array dtype {arr.dtype} cannot be stored as the dataset's {target.name} "
                            "(the first array's dtype)")
    with np.errstate(over="ignore"):  # overflow is checked just below, with a reason
        out = arr.astype(target)  # keeps a 0-d array 0-d (ascontiguousarray makes it 1-d); tobytes() is C order
    if target.kind == "f" and arr.dtype.kind == "f" and not np.array_equal(np.isfinite(out), np.isfinite(arr)):
        raise RejectedInput(f"array values overflow {target.name} (max |x| = {float(np.nanmax(np.abs(arr))):g}); "
                            "build without --half to keep float32")
    return out.tobytes()


def arrays(samples, *, spec: dict | None, log: RejectionLog) -> Iterator:
    """Stage: the .npy bytes under 'array' -> stored array bytes of the dataset's spec."""

    def one(sample):
        data = sample.fields.get(ARRAY_FIELD)
        if data is not None:
            sample.fields[ARRAY_FIELD] = convert(data, spec)
        return sample

    return map_samples(samples, one, stage="array", log=log)
