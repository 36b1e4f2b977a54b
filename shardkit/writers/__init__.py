"""Shard writers: one shard per call, deterministic bytes, a ShardInfo back. Registry: `_writers()`,
{format: (from Samples, from a table)}, imported on first use (a bad format: `_lookup` names the choices).

Each format has two entry points with the same bytes out: from Samples (`get_writer`) and from a
samples table, the Arrow form build tasks hand each other (`get_table_writer`). A dataset of packed
token rows has its own layout per format (writers/token_rows.py), written from Samples.
"""

from __future__ import annotations


def _writers():
    from shardkit.writers.parquet import write_parquet, write_parquet_table
    from shardkit.writers.tar import write_tar, write_tar_table
    from shardkit.writers.token_rows import packed_or, write_rows_parquet, write_rows_tar

    return {"tar": (packed_or(write_tar, write_rows_tar), write_tar_table),
            "parquet": (packed_or(write_parquet, write_rows_parquet), write_parquet_table)}


def _lookup(fmt: str):
    writers = _writers()
    if fmt not in writers:
        raise ValueError(f"unknown shard format {fmt!r}; valid formats: {', '.join(sorted(writers))}")
    return writers[fmt]


def get_writer(fmt: str):
    """The writer of Samples for a shard format; a bad name lists the valid ones."""
    return _lookup(fmt)[0]


def get_table_writer(fmt: str):
    """The writer of a samples table (writers.parquet.samples_table) for a shard format (not for packed
    token rows: they are written from Samples)."""
    return _lookup(fmt)[1]
