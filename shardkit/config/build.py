"""The offline jobs' configs, with their checks: `shardkit build` (BuildConfig), `shardkit dedup` and
`build --dedup` (DedupConfig, and the LSH parameters a threshold gives; the two refer to each
other), `shardkit annotate` (AnnotateConfig)."""

from __future__ import annotations

import functools
import hashlib
import json
import math
import re
from dataclasses import asdict, dataclass

from shardkit.config.common import (BUILD_ENCODE, ENCODINGS, FORMATS, QUALITY, RESAMPLE_FILTERS, RESIZE_MODES,
                                    SHARD_SIZE, choice, positive)
from shardkit.config.job import JobOptions
from shardkit.contract import IMAGE_FIELD
from shardkit.errors import ConfigError


MAX_DOC_BYTES = 10_000_000  # --filter-max-bytes' default: a page of text is ~10 KB; 10 MB is a book shelf
NEW_DEFAULTS = {"filter_max_bytes": MAX_DOC_BYTES}  # BuildConfig.recorded leaves these out at their default


@dataclass(frozen=True)
class BuildConfig(JobOptions):
    """`shardkit build SRC OUT`: every CLI flag is one field here."""

    src: str
    out: str
    format: str = "tar"
    shard_size: int = SHARD_SIZE
    max_samples_per_shard: int = 10_000
    image_size: int | None = None
    resize_mode: str = "shorter"
    crop_size: int | None = None  # keep the centre crop_size×crop_size after resizing (256 → 224)
    resample: str = "bicubic"
    encode: str = BUILD_ENCODE  # config/common.py: why ShardWriter's differs
    quality: int = QUALITY
    labels: bool | None = None  # label by first-level subfolder; None: when SRC has class subfolders
    text_field: str = "text"  # the text of a .jsonl line (a JSON key) or of a Parquet row (a column)
    image_field: str = "image"  # the image column of Parquet sources: binary, or a struct {bytes, path}
    label_field: str | None = None  # the label column of Parquet sources (replaces folder labels)
    unit_samples: int | None = None  # samples per work unit; None: chosen from the worker count
    tokenizer: str | None = None  # a tokenizer.json file, or bpe:VOCAB_SIZE (trained on the corpus)
    eos_token: str | None = None
    seq_len: int | None = None  # pack documents into rows of seq_len + 1 tokens
    tail: str = "pad"  # the last partial packed row of a shard: pad it or drop it (counted)
    augment: int = 0  # K augmented variants per image, 0 = off
    augment_ops: str = "crop,flip,color"
    augment_keep_original: bool = False
    augment_seed: int = 0
    half: bool = False  # float .npy arrays stored as float16
    dedup: bool = False  # remove near-duplicates before shards are assigned (see DedupConfig)
    dedup_threshold: float = 0.8
    dedup_verify: bool = False
    image_distance: int = 10
    allow_empty: bool = False  # a folder without samples gives an empty dataset instead of an error
    map: str | None = None  # MODULE:FUNCTION run on each sample after the built-in stages (jobs/mapped_build.py)
    # workers, scheduler, worker_pool, on_error, progress, timeout, retries: JobOptions (config/job.py)
    # Curation (checked by stages.filters.Curation): --filter, --filter-option, --lang, --lang-threshold, --mask-pii
    filter: str | None = None  # comma-separated filters (stages.filters.FILTERS): drop what they refuse
    filter_option: tuple[str, ...] = ()
    lang: str | None = None
    lang_threshold: float = 0.65
    mask_pii: bool = False
    # A text larger than this is not given to the filters (each holds a few copies of it): removed and counted
    # as too-large (--filter-max-bytes; None: no bound).
    filter_max_bytes: int | None = MAX_DOC_BYTES
    dedup_exact: bool = False
    dedup_paragraphs: bool = False  # remove lines repeated across documents, the first copy in key order kept
    annotate: bool = False  # keep every sample; store the scores of the filters and --dedup as attribute tables

    # Fields that do not change the bytes written: left out of the recorded config and its hash,
    # so that the manifest is identical whatever the worker count, cluster or paths.
    RUNTIME_ONLY = ("src", "out", "unit_samples", "allow_empty", "map", *JobOptions.RUNTIME_ONLY)  # map: its output's fingerprint and manifest are build_map's

    def __post_init__(self):
        choice("format", self.format, FORMATS, "--format")
        choice("resize_mode", self.resize_mode, RESIZE_MODES, "--resize-mode")
        choice("resample", self.resample, RESAMPLE_FILTERS, "--resample")
        choice("encode", self.encode, ENCODINGS, "--encode")
        self.check_job()
        positive("shard_size", self.shard_size, "--shard-size")
        positive("max_samples_per_shard", self.max_samples_per_shard, "--max-samples-per-shard")
        positive("image_size", self.image_size, "--image-size", allow_none=True)
        positive("unit_samples", self.unit_samples, "--unit-samples", allow_none=True)
        positive("filter_max_bytes", self.filter_max_bytes, "--filter-max-bytes", allow_none=True)
        if not 1 <= self.quality <= 100:
            raise ConfigError(f"quality={self.quality!r}: expected 1..100 (--quality)")
        if self.resize_mode != "none" and self.image_size is None and self.resize_mode != "shorter":
            raise ConfigError(f"--resize-mode {self.resize_mode} needs --image-size N")
        if self.encode == "keep" and (self.image_size is not None or self.augment):
            raise ConfigError("--encode keep stores each input image's own bytes: it cannot resize or augment; "
                              "drop --image-size/--augment, or choose --encode jpeg|png|webp|raw")
        check_crop(self)
        if self.encode == "raw" and self.stored_size is None:
            raise ConfigError("--encode raw stores uint8 HxWx3 arrays of one fixed shape: give --image-size N with "
                              "--resize-mode center-crop or pad, or --crop-size C")
        if not self.text_field:
            raise ConfigError("text_field must be a non-empty JSON key or column name (--text-field)")
        if not self.image_field:
            raise ConfigError("image_field must be a non-empty column name (--image-field)")
        if self.label_field is not None and self.label_field in ("", self.text_field, self.image_field):
            raise ConfigError(f"label_field={self.label_field!r}: expected a column other than the text and image "
                              "columns (--label-field)")
        if self.labels not in (None, True, False):
            raise ConfigError(f"labels={self.labels!r}: expected True, False or None (--labels/--no-labels; "
                              "leave both out to label only folders with class subfolders)")
        check_cache_options(self)
        if self.annotate:
            _check_annotate(self)
        if self.dedup:
            self.dedup_config()  # validates the dedup options with DedupConfig's own checks

    def dedup_config(self) -> DedupConfig:
        """The DedupConfig that `build --dedup` runs with."""
        return DedupConfig(src=self.src, out=self.out, threshold=self.dedup_threshold, verify=self.dedup_verify,
                           image_distance=self.image_distance, text_field=self.text_field,
                           image_field=self.image_field, workers=self.workers,
                           scheduler=self.scheduler, on_error=self.on_error, progress=self.progress,
                           timeout=self.timeout, retries=self.retries)

    @property
    def output_image_field(self) -> str:
        """The stored image field: the encoding's extension (WebDataset); `keep` names each by its own."""
        return IMAGE_FIELD.get(self.encode, "image")

    @property
    def stored_size(self) -> int | None:
        """The side of the square every stored image has, or None when sizes vary."""
        if self.crop_size is not None:
            return self.crop_size
        return self.image_size if self.resize_mode in ("center-crop", "pad") else None

    def recorded(self) -> dict:
        """The output-affecting part of the config, as written into the manifest. A field added since
        datasets were built is left out at its default (NEW_DEFAULTS), so their hashes still match."""
        d = asdict(self)
        return {k: d[k] for k in sorted(d) if k not in self.RUNTIME_ONLY and not (
            k in NEW_DEFAULTS and d[k] == NEW_DEFAULTS[k])}

    def output_hash(self) -> str:
        blob = json.dumps(self.recorded(), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]


