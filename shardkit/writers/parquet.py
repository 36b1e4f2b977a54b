"""Parquet shards: one row per sample, one column per field, row groups of a few MB."""

from __future__ import annotations

import json
import os

from shardkit.store.local import atomic_writer, sha256_file
from shardkit.contract import (CHECKSUM_SUFFIX, SOURCE_COLUMN, SOURCE_ROW_COLUMN, ShardInfo, checksum,
                               fixed_nbytes, key_bounds, shard_relpath, source_columns, sums_digest)

ROW_GROUP_BYTES = 4 * 2**20  # a few MB: large enough for columnar reads, small enough to stream
# Bytes per data page: a remote sample read by range fetches its page (its place from the page index),
# so a page is a few samples, not a row group. pyarrow cuts a page only between write batches of rows,
# so the batch is sized to match (at least one row).
PAGE_BYTES = 256 << 10


def arrow_type(spec: dict):
    """The Arrow type of a field spec (fixed-size binary for raw arrays: zero-copy to numpy)."""
    import pyarrow as pa

    kind = spec["kind"]
    if kind == "int":
        return pa.int64()
    if kind in ("text", "json"):
        return pa.string()
    nbytes = fixed_nbytes(spec)
    return pa.binary() if nbytes is None else pa.binary(nbytes)


def _column_value(spec: dict, value):
    if value is None:
        return None
    if spec["kind"] == "json":
        return json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    if spec["kind"] in ("image", "bytes", "array", "tokens"):
        return bytes(value)
    return value


def samples_table(samples, fields: dict):
    """`samples` (sorted by key) as an Arrow table: __key__, then per field (sorted) a nullable column
    and its `<field>.xxh3` column, the checksum of every stored value (null where the value is),
    then each sample's source (contract.source_columns).

    The same columns serve Parquet shards and the build's work-unit files, so a shard assembled from
    units holds exactly the bytes a shard written in one go would (and the units compute the sums)."""
    import pyarrow as pa

    samples = list(samples)
    columns = {"__key__": pa.array([s.key for s in samples], pa.string())}
    for name in sorted(fields):
        spec = fields[name]
        values = [_column_value(spec, s.fields.get(name)) for s in samples]
        columns[name] = _arrow_values(values, arrow_type(spec))
        columns[name + CHECKSUM_SUFFIX] = pa.array([None if v is None else checksum(v) for v in values], pa.uint64())
    columns.update(source_columns(samples))
    return pa.table(columns)


def _arrow_values(values: list, type_):
    """pa.array(values, type_); a fixed-size binary column without nulls (raw images, arrays) from one
    joined buffer instead: bytes.join copies large values without holding the GIL, so worker threads
    building tables do not queue behind each other (pa.array copies each value holding it)."""
    import pyarrow as pa

    if pa.types.is_fixed_size_binary(type_) and values and all(type(v) is bytes and len(v) == type_.byte_width
                                                                 for v in values):
        return pa.FixedSizeBinaryArray.from_buffers(type_, len(values), [None, pa.py_buffer(b"".join(values))])
    return pa.array(values, type_)


def table_samples(table, fields: dict) -> list:
    """The inverse of samples_table: Samples with the same field values (absent where null) and
    sources (meta source_path, source_row, and source as errors.jsonl names it)."""
    from shardkit.sample import Sample

    columns = {name: table.column(name).to_pylist() for name in sorted(fields)}  # the sums are left out
    paths, rows = table.column(SOURCE_COLUMN).to_pylist(), table.column(SOURCE_ROW_COLUMN).to_pylist()
    out = []
    for i, key in enumerate(table.column("__key__").to_pylist()):
        where = paths[i] if rows[i] is None else f"{paths[i]}:{rows[i]}"
        sample = Sample(key, meta={"source": key if paths[i] is None else where, "source_path": paths[i],
                                   "source_row": rows[i]})
        for name, values in columns.items():
            if values[i] is not None:
                sample.fields[name] = json.loads(values[i]) if fields[name]["kind"] == "json" else values[i]
        out.append(sample)
    return out


def write_parquet(samples, root: str, shard_id: int, fields: dict) -> ShardInfo:
    """Write `samples` (sorted by key) as one Parquet file; every field is a nullable column.

    Each field column has a `<field>.xxh3` column beside it: the checksum of every stored value
    (null where the value is), checked by readers on the values they read, however they read
    them. Pages carry CRCs too (the Parquet standard's), for readers that check those.
    """
    return write_parquet_table(samples_table(samples, fields), root, shard_id, fields)


def write_parquet_table(table, root: str, shard_id: int, fields: dict, durable: bool = True) -> ShardInfo:
    """Write a samples_table (possibly concatenated from several) as shard `shard_id`; durable=False
    leaves the fsync to the caller."""
    import pyarrow.parquet as pq

    rel = shard_relpath(shard_id, "parquet")
    names = sorted(fields)
    table = table.combine_chunks()  # row groups are sized from nbytes, which counts each chunk's offsets
    row_bytes = max(1, table.nbytes // max(1, table.num_rows))
    rows_per_group = max(1, min(table.num_rows, ROW_GROUP_BYTES // row_bytes))
    # Encoded media is already compressed: zstd there costs CPU on every read for nothing. Media and
    # fixed-size columns are also written PLAIN, without a dictionary, so each value's bytes lie in
    # the file as they are and readers slice them out by offset (reader/parquet_pages.py).
    compression = {n: "zstd" if fields[n]["kind"] in ("text", "json", "int", "tokens") else "none"
                   for n in names}
    compression.update({"__key__": "zstd", SOURCE_COLUMN: "zstd", SOURCE_ROW_COLUMN: "zstd"})
    dictionary = [n for n, codec in compression.items() if codec != "none"]
    compression.update({n + CHECKSUM_SUFFIX: "none" for n in names})  # random bits: nothing to gain
    path = os.path.join(root, rel)
    with atomic_writer(path, durable=durable) as out:
        pq.write_table(table, out, row_group_size=rows_per_group, compression=compression,
                       use_dictionary=dictionary, write_page_checksum=True, write_page_index=True,
                       data_page_size=PAGE_BYTES, write_batch_size=max(1, PAGE_BYTES // row_bytes))
    return ShardInfo(shard_id, "parquet", rel, table.num_rows, os.path.getsize(path), sha256_file(path),
                     keys=key_bounds(table.column("__key__")), sums=table_sums(table))


def table_sums(table) -> str:
    """contract.sums_digest of a samples_table: what ShardInfo.sums records of its shard."""
    sums = {}
    for name in table.column_names:
        if name.endswith(CHECKSUM_SUFFIX):
            col = table.column(name).combine_chunks()
            sums[name] = (col.fill_null(0).to_numpy(), col.is_valid().to_numpy(zero_copy_only=False))
    return sums_digest(table.column("__key__").to_pylist(), sums)
