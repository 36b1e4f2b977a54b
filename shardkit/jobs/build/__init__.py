"""Runs a build on Dask: list SRC while the cluster starts, count row files on it, plan shards from
compact columns, run work units and one step per shard (reusing finished shards), manifest last."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from dataclasses import dataclass, field, replace

import shardkit.store as store
from shardkit.jobs import durable
from shardkit.jobs.build.tasks import (FILTERED_DIR, STATE_DIR, BuildContext, ShardResult, ShardTask, UnitTask,
                                       add_stats, make_durable, marker, reused_shards, shard_task, unit_task, units_dir)
from shardkit.jobs.durable import flush_durable
from shardkit.config import BuildConfig, DedupConfig, remote_policy
from shardkit.contract import ShardInfo
from shardkit.errors import (ConfigError, EmptyInput, FailFast, Rejection, RejectionLog,
                             count_by_reason)
from shardkit.jobs.build import attributes as curate
from shardkit.manifest import Manifest, write_manifest
from shardkit.manifest.attributes import attach
from shardkit.sources import walk as W
from shardkit.sources.inventory import Inventory, make_inventory, scan_options
from shardkit.sources.plan import ShardPlan, plan_shards, split, unit_samples, unit_sizes
from shardkit.sources.read import SourceReader
from shardkit.sources.rows import count_rows, counted
from shardkit.stages.filters import STAT, Curation, rejections_by_filter
from shardkit.duplicates.review import dedup_record
from shardkit.stages.tokenize import TOKENIZER_NAME, TOKENS_FIELD, TokenizerInfo, prepare_tokenizer
from shardkit.jobs.cluster import background_client, import_in_background, plan_execution
from shardkit.jobs.build.dedup import (dedup_step, exact_dedup, execution_of, finish_dedup, paragraph_copies,
                                       source_reader, write_exact_report)
from shardkit.jobs.dedup_tasks import estimate_inventory_seconds
from shardkit.jobs.build.probe import build_pool
from shardkit.jobs.build.fields import Corpus, cache_fields, corpus_key, field_specs
from shardkit.jobs.tasks import Then, progress_bar, run_tasks
from shardkit.errors import redact
from shardkit.store.lease import out_lock

log = logging.getLogger("shardkit.build")
LIST_BAR_DELAY = 2.0  # seconds of listing before its bar shows (a small SRC lists without one)


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
    stats: dict = field(default_factory=dict)  # stage counters: curation.<filter>.<rule>, tokens, ...
    exact_duplicates: int = 0  # removed by --dedup-exact (see OUT/dedup/exact/)

    @property
    def rejected_by_reason(self) -> dict[str, int]:
        return count_by_reason(self.rejections)


def _scan(cfg: BuildConfig, pending, start: bool) -> Inventory:
    """List SRC here, then (`start`) start the cluster in the background, of threads for image work
    (pool.choose_pool), count row files on the cluster, order everything. Source rejections
    go through the policy; OUT's manifest is retired before any write."""
    if not store.is_url(cfg.src) and not os.path.isdir(cfg.src):
        raise FileNotFoundError(f"source folder {cfg.src!r} does not exist or is not a folder")
    policy = remote_policy(cfg)
    with progress_bar(None, desc="list SRC", unit=" files", enabled=cfg.progress, delay=LIST_BAR_DELAY) as bar:
        listing = W.walk(cfg.src, cfg.out, policy, seen=bar.update)
    choice = build_pool(cfg, listing)
    pending.use_threads(choice.threads, choice.head_threads)
    if start:
        pending.start()
    opts = scan_options(cfg)
    counts = {rf.id: c for rf in listing.row_files if (c := counted(rf, opts)) is not None}
    todo = [rf for rf in listing.row_files if rf.id not in counts]
    if todo:  # files not counted before (or changed): on the cluster
        found = run_tasks(count_rows, todo, client=pending, name="build-count", shared=(opts,))
        counts.update({rf.id: c for rf, c in zip(todo, found)})
    inv = make_inventory(listing, counts, cfg, opts)
    source_log = RejectionLog(cfg.on_error)
    for r in inv.rejections:
        source_log.reject(r.path, r.stage, r.reason)
    if not inv.samples and not cfg.allow_empty:
        passed = f" ({len(inv.rejections)} files passed over: {count_by_reason(inv.rejections)})"
        raise EmptyInput(f"{cfg.src} holds no input shardkit can read{passed if inv.rejections else ''}; "
                         "add images, text, .jsonl or .parquet files, or pass --allow-empty to write an empty dataset")
    for note in inv.notes:
        log.info("%s", redact(note))
    store.makedirs(store.join(cfg.out, "shards"))
    durable.retire_manifest(cfg.out, policy)  # until this build ends, no manifest may name shards it is about to replace
    return inv