def _check_annotate(cfg: BuildConfig) -> None:
    """--annotate keeps every sample as read and stores scores: it needs something to score, and no
    step that edits or removes what it would score."""
    if not (cfg.filter or cfg.lang or cfg.dedup):
        raise ConfigError("--annotate keeps every sample and stores the scores of --filter, --lang and --dedup: add "
                          "--filter NAMES, --lang and/or --dedup")
    if cfg.tokenizer:
        raise ConfigError("--annotate scores documents' text, which a --tokenizer build does not keep: build the "
                          "text with it first, then tokenize what where= keeps")
    if cfg.mask_pii or cfg.dedup_exact:
        raise ConfigError("--annotate keeps every sample unchanged: --mask-pii (it edits the stored text) and "
                          "--dedup-exact (it removes) do not combine with it; --dedup marks exact duplicates too "
                          "(attribute exact_dup), and PII counts are scored with --filter pii")


@dataclass(frozen=True)
class AnnotateConfig(JobOptions):
    """`shardkit annotate OUT`: every CLI flag is one field here."""

    out: str
    scorers: str | None = None  # comma-separated names of stages.filters.FILTERS
    scorer_option: tuple[str, ...] = ()  # SCORER.OPTION=VALUE, --filter-option's syntax (stages.filters.parse_options)
    select: tuple[str, ...] = ()  # where= expressions whose kept samples per shard are stored

    def __post_init__(self):
        object.__setattr__(self, "select", tuple(self.select))
        object.__setattr__(self, "scorer_option", tuple(self.scorer_option))
        if not self.scorers and not self.select:
            raise ConfigError("nothing to do: name scorers (--scorers text-length,...) and/or selections to store "
                              "(--select \"lang == 'en'\")")
        self.check_job()


