"""Runs a build on Dask: plan shards up front, one task per shard, skip finished ones, manifest last."""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import time
from dataclasses import dataclass, field

from shardkit.config import BuildConfig, DedupConfig
from shardkit.contract import ShardInfo
from shardkit.errors import (ConfigError, EmptyInput, FailFast, Rejection, RejectedInput, RejectionLog,
                             count_by_reason)
from shardkit.fs import atomic_write, folder_lock
from shardkit.manifest import MANIFEST_NAME, Manifest, remove_unlisted_shards, write_manifest
from shardkit.sources import TEXT_EXTS, InputRecord, ScanResult, read_record, read_records, scan
from shardkit.stages import compose, map_samples
from shardkit.stages.arrays import array_spec, arrays
from shardkit.stages.augment import augmented_images, variant_fields
from shardkit.stages.image import images
from shardkit.stages.tokenize import (TOKENIZER_NAME, TOKENS_FIELD, TokenizerInfo, prepare_tokenizer, token_fields,
                                     tokenize)
from shardkit.dedup_engine import dedup_records, estimate_seconds
from shardkit.stages.dedup.report import dedup_record, write_report
from shardkit.tasks import lazy_client, plan_execution, progress_bar, run_tasks
from shardkit.writers import get_writer

log = logging.getLogger("shardkit.build")
STATE_DIR = ".shardkit"
MARKER_VERSION = 1


@dataclass(frozen=True)
class ShardPlan:
    """Which inputs one output shard holds: decided before any task runs, from sorted keys."""

    id: int
    records: tuple[InputRecord, ...]

    def fingerprint(self, config_hash: str) -> str:
        h = hashlib.sha256(f"{MARKER_VERSION}|{config_hash}|{self.id}".encode())
        for r in self.records:
            h.update(r.fingerprint().encode("utf-8", "surrogatepass"))
        return h.hexdigest()


@dataclass
class ShardResult:
    id: int
    shards: list[ShardInfo]
    rejections: list[Rejection]
    images: int = 0
    utf8_replaced: int = 0
    seconds: float = 0.0
    skipped: bool = False  # reused from a previous build
    failed: Rejection | None = None
    stats: dict = field(default_factory=dict)  # stage counters, e.g. tokens, rows, pad/dropped tokens

    def to_json(self) -> dict:
        return {"id": self.id, "shards": [s.to_dict() for s in self.shards],
                "rejections": [[r.path, r.stage, r.reason] for r in self.rejections],
                "images": self.images, "utf8_replaced": self.utf8_replaced, "stats": self.stats}

    @classmethod
    def from_json(cls, d: dict) -> "ShardResult":
        return cls(d["id"], [ShardInfo.from_dict(s) for s in d["shards"]],
                   [Rejection(*r) for r in d["rejections"]], d["images"], d["utf8_replaced"], skipped=True,
                   stats=d.get("stats", {}))


@dataclass
class BuildResult:
    """What the one-screen summary shows."""

    out: str
    inputs: int
    samples: int
    rejections: list[Rejection]
    shards: list[ShardInfo]
    seconds: float
    images: int
    reused_shards: int = 0
    utf8_replaced: int = 0
    duplicates: int = 0  # removed by --dedup (see OUT/dedup/)
    manifest: Manifest | None = field(default=None, repr=False)
    dedup: object = field(default=None, repr=False)  # the DedupResult of --dedup
    notes: list[str] = field(default_factory=list)  # what the scan read in a way worth knowing

    @property
    def rejected_by_reason(self) -> dict[str, int]:
        return count_by_reason(self.rejections)


def estimate_bytes(rec: InputRecord, cfg: BuildConfig, has_image: bool) -> int:
    """Output size guess used to cut shards before anything is encoded (shards are a target size)."""
    if not has_image or cfg.image_size is None or cfg.resize_mode == "none":
        return rec.size
    px = cfg.stored_size ** 2 if cfg.stored_size else cfg.image_size ** 2 * 4 / 3
    per_px = {"raw": 3.0, "png": 1.5, "jpeg": 0.3, "webp": 0.2}[cfg.encode]
    return int(px * per_px) + (rec.size if len(rec.files) > 1 else 0) // 8


def plan_shards(records: list[InputRecord], cfg: BuildConfig) -> list[ShardPlan]:
    """Cut the sorted records into shards by estimated bytes and sample count (deterministic)."""
    from shardkit.sources import IMAGE_EXTS

    plans, current, size = [], [], 0
    for rec in records:
        est = estimate_bytes(rec, cfg, any(os.path.splitext(f)[1].lower() in IMAGE_EXTS for f in rec.files))
        if current and (size + est > cfg.shard_size or len(current) >= cfg.max_samples_per_shard):
            plans.append(ShardPlan(len(plans), tuple(current)))
            current, size = [], 0
        current.append(rec)
        size += est
    if current:
        plans.append(ShardPlan(len(plans), tuple(current)))
    return plans


