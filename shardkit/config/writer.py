"""WriterConfig: how ShardWriter and build_map store samples and cut them into shards."""

from __future__ import annotations

from dataclasses import dataclass

from shardkit.config.common import ENCODINGS as BUILD_ENCODINGS
from shardkit.config.common import FORMATS, QUALITY, SHARD_SIZE, USER_ENCODE
from shardkit.errors import ConfigError

ENCODINGS = tuple(e for e in BUILD_ENCODINGS if e != "keep")  # how a PIL image is stored (stages.image.encode)


@dataclass(frozen=True)
class WriterConfig:
    """How samples are stored and cut into shards (ShardWriter's and build_map's options); a bad one is a
    ConfigError naming the keyword."""

    format: str = "tar"
    shard_size: int = SHARD_SIZE
    max_samples_per_shard: int | None = None
    encode: str = USER_ENCODE  # PIL images: jpeg, png, webp or raw (HWC uint8)
    quality: int = QUALITY  # jpeg / webp

    def __post_init__(self):
        if self.format not in FORMATS:
            raise ConfigError(f"format={self.format!r}; expected one of {', '.join(FORMATS)}")
        if self.encode not in ENCODINGS:
            raise ConfigError(f"encode={self.encode!r}; expected one of {', '.join(ENCODINGS)} "
                              "(how PIL images are stored)")
        if not isinstance(self.shard_size, int) or isinstance(self.shard_size, bool) or self.shard_size <= 0:
            raise ConfigError(f"shard_size={self.shard_size!r}; expected a positive number of bytes, e.g. 256 * 10**6")
        if self.max_samples_per_shard is not None and self.max_samples_per_shard <= 0:
            raise ConfigError(f"max_samples_per_shard={self.max_samples_per_shard!r}; expected a positive count or None")
        if not 1 <= self.quality <= 100:
            raise ConfigError(f"quality={self.quality!r}; expected 1..100")

    @property
    def formats(self) -> list[str]:
        return ["tar", "parquet"] if self.format == "both" else [self.format]
