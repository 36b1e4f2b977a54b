"""The build's Dask tasks: work units turn samples into a samples table file; one step per shard writes
the shard from its units' tables, in key order, and marks it done.

A unit runs every per-sample stage (read, images, arrays, per-document tokens) and writes the
table (writers.parquet.samples_table) under OUT/.shardkit/units; the shard step concatenates the
tables and writes tar and/or Parquet with the same bytes as one task writing the whole shard, and
runs the per-shard stage (packing tokens into rows). A shard of one unit is done in one task.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import shardkit.store as store
from shardkit.config import BuildConfig, remote_policy
from shardkit.contract import AttributeInfo, ShardInfo
from shardkit.errors import FailFast, RejectedInput, Rejection, RejectionLog
from shardkit.jobs.build import attributes
from shardkit.jobs import durable
from shardkit.jobs.durable import STATE_DIR
from shardkit.sources.key_order import Piece
from shardkit.sources.read import SourceReader
from shardkit.stages import compose, map_samples
from shardkit.stages.arrays import arrays
from shardkit.stages.filters import curate
from shardkit.jobs.paragraph_tasks import drop_paragraphs
from shardkit.stages.augment import augmented_images
from shardkit.stages.image import images
from shardkit.stages.tokenize import TOKENS_FIELD, token_counter, tokenize
from shardkit.writers import get_table_writer, get_writer
from shardkit.writers.parquet import samples_table, table_samples

FILTERED_DIR = "curation"  # OUT/curation/filtered-NNNNN.parquet: what the curation filters removed, per shard
TABLE_BATCH = 256  # samples turned into Arrow columns at a time


@dataclass(frozen=True)
class BuildContext:
    """What every task of a build shares (sent to each worker once)."""

    cfg: BuildConfig
    fields: dict  # the shard fields (the manifest's)
    unit_fields: dict  # the fields of unit tables: the same, or with txt when tokens are packed per shard
    config_hash: str
    reader: SourceReader
    pack: bool  # --seq-len: documents are packed into token rows per shard, in the shard step
    in_memory: bool = False  # every task runs in this process: units hand their tables over as they are
    curation: object = None  # stages.filters.Curation: quality filters, language, PII (None: off)
    paragraphs: object = None  # jobs.paragraph_tasks.ParagraphDrops of --dedup-paragraphs (None: off)

    @property
    def policy(self):
        """The job's RemotePolicy (--timeout/--retries): every store call of a task waits as it."""
        return remote_policy(self.cfg)


@dataclass(frozen=True)
class ShardTask:
    """One output shard to write: its id, its rerun fingerprint and its work units (pieces each)."""

    id: int
    fingerprint: str
    units: tuple[tuple[Piece, ...], ...]
    marks: tuple = ()  # build --dedup --annotate: (key, cluster, duplicate, exact) of its clustered samples


@dataclass(frozen=True)
class UnitTask:
    """One work unit: unit `index` of shard `shard`."""

    shard: int
    index: int
    pieces: tuple[Piece, ...]


@dataclass
class UnitResult:
    """What a unit hands its shard step: its table file, rejections and counters."""

    rows: int
    rejections: list[Rejection]
    images: int = 0
    utf8_replaced: int = 0
    stats: dict = field(default_factory=dict)
    failed: Rejection | None = None
    path: str | None = None  # the unit's table file
    table: object = None  # or the table itself (BuildContext.in_memory)
    linked: list = field(default_factory=list)  # files read by path from Parquet rows: [path, size, mtime_ns]
    dropped: list = field(default_factory=list)  # samples a curation filter removed: (key, source, row, filter, rule)


@dataclass
class ShardResult:
    """What the client gets back for one shard (and what its completion marker records)."""

    id: int
    shards: list[ShardInfo]
    rejections: list[Rejection]
    images: int = 0
    utf8_replaced: int = 0
    seconds: float = 0.0
    skipped: bool = False  # reused from a previous build
    failed: Rejection | None = None
    stats: dict = field(default_factory=dict)  # stage counters, e.g. tokens, rows, pad/dropped tokens
    linked: list = field(default_factory=list)  # inputs named by rows, not by the shard's fingerprint
    attributes: AttributeInfo | None = None  # --annotate: the shard's attribute table

    def to_json(self) -> dict:
        return {"id": self.id, "shards": [s.to_dict() for s in self.shards],
                "rejections": [[r.path, r.stage, r.reason] for r in self.rejections],
                "images": self.images, "utf8_replaced": self.utf8_replaced, "stats": self.stats,
                "linked": self.linked, "attributes": self.attributes.to_dict() if self.attributes else None}

    @classmethod
    def from_json(cls, d: dict) -> "ShardResult":
        attributes = AttributeInfo.from_dict(d["attributes"]) if d.get("attributes") else None
        return cls(d["id"], [ShardInfo.from_dict(s) for s in d["shards"]],
                   [Rejection(*r) for r in d["rejections"]], d["images"], d["utf8_replaced"], skipped=True,
                   stats=d.get("stats", {}), linked=d.get("linked", []), attributes=attributes)