TAIL_CHOICES = ("pad", "drop")
AUGMENT_OPS = ("crop", "flip", "rotate", "color", "blur")


def check_crop(cfg: BuildConfig) -> None:
    """--crop-size C: after --image-size N (shorter side → N) keep the centre C×C, C <= N."""
    if cfg.crop_size is None:
        return
    positive("crop_size", cfg.crop_size, "--crop-size")
    if cfg.image_size is None or cfg.resize_mode not in ("shorter", "center-crop"):
        raise ConfigError(f"--crop-size {cfg.crop_size} crops the centre of the resized image: give --image-size N "
                          "with --resize-mode shorter (or center-crop), e.g. --image-size 256 --crop-size 224")
    if cfg.crop_size > cfg.image_size:
        raise ConfigError(f"--crop-size {cfg.crop_size} is larger than --image-size {cfg.image_size}, the shorter "
                          f"side after resizing: give a crop size of at most {cfg.image_size}")


def check_cache_options(cfg: BuildConfig) -> None:
    """Validate the tokenize / augment / half options of a BuildConfig (--tokenizer, --augment, ...)."""
    import os

    tok = cfg.tokenizer
    if tok is not None:
        m = re.fullmatch(r"bpe:([0-9]+)", tok) if isinstance(tok, str) else None
        if m is None and not (isinstance(tok, str) and os.path.isfile(tok)):
            raise ConfigError(
                f"--tokenizer {tok!r} is neither a tokenizer.json file nor bpe:VOCAB_SIZE; shardkit never downloads "
                "from the Hugging Face hub: save one with Tokenizer.from_pretrained(NAME).save('tokenizer.json') "
                "and pass that file, or train one on the corpus with e.g. --tokenizer bpe:32000")
        if m is not None and not 257 <= int(m.group(1)) <= 2**31:
            raise ConfigError(f"--tokenizer {tok}: a byte-level BPE needs a vocabulary of at least 257 "
                              "(256 bytes + end of text), e.g. bpe:32000")
    for name, flag in (("eos_token", "--eos-token"), ("seq_len", "--seq-len")):
        if getattr(cfg, name) is not None and tok is None:
            raise ConfigError(f"{flag} applies to tokenized builds: add --tokenizer FILE or --tokenizer bpe:N")
    positive("seq_len", cfg.seq_len, "--seq-len", allow_none=True)
    choice("tail", cfg.tail, TAIL_CHOICES, "--tail")
    if not isinstance(cfg.augment, int) or isinstance(cfg.augment, bool) or cfg.augment < 0:
        raise ConfigError(f"augment={cfg.augment!r}: expected 0 (off) or K >= 1 variants per image (--augment K)")
    if cfg.augment_keep_original and cfg.augment < 2:
        raise ConfigError("--augment-keep-original stores the original as variant 0 of K: give --augment K with K >= 2")
    ops = [op.strip() for op in str(cfg.augment_ops).split(",") if op.strip()]
    bad = [op for op in ops if op not in AUGMENT_OPS]
    if bad or (cfg.augment and not ops):
        raise ConfigError(f"--augment-ops {cfg.augment_ops!r}: expected a comma-separated list of "
                          f"{', '.join(AUGMENT_OPS)} (e.g. crop,flip,color)")
    if not isinstance(cfg.augment_seed, int) or cfg.augment_seed < 0:
        raise ConfigError(f"augment_seed={cfg.augment_seed!r}: expected an integer >= 0 (--augment-seed)")


