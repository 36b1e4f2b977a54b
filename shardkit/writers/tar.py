"""Plain WebDataset tar shards with fixed header fields, plus a member-offset index sidecar."""

from __future__ import annotations

import hashlib
import os
import tarfile

from shardkit.store.local import atomic_writer, sha256_file
from shardkit.contract import (CHECKSUM_SUFFIX, SOURCE_COLUMN, SOURCE_ROW_COLUMN, ShardInfo, checksum, key_bounds,
                               shard_relpath)

BLOCK = 512
RECORD = 20 * BLOCK  # tar's default blocking factor, so other tools see a conventional file end


def _tarfile_header(name: str, size: int) -> bytes:
    info = tarfile.TarInfo(name)
    info.size = size
    # Fixed metadata: two builds of the same input must give byte-identical shards.
    info.mtime = 0
    info.mode = 0o644
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.type = tarfile.REGTYPE
    return info.tobuf(tarfile.GNU_FORMAT, "utf-8", "strict")


# Every header differs from this one only in its name, size and checksum fields: filling them in
# costs ~3 us where tarfile's TarInfo.tobuf costs ~50 (a third of a small text sample's build time).
_TEMPLATE = _tarfile_header("", 0)
_BASE_SUM = sum(_TEMPLATE[:124]) + sum(_TEMPLATE[136:148]) + 8 * 32 + sum(_TEMPLATE[156:])


def _header(name: str, size: int) -> bytes:
    """The GNU tar header tarfile writes for a regular member with shardkit's fixed metadata."""
    raw = name.encode("utf-8")
    if len(raw) > 100 or size >= 8**11:  # a long-name block or a base-256 size: tarfile's own code
        return _tarfile_header(name, size)
    size_field = b"%011o\0" % size
    total = _BASE_SUM + sum(raw) + sum(size_field)
    return b"".join((raw, bytes(100 - len(raw)), _TEMPLATE[100:124], size_field, _TEMPLATE[136:148],
                     b"%06o\0 " % total, _TEMPLATE[156:]))


class _HashingFile:
    """Counts and hashes what is written, so the shard is not read back to checksum it."""

    def __init__(self, f):
        self.f, self.h, self.n = f, hashlib.sha256(), 0

    def write(self, data: bytes) -> None:
        self.f.write(data)
        self.h.update(data)
        self.n += len(data)


def write_tar(samples, root: str, shard_id: int, fields: dict) -> ShardInfo:
    """Write `samples` (sorted by key) as `{key}.{field}` members; return the ShardInfo."""
    from shardkit.writers.parquet import samples_table

    return write_tar_table(samples_table(samples, fields), root, shard_id, fields)


def _member_views(array, sums):
    """(valid flags, i -> member bytes, i -> member checksum) of one Arrow column chunk, without copying
    binary values. `sums`: the column's checksums (samples_table's), those of the stored bytes."""
    import numpy as np
    import pyarrow as pa

    valid = array.is_valid().to_numpy(zero_copy_only=False)
    t = array.type
    if pa.types.is_integer(t):  # int fields: decimal text, as WebDataset's cls members
        values = array.to_pylist()
        return valid, lambda i: str(values[i]).encode("ascii"), lambda i: checksum(str(values[i]).encode("ascii"))
    sums = sums.fill_null(0).to_numpy()  # uint64 exactly (nulls would make it float)
    buffers = array.buffers()
    data = memoryview(buffers[-1]) if buffers[-1] is not None else memoryview(b"")
    if pa.types.is_fixed_size_binary(t):
        width, base = t.byte_width, array.offset * t.byte_width
        return valid, lambda i: data[base + i * width:base + (i + 1) * width], lambda i: int(sums[i])
    wide = pa.types.is_large_binary(t) or pa.types.is_large_string(t)
    offsets = np.frombuffer(buffers[1], np.int64 if wide else np.int32)[array.offset:array.offset + len(array) + 1]
    offsets = offsets.tolist()
    # text: its UTF-8; json: its canonical dump (the bytes samples_table summed)
    return valid, lambda i: data[offsets[i]:offsets[i + 1]], lambda i: int(sums[i])


def _write_members(f, table, names: list[str], keys: list[str], offsets: dict, sizes: dict, sums: dict) -> None:
    """Writes each sample of `table` as `{key}.{field}` members to f, noting its key and, per field, each
    member's data offset, size and checksum (-1, -1, 0 where the sample lacks the field)."""
    for batch in table.to_batches():
        batch_keys = batch.column("__key__").to_pylist()
        columns = [(name, *_member_views(batch.column(name), batch.column(name + CHECKSUM_SUFFIX)))
                   for name in names]
        for i, key in enumerate(batch_keys):
            keys.append(key)
            for name, valid, member, member_sum in columns:
                if not valid[i]:
                    offsets[name].append(-1)
                    sizes[name].append(-1)
                    sums[name].append(0)
                    continue
                data = member(i)
                f.write(_header(f"{key}.{name}", len(data)))
                offsets[name].append(f.n)
                sizes[name].append(len(data))
                sums[name].append(member_sum(i))
                f.write(data)
                f.write(b"\0" * (-len(data) % BLOCK))


def write_tar_table(table, root: str, shard_id: int, fields: dict, durable: bool = True) -> ShardInfo:
    """Write a samples_table (possibly concatenated from work units) as `{key}.{field}` members.

    The index sidecar (Parquet: __key__, then `<field>.offset` / `<field>.size`, -1 when a
    sample lacks the field, `<field>.xxh3`, each member's checksum, then each sample's source)
    lets readers slice members out of the shard without parsing headers, and check what they sliced.
    durable=False leaves the fsync to the caller.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    rel = shard_relpath(shard_id, "tar")
    names = sorted(fields)
    keys: list[str] = []
    offsets = {n: [] for n in names}
    sizes = {n: [] for n in names}
    sums = {n: [] for n in names}
    with atomic_writer(os.path.join(root, rel), durable=durable) as raw:
        f = _HashingFile(raw)
        _write_members(f, table, names, keys, offsets, sizes, sums)
        f.write(b"\0" * (2 * BLOCK))
        f.write(b"\0" * (-f.n % RECORD))
        digest, nbytes = f.h.hexdigest(), f.n
    columns = {"__key__": pa.array(keys, pa.string())}
    for name in names:
        columns[f"{name}.offset"] = pa.array(offsets[name], pa.int64())
        columns[f"{name}.size"] = pa.array(sizes[name], pa.int64())
        columns[name + CHECKSUM_SUFFIX] = pa.array(sums[name], pa.uint64())
    for name in (SOURCE_COLUMN, SOURCE_ROW_COLUMN):
        columns[name] = table.column(name).combine_chunks()
    index_rel = rel + ".idx.parquet"
    with atomic_writer(os.path.join(root, index_rel), durable=durable) as out:
        pq.write_table(pa.table(columns), out, compression="zstd")
    index_path = os.path.join(root, index_rel)
    index = {"path": index_rel, "bytes": os.path.getsize(index_path), "sha256": sha256_file(index_path)}
    return ShardInfo(shard_id, "tar", rel, len(keys), nbytes, digest, index, keys=key_bounds(keys))
