"""Frozen configuration dataclasses of the commands (build, dedup, annotate) and of StreamingDataset;
__post_init__ validates each value and a bad one is a ConfigError naming the flag or keyword.
common.py: the choices and checks they share; job.py: JobOptions, the job options the three commands'
configs embed; build.py: build, dedup, annotate; stream.py: StreamingDataset."""

from shardkit.config.build import (AUGMENT_OPS, DEDUP_MODALITIES, IMAGE_HASHES, LSH_WEIGHTS, MAX_MIN_SHINGLES,
                                   TAIL_CHOICES, AnnotateConfig, BuildConfig, DedupConfig, check_cache_options,
                                   check_crop, min_shingles, optimal_lsh_params)
from shardkit.config.common import (ENCODINGS, FORMATS, RESAMPLE_FILTERS, RESIZE_MODES, WORKER_POOLS, choice,
                                    parse_bytes, positive, remote_policy)
from shardkit.config.job import JobOptions
from shardkit.config.stream import (DTYPE_ALIASES, FLOAT_DTYPES, INT_DTYPES, TOKEN_MODES, VARIANT_POLICIES,
                                    StreamConfig)

__all__ = ["AUGMENT_OPS", "DEDUP_MODALITIES", "DTYPE_ALIASES", "ENCODINGS", "FLOAT_DTYPES", "FORMATS", "IMAGE_HASHES",
           "INT_DTYPES", "LSH_WEIGHTS", "MAX_MIN_SHINGLES", "RESAMPLE_FILTERS", "RESIZE_MODES", "TAIL_CHOICES",
           "TOKEN_MODES", "VARIANT_POLICIES", "WORKER_POOLS", "AnnotateConfig", "BuildConfig", "DedupConfig", "JobOptions",
           "StreamConfig", "check_cache_options", "check_crop", "choice", "min_shingles", "optimal_lsh_params",
           "parse_bytes", "positive", "remote_policy"]
