"""Frozen configuration dataclasses, one per command; __post_init__ validates each value."""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict, dataclass, fields

from shardkit.errors import ON_ERROR_CHOICES, ConfigError

FORMATS = ("tar", "parquet", "both")
RESIZE_MODES = ("shorter", "center-crop", "pad", "none")
ENCODINGS = ("jpeg", "png", "webp", "raw")
# Output field name of an image per encoding (WebDataset convention: field = extension).
IMAGE_FIELD = {"jpeg": "jpg", "png": "png", "webp": "webp", "raw": "raw"}

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
    if value is None and allow_none:
        return
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ConfigError(f"{name}={value!r}: expected a positive integer ({flag})")


@dataclass(frozen=True)
class BuildConfig:
    """`shardkit build SRC OUT`: every CLI flag is one field here."""

    src: str
    out: str
    format: str = "tar"
    shard_size: int = 256 * 10**6
    max_samples_per_shard: int = 10_000
    image_size: int | None = None
    resize_mode: str = "shorter"
    encode: str = "jpeg"
    quality: int = 90
    labels: bool = True
    text_field: str = "text"
    workers: int | None = None
    scheduler: str | None = None
    on_error: str = "skip"
    progress: bool = True

    # Fields that do not change the bytes written: left out of the recorded config and its hash,
    # so that the manifest is identical whatever the worker count, cluster or paths.
    RUNTIME_ONLY = ("src", "out", "workers", "scheduler", "progress")

    def __post_init__(self):
        choice("format", self.format, FORMATS, "--format")
        choice("resize_mode", self.resize_mode, RESIZE_MODES, "--resize-mode")
        choice("encode", self.encode, ENCODINGS, "--encode")
        choice("on_error", self.on_error, ON_ERROR_CHOICES, "--on-error")
        positive("shard_size", self.shard_size, "--shard-size")
        positive("max_samples_per_shard", self.max_samples_per_shard, "--max-samples-per-shard")
        positive("image_size", self.image_size, "--image-size", allow_none=True)
        if self.workers is not None and (not isinstance(self.workers, int) or self.workers < 0):
            raise ConfigError(f"workers={self.workers!r}: expected 0 (in-process, no cluster) or more (--workers)")
        if not 1 <= self.quality <= 100:
            raise ConfigError(f"quality={self.quality!r}: expected 1..100 (--quality)")
        if self.resize_mode != "none" and self.image_size is None and self.resize_mode != "shorter":
            raise ConfigError(f"--resize-mode {self.resize_mode} needs --image-size N")
        if self.encode == "raw" and (self.image_size is None or self.resize_mode not in ("center-crop", "pad")):
            raise ConfigError(
                "--encode raw stores uint8 HxWx3 arrays of one fixed shape: give --image-size N with "
                "--resize-mode center-crop or pad"
            )
        if not self.text_field:
            raise ConfigError("text_field must be a non-empty JSON key (--text-field)")

    @property
    def image_field(self) -> str:
        return IMAGE_FIELD[self.encode]

    def recorded(self) -> dict:
        """The output-affecting part of the config, as written into the manifest."""
        d = asdict(self)
        return {k: d[k] for k in sorted(d) if k not in self.RUNTIME_ONLY}

    def output_hash(self) -> str:
        blob = json.dumps(self.recorded(), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]


def field_names(cls) -> list[str]:
    return [f.name for f in fields(cls)]