# BuildConfig's curation fields: what DedupConfig.curation may hold (the curation flags of every job)
CURATION_FIELDS = ("filter", "filter_option", "lang", "lang_threshold", "mask_pii", "dedup_exact", "dedup_paragraphs",
                   "filter_max_bytes")
DEDUP_MODALITIES = ("auto", "text", "image")
# Weights (false positive, false negative) for datasketch's LSH parameter search. Candidates are checked
# against the threshold afterwards, so a false positive costs one cheap comparison while a false negative
# is a duplicate lost for good: misses weigh 9:1. At t=0.8, 128 perms: 14 x 9 (found: 87% at J=0.8,
# 97.5% at 0.85) where (0.5, 0.5) gives 9 x 13 (40% at 0.8, 69% at 0.85).
LSH_WEIGHTS = (0.1, 0.9)


@functools.lru_cache(maxsize=64)
def optimal_lsh_params(threshold: float, num_perm: int, weights: tuple[float, float] = LSH_WEIGHTS) -> tuple[int, int]:
    """(bands, rows) minimising the weighted false positive + false negative area, as MinHashLSH
    chooses them: FP = ∫_0^t P(s) ds, FN = ∫_t^1 (1 - P(s)) ds with P(s) = 1 - (1 - s^r)^b, the first
    (b, r) in b-then-r order at the least error. Computed here, not through datasketch's private
    `_optimal_param`: each integrand is a polynomial of degree <= num_perm, which Gauss-Legendre
    with num_perm / 2 + 1 nodes integrates exactly (tests/test_dedup_text.py checks the two agree)."""
    import numpy as np

    x, w = np.polynomial.legendre.leggauss(max(32, num_perm // 2 + 1))
    below, w_below = (x + 1) * threshold / 2, w * threshold / 2
    above, w_above = threshold + (x + 1) * (1 - threshold) / 2, w * (1 - threshold) / 2
    best, opt = float("inf"), (0, 0)
    for b in range(1, num_perm + 1):
        r = np.arange(1, num_perm // b + 1, dtype=np.float64)[:, None]
        error = weights[0] * ((1 - (1 - below ** r) ** b) @ w_below) + weights[1] * (((1 - above ** r) ** b) @ w_above)
        i = int(np.argmin(error))
        if error[i] < best:
            best, opt = float(error[i]), (b, i + 1)
    return opt


MAX_MIN_SHINGLES = 32  # the most distinct shingles ever required (thresholds above ~0.97)


def min_shingles(threshold: float, cap: int = MAX_MIN_SHINGLES) -> int:
    """Fewest distinct shingles a document needs to be compared by similarity. Two different sets of s
    shingles reach Jaccard t only if s >= t / (1 - t) (one inside the other, one shingle apart); below
    that only identical sets match, which for different texts comes from repetition alone ('ha ha ha
    …', ASCII art folded to a few words): such documents are compared for exact equality instead."""
    return cap if threshold >= 1.0 else min(cap, max(1, math.ceil(threshold / (1.0 - threshold) - 1e-9)))
IMAGE_HASHES = ("dhash", "phash")


@dataclass(frozen=True)
class DedupConfig(JobOptions):
    """`shardkit dedup SRC OUT` (and `build --dedup`): every CLI flag is one field here."""

    src: str = ""
    out: str = ""
    threshold: float = 0.8
    num_perm: int = 128
    ngram: int = 5
    bands: int | None = None
    rows: int | None = None
    seed: int = 1
    verify: bool = False
    modality: str = "auto"
    image_hash: str = "phash"
    image_distance: int = 10
    partition_size: int = 5000
    format: str = "tar"  # shard format when SRC is a raw folder (a dataset keeps its own formats)
    text_field: str = "text"
    image_field: str = "image"  # the image column of Parquet sources in a raw folder
    exact_only: bool = False  # equal normalised texts only, no MinHash (build --dedup-exact)
    # The curation flags, as BuildConfig's fields of the same names ({"filter": "c4", "lang": "en"}); None: off.
    # A raw SRC's build runs them; a built dataset's text runs through them after the dedup (jobs.dedup).
    curation: dict | None = None

    RUNTIME_ONLY = ("src", "out", "partition_size", *JobOptions.RUNTIME_ONLY)

    def __post_init__(self):
        if not isinstance(self.threshold, (int, float)) or not 0.0 < self.threshold <= 1.0:
            raise ConfigError(f"threshold={self.threshold!r}: expected a Jaccard similarity in (0, 1] (--threshold)")
        positive("num_perm", self.num_perm, "--num-perm")
        positive("ngram", self.ngram, "--ngram")
        positive("bands", self.bands, "--bands", allow_none=True)
        positive("rows", self.rows, "--rows", allow_none=True)
        positive("partition_size", self.partition_size, "--partition-size")
        if (self.bands is None) != (self.rows is None):
            raise ConfigError("give both --bands and --rows, or neither (then the optimal pair for --threshold is used)")
        if self.bands is not None and self.bands * self.rows > self.num_perm:
            raise ConfigError(f"--bands {self.bands} x --rows {self.rows} = {self.bands * self.rows} exceeds "
                              f"--num-perm {self.num_perm}; lower them or raise --num-perm")
        if not isinstance(self.seed, int) or self.seed < 0:
            raise ConfigError(f"seed={self.seed!r}: expected a non-negative integer (--seed)")
        choice("modality", self.modality, DEDUP_MODALITIES, "--modality")
        choice("image_hash", self.image_hash, IMAGE_HASHES, "--image-hash")
        choice("format", self.format, FORMATS, "--format")
        if not isinstance(self.image_distance, int) or not 0 <= self.image_distance <= 32:
            raise ConfigError(f"image_distance={self.image_distance!r}: expected 0..32 bits of 64 (--image-distance)")
        self.check_job()
        if not self.text_field:
            raise ConfigError("text_field must be a non-empty JSON key (--text-field)")
        if not self.image_field:
            raise ConfigError("image_field must be a non-empty column name (--image-field)")
        if self.curation is not None:
            if not isinstance(self.curation, dict) or set(self.curation) - set(CURATION_FIELDS):
                raise ConfigError(f"DedupConfig(curation={self.curation!r}): expected a dict of BuildConfig's curation "
                                  f"fields ({', '.join(CURATION_FIELDS)})")

    def lsh_params(self) -> tuple[int, int]:
        """(bands, rows) in effect: the ones given, else the optimal pair weighted toward recall."""
        if self.exact_only:
            return 0, 0
        return (self.bands, self.rows) if self.bands else optimal_lsh_params(self.threshold, self.num_perm)

    def min_shingles(self) -> int:
        """Distinct shingles a text needs to be compared by similarity (fewer: exact equality only)."""
        return 1 << 30 if self.exact_only else min_shingles(self.threshold)

    def recorded(self) -> dict:
        """The result-affecting config for summary.json: values in effect (bands, rows), never a null."""
        d = asdict(self)
        d["bands"], d["rows"] = self.lsh_params()
        d["min_shingles"] = self.min_shingles()
        # the curation is the manifest's record (build.curation), not the dedup's
        return {k: d[k] for k in sorted(d) if k not in self.RUNTIME_ONLY and k != "curation"}

    def build_config(self) -> BuildConfig:
        """The build `shardkit dedup RAW OUT` runs: input bytes kept (encode keep), this config's settings."""
        return BuildConfig(self.src, self.out, format=self.format, encode="keep", text_field=self.text_field,
                           image_field=self.image_field, workers=self.workers, scheduler=self.scheduler, on_error=self.on_error,
                           progress=self.progress, dedup=True, dedup_threshold=self.threshold,
                           dedup_verify=self.verify, image_distance=self.image_distance, timeout=self.timeout,
                           retries=self.retries, **(self.curation or {}))