def add_stats(total: dict, more: dict) -> dict:
    for k, v in more.items():
        total[k] = total.get(k, 0) + v
    return total


def marker(shard_id: int) -> str:
    """A shard's completion marker, relative to OUT."""
    return f"{STATE_DIR}/done/shard-{shard_id:05d}.json"


def units_dir(cfg: BuildConfig) -> str:
    return store.join(cfg.out, STATE_DIR, "units")


def reusable(cfg: BuildConfig, shard_id: int, fingerprint: str, sizes: dict | None = None,
             data: bytes | None = None) -> ShardResult | None:
    """A previous build's result for this shard, if its inputs, config and files are unchanged
    (`sizes`, `data`: see durable.reusable)."""
    policy = remote_policy(cfg)
    result = durable.reusable(cfg.out, marker(shard_id), fingerprint, sizes, data, policy)
    if result is None:
        return None
    try:
        result = ShardResult.from_json(result)
    except (KeyError, TypeError, ValueError):
        return None
    if not attributes.unchanged(cfg.out, result.attributes, policy):  # `shardkit annotate` may have rewritten it since
        return None
    return result if all(_unchanged(cfg.src, *link, policy) for link in result.linked) else None


def reused_shards(cfg: BuildConfig, plans: list[tuple[int, str]]) -> dict[int, ShardResult]:
    """The shards (id, fingerprint) a previous build finished with the same inputs and config: their
    markers read at once (durable.reused)."""
    fingerprints = dict(plans)
    return durable.reused(cfg.out, f"{STATE_DIR}/done", {i: marker(i) for i in fingerprints},
                          lambda i, sizes, data: reusable(cfg, i, fingerprints[i], sizes, data),
                          remote_policy(cfg))


def _unchanged(root: str, rel: str, size: int, mtime_ns: int, policy=None) -> bool:
    """Whether a file a row named (an image by path) has the stats it had when the shard was built."""
    stat = store.stat_source(store.join(root, rel), policy)
    return size == -1 if stat is None else stat == (size, mtime_ns)


def _process(pieces, ctx: BuildContext, shard_id: int):
    """Read and run the per-sample stages over some pieces: (UnitResult, samples table)."""
    cfg = ctx.cfg
    log = RejectionLog(cfg.on_error)
    result = UnitResult(0, log.items)

    def read(ref):
        try:
            sample = ref.make()
        except RejectedInput as e:
            if e.linked:
                result.linked.append(e.linked)
            raise
        if "linked" in sample.meta:
            result.linked.append(sample.meta["linked"])
        result.images += "image" in sample.fields
        result.utf8_replaced += sample.meta.get("utf8_replaced", 0)
        return sample

    stages = [lambda refs: map_samples(refs, read, stage="read", log=log, where=lambda r: r.source)]
    if ctx.paragraphs:  # the filters then judge what is left of each text
        stages.append(lambda s: drop_paragraphs(s, drops=ctx.paragraphs, stats=result.stats, dropped=result.dropped))
    if ctx.curation:  # before any costly stage: what a filter removes is never decoded or tokenized
        # (with a tokenizer, each text is counted in tokens here, to say what the filters saved in tokens)
        count = token_counter(ctx.fields[TOKENS_FIELD], cfg.out, ctx.policy) if TOKENS_FIELD in ctx.fields else None
        stages.append(lambda s: curate(s, curation=ctx.curation, stats=result.stats, dropped=result.dropped,
                                       count=count))
    stages += [lambda s: (augmented_images if cfg.augment else images)(s, cfg=cfg, log=log),
              lambda s: arrays(s, spec=ctx.fields.get("array"), log=log)]
    if TOKENS_FIELD in ctx.fields and not ctx.pack:
        stages.append(lambda s: tokenize(s, spec=ctx.fields[TOKENS_FIELD], root=cfg.out, tail=cfg.tail,
                                         shard_id=shard_id, stats=result.stats, log=log, policy=ctx.policy))
    try:
        table = _table(compose(ctx.reader.refs(pieces), *stages), ctx.unit_fields)
    except FailFast as e:
        result.failed = e.rejection
        return result, None
    result.rows = table.num_rows
    return result, table


def _table(samples, fields: dict):
    """The samples as a table, built TABLE_BATCH samples at a time: a task holds its output's bytes in
    Arrow buffers, and at most one batch of samples as Python objects."""
    import itertools

    import pyarrow as pa

    batches, it = [], iter(samples)
    while chunk := list(itertools.islice(it, TABLE_BATCH)):
        batches += samples_table(chunk, fields).to_batches()
    return pa.Table.from_batches(batches, schema=samples_table([], fields).schema)