def _workers(cfg: BuildConfig, pending) -> int:
    """Worker threads the work is spread over (1 in-process); an embedded cluster need not be up yet."""
    if pending.local:
        return 1
    if cfg.scheduler:
        return max(1, sum(pending.get().nthreads().values()))
    return cfg.workers or max(1, os.cpu_count() or 1)


def _shard_tasks(plans: list[ShardPlan], inv: Inventory, cfg: BuildConfig, config_hash: str,
                 workers: int, marks: dict) -> list[ShardTask]:
    """Each shard cut into work units sized from the worker count and the number of samples to do."""
    kind = "image" if "image" in inv.kinds else "text"
    counts = [p.samples for p in plans]
    if cfg.unit_samples:  # as asked, no smaller units at the ends
        sizes = unit_sizes(counts, cfg.unit_samples, 1, kind)
    else:
        sizes = unit_sizes(counts, unit_samples(sum(counts), workers, kind), workers, kind)
    return [ShardTask(p.id, curate.marked(p.fingerprint(inv, config_hash), marks.get(p.id)), tuple(split(p, s)),
                      marks.get(p.id, ())) for p, s in zip(plans, sizes)]


def _check_result(result: ShardResult) -> None:
    if result.failed:
        raise FailFast(result.failed)


def _run(tasks: list[ShardTask], ctx: BuildContext, client, bar) -> list[ShardResult]:
    items, members = [], []
    for task in tasks:
        members.append([] if len(task.units) == 1 else list(range(len(items), len(items) + len(task.units))))
        if len(task.units) > 1:
            items += [UnitTask(task.id, j, unit) for j, unit in enumerate(task.units)]
    return run_tasks(unit_task, items, client=client, bar=bar, name=f"build-{ctx.config_hash}",
                     check=_check_result, shared=(ctx,), then=Then(shard_task, tasks, members))


def _durable(cfg: BuildConfig, tasks: list[ShardTask], done: list[ShardResult], pending) -> None:
    """Every new shard on disk with its marker before the manifest may name it: wait for the fsync
    threads (workers, and this process for the head start), then finish any a lost worker left. On a
    store a shard step returns only once its files are uploaded and its marker written, so every
    marker is there: checked from one listing."""
    if store.is_url(cfg.out):
        durable.check_markers(cfg.out, [marker(t.id) for t in tasks], remote_policy(cfg))
        return
    flush_durable()
    if not pending.local:
        pending.get().run(flush_durable)
    for task, result in zip(tasks, done):
        if not os.path.exists(os.path.join(cfg.out, marker(task.id))):
            make_durable(cfg, task, result)


def _remove_stale(cfg: BuildConfig, shards: list[ShardInfo], n_plans: int) -> None:
    """Delete shard files and markers a previous, larger build left behind, and unit files."""
    policy = remote_policy(cfg)
    durable.remove_unlisted(cfg.out, shards, policy)
    durable.remove_markers(cfg.out, FILTERED_DIR, "filtered-", n_plans, policy)  # lists of what --filter removed
    durable.remove_markers(cfg.out, f"{STATE_DIR}/done", "shard-", n_plans, policy)
    store.remove_tree(units_dir(cfg), policy)


def _fields(inv: Inventory, cfg: BuildConfig, reader: SourceReader, curating: tuple = (None, None)):
    """(shard fields, unit fields, config hash): known before any task runs. A bpe:N tokenizer trains
    on the text as curated (`curating`: the Curation the units run, or None, and the paragraph drops)."""
    fields, config_hash = field_specs(inv, cfg), cfg.output_hash()
    tok = None
    if cfg.tokenizer:
        curation, paragraphs = curating
        key = corpus_key(inv)
        if curation or paragraphs:  # other filters or drops: other training text
            blob = json.dumps([curation.record() if curation else None, paragraphs and paragraphs.digest],
                              sort_keys=True, default=str)
            key = hashlib.sha256(f"{key}|{blob}".encode()).hexdigest()
        tok = prepare_tokenizer(cfg, lambda: Corpus(inv, reader, curating), key)
    else:
        store.remove(store.join(cfg.out, TOKENIZER_NAME), remote_policy(cfg))  # left by an earlier tokenized build
    shard_fields = cache_fields(fields, inv, cfg, tok)
    if tok is not None:  # the tokenizer file's content and the token layout change the output, not only the path
        token_spec = json.dumps(shard_fields.get(TOKENS_FIELD), sort_keys=True)
        config_hash = hashlib.sha256(f"{config_hash}|{tok.sha256}|{token_spec}".encode()).hexdigest()[:16]
    unit_fields = cache_fields(fields, inv, cfg, None) if tok is not None and cfg.seq_len else shard_fields
    return shard_fields, unit_fields, config_hash, tok


