"""The row index of a row file, shared by counting and reading: ScanOptions, RowCount, keys, RowRef."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np

from shardkit.errors import RejectedInput

# One row per sample of a row file: 1-based line number (jsonl) or 0-based row (Parquet), the row's
# byte offset and length in the file (jsonl), and the running total of estimated output bytes.
INDEX_DTYPE = np.dtype([("number", "<i8"), ("offset", "<i8"), ("length", "<i8"), ("cum", "<i8")])
KEY_DIGITS = 6  # `{stem}/{line:06d}`; a file with more lines gets as many digits as its last number needs


@dataclass(frozen=True)
class ScanOptions:
    """What counting and reading rows depends on (a part of BuildConfig, small enough to ship to tasks)."""

    root: str
    state_dir: str  # OUT/.shardkit/scan
    text_field: str = "text"
    image_field: str = "image"
    label_field: str | None = None
    image_estimate: int | None = None  # estimated output bytes of one image when images are resized
    image_exts: bool = False  # find the formats of Parquet images (`--encode keep` names fields by them)
    policy: object = None  # the job's store.remote.RemotePolicy: every store call of a scan or read waits as it


@dataclass(frozen=True)
class RowCount:
    """What a counting task returns: a few numbers, never per-row data."""

    rows: int  # samples (non-blank lines, or Parquet rows)
    first: int  # number of the first and last sample
    last: int
    top_number: int  # the largest number the file could give a sample: sets the key width
    total_estimate: int  # estimated output bytes of all rows
    index: str  # the row index file (INDEX_DTYPE)
    parquet: dict = field(default_factory=dict)  # Parquet only: columns and label information
    error: str | None = None  # why the file could not be read (it is then a rejected input)
    keys: str | None = None  # the row keys file, when keys are not `{stem}/{number}` (tars: sources.tars)
    tar: dict = field(default_factory=dict)  # tar only: fields, labels, what was passed over (sources.tars)

    @property
    def width(self) -> int:
        return max(KEY_DIGITS, len(str(self.top_number)))


def row_key(stem_key: str, number: int, width: int) -> str:
    return f"{stem_key}/{number:0{width}d}"


def keys_of(stem_key: str, count: RowCount, start: int, stop: int, policy=None) -> list[str]:
    """The keys of rows [start, stop) of a row file: from its keys file, else `{stem}/{number}`.
    `policy` (here and below): the job's RemotePolicy, for files on a store (ScanOptions.policy)."""
    if count.keys is not None:
        return keys_table(count.keys, policy).column("key").slice(start, stop - start).to_pylist()
    return [row_key(stem_key, n, count.width) for n in load_index(count, policy)["number"][start:stop].tolist()]


def key_bounds(stem_key: str, count: RowCount, policy=None) -> tuple[str, str]:
    """The first and last key of a row file (it has rows)."""
    return (keys_of(stem_key, count, 0, 1, policy)[0],
            keys_of(stem_key, count, count.rows - 1, count.rows, policy)[0])


@lru_cache(maxsize=8)
def keys_table(path: str, policy=None):
    """A keys file (Arrow IPC, columns key and member), memory-mapped once per process."""
    import pyarrow as pa

    from shardkit.store import local_copy

    return pa.ipc.open_file(pa.memory_map(local_copy(path, policy=policy))).read_all()


def load_index(count: RowCount, policy=None) -> np.ndarray:
    """The row index, memory-mapped: callers touch only the pages of the rows they use (an index on a
    store is downloaded once per machine: its name changes with its content)."""
    from shardkit.store import local_copy

    return np.load(local_copy(count.index, policy=policy), mmap_mode="r")


class RowRef:
    """One row about to be read: where it comes from (for errors.jsonl) and how to make its Sample."""

    __slots__ = ("source", "make")

    def __init__(self, source: str, make):
        self.source, self.make = source, make

    @classmethod
    def failed(cls, source: str, reason: str) -> "RowRef":
        """A row that cannot be read (its file vanished or changed since it was counted)."""
        def make():
            raise RejectedInput(reason)

        return cls(source, make)
