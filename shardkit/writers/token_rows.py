"""Packed token shards: one (rows, seq_len+1) id array per shard plus its document offsets.

Tar: two NPY members, `tokens-{shard}.tokens.npy` (the rows) and `tokens-{shard}.doc_offsets.npy`,
so `webdataset.WebDataset(url).decode()` yields the shard as one sample of two arrays and
`numpy.load` reads each member as is. Parquet: one row per packed row in a fixed-size binary
column `tokens` (stored uncompressed and unencoded: ids barely compress, and reads stay copies),
the offsets in the file's key-value metadata. Either way the ids cost their own bytes plus a few
per document, not a tar header and padding per row.
"""

from __future__ import annotations

import base64
import io
import os

import numpy as np

from shardkit.contract import ShardInfo, shard_relpath
from shardkit.store.local import atomic_writer, sha256_file
from shardkit.stages.tokenize import OFFSETS_FIELD, PACKED, TOKENS_FIELD
from shardkit.writers.tar import BLOCK, RECORD, _HashingFile, _header

OFFSETS_METADATA = b"shardkit.doc_offsets"  # Parquet key-value metadata: base64 of the offsets' NPY bytes
ROW_GROUP_BYTES = 4 * 2**20  # as the other Parquet shards: a few MB per row group


def is_packed(fields: dict) -> bool:
    """Whether the dataset's tokens field uses the packed row layout."""
    return fields.get(TOKENS_FIELD, {}).get("layout") == PACKED


def packed_or(write, write_rows):
    """The writer for a format: `write_rows` for a dataset of packed token rows, else `write`."""
    def writer(samples, root: str, shard_id: int, fields: dict) -> ShardInfo:
        return (write_rows if is_packed(fields) else write)(samples, root, shard_id, fields)

    return writer


def _arrays(samples, fields: dict) -> tuple[np.ndarray, np.ndarray]:
    """The one shard sample the tokenize stage makes: (rows, offsets), checked against the spec."""
    samples = list(samples)
    if len(samples) != 1 or set(samples[0].fields) != {TOKENS_FIELD, OFFSETS_FIELD}:
        raise ValueError(f"a packed token shard is written from one sample with fields {TOKENS_FIELD!r} and "
                         f"{OFFSETS_FIELD!r} (what the tokenize stage yields); got {len(samples)} samples")
    rows, offsets = samples[0].fields[TOKENS_FIELD], samples[0].fields[OFFSETS_FIELD]
    spec = fields[TOKENS_FIELD]
    expected = np.dtype(spec["dtype"]).newbyteorder("<")
    assert rows.dtype == expected and rows.ndim == 2 and rows.shape[1] == spec["seq_len"] + 1, rows.shape
    return np.ascontiguousarray(rows), np.ascontiguousarray(offsets)


def npy_bytes(arr: np.ndarray) -> tuple[bytes, memoryview]:
    """(NPY header, data) of a C-contiguous array: numpy.load reads the two joined."""
    head = io.BytesIO()
    np.lib.format.write_array_header_1_0(head, np.lib.format.header_data_from_array_1_0(arr))
    return head.getvalue(), memoryview(arr).cast("B")


def write_rows_tar(samples, root: str, shard_id: int, fields: dict) -> ShardInfo:
    """The packed shard as a plain tar of two NPY members (rows, then document offsets)."""
    rows, offsets = _arrays(samples, fields)
    rel = shard_relpath(shard_id, "tar")
    path = os.path.join(root, rel)
    with atomic_writer(path) as raw:
        f = _HashingFile(raw)
        for name, arr in ((TOKENS_FIELD, rows), (OFFSETS_FIELD, offsets)):
            head, data = npy_bytes(arr)
            size = len(head) + data.nbytes
            f.write(_header(f"tokens-{shard_id:05d}.{name}.npy", size))
            f.write(head)
            f.write(data)
            f.write(b"\0" * (-size % BLOCK))
        f.write(b"\0" * (2 * BLOCK))
        f.write(b"\0" * (-f.n % RECORD))
        digest, nbytes = f.h.hexdigest(), f.n
    return ShardInfo(shard_id, "tar", rel, len(rows), nbytes, digest, documents=len(offsets) - 1)


def write_rows_parquet(samples, root: str, shard_id: int, fields: dict) -> ShardInfo:
    """The packed shard as Parquet: one row per packed row, offsets in the key-value metadata."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows, offsets = _arrays(samples, fields)
    width = rows.shape[1] * rows.itemsize
    column = pa.FixedSizeBinaryArray.from_buffers(pa.binary(width), len(rows), [None, pa.py_buffer(rows)])
    head, data = npy_bytes(offsets)
    table = pa.table({TOKENS_FIELD: column}).replace_schema_metadata(
        {OFFSETS_METADATA: base64.b64encode(head + bytes(data))})
    rel = shard_relpath(shard_id, "parquet")
    path = os.path.join(root, rel)
    with atomic_writer(path) as out:
        pq.write_table(table, out, row_group_size=max(1, ROW_GROUP_BYTES // width), compression="none",
                       use_dictionary=False, write_statistics=False)
    return ShardInfo(shard_id, "parquet", rel, len(rows), os.path.getsize(path), sha256_file(path),
                     documents=len(offsets) - 1)
