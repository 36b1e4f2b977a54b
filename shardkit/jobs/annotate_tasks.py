"""One shard's attributes: score its texts, lay the columns out in their canonical order, write the
attribute table, count the stored selections. Shared by `shardkit annotate` (a task per shard) and
the build's shard step (`--annotate`, `--filter`)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np

from shardkit.contract import AttributeInfo, ShardInfo
from shardkit.reader.selection import read_columns
from shardkit.reader.shards import missing_shard, open_shard
from shardkit.reader.where import Where
from shardkit.stages.attributes import DEDUP, DEDUP_COLUMNS, arrow_type, score_texts, type_name
from shardkit.writers.attributes import attribute_table, write_attributes

TEXT_FIELD = "txt"


def layout(scorers: list, keep_dedup: bool = False) -> dict:
    """{scorer name: its columns} in the order every attribute table lays them out: by scorer name,
    each scorer's columns as it declares them; the dedup step's columns under DEDUP."""
    out = {s.name: list(s.columns) for s in scorers}
    if keep_dedup:
        out[DEDUP] = list(DEDUP_COLUMNS)
    return dict(sorted(out.items()))


def column_specs(scorers: list, keep_dedup: bool = False) -> dict:
    """manifest attributes' `columns`: {column: {"type", "scorer"}}, in table order."""
    types = {c: type_name(t) for s in scorers for c, t in s.columns.items()}
    types.update(DEDUP_COLUMNS if keep_dedup else {})
    return {c: {"type": types[c], "scorer": name} for name, cols in layout(scorers, keep_dedup).items() for c in cols}


def shard_texts(root: str, shard: ShardInfo, fields: dict) -> tuple[list, list]:
    """(keys, texts) of one local shard, every text checked against its recorded checksum; texts are
    None where a sample has none."""
    index = os.path.join(root, shard.index["path"]) if shard.index else None
    specs = {TEXT_FIELD: fields[TEXT_FIELD]} if TEXT_FIELD in fields else {}
    try:
        reader = open_shard(os.path.join(root, shard.path), shard, specs, shard.path, index_path=index)
    except FileNotFoundError as e:
        raise missing_shard(os.path.join(root, shard.path), e) from e
    rows = np.arange(len(reader.keys))
    texts = reader.values(TEXT_FIELD, rows) if specs and reader.has(TEXT_FIELD) else [None] * len(rows)
    return list(reader.keys), [t if t is None or isinstance(t, str) else bytes(t).decode() for t in texts]


@dataclass(frozen=True)
class ShardJob:
    """One shard of `shardkit annotate`: the scorers to run on it, and those whose columns the existing
    table `previous` already holds for this content (copied as they are)."""

    shard: ShardInfo  # the shard scored (the source format's)
    compute: tuple = ()
    copy: tuple = ()
    previous: AttributeInfo | None = None


@dataclass(frozen=True)
class AnnotateContext:
    """What every task of one annotate run shares (sent to each worker once)."""

    out: str
    fields: dict
    scorers: tuple  # the scorers to run (objects), by name
    layout: dict  # scorer name -> columns, in table order (layout())
    fingerprints: dict  # scorer name -> fingerprint, for every scorer the tables hold
    types: dict  # column -> recorded type name
    selections: tuple = ()  # where= texts whose kept samples are counted per shard


@dataclass
class ShardDone:
    """What a shard's task gives back: its table's record, kept samples per selection, documents a
    scorer could not score (its scores null)."""

    info: AttributeInfo
    kept: dict = field(default_factory=dict)
    failed: dict = field(default_factory=dict)
    written: bool = False


def ordered(columns: dict, lay: dict, n: int) -> dict:
    """`columns` in layout order; every laid-out column must be there with `n` rows."""
    out = {c: columns[c] for cols in lay.values() for c in cols}
    assert all(len(v) == n for v in out.values()), "attribute columns of unequal length"
    return out