@dataclass
class _Plan:
    """Everything decided before any shard task runs."""

    cfg: BuildConfig
    scanned: Inventory  # as listed (inputs are counted here)
    inv: Inventory  # without --dedup's duplicates
    dedup: object  # DedupResult or None
    exact: object  # the DedupResult of --dedup-exact, or None
    paragraphs: object  # the ParagraphDrops of --dedup-paragraphs, or None
    curation: object  # stages.filters.Curation (empty: no curation)
    reader: SourceReader
    fields: dict
    unit_fields: dict
    config_hash: str
    tok: TokenizerInfo | None
    plans: list[ShardPlan]
    reused: dict[int, ShardResult]
    marks: dict  # build --dedup --annotate: shard id -> its clustered samples (curate.dedup_marks)


def _prepare(cfg: BuildConfig, dcfg: DedupConfig | None, pending, start: bool, curation) -> _Plan:
    scanned = inv = _scan(cfg, pending, start)
    dedup_result = exact = None
    if cfg.dedup_exact:  # before MinHash, which then signs only distinct texts
        inv, exact = exact_dedup(inv, cfg, pending)
    paragraphs = paragraph_copies(inv, cfg, pending) if cfg.dedup_paragraphs else None
    if dcfg is not None:  # before tokenizer training: a trained vocabulary never sees duplicates
        # The dedup step decides in-process vs cluster from the work ahead (small jobs skip the cluster).
        execution = plan_execution(cfg.scheduler, cfg.workers, estimate_inventory_seconds(inv, cfg.encode))
        if execution.mode == "in-process":
            pending.prefer_local()
        inv, dedup_result = dedup_step(inv, cfg, dcfg, pending)
        dedup_result.summary["execution"].update(execution_of(cfg, pending, execution).record())
    reader = source_reader(inv)
    units_curation = None if cfg.annotate else curation or None  # what the units run (--annotate keeps all)
    fields, unit_fields, config_hash, tok = _fields(inv, cfg, reader, (units_curation, paragraphs))
    if curation or paragraphs:  # the filters' options (defaults included) and the paragraphs removed
        blob = json.dumps([curation.record(), paragraphs and paragraphs.digest], sort_keys=True, default=str)
        config_hash = hashlib.sha256(f"{config_hash}|{blob}".encode()).hexdigest()[:16]
    plans = plan_shards(inv, cfg.shard_size, cfg.max_samples_per_shard)
    marks = curate.dedup_marks(plans, reader, dedup_result) if cfg.annotate and dedup_result else {}
    reused = reused_shards(cfg, [(p.id, curate.marked(p.fingerprint(inv, config_hash), marks.get(p.id)))
                                 for p in plans])
    log.info("%d inputs, %d shards planned, %d reused", scanned.inputs, len(plans), len(reused))
    return _Plan(cfg, scanned, inv, dedup_result, exact, paragraphs, curation, reader, fields, unit_fields,
                 config_hash, tok, plans, reused, marks)


def _build_todo(b: _Plan, pending) -> list[ShardResult]:
    """Run the shards not reused: units and shard steps, then wait until they are all on disk."""
    todo = [p for p in b.plans if p.id not in b.reused]
    if not todo:
        return []
    ctx = BuildContext(b.cfg, b.fields, b.unit_fields, b.config_hash, b.reader,
                       bool(b.tok is not None and b.cfg.seq_len), in_memory=pending.in_process,
                       curation=None if b.cfg.annotate else b.curation or None, paragraphs=b.paragraphs)
    tasks = _shard_tasks(todo, b.inv, b.cfg, b.config_hash, _workers(b.cfg, pending), b.marks)
    with progress_bar(len(b.plans), initial=len(b.reused), desc="build", unit="shard",
                      enabled=b.cfg.progress) as bar:
        done = _run(tasks, ctx, pending, bar)
    _durable(b.cfg, tasks, done, pending)
    return done


