"""build_map's Dask tasks: a work unit runs the user's function over its inputs into a samples table;
a group's step writes the group's shard(s) from its units' tables, in input order, then its marker.

The client side (groups, fingerprints, the run, the manifest) is shardkit/jobs/map/__init__.py.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace

import shardkit.store as store
from shardkit.jobs import durable
from shardkit.jobs.build.tasks import add_stats, write_filtered
from shardkit.stages.filters import curate
from shardkit.contract import ShardInfo
from shardkit.errors import ConfigError, Rejection, RejectionLog
from shardkit.writers.user_samples import BadSample, to_sample
from shardkit.config.writer import WriterConfig
from shardkit.writers import get_table_writer

STATE = ".shardkit/map"
MAX_PARTS = 100_000  # shards one group may be cut into (its part number is below this)
REPR_CHARS = 300  # of an input's repr in errors.jsonl


@dataclass(frozen=True)
class MapContext:
    """What every task shares (sent to each worker once)."""

    fn: object
    out: str
    fields: dict
    writer: WriterConfig
    on_error: str
    in_memory: bool  # every task runs in this process: units hand their tables over as they are
    curation: object = None  # stages.filters.Curation run on each sample's text (None: off)
    policy: object = None  # the job's store.remote.RemotePolicy (timeout, retries): every store call waits as it


@dataclass(frozen=True)
class Group:
    """One shard group: inputs [start, stop), its rerun fingerprint."""

    index: int
    start: int
    stop: int
    fingerprint: str


@dataclass(frozen=True)
class Unit:
    group: int
    index: int
    start: int
    inputs: tuple


@dataclass
class UnitOutput:
    rows: int
    rejections: list
    table: object = None
    path: str | None = None
    dropped: list = field(default_factory=list)  # (key, input, None, filter, rule) the curation removed
    stats: dict = field(default_factory=dict)  # curation counters


@dataclass
class GroupResult:
    """One group's shards and rejections (what its marker records)."""

    index: int
    shards: list[ShardInfo]
    rejections: list[Rejection]
    reused: bool = False
    stats: dict = field(default_factory=dict)  # curation counters

    def to_json(self) -> dict:
        return {"index": self.index, "shards": [s.to_dict() for s in self.shards],
                "rejections": [[r.path, r.stage, r.reason] for r in self.rejections], "stats": self.stats}


def samples_of(out) -> list:
    """fn's result as a list of sample dicts: one dict, an iterable of them, or None (skip)."""
    if out is None:
        return []
    if isinstance(out, dict):
        return [out]
    try:
        return list(out)
    except TypeError:
        raise BadSample(f"fn returned a {type(out).__name__}; it returns a sample dict, an iterable of "
                        "sample dicts, or None to skip the input") from None


def _last_line(e: BaseException) -> str:
    """`Type: message`, with the message's last line only (what a traceback's last line shows)."""
    lines = str(e).strip().splitlines()
    return f"{type(e).__name__}: {lines[-1]}" if lines else type(e).__name__


def run_unit(unit: Unit, ctx: MapContext) -> UnitOutput:
    """fn over one unit's inputs; an input whose fn raises (or gives a sample that does not fit) is
    rejected whole, with its repr and the exception's last line."""
    from shardkit.writers.parquet import samples_table

    log, samples, dropped, stats = RejectionLog(ctx.on_error), [], [], {}
    for offset, item in enumerate(unit.inputs):
        try:
            made = [to_sample(s, ctx.fields, ctx.writer) for s in samples_of(ctx.fn(item))]
        except Exception as e:  # noqa: BLE001 — the user's function: any failure is this input's
            log.reject(repr(item)[:REPR_CHARS], "map", _last_line(e))
            continue
        if ctx.curation:
            mine: list = []
            made = list(curate(made, curation=ctx.curation, stats=stats, dropped=mine))
            dropped += [(d[0], repr(item)[:REPR_CHARS], None, *d[3:]) for d in mine]
        samples += made
    table = samples_table(samples, ctx.fields)
    result = UnitOutput(table.num_rows, log.items, dropped=dropped, stats=stats)
    if ctx.in_memory:
        result.table = table
    else:
        name = f"{unit.group:05d}-{unit.index:04d}.arrow"
        result.path = durable.save_unit(table, store.join(ctx.out, STATE, "units", name), ctx.policy)
    return result


def _marker(g: int) -> str:
    """A group's completion marker, relative to OUT."""
    return f"{STATE}/done/group-{g:05d}.json"


def run_group(group: Group, parts: list[UnitOutput], ctx: MapContext) -> GroupResult:
    """A group's step: its units' tables in input order, duplicate keys rejected (the first kept),
    sorted by key, cut by size and count, written; then its marker."""
    import pyarrow as pa

    tables = [p.table if p.table is not None else durable.load_unit(p.path, ctx.policy) for p in parts]
    rejections = [r for p in parts for r in p.rejections]
    table, dups = _sorted_unique(pa.concat_tables(tables))
    for key in dups:
        rejections.append(Rejection(key, "map", f"duplicate key: {key!r} was given by an earlier input, kept"))
    shards = _write_parts(table, group.index, ctx)
    # none: an earlier list goes
    write_filtered(ctx.out, group.index, [d for p in parts for d in p.dropped], ctx.policy)
    stats: dict = {}
    for p in parts:
        add_stats(stats, p.stats)
    result = GroupResult(group.index, shards, rejections, stats=stats)
    durable.settle(ctx.out, make_durable, ctx.out, group, result, [p.path for p in parts if p.path], ctx.policy)
    return result


