"""WriterConfig: how ShardWriter and build_map store samples and cut them into shards."""

from __future__ import annotations
from dataclasses import dataclass


ENCODINGS = ("jpeg", "png", "webp", "raw")  # how a PIL image is stored (stages.image.encode)


FORMATS = ("tar", "parquet", "both")


@dataclass(frozen=True)
class WriterConfig:
    """How samples are stored and cut into shards (ShardWriter's and build_map's options)."""

    format: str = "tar"
    shard_size: int = 256 * 2**20  # stored bytes per shard, at most (one sample larger than this is a shard)
    max_samples_per_shard: int | None = None
    encode: str = "png"  # PIL images: jpeg, png, webp or raw (HWC uint8)
    quality: int = 90  # jpeg / webp

    def __post_init__(self):
        if self.format not in FORMATS:
            raise ValueError(f"format={self.format!r}; expected one of {', '.join(FORMATS)}")
        if self.encode not in ENCODINGS:
            raise ValueError(f"encode={self.encode!r}; expected one of {', '.join(ENCODINGS)} "
                             "(how PIL images are stored)")
        if not isinstance(self.shard_size, int) or self.shard_size <= 0:
            raise ValueError(f"shard_size={self.shard_size!r}; expected a positive number of bytes, e.g. 256 * 2**20")
        if self.max_samples_per_shard is not None and self.max_samples_per_shard <= 0:
            raise ValueError(f"max_samples_per_shard={self.max_samples_per_shard!r}; expected a positive count or None")
        if not 1 <= self.quality <= 100:
            raise ValueError(f"quality={self.quality!r}; expected 1..100")

    @property
    def formats(self) -> list[str]:
        return ["tar", "parquet"] if self.format == "both" else [self.format]