def field_specs(result: ScanResult, cfg: BuildConfig) -> dict:
    """The manifest's field specs, known before any task runs so every shard has the same schema."""
    fields = {}
    if "image" in result.kinds and cfg.encode == "keep":  # each input's own bytes, under its own extension
        fields.update({ext: {"kind": "image", "encoding": "keep"} for ext in sorted(result.image_exts)})
    elif "image" in result.kinds:
        spec = {"kind": "image", "encoding": cfg.encode}
        if cfg.encode == "raw":
            spec.update(dtype="uint8", shape=[cfg.stored_size, cfg.stored_size, 3])
        fields[cfg.image_field] = spec
    if "txt" in result.kinds:
        fields["txt"] = {"kind": "text"}
    if "json" in result.kinds:
        fields["json"] = {"kind": "json"}
    if result.classes is not None:
        fields["cls"] = {"kind": "int", "dtype": "int64"}
    return fields


def cache_fields(fields: dict, result: ScanResult, cfg: BuildConfig, tok: TokenizerInfo | None) -> dict:
    """field_specs plus the caching stages: augmented variants, arrays, tokens (txt becomes tokens)."""
    if cfg.augment and cfg.image_field in fields:
        fields.update(variant_fields(cfg.image_field, fields.pop(cfg.image_field), cfg))
    if "array" in result.kinds and (spec := array_spec(cfg.src, result.records, cfg.half)) is not None:
        fields["array"] = spec
    return fields if tok is None else token_fields(fields, result.kinds, tok, cfg.seq_len)


def _corpus_key(scanned: ScanResult) -> str:
    """Fingerprint of every input (names, sizes, mtimes): a trained tokenizer is reused while it holds."""
    h = hashlib.sha256()
    for rec in scanned.records:
        h.update(rec.fingerprint().encode("utf-8", "surrogatepass"))
    return h.hexdigest()


def _corpus(scanned: ScanResult, cfg: BuildConfig) -> list[str]:
    """Every document's text, in key order, to train a tokenizer on (bad inputs are rejected later)."""
    texts = []
    for rec in scanned.records:
        if rec.line is None and not any(os.path.splitext(f)[1].lower() in TEXT_EXTS for f in rec.files):
            continue
        try:
            texts.append(read_record(cfg.src, rec, cfg.text_field).fields["txt"])
        except (RejectedInput, KeyError):
            continue
    return texts


def _marker_path(cfg: BuildConfig, shard_id: int) -> str:
    return os.path.join(cfg.out, STATE_DIR, "done", f"shard-{shard_id:05d}.json")


def build_shard(plan: ShardPlan, cfg: BuildConfig, fields: dict, config_hash: str) -> ShardResult:
    """The Dask task: read the plan's inputs, run the stages, write one shard per format, mark it done."""
    start = time.perf_counter()
    rejections = RejectionLog(cfg.on_error)
    stats = {"images": 0, "utf8_replaced": 0}

    def read(pair: tuple):
        _, sample = pair  # read_records: (record, Sample or the RejectedInput it met)
        if isinstance(sample, RejectedInput):
            raise sample
        stats["images"] += "image" in sample.fields
        stats["utf8_replaced"] += sample.meta.get("utf8_replaced", 0)
        return sample

    counters: dict = {}
    stages = [lambda recs: map_samples(read_records(cfg.src, list(recs), cfg.text_field), read, stage="read",
                                       log=rejections, where=lambda pair: pair[0].source),
              lambda s: (augmented_images if cfg.augment else images)(s, cfg=cfg, log=rejections),
              lambda s: arrays(s, spec=fields.get("array"), log=rejections)]
    if TOKENS_FIELD in fields:
        stages.append(lambda s: tokenize(s, spec=fields[TOKENS_FIELD], root=cfg.out, tail=cfg.tail,
                                         shard_id=plan.id, stats=counters, log=rejections))
    try:
        samples = list(compose(plan.records, *stages))
    except FailFast as e:
        return ShardResult(plan.id, [], rejections.items, failed=e.rejection)
    formats = ["tar", "parquet"] if cfg.format == "both" else [cfg.format]
    infos = [get_writer(fmt)(samples, cfg.out, plan.id, fields) for fmt in formats] if samples else []
    result = ShardResult(plan.id, infos, rejections.items, stats["images"], stats["utf8_replaced"],
                         time.perf_counter() - start, stats=counters)
    marker = {"fingerprint": plan.fingerprint(config_hash), "result": result.to_json()}
    atomic_write(_marker_path(cfg, plan.id), json.dumps(marker, sort_keys=True))
    return result


