"""Shard writers: one shard per call, deterministic bytes, a ShardInfo back. Registry: WRITERS."""

from __future__ import annotations

import json
from typing import Any


def encode_value(spec: dict, value: Any) -> bytes:
    """A field value as the bytes of its tar member (WebDataset conventions)."""
    kind = spec["kind"]
    if kind in ("image", "bytes", "array", "tokens"):
        return bytes(value)
    if kind == "int":
        return str(int(value)).encode("ascii")
    if kind == "text":
        return value.encode("utf-8")
    if kind == "json":
        return json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    raise ValueError(f"unknown field kind {kind!r}; expected image, bytes, array, tokens, int, text or json")


def source_columns(samples) -> dict:
    """The `__source__` / `__source_row__` columns (contract.SOURCE_COLUMN): each sample's input
    path and its line or row, null where a sample has none (e.g. packed token rows)."""
    import pyarrow as pa

    from shardkit.contract import SOURCE_COLUMN, SOURCE_ROW_COLUMN, sample_source

    paths, rows = zip(*(sample_source(s.meta) for s in samples)) if samples else ((), ())
    return {SOURCE_COLUMN: pa.array(paths, pa.string()), SOURCE_ROW_COLUMN: pa.array(rows, pa.int64())}


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