def annotate_shard(job: ShardJob, ctx: AnnotateContext) -> ShardDone:
    """The task of one shard: score what must be, copy what may be, write the table (unless nothing
    changed), count the selections on it."""
    columns, failed = {}, {}
    keys = None
    if job.copy:
        wanted = [c for name in job.copy for c in ctx.layout[name]]
        old = read_columns(ctx.out, job.previous, ["__key__"] + wanted)
        keys = old.column("__key__").combine_chunks()
        columns.update({c: old.column(c).combine_chunks() for c in wanted})
    if job.compute:
        keys, texts = shard_texts(ctx.out, job.shard, ctx.fields)
        scores = score_texts(texts, [s for s in ctx.scorers if s.name in job.compute])
        columns.update(scores.columns)
        failed = scores.failed
    if job.compute or job.previous is None or set(job.copy) != set(job.previous.scorers):
        table = attribute_table(keys, ordered(columns, ctx.layout, job.shard.samples), job.shard.sha256,
                                {n: ctx.fingerprints[n] for n in ctx.layout})
        info, written = write_attributes(table, ctx.out, job.shard.id), True
    else:
        info, written = job.previous, False
    return ShardDone(info, count_selections(ctx.out, info, ctx.selections, ctx.types), failed, written)


def count_selections(root: str, info: AttributeInfo, selections, types: dict) -> dict:
    """Kept samples of each selection in one attribute table (reading only the columns they name)."""
    wheres = [Where(text, types) for text in selections]
    needed = sorted({c for w in wheres for c in w.columns})
    if not wheres:
        return {}
    table = read_columns(root, info, needed)
    return {w.text: int(w.mask(table).sum()) for w in wheres}


def shard_attributes(table, scorers: list, dedup: dict | None, source: str, fingerprints: dict):
    """The build's attribute table of a shard written from `table` (a samples table) whose source
    file has sha256 `source`: the scorers' columns over its texts and, with `dedup` ({key: (cluster,
    duplicate, exact)} of its clustered samples), the dedup step's columns, null / False elsewhere.
    Returns (Arrow table, {scorer: documents it could not score})."""
    import pyarrow as pa

    keys = table.column("__key__").combine_chunks()
    texts = table.column(TEXT_FIELD).to_pylist() if TEXT_FIELD in table.column_names else [None] * len(keys)
    scores = score_texts(texts, scorers)
    columns = dict(scores.columns)
    if dedup is not None:
        rows = [dedup.get(k) for k in keys.to_pylist()]
        columns["exact_dup"] = pa.array([bool(r and r[2]) for r in rows], arrow_type("bool"))
        columns["duplicate"] = pa.array([bool(r and r[1]) for r in rows], arrow_type("bool"))
        columns["near_dup_cluster"] = pa.array([r[0] if r else None for r in rows], arrow_type("int64"))
    lay = layout(scorers, dedup is not None)
    return attribute_table(keys, ordered(columns, lay, len(keys)), source, fingerprints), scores.failed


def filter_table(table, scorers: list):
    """--filter: the rows of a samples table that every scorer keeps, and (source, rule) of each
    row it drops, in row order."""
    from shardkit.contract import SOURCE_COLUMN, SOURCE_ROW_COLUMN

    texts = table.column(TEXT_FIELD).to_pylist() if TEXT_FIELD in table.column_names else [None] * len(table)
    scores = score_texts(texts, scorers)
    dropped = np.flatnonzero(~scores.keep).tolist()
    paths, rows = table.column(SOURCE_COLUMN).to_pylist(), table.column(SOURCE_ROW_COLUMN).to_pylist()
    keys = table.column("__key__").to_pylist()
    named = [keys[i] if paths[i] is None else paths[i] if rows[i] is None else f"{paths[i]}:{rows[i]}"
             for i in dropped]
    return table.filter(scores.keep), [(where, scores.rules[i]) for where, i in zip(named, dropped)]