def build(cfg: BuildConfig, dedup: DedupConfig | None = None) -> BuildResult:
    """Build OUT from SRC: scan, plan, run work units and shard steps (reusing finished shards), manifest.

    `dedup` (what `shardkit dedup RAW OUT` passes) removes duplicates with all of its options;
    otherwise `cfg.dedup` does, with the options BuildConfig carries. One build (or dedup) at a
    time per OUT: a second one fails with FolderLocked naming the first. SRC and OUT may be local
    folders or URLs (s3://, gs://, ...: see shardkit.store).
    """
    cfg = replace(cfg, src=store.location(cfg.src, "SRC"), out=store.location(cfg.out, "OUT", write=True))
    policy = remote_policy(cfg)
    if cfg.map:  # never ignored silently: the map step is build_map's (jobs/mapped_build.py)
        raise ConfigError(f"BuildConfig(map={cfg.map!r}) runs through shardkit.jobs.map.mapped_build.build_with_map(cfg) "
                          "(what `shardkit build --map` calls), not build(cfg)")
    if store.same_location(cfg.src, cfg.out):
        raise ConfigError(f"OUT {cfg.out!r} is SRC: the build writes shards, manifest.json and errors.jsonl into "
                          "OUT; choose another folder (it may lie inside SRC: the scan leaves it out)")
    curation = Curation.from_options(cfg.filter, cfg.filter_option, cfg.lang, cfg.lang_threshold, cfg.mask_pii,
                                     max_bytes=cfg.filter_max_bytes)
    store.check_source(cfg.src, policy)  # before OUT's lock: a SRC that is not there leaves nothing in OUT
    # `shardkit dedup RAW OUT` holds OUT's lock and runs this build inside it
    within = "shardkit dedup" if dedup is not None else None
    with out_lock(cfg.out, "shardkit build", within=within, policy=policy):
        return _build(cfg, dedup, curation)


def _build(cfg: BuildConfig, dedup: DedupConfig | None, curation) -> BuildResult:
    start = time.perf_counter()
    dcfg = dedup or (cfg.dedup_config() if cfg.dedup else None)
    # A first build starts the cluster in the background once SRC is listed (the listing says whether
    # its workers are threads); a rerun (markers from an earlier build) only when some shard or row
    # file turns out to need it, and a dedup build once its dedup step knows whether the work can pay
    # for one (cluster.plan_execution).
    rerun = durable.any_marker(cfg.out, f"{STATE_DIR}/done", remote_policy(cfg))
    if not rerun and cfg.workers != 0:
        import_in_background()
    with background_client(cfg.scheduler, cfg.workers, start=False) as pending:
        late = dcfg is not None or cfg.dedup_exact or cfg.dedup_paragraphs  # those steps choose for themselves
        b = _prepare(cfg, dcfg, pending, start=not rerun and not late, curation=curation)
        results = list(b.reused.values()) + _build_todo(b, pending)
    return _finish(b, results, start)


def _build_record(b: _Plan, samples: int, stats: dict) -> tuple[dict, dict]:
    """The manifest's `build` record (the config and its hash, what dedup and curation did), and the
    curation counts among stats."""
    cfg = b.cfg
    build_record = {"config": cfg.recorded(), "hash": b.config_hash}
    if b.dedup is not None:
        build_record["dedup"] = dedup_record(b.dedup.summary, samples)
        if cfg.annotate:  # marked in the attribute `duplicate`, not removed
            build_record["dedup"].update(removed=0, marked=b.dedup.summary["removed"], source_samples=samples)
    if b.exact is not None:
        build_record["dedup_exact"] = {"removed": b.exact.summary["removed"], "report": "dedup/exact/summary.json"}
    curated = {k: v for k, v in sorted(stats.items()) if k.startswith(STAT + ".")}
    if b.curation:
        build_record["curation"] = {"filters": b.curation.record(), "counts": curated,
                                    "filtered": f"{FILTERED_DIR}/filtered-*.parquet"}
    return build_record, curated


