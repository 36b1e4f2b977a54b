"""WriterConfig: how ShardWriter and build_map store samples and cut them into shards; MapConfig: the
rest of build_map's options."""

from __future__ import annotations

from dataclasses import dataclass, field

from shardkit.config.common import ENCODINGS as BUILD_ENCODINGS
from shardkit.config.common import FORMATS, QUALITY, SHARD_SIZE, USER_ENCODE
from shardkit.config.job import JobOptions
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


WRITER_OPTIONS = ("format", "shard_size", "max_samples_per_shard", "encode", "quality")


@dataclass(frozen=True, kw_only=True)
class MapConfig(JobOptions):
    """build_map's options: how it runs (JobOptions), how it writes (`writer`), and how it groups inputs
    (`inputs_per_shard`), declares fields and curates (`curation`, a stages.filters.Curation)."""

    writer: WriterConfig = field(default_factory=WriterConfig)
    fields: dict | None = None
    inputs_per_shard: int = 1000
    curation: object = None

    def __post_init__(self):
        self.check_job("{}=")
        if not self.curation:  # None, or a curation that does nothing
            object.__setattr__(self, "curation", None)
        if not isinstance(self.inputs_per_shard, int) or isinstance(self.inputs_per_shard, bool) \
                or self.inputs_per_shard <= 0:
            raise ConfigError(f"inputs_per_shard={self.inputs_per_shard!r}; expected a positive int")

    @classmethod
    def from_options(cls, options: dict) -> MapConfig:
        """A MapConfig from build_map's keywords (the writer's among them); an unknown one is a ConfigError."""
        valid = WRITER_OPTIONS + tuple(f for f in cls.__dataclass_fields__ if f != "writer")
        unknown = sorted(set(options) - set(valid))
        if unknown:
            raise ConfigError(f"build_map: unknown option(s) {unknown}; valid: {', '.join(valid)}")
        writer = WriterConfig(**{k: v for k, v in options.items() if k in WRITER_OPTIONS})
        return cls(writer=writer, **{k: v for k, v in options.items() if k not in WRITER_OPTIONS})