def _reusable(plan: ShardPlan, cfg: BuildConfig, config_hash: str) -> ShardResult | None:
    """A previous build's result for this shard, if its inputs, config and files are unchanged."""
    try:
        with open(_marker_path(cfg, plan.id), encoding="utf-8") as f:
            marker = json.load(f)
        if marker["fingerprint"] != plan.fingerprint(config_hash):
            return None
        result = ShardResult.from_json(marker["result"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    for info in result.shards:
        files = [(info.path, info.bytes)] + ([(info.index["path"], info.index["bytes"])] if info.index else [])
        for rel, size in files:
            full = os.path.join(cfg.out, rel)
            if not os.path.isfile(full) or os.path.getsize(full) != size:
                return None
    return result


def _sum_stats(results: list[ShardResult]) -> dict:
    total: dict = {}
    for r in results:
        for k, v in r.stats.items():
            total[k] = total.get(k, 0) + v
    return dict(sorted(total.items()))


def _check_result(result: ShardResult) -> None:
    if result.failed:
        raise FailFast(result.failed)


def _run_tasks(todo: list[ShardPlan], cfg: BuildConfig, fields: dict, config_hash: str, bar,
               client) -> list[ShardResult]:
    return run_tasks(build_shard, todo, client=client, bar=bar, name=f"build-shard-{config_hash}",
                     check=_check_result, shared=(cfg, fields, config_hash))


def _remove_stale(cfg: BuildConfig, shards: list[ShardInfo], n_plans: int) -> None:
    """Delete shard files and markers a previous, larger build left behind."""
    remove_unlisted_shards(cfg.out, shards)
    done_dir = os.path.join(cfg.out, STATE_DIR, "done")
    for name in os.listdir(done_dir) if os.path.isdir(done_dir) else []:
        if name.startswith("shard-") and int(name[6:11]) >= n_plans:
            os.remove(os.path.join(done_dir, name))


def _dedup(records: list[InputRecord], cfg: BuildConfig, dcfg: DedupConfig, client):
    """The dedup step: drop duplicate records before shards are assigned. Returns (kept, DedupResult)."""
    keep, result = dedup_records(records, cfg.src, dcfg, client, os.path.join(cfg.out, STATE_DIR, "dedup"))
    return [r for r, k in zip(records, keep.tolist()) if k], result


def _finish_dedup(cfg: BuildConfig, result, manifest: Manifest, rejected: int) -> None:
    """OUT/dedup/: the report of the dedup step, written once, with what the build wrote."""
    encode = "original bytes kept" if cfg.encode == "keep" else f"re-encoded: {cfg.encode}" + (
        f" q{cfg.quality}" if cfg.encode in ("jpeg", "webp") else "") + (
        f", {cfg.resize_mode} {cfg.image_size}" if cfg.image_size else "") + (
        f", crop {cfg.crop_size}" if cfg.crop_size else "")
    result.summary["output"] = {"samples": manifest.samples, "shards": len({s.id for s in manifest.shards}),
                                "images": encode, "rejected_by_build": rejected}
    write_report(os.path.join(cfg.out, "dedup"), result)


def _scan(cfg: BuildConfig) -> ScanResult:
    """Scan SRC (source rejections go through the policy) and retire OUT's manifest before any write."""
    scanned = scan(cfg)
    source_log = RejectionLog(cfg.on_error)
    for r in scanned.rejections:
        source_log.reject(r.path, r.stage, r.reason)
    if not scanned.records and not cfg.allow_empty:
        passed = f" ({len(scanned.rejections)} files passed over: {count_by_reason(scanned.rejections)})"
        raise EmptyInput(f"{cfg.src} holds no input shardkit can read{passed if scanned.rejections else ''}; "
                         "add images, text or .jsonl files, or pass --allow-empty to write an empty dataset")
    for note in scanned.notes:
        log.info("%s", note)
    os.makedirs(os.path.join(cfg.out, "shards"), exist_ok=True)
    # Until this build ends, no manifest may name shards it is about to replace.
    with contextlib.suppress(FileNotFoundError):
        os.remove(os.path.join(cfg.out, MANIFEST_NAME))
    return scanned


def build(cfg: BuildConfig, dedup: DedupConfig | None = None) -> BuildResult:
    """Build OUT from SRC: scan, plan, run one task per shard (reusing finished ones), write the manifest.

    `dedup` (what `shardkit dedup RAW OUT` passes) removes duplicates with all of its options;
    otherwise `cfg.dedup` does, with the options BuildConfig carries. One client serves every
    stage; it starts only if a stage has tasks to run and the work can pay for it. One build (or
    dedup) at a time per OUT: a second one fails with FolderLocked naming the first.
    """
    from dataclasses import replace

    cfg = replace(cfg, src=os.path.abspath(cfg.src), out=os.path.abspath(cfg.out))
    if os.path.realpath(cfg.src) == os.path.realpath(cfg.out):
        raise ConfigError(f"OUT {cfg.out!r} is SRC: the build writes shards, manifest.json and errors.jsonl into "
                          "OUT; choose another folder (it may lie inside SRC: the scan leaves it out)")
    with folder_lock(cfg.out, "shardkit build"):
        return _build(cfg, dedup)


def _build(cfg: BuildConfig, dedup: DedupConfig | None) -> BuildResult:
    start = time.perf_counter()
    scanned = _scan(cfg)
    dcfg = dedup or (cfg.dedup_config() if cfg.dedup else None)
    # A dedup step decides in-process vs cluster from the work ahead (small jobs skip the cluster).
    execution = plan_execution(cfg.scheduler, cfg.workers,
                               None if dcfg is None else estimate_seconds(scanned.records, cfg.encode))
    with lazy_client(cfg.scheduler, execution.workers) as client:
        return _run(cfg, scanned, dcfg, execution, client, start)


def _run(cfg: BuildConfig, scanned: ScanResult, dcfg: DedupConfig | None, execution, client,
         start: float) -> BuildResult:
    from dataclasses import replace

    records, dedup_result = scanned.records, None
    if dcfg is not None:  # before tokenizer training: a trained vocabulary never sees duplicates
        records, dedup_result = _dedup(records, cfg, dcfg, client)
        dedup_result.summary["execution"].update(execution.record())
    kept = replace(scanned, records=records)
    fields, config_hash = field_specs(kept, cfg), cfg.output_hash()
    tok = prepare_tokenizer(cfg, lambda: _corpus(kept, cfg), _corpus_key(kept)) if cfg.tokenizer else None
    fields = cache_fields(fields, kept, cfg, tok)
    if tok is not None:  # the tokenizer file's content and the token layout change the output, not only the path
        token_spec = json.dumps(fields.get(TOKENS_FIELD), sort_keys=True)
        config_hash = hashlib.sha256(f"{config_hash}|{tok.sha256}|{token_spec}".encode()).hexdigest()[:16]
    else:
        with contextlib.suppress(FileNotFoundError):
            os.remove(os.path.join(cfg.out, TOKENIZER_NAME))  # left by an earlier tokenized build
    plans = plan_shards(records, cfg)
    reused = {p.id: r for p in plans if (r := _reusable(p, cfg, config_hash)) is not None}
    todo = [p for p in plans if p.id not in reused]
    log.info("%d inputs, %d shards planned, %d reused", scanned.inputs, len(plans), len(reused))
    with progress_bar(len(plans), initial=len(reused), desc="build", unit="shard", enabled=cfg.progress) as bar:
        results = list(reused.values()) + _run_tasks(todo, cfg, fields, config_hash, bar, client)
    results.sort(key=lambda r: r.id)
    shards = [info for r in results for info in r.shards]
    rejections = sorted(scanned.rejections + [x for r in results for x in r.rejections],
                        key=lambda r: (r.path, r.stage, r.reason))
    _remove_stale(cfg, shards, len(plans))
    atomic_write(os.path.join(cfg.out, "errors.jsonl"), "".join(r.to_json() + "\n" for r in rejections))
    first_format = "parquet" if cfg.format == "parquet" else "tar"
    samples = sum(s.samples for s in shards if s.format == first_format)
    if samples == 0 and not cfg.allow_empty:  # errors.jsonl says why; no manifest: nothing looks built
        raise EmptyInput(f"no sample of {cfg.src} passed the build: {len(rejections)} inputs rejected "
                         f"{count_by_reason(rejections)}, see {os.path.join(cfg.out, 'errors.jsonl')}; fix them, "
                         "or pass --allow-empty to write an empty dataset")
    build_record = {"config": cfg.recorded(), "hash": config_hash}
    if dedup_result is not None:
        build_record["dedup"] = dedup_record(dedup_result.summary, samples)
    classes = scanned.classes if "cls" in fields else None  # packed token rows drop the labels
    manifest = Manifest(samples=samples, fields=fields, shards=shards, classes=classes,
                        build=build_record,
                        errors={"count": len(rejections), "by_reason": count_by_reason(rejections)},
                        extra={} if tok is None else {"tokenizer": dict(tok.to_dict(), stats=_sum_stats(results))})
    write_manifest(cfg.out, manifest)
    if dedup_result is not None:
        _finish_dedup(cfg, dedup_result, manifest, len(rejections) - len(scanned.rejections))
    return BuildResult(cfg.out, scanned.inputs, samples, rejections, shards, time.perf_counter() - start,
                       sum(r.images for r in results), len(reused), sum(r.utf8_replaced for r in results),
                       len(scanned.records) - len(records), manifest, dedup_result, scanned.notes)