def unit_task(unit: UnitTask, ctx: BuildContext) -> UnitResult:
    """A work unit: its samples through the per-sample stages, as a table for the shard step: a file,
    unless every task runs in this process (threads share the table itself, no copy)."""
    result, table = _process(unit.pieces, ctx, unit.shard)
    if table is not None and ctx.in_memory:
        result.table = table
    elif table is not None:
        name = f"{ctx.config_hash}-{unit.shard:05d}-{unit.index:04d}.arrow"
        result.path = durable.save_unit(table, store.join(units_dir(ctx.cfg), name), ctx.policy)
    return result


def make_durable(cfg: BuildConfig, shard: ShardTask, result: ShardResult, unit_paths=()) -> None:
    """The shard's files and attribute table durable (fsync'd, or uploaded to OUT's store), then its
    marker, then its unit files dropped (durable.mark_done)."""
    extra = (result.attributes.path,) if result.attributes is not None else ()
    durable.mark_done(cfg.out, marker(shard.id), shard.fingerprint, result.to_json(), result.shards, unit_paths,
                      extra=extra, policy=remote_policy(cfg))


def _write(shard: ShardTask, table, parts: list[UnitResult], ctx: BuildContext, start: float) -> ShardResult:
    cfg, stats, log = ctx.cfg, {}, RejectionLog(ctx.cfg.on_error)
    for part in parts:
        add_stats(stats, part.stats)
    formats = ["tar", "parquet"] if cfg.format == "both" else [cfg.format]
    if ctx.pack:  # a per-shard stage: the shard's documents packed into token rows (writers/token_rows.py)
        try:
            samples = list(tokenize(table_samples(table, ctx.unit_fields), spec=ctx.fields[TOKENS_FIELD],
                                    root=cfg.out, tail=cfg.tail, shard_id=shard.id, stats=stats, log=log,
                                    policy=ctx.policy))
        except FailFast as e:
            return ShardResult(shard.id, [], [r for p in parts for r in p.rejections] + log.items, failed=e.rejection)
        infos = [get_writer(fmt)(samples, store.staged(cfg.out), shard.id, ctx.fields) for fmt in formats] \
            if samples else []
    else:
        infos = [get_table_writer(fmt)(table, store.staged(cfg.out), shard.id, ctx.fields, durable=False)
                 for fmt in formats] if len(table) else []
    write_filtered(cfg.out, shard.id, [d for p in parts for d in p.dropped], ctx.policy)
    result = ShardResult(shard.id, infos, [r for part in parts for r in part.rejections] + log.items,
                         sum(p.images for p in parts), sum(p.utf8_replaced for p in parts),
                         time.perf_counter() - start, stats=stats,
                         linked=sorted({tuple(link) for p in parts for link in p.linked}),
                         attributes=None if ctx.pack else attributes.after_write(table, infos, cfg, shard.marks, shard.id))
    units = [p.path for p in parts if p.path]
    durable.settle(cfg.out, make_durable, cfg, shard, result, units)
    return result


def filtered_path(out: str, shard_id: int) -> str:
    return store.join(out, FILTERED_DIR, f"filtered-{shard_id:05d}.parquet")


def write_filtered(out: str, shard_id: int, dropped: list, policy=None) -> None:
    """OUT/curation/filtered-NNNNN.parquet: the shard's samples a filter removed, one row each (key,
    source, source_row, filter, rule), in key order; none (and an earlier one removed) when none was."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = filtered_path(out, shard_id)
    if not dropped:
        store.remove(path, policy)
        return
    dropped = sorted(dropped, key=lambda d: d[0])
    names = ("key", "source", "source_row", "filter", "rule")
    types = (pa.string(), pa.string(), pa.int64(), pa.string(), pa.string())
    table = pa.table({n: pa.array([d[i] for d in dropped], t) for i, (n, t) in enumerate(zip(names, types))})
    store.makedirs(store.join(out, FILTERED_DIR))
    with store.writer(path, policy=policy) as f:  # a local folder (temp, then rename) or a store
        pq.write_table(table, f, compression="zstd")


def shard_task(shard: ShardTask, parts: list[UnitResult], ctx: BuildContext) -> ShardResult:
    """The shard step: write the shard from its units' tables (or, for a one-unit shard, do the unit here).
    The shard's fsync, marker and unit-file cleanup run behind the next tasks (see flush_durable)."""
    import pyarrow as pa

    start = time.perf_counter()
    if not parts:
        part, table = _process(shard.units[0], ctx, shard.id)
        if part.failed:
            return ShardResult(shard.id, [], part.rejections, failed=part.failed)
        return _write(shard, table, [part], ctx, start)
    failed = next((p for p in parts if p.failed), None)
    if failed is not None:
        return ShardResult(shard.id, [], [r for p in parts for r in p.rejections], failed=failed.failed)
    done = reusable(ctx.cfg, shard.id, shard.fingerprint)
    if done is not None:  # this step ran before (a retry after a lost worker): its units are gone
        return done
    tables = [p.table if p.table is not None else durable.load_unit(p.path, ctx.policy) for p in parts]
    return _write(shard, pa.concat_tables(tables), parts, ctx, start)