def _finish(b: _Plan, results: list[ShardResult], start: float) -> BuildResult:
    """errors.jsonl, then the manifest (last), then the summary."""
    cfg, policy = b.cfg, remote_policy(b.cfg)
    results.sort(key=lambda r: r.id)
    shards = [info for r in results for info in r.shards]
    rejections = sorted(b.inv.rejections + [x for r in results for x in r.rejections],
                        key=lambda r: (r.path, r.stage, r.reason))
    _remove_stale(cfg, shards, len(b.plans))
    _remove_stale_scan(b)
    # renamed samples are kept: not counted as rejected
    durable.write_errors(cfg.out, rejections + b.inv.renamed, policy=policy)
    first_format = "parquet" if cfg.format == "parquet" else "tar"
    samples = sum(s.samples for s in shards if s.format == first_format)
    stats = {}
    for r in results:
        add_stats(stats, r.stats)
    if samples == 0 and not cfg.allow_empty:  # errors.jsonl says why; no manifest: nothing looks built
        raise EmptyInput(_nothing_passed(cfg, rejections, stats, b))
    build_record, curated = _build_record(b, samples, stats)
    tok_stats = {k: v for k, v in sorted(stats.items()) if k not in curated}
    extra = {} if b.tok is None else {"tokenizer": dict(b.tok.to_dict(), stats=tok_stats)}
    classes = b.scanned.classes if "cls" in b.fields else None  # packed token rows drop the labels
    manifest = Manifest(samples=samples, fields=b.fields, shards=shards, classes=classes,
                        build=build_record, errors=_errors_record(rejections, b.inv.renamed),
                        extra=extra)
    attach(cfg.out, manifest, curate.manifest_attributes(cfg, [r.attributes for r in results if r.attributes]),
           policy)
    write_manifest(cfg.out, manifest, policy)
    if b.dedup is not None:
        finish_dedup(cfg, b.dedup, manifest, len(rejections) - len(b.scanned.rejections))
    if b.exact is not None:
        write_exact_report(store.join(cfg.out, "dedup", "exact"), b.exact, policy)
    else:  # an earlier build's report would describe what this one did not do
        store.remove_tree(store.join(cfg.out, "dedup", "exact"), policy)
    exact = len(b.exact.removed_ids) if b.exact is not None else 0
    return BuildResult(cfg.out, b.scanned.inputs, samples, rejections, shards, time.perf_counter() - start,
                       sum(r.images for r in results), len(b.reused), sum(r.utf8_replaced for r in results),
                       b.scanned.samples - b.inv.samples - exact, manifest, b.dedup, b.scanned.notes,
                       dict(sorted(stats.items())), exact)


def _errors_record(rejections: list, renamed: list) -> dict:
    """The manifest's `errors`: rejections by reason, and the samples kept under a new key (both in errors.jsonl)."""
    record = {"count": len(rejections), "by_reason": count_by_reason(rejections)}
    return dict(record, renamed=len(renamed)) if renamed else record


def _nothing_passed(cfg: BuildConfig, rejections: list, stats: dict, b: _Plan) -> str:
    """Why a build kept no sample: what rejected the inputs, what the filters and dedup removed."""
    why = [f"{len(rejections)} inputs rejected {count_by_reason(rejections)} (see {store.join(cfg.out, 'errors.jsonl')})"]
    filtered = sum(sum(rules.values()) for rules in rejections_by_filter(stats).values())
    if filtered:
        why.append(f"{filtered} removed by the curation filters (see {store.join(cfg.out, FILTERED_DIR)}; loosen them "
                   "with --filter-option, or drop a filter)")
    emptied = stats.get(f"{STAT}.dedup-paragraphs.emptied", 0)
    if emptied:
        why.append(f"{emptied} left empty by --dedup-paragraphs")
    removed = b.scanned.samples - b.inv.samples
    if removed:
        why.append(f"{removed} removed as duplicates")
    return (f"no sample of {cfg.src} passed the build: {'; '.join(why)}; fix the inputs or the options, or pass "
            "--allow-empty to write an empty dataset")


def _remove_stale_scan(b: _Plan) -> None:
    """Row indexes of files that changed or left SRC, and file-sample tables of earlier builds."""
    keep = {(b.reader.atoms_path or "").rsplit("/", 1)[-1]}
    for count in b.scanned.counts.values():
        base = count.index.rsplit("/", 1)[-1]
        keep |= {base, base[:-len(".npy")] + ".json", (count.keys or "").rsplit("/", 1)[-1]}
    folder, policy = b.inv.opts.state_dir, b.inv.opts.policy
    for name in store.listdir(folder, policy):
        if name not in keep:
            store.remove(store.join(folder, name), policy)