def make_durable(out: str, group: Group, result: GroupResult, unit_paths=(), policy=None) -> None:
    """A group's shard files durable, then its marker, then its unit files dropped (durable.mark_done)."""
    durable.mark_done(out, _marker(group.index), group.fingerprint, result.to_json(), result.shards, unit_paths,
                      policy=policy)


def has_marker(out: str, g: int, policy=None) -> bool:
    return store.exists(store.join(out, _marker(g)), policy)


def _sorted_unique(table):
    """The table sorted by key (stable: among equal keys the first input's row first), repeated keys
    dropped; returns (table, the repeated keys)."""
    import numpy as np
    import pyarrow.compute as pc

    order = pc.sort_indices(table, [("__key__", "ascending")]).to_numpy()  # a stable sort
    keys = table.column("__key__").take(order).to_pylist()
    repeat = np.zeros(len(keys), bool)  # a group whose every input was skipped has no row
    repeat[1:] = [a == b for a, b in zip(keys, keys[1:])]
    return table.take(order[~repeat]), [k for k, r in zip(keys, repeat) if r]


def _row_bytes(table):
    """Each row's stored size in a tar shard (values plus a member's overhead per field present)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    from shardkit.contract import CHECKSUM_SUFFIX
    from shardkit.jobs.shard_writer import TAR_MEMBER_OVERHEAD

    total = np.zeros(table.num_rows, np.int64)
    for name in table.column_names:
        if name.startswith("__") or name.endswith(CHECKSUM_SUFFIX):
            continue
        col = table.column(name)
        present = col.is_valid().to_numpy(zero_copy_only=False)
        t = col.type
        if pa.types.is_binary(t) or pa.types.is_string(t) or pa.types.is_fixed_size_binary(t):
            sizes = pc.binary_length(col).fill_null(0).to_numpy(zero_copy_only=False)
        else:  # an int: its decimal text in a tar member
            sizes = np.full(table.num_rows, 20)
        total += np.where(present, sizes + TAR_MEMBER_OVERHEAD, 0)
    return total


def _cuts(sizes, cfg: WriterConfig) -> list[tuple[int, int]]:
    """[start, stop) rows of each shard: greedy by size and count, at least one row each."""
    cuts, start, acc = [], 0, 0
    for i, size in enumerate(sizes.tolist()):
        full = cfg.max_samples_per_shard is not None and i - start >= cfg.max_samples_per_shard
        if i > start and (full or acc + size > cfg.shard_size):
            cuts.append((start, i))
            start, acc = i, 0
        acc += size
    if start < len(sizes):
        cuts.append((start, len(sizes)))
    return cuts


def _write_parts(table, g: int, ctx: MapContext) -> list[ShardInfo]:
    """Shards `data-GGGGG-PPP` of one group (written under a numeric id, then renamed)."""
    cuts = _cuts(_row_bytes(table), ctx.writer)
    if len(cuts) >= MAX_PARTS:
        raise ConfigError(f"group {g} makes {len(cuts)} shards; raise shard_size or lower inputs_per_shard")
    infos = []
    for p, (a, b) in enumerate(cuts):
        for fmt in ctx.writer.formats:
            root = store.staged(ctx.out)
            info = get_table_writer(fmt)(table.slice(a, b - a), root, g * MAX_PARTS + p, ctx.fields, durable=False)
            infos.append(_rename(info, f"shards/data-{g:05d}-{p:03d}", root))
    return infos


def _rename(info: ShardInfo, stem: str, out: str) -> ShardInfo:
    path = stem + os.path.splitext(info.path)[1]
    os.replace(os.path.join(out, info.path), os.path.join(out, path))
    index = None
    if info.index:
        index = dict(info.index, path=path + ".idx.parquet")
        os.replace(os.path.join(out, info.index["path"]), os.path.join(out, index["path"]))
    return replace(info, path=path, index=index)


def reusable(out: str, group: Group, sizes: dict | None = None, data: bytes | None = None,
             policy=None) -> GroupResult | None:
    """A previous run's result for this group, if its fingerprint matches and its files are there
    (`sizes`, `data`: see durable.reusable)."""
    d = durable.reusable(out, _marker(group.index), group.fingerprint, sizes, data, policy)
    if d is None:
        return None
    try:
        return GroupResult(group.index, [ShardInfo.from_dict(s) for s in d["shards"]],
                           [Rejection(*r) for r in d["rejections"]], reused=True, stats=d.get("stats", {}))
    except (KeyError, TypeError, ValueError):
        return None


def markers(out: str, groups, policy=None) -> dict[int, GroupResult]:
    """The groups a previous run finished with the same inputs: markers read at once (durable.reused)."""
    by_index = {g.index: g for g in groups}
    return durable.reused(out, f"{STATE}/done", {g: _marker(g) for g in by_index},
                          lambda g, sizes, data: reusable(out, by_index[g], sizes, data, policy), policy)


