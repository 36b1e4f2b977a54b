"""The dataset contract both sides share: shard records, field kinds and sizes, key hashing, text bytes.

Build (writers, jobs) and read (reader, loader) import these from here, never from each other.
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass, field
from typing import Any

# Field kinds a manifest may declare (`fields[name]["kind"]`).
FIELD_KINDS = ("image", "bytes", "array", "tokens", "int", "text", "json")
# Image field names a dataset can hold, by encoding (WebDataset convention: field = extension).
IMAGE_FIELD = {"jpeg": "jpg", "png": "png", "webp": "webp", "raw": "raw"}
IMAGE_FIELDS = ("raw", "jpg", "png", "webp")
SHARD_SUFFIX = {"tar": ".tar", "parquet": ".parquet"}
# Per-member checksums: column `<field>` + this suffix (uint64) in the tar index sidecar and in
# Parquet shards. xxh3-64 hashes ~30 GB/s on one core, 7-12x zlib.crc32 (bench/checksum_bench.py).
CHECKSUM_SUFFIX = ".xxh3"

# Where each sample came from, beside its fields (never a tar member, never a manifest field): the
# input's path relative to the raw folder, and its line (1-based, .jsonl) or row (0-based, .parquet),
# null for whole files. Columns of the Parquet shard and of the tar index sidecar.
SOURCE_COLUMN, SOURCE_ROW_COLUMN = "__source__", "__source_row__"


def sample_source(meta: dict) -> tuple[str | None, int | None]:
    """(path, line or row) of a sample from its meta, as the builders record it."""
    return meta.get("source_path"), meta.get("source_row")


def source_columns(samples) -> dict:
    """The SOURCE_COLUMN / SOURCE_ROW_COLUMN arrays of a shard's samples, null where one has none."""
    import pyarrow as pa

    paths, rows = zip(*(sample_source(s.meta) for s in samples)) if samples else ((), ())
    return {SOURCE_COLUMN: pa.array(paths, pa.string()), SOURCE_ROW_COLUMN: pa.array(rows, pa.int64())}


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
    documents: int | None = None  # packed token shards: documents it holds (global document ids)
    # (first, last) sample key: a reader finds a key's shard without opening shards (keys are
    # sorted within a shard and across the shards of a build)
    keys: tuple[str, str] | None = None
    # Parquet shards: sums_digest of the keys and `<field>.xxh3` columns inside the file, so that
    # the checksums its values are checked against are vouched for by the manifest (a tar shard's
    # are, through its index sidecar's sha256). None: an older build (a remote copy is then checked
    # against `sha256` as it is fetched).
    sums: str | None = None

    def to_dict(self) -> dict:
        d = asdict(self)
        for optional in ("index", "documents", "keys", "sums"):
            if d[optional] is None:
                del d[optional]
        if "keys" in d:
            d["keys"] = list(d["keys"])
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "ShardInfo":
        keys = d.get("keys")
        return cls(**{k: d[k] for k in ("id", "format", "path", "samples", "bytes", "sha256")},
                   index=d.get("index"), documents=d.get("documents"), keys=tuple(keys) if keys else None,
                   sums=d.get("sums"))


def sums_digest(keys: list[str], sums: dict) -> str:
    """An xxh3-128 of a Parquet shard's keys and of its checksum columns `sums` {column name:
    (uint64 values, null as 0; validity)}, taken in name order: ShardInfo.sums, computed by the writer
    from the table it writes and by the reader from the file it opens (8 bytes a value to read)."""
    import numpy as np
    import xxhash

    h = xxhash.xxh3_128()
    h.update("\n".join(keys).encode("utf-8", "surrogatepass"))
    for name in sorted(sums):
        values, valid = sums[name]
        h.update(f"\n{name}\n".encode())
        h.update(np.ascontiguousarray(values, "<u8").tobytes())
        h.update(np.packbits(np.asarray(valid, bool)).tobytes())
    return h.hexdigest()


def key_bounds(keys) -> tuple[str, str] | None:
    """A shard's (first, last) key as its ShardInfo records them, from a list of keys or an Arrow key
    column; None for an empty shard."""
    if not len(keys):
        return None
    first, last = keys[0], keys[-1]
    return (getattr(first, "as_py", lambda: first)(), getattr(last, "as_py", lambda: last)())


def shard_relpath(shard_id: int, fmt: str) -> str:
    return f"shards/data-{shard_id:05d}{SHARD_SUFFIX[fmt]}"


def fixed_nbytes(spec: dict) -> int | None:
    """Bytes per value of a fixed-shape field (raw images, packed token rows, arrays, 0-d ones too),
    else None: Parquet stores these as fixed-size binary and readers gather them without copies."""
    if spec.get("shape") is not None and spec.get("dtype"):
        import numpy as np

        return int(np.prod(spec["shape"], dtype=np.int64)) * np.dtype(spec["dtype"]).itemsize
    return None


def key_hash(key: str) -> int:
    """A stable 63-bit hash of a sample key (Python's hash() is salted per process)."""
    return int.from_bytes(hashlib.blake2b(key.encode("utf-8"), digest_size=8).digest(), "little") >> 1


def decode_text(data: bytes | str) -> tuple[str, int]:
    """UTF-8 with replacement; returns the text and how many characters were replaced."""
    if isinstance(data, str):
        return data, 0
    try:
        return data.decode("utf-8"), 0
    except UnicodeDecodeError:
        text = data.decode("utf-8", errors="replace")
        return text, text.count("\ufffd") - data.decode("utf-8", errors="ignore").count("\ufffd")


def checksum(value) -> int:
    """xxh3-64 of one stored value: bytes-like as is, str as UTF-8, int as 8 little-endian bytes.

    The writers record it per member and the readers recompute it on the bytes they read.
    """
    import xxhash

    if isinstance(value, str):
        value = value.encode("utf-8")
    elif isinstance(value, int):
        value = value.to_bytes(8, "little", signed=True)
    return xxhash.xxh3_64_intdigest(value)


ATTRIBUTES_DIR = "attributes"  # OUT/attributes/data-NNNNN.parquet: one attribute table per shard id


@dataclass(frozen=True)
class AttributeInfo:
    """What the manifest records of one attribute table: shard `id`'s samples' scores, row i =
    sample i of the shard; `source` is the sha256 of the shard file they were computed from, and
    `scorers` {name: fingerprint} the scorers whose columns it holds."""

    id: int
    path: str
    rows: int
    bytes: int
    sha256: str
    source: str
    scorers: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "AttributeInfo":
        return cls(**{k: d[k] for k in ("id", "path", "rows", "bytes", "sha256", "source")},
                   scorers=dict(d.get("scorers") or {}))


def attributes_relpath(shard_id: int) -> str:
    return f"{ATTRIBUTES_DIR}/data-{shard_id:05d}.parquet"
