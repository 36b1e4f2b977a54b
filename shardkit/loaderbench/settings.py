"""BenchConfig: every `shardkit bench` flag is one field here, validated on creation."""

from __future__ import annotations

import os
from dataclasses import dataclass

from shardkit.config import positive
from shardkit.errors import ConfigError

VARIANT_NAMES = ("raw-folder", "webdataset-tar", "shardkit-tar", "shardkit-parquet", "shardkit-raw")
EXTRA_VARIANTS = ("shardkit-mix",)  # measured when named: a mixture reads its own sample set


def default_workers() -> tuple[int, ...]:
    """0, 1, 2, ... up to the core count: where the loader stops scaling is the point of the run."""
    return tuple(range(0, (os.cpu_count() or 1) + 1))


def default_cache_dir() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "shardkit", "bench")


@dataclass(frozen=True)
class BenchConfig:
    """`shardkit bench [RAW_FOLDER]`: what to read, which variants, how to measure, where to write."""

    raw_folder: str | None = None  # None: a generated photo-like folder of `images` JPEGs
    out: str = "shardkit-bench"
    cache_dir: str | None = None  # None: default_cache_dir()
    images: int = 3000
    classes: int = 10
    image_size: int = 224
    workers: tuple[int, ...] | None = None  # None: default_workers()
    variants: tuple[str, ...] = VARIANT_NAMES
    batch_size: int = 64
    repeat: int = 3
    warmup: int = 5
    min_batches: int = 20  # batches measured per run at least: a small folder is read for several epochs
    step_ms: float = 0.0
    gpu: bool = False
    build_workers: int | None = None
    seed: int = 0
    plot: bool = True
    progress: bool = True
    trace: str | None = None  # a pipeline trace per variant x workers: PATH -> PATH's stem.<variant>.w<N>.trace.json

    def __post_init__(self):
        for name in ("images", "classes", "image_size", "batch_size", "repeat", "min_batches"):
            positive(name, getattr(self, name), f"--{name.replace('_', '-')}")
        if not isinstance(self.warmup, int) or self.warmup < 0:
            raise ConfigError(f"warmup={self.warmup!r}: expected batches >= 0 left out of each run (--warmup)")
        if not isinstance(self.step_ms, (int, float)) or self.step_ms < 0:
            raise ConfigError(f"step_ms={self.step_ms!r}: expected milliseconds >= 0 (--step-ms)")
        if self.gpu and self.step_ms:
            raise ConfigError("--gpu runs a real model step; drop --step-ms (the simulated step) or --gpu")
        if self.build_workers is not None and self.build_workers < 0:
            raise ConfigError(f"build_workers={self.build_workers!r}: expected 0 (in-process) or more (--build-workers)")
        workers = default_workers() if self.workers is None else tuple(self.workers)
        if not workers or any(not isinstance(w, int) or w < 0 for w in workers):
            raise ConfigError(f"workers={self.workers!r}: expected DataLoader worker counts >= 0, e.g. --workers 0,1,2")
        object.__setattr__(self, "workers", tuple(sorted(set(workers))))
        variants = tuple(self.variants)
        known = VARIANT_NAMES + EXTRA_VARIANTS
        bad = [v for v in variants if v not in known]
        if bad or not variants:
            raise ConfigError(f"variants={list(variants)!r}: {bad or 'none given'}; choose from "
                              f"{', '.join(known)} (--variants)")
        object.__setattr__(self, "variants", tuple(v for v in known if v in variants))
        if self.cache_dir is None:
            object.__setattr__(self, "cache_dir", default_cache_dir())

    def epochs_per_run(self, samples: int) -> int:
        """Epochs each run reads so that at least min_batches batches are measured after the warmup
        left out: 1 for any folder of batch_size * (warmup + min_batches) images or more."""
        per_epoch = max(1, -(-samples // self.batch_size))
        return max(1, -(-(self.warmup + self.min_batches) // per_epoch))
