"""Packed token shards on the read side: rows gathered straight from the stored id array, and the
offsets of the shard's documents (the layout is described in shardkit/writers/token_rows.py)."""

from __future__ import annotations

import base64
import io
import mmap
import tarfile

import numpy as np

from shardkit.contract import ShardInfo
from shardkit.errors import ShardError

BLOCK = 512
TOKENS_MEMBER, OFFSETS_MEMBER = "tokens.npy", "doc_offsets.npy"
OFFSETS_METADATA = b"shardkit.doc_offsets"


def _npy_array(buf, offset: int, size: int, url: str, what: str) -> np.ndarray:
    """The NPY array stored at buf[offset:offset+size], as a view (no copy)."""
    head = io.BytesIO(bytes(buf[offset:offset + min(size, 4096)]))
    try:
        version = np.lib.format.read_magic(head)
        read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, fortran, dtype = read(head)
    except ValueError as e:
        raise ShardError(f"shard {url}: {what} is not an NPY array ({e}); rebuild the dataset") from e
    start = offset + head.tell()
    count = int(np.prod(shape, dtype=np.int64))
    if fortran or dtype.hasobject or start + count * dtype.itemsize > offset + size:
        raise ShardError(f"shard {url}: {what} has an unexpected NPY header; rebuild the dataset")
    return np.frombuffer(buf, dtype, count, start).reshape(shape)


def _member(mm, offset: int, url: str) -> tuple[str, int, int]:
    """(name, data offset, size) of the tar member whose header starts at `offset`."""
    try:
        info = tarfile.TarInfo.frombuf(bytes(mm[offset:offset + BLOCK]), "utf-8", "surrogateescape")
    except tarfile.TarError as e:
        raise ShardError(f"shard {url}: no tar member at byte {offset} ({e}); rebuild the dataset") from e
    return info.name, offset + BLOCK, info.size


def check_rows(dtype: np.dtype, shape: tuple, offsets: np.ndarray, shard: ShardInfo, spec: dict, url: str) -> None:
    """The stored rows must match the manifest (dtype, shape, row count) and the document offsets
    must run from 0, increasing, to somewhere in the last row."""
    expected = np.dtype(spec["dtype"]).newbyteorder("<")
    row_len = int(spec["seq_len"]) + 1
    if dtype != expected or len(shape) != 2 or shape[1] != row_len or shape[0] != shard.samples:
        raise ShardError(f"shard {url} holds {dtype} rows of shape {shape}, the manifest says "
                         f"{shard.samples} x {row_len} {expected}; rebuild the dataset")
    end = shape[0] * (row_len - 1) + 1  # rows overlap by one id
    if (offsets.ndim != 1 or len(offsets) < 2 or offsets[0] != 0 or np.any(np.diff(offsets) <= 0)
            or offsets[-1] > end or offsets[-1] <= end - row_len):
        raise ShardError(f"shard {url}: its document offsets are not an increasing run from 0 into the last "
                         "row; rebuild the dataset")
    if shard.documents is not None and len(offsets) - 1 != shard.documents:
        raise ShardError(f"shard {url} holds {len(offsets) - 1} documents, the manifest says {shard.documents}; "
                         "rebuild the dataset")


class TarRows:
    """A packed tar shard, memory-mapped: both NPY members are found from their tar headers."""

    def __init__(self, path: str, shard: ShardInfo, spec: dict, url: str):
        self.url = url
        with open(path, "rb") as f:
            self.mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        name, start, size = _member(self.mm, 0, url)
        if not name.endswith("." + TOKENS_MEMBER):
            raise ShardError(f"shard {url}: first member is {name!r}, expected *.{TOKENS_MEMBER}; rebuild the dataset")
        self.rows = _npy_array(self.mm, start, size, url, name)
        name, start, size = _member(self.mm, start + size + (-size % BLOCK), url)
        if not name.endswith("." + OFFSETS_MEMBER):
            raise ShardError(f"shard {url}: second member is {name!r}, expected *.{OFFSETS_MEMBER}; "
                             "rebuild the dataset")
        self.offsets = _npy_array(self.mm, start, size, url, name).astype(np.int64)
        check_rows(self.rows.dtype, self.rows.shape, self.offsets, shard, spec, url)

    def fill(self, rows: np.ndarray, out: np.ndarray, positions: np.ndarray) -> None:
        """Copy stored rows `rows` into out[positions] (out: rows of the same dtype and width)."""
        out[positions] = self.rows[rows]


class ParquetRows:
    """A packed Parquet shard: rows read through the ordinary Parquet reader (row groups cached)."""

    def __init__(self, path: str, shard: ShardInfo, spec: dict, url: str, cache):
        from shardkit.reader.shards import ParquetShard

        self.url = url
        self.shard = ParquetShard(path, shard, {"tokens": spec}, url, cache)
        meta = self.shard.pf.schema_arrow.metadata or {}
        if OFFSETS_METADATA not in meta:
            raise ShardError(f"shard {url} lacks its document offsets ({OFFSETS_METADATA.decode()} in the Parquet "
                             "metadata); rebuild the dataset")
        blob = base64.b64decode(meta[OFFSETS_METADATA])
        self.offsets = _npy_array(blob, 0, len(blob), url, "doc_offsets").astype(np.int64)
        width = self.shard.pf.schema_arrow.field("tokens").type.byte_width
        dtype = np.dtype(spec["dtype"]).newbyteorder("<")
        check_rows(dtype, (int(self.shard.starts[-1]), width // dtype.itemsize), self.offsets, shard, spec, url)

    def fill(self, rows: np.ndarray, out: np.ndarray, positions: np.ndarray) -> None:
        self.shard.fill("tokens", rows, out.view(np.uint8), positions)


def open_rows(path: str, shard: ShardInfo, spec: dict, url: str, cache) -> TarRows | ParquetRows:
    """A reader for one local packed token shard."""
    from shardkit.reader.shards import _check_size

    _check_size(path, shard, url)
    try:
        if shard.format == "tar":
            return TarRows(path, shard, spec, url)
        if shard.format == "parquet":
            return ParquetRows(path, shard, spec, url, cache)
    except ShardError:
        raise
    except Exception as e:  # pyarrow/OS errors: all mean the shard cannot be used
        raise ShardError(f"cannot open shard {url}: {type(e).__name__}: {e}; rebuild the dataset") from e
    raise ShardError(f"shard {url} has format {shard.format!r}; this reader knows 'tar' and 'parquet'")
