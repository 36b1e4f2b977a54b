"""Shard writers: one shard per call, deterministic bytes, a ShardInfo back. Registry: WRITERS."""

from __future__ import annotations


def _writers():
    from shardkit.writers.parquet import write_parquet
    from shardkit.writers.tar import write_tar

    return {"tar": write_tar, "parquet": write_parquet}


def get_writer(fmt: str):
    """The writer function for a shard format; a bad name lists the valid ones."""
    writers = _writers()
    if fmt not in writers:
        raise ValueError(f"unknown shard format {fmt!r}; valid formats: {', '.join(sorted(writers))}")
    return writers[fmt]
