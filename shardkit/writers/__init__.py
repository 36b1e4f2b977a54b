"""Shard writers: one shard per call, deterministic bytes, a ShardInfo back. Registry: WRITERS."""

from __future__ import annotations


def _writers():
    from shardkit.writers.parquet import write_parquet
    from shardkit.writers.tar import write_tar
    from shardkit.writers.tokens import packed_or, write_rows_parquet, write_rows_tar

    # A dataset of packed token rows has its own layout per format (writers/tokens.py).
    return {"tar": packed_or(write_tar, write_rows_tar), "parquet": packed_or(write_parquet, write_rows_parquet)}


def get_writer(fmt: str):
    """The writer function for a shard format; a bad name lists the valid ones."""
    writers = _writers()
    if fmt not in writers:
        raise ValueError(f"unknown shard format {fmt!r}; valid formats: {', '.join(sorted(writers))}")
    return writers[fmt]
