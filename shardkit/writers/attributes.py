"""Attribute tables: one Parquet file per shard id, row i = sample i of the shard, deterministic bytes.

Columns: `__key__` (the sample's key, so the table is checked against its shard and joins with
anything else keyed by sample), then the attribute columns in the order given. The file's schema
metadata `shardkit.attributes` records the shard content they were computed from (its sha256) and
the scorers' fingerprints, so a rerun can tell from the file alone whether it is current.
"""

from __future__ import annotations

import json
import os

from shardkit.contract import AttributeInfo, attributes_relpath
from shardkit.store.local import atomic_writer, sha256_file

METADATA_KEY = b"shardkit.attributes"


def attribute_table(keys, columns: dict, source: str, scorers: dict):
    """The Arrow table an attribute file holds: keys, then `columns` (name -> array) in order."""
    import pyarrow as pa

    table = pa.table({"__key__": pa.array(keys, pa.string()), **columns})
    meta = json.dumps({"source": source, "scorers": dict(sorted(scorers.items()))}, sort_keys=True)
    return table.replace_schema_metadata({METADATA_KEY: meta.encode()})


def write_attributes(table, root: str, shard_id: int, durable: bool = True) -> AttributeInfo:
    """Write an attribute_table as shard `shard_id`'s attribute file (temp, then rename); `durable=False`
    leaves the fsync to the caller. One row group: a reader takes whole columns of one shard."""
    import pyarrow.parquet as pq

    rel = attributes_relpath(shard_id)
    path = os.path.join(root, rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with atomic_writer(path, durable=durable) as out:
        pq.write_table(table.combine_chunks(), out, row_group_size=max(1, table.num_rows), compression="zstd",
                       write_page_checksum=True, write_statistics=False)
    meta = recorded(table.schema)
    return AttributeInfo(shard_id, rel, table.num_rows, os.path.getsize(path), sha256_file(path),
                         meta["source"], meta["scorers"])


def recorded(schema) -> dict:
    """{"source", "scorers"} as an attribute file's schema records them ({} for a file without)."""
    raw = (schema.metadata or {}).get(METADATA_KEY)
    return json.loads(raw) if raw else {}
