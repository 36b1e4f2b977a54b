"""What the configs share: the choices several commands take, sizes, and the checks that name the flag."""

from __future__ import annotations

import re

from shardkit.errors import ConfigError

FORMATS = ("tar", "parquet", "both")
RESIZE_MODES = ("shorter", "center-crop", "pad", "none")
RESAMPLE_FILTERS = ("nearest", "box", "bilinear", "hamming", "bicubic", "lanczos")  # PIL's, by name
ENCODINGS = ("jpeg", "png", "webp", "raw", "keep")  # keep: the input image's own bytes and extension
WORKER_POOLS = ("auto", "threads", "processes")  # how embedded Dask workers run (jobs/pool.choose_pool)

# The writers' defaults, written once: BuildConfig and `build --shard-size`, WriterConfig (ShardWriter,
# build_map). The image encoding is the one that differs, by what is stored: a build decodes photos
# and re-encodes them after resizing (jpeg, as such inputs mostly are); ShardWriter and build_map store
# a user's PIL images, which may be masks, labels or renders whose values a lossy codec would change.
SHARD_SIZE = 256 * 10**6  # stored bytes per shard, at most (one sample larger than this is a shard)
QUALITY = 90  # jpeg / webp
BUILD_ENCODE, USER_ENCODE = "jpeg", "png"

_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def parse_bytes(text: str | int) -> int:
    """'256MB' -> 256_000_000, '1GiB' -> 1_073_741_824, 4096 -> 4096."""
    if isinstance(text, int):
        return text
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*", str(text))
    if not m or m.group(2).lower() not in _UNITS:
        raise ConfigError(
            f"cannot read size {text!r}: expected a number with an optional unit, e.g. 256MB, 1GiB, 65536"
        )
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def choice(name: str, value, valid, flag: str) -> None:
    """Raise a ConfigError naming the bad value, the valid choices and the flag."""
    if value not in valid:
        raise ConfigError(f"{name}={value!r} is not valid; choose one of {', '.join(map(str, valid))} ({flag})")


def positive(name: str, value, flag: str, *, allow_none: bool = False) -> None:
    if (value is not None or not allow_none) and (not isinstance(value, int) or isinstance(value, bool) or value <= 0):
        raise ConfigError(f"{name}={value!r}: expected a positive integer ({flag})")


def remote_policy(cfg):
    from shardkit.store.urls import remote_policy as policy  # the store's module, imported when a job starts
    return policy(cfg)
