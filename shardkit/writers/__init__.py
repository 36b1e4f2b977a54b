"""Shard writers: one shard per call, deterministic bytes, a ShardInfo back. Registry: WRITERS."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class ShardInfo:
    """What the manifest records of one written shard. `path` is relative to the dataset root."""

    id: int
    format: str
    path: str
    samples: int
    bytes: int
    sha256: str
    index: dict[str, Any] | None = field(default=None)

    def to_dict(self) -> dict:
        d = asdict(self)
        if d["index"] is None:
            del d["index"]
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "ShardInfo":
        return cls(**{k: d[k] for k in ("id", "format", "path", "samples", "bytes", "sha256")},
                   index=d.get("index"))


def fixed_nbytes(spec: dict) -> int | None:
    """Bytes per value of a fixed-shape field (raw images, packed token rows, arrays, 0-d ones too),
    else None: Parquet stores these as fixed-size binary and readers gather them without copies."""
    if spec.get("shape") is not None and spec.get("dtype"):
        import numpy as np

        return int(np.prod(spec["shape"], dtype=np.int64)) * np.dtype(spec["dtype"]).itemsize
    return None


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


SHARD_SUFFIX = {"tar": ".tar", "parquet": ".parquet"}


def shard_relpath(shard_id: int, fmt: str) -> str:
    return f"shards/data-{shard_id:05d}{SHARD_SUFFIX[fmt]}"
