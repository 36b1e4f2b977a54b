"""`shardkit annotate OUT --scorers ...`: attribute tables beside an existing dataset's shards (which
are never rewritten), on Dask, OUT locked, the manifest written last.

The dataset's tables then hold the scorers named now and those of earlier runs. A rerun scores a
shard only where its table is missing, was computed from other shard content, or lacks a scorer (or
holds one with other options): the rest is reused as it is, or copied column by column into the
shard's new table. Stored selections (`--select EXPR`, and those stored before) are counted per
shard on the final tables, so that readers plan a where= epoch without reading them.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field, replace

import numpy as np

from shardkit.config import AnnotateConfig, remote_policy
from shardkit.contract import AttributeInfo, attributes_relpath
from shardkit.errors import ConfigError
from shardkit.store.locks import folder_lock
from shardkit.store.local import is_url, sha256_file
from shardkit.jobs.annotate_tasks import (DEDUP, TEXT_FIELD, AnnotateContext, ShardDone, ShardJob, annotate_shard,
                                          column_specs, layout, shard_texts)
from shardkit.jobs.cluster import background_client
from shardkit.jobs.tasks import progress_bar, run_tasks
from shardkit.manifest import load_manifest, write_manifest
from shardkit.manifest.attributes import Attributes, attach, load_attributes, source_format
from shardkit.reader.where import Where
from shardkit.stages.attributes import fingerprint, make_scorers
from shardkit.writers.attributes import recorded

log = logging.getLogger("shardkit.annotate")


@dataclass
class AnnotateResult:
    """What the one-screen summary shows."""

    out: str
    shards: int
    written: int  # attribute tables written by this run
    columns: dict  # the dataset's attribute columns: {column: {"type", "scorer"}}
    selections: dict  # {where: kept samples}
    failed: dict = field(default_factory=dict)  # scorer -> documents it could not score in this run
    seconds: float = 0.0
    manifest_written: bool = False


def annotate(cfg: AnnotateConfig) -> AnnotateResult:
    """Add attribute columns (cfg.scorers) and stored selections (cfg.select) to the dataset in cfg.out."""
    if is_url(cfg.out):
        raise ConfigError(f"{cfg.out}: annotate writes beside the shards, so OUT must be a local folder (or one "
                          "mounted); copy the dataset there, annotate it, and copy it back")
    cfg = replace(cfg, out=os.path.abspath(cfg.out))
    with folder_lock(cfg.out, "shardkit annotate"):
        return _annotate(cfg)


def scorer_options(cfg: AnnotateConfig) -> dict:
    """{scorer: {option: value}} of --scorer-option (the syntax of --filter-option), each for a scorer named."""
    from shardkit.stages.filters import parse_options

    options = parse_options(cfg.scorer_option)
    named = {n.strip() for n in (cfg.scorers or "").split(",")}
    unused = sorted(set(options) - named)
    if unused:
        raise ConfigError(f"--scorer-option for {', '.join(unused)}, which is not run: add it to --scorers")
    return options


def _scorers(cfg: AnnotateConfig, previous: Attributes | None) -> tuple[list, dict]:
    """(the scorers a rerun may run: named now, or stored before and rebuilt with the same options;
    {name: fingerprint} of everything the tables will hold)."""
    named = make_scorers(cfg.scorers, scorer_options(cfg)) if cfg.scorers else []
    fingerprints = {s.name: fingerprint(s) for s in named}
    runnable = list(named)
    for name, meta in (previous.scorers if previous else {}).items():
        if name in fingerprints:
            continue
        fingerprints[name] = meta["fingerprint"]
        if name != DEDUP:
            try:
                again = make_scorers([name])[0]
            except ConfigError:
                continue  # a scorer this shardkit lacks: its columns can only be copied
            if fingerprint(again) == meta["fingerprint"]:
                runnable.append(again)
    return runnable, fingerprints


def _info_on_disk(out: str, shard_id: int) -> AttributeInfo | None:
    """The attribute table already in OUT for a shard (left by a run whose manifest was not written,
    or named by an earlier manifest), described from its own footer."""
    import pyarrow.parquet as pq

    rel = attributes_relpath(shard_id)
    path = os.path.join(out, rel)
    try:
        meta = pq.read_metadata(path)
        mine = recorded(pq.read_schema(path))
    except (OSError, ValueError):  # missing, or not a table this shardkit wrote
        return None
    if "source" not in mine:
        return None
    return AttributeInfo(shard_id, rel, meta.num_rows, os.path.getsize(path), sha256_file(path), mine["source"],
                         mine.get("scorers", {}))


def _existing(records: dict, out: str, shard) -> AttributeInfo | None:
    """The current table of `shard` if it was computed from its present content, else None;
    `records` are the manifest's {shard id: AttributeInfo}."""
    info = records.get(shard.id)
    if info is not None:
        path = os.path.join(out, info.path)
        if not os.path.isfile(path) or os.path.getsize(path) != info.bytes:
            info = None
    info = info or _info_on_disk(out, shard.id)
    return info if info is not None and info.source == shard.sha256 and info.rows == shard.samples else None


def _known(previous: Attributes | None, records: dict, info: AttributeInfo | None, selections: list) -> dict | None:
    """The kept counts of every selection in this table, when the previous record stored them all."""
    if previous is None or info is None or any(w not in previous.selections for w in selections):
        return None
    if records.get(info.id) != info:
        return None
    i = int(np.searchsorted(previous.ids, info.id))
    return {w: int(previous.kept(w)[i]) for w in selections}


def _plan(shards, infos: dict, ctx: AnnotateContext, runnable: set, previous, records: dict) -> tuple[list, dict]:
    """(a job per shard with work to do, {shard id: ShardDone} of the shards left as they are)."""
    jobs, kept = [], {}
    for shard in shards:
        prev = infos.get(shard.id)
        have = {n for n, fp in (prev.scorers if prev else {}).items() if ctx.fingerprints.get(n) == fp}
        job = ShardJob(shard, tuple(n for n in ctx.layout if n not in have),
                       tuple(n for n in ctx.layout if n in have), prev)
        missing = [n for n in job.compute if n not in runnable]
        if missing:
            raise ConfigError(f"shard {shard.path} needs the columns of {missing} computed again (its content changed "
                              "or its table is missing), which this run cannot: name them in --scorers")
        counts = _known(previous, records, prev, list(ctx.selections))
        if not job.compute and prev is not None and set(prev.scorers) == set(ctx.layout) and counts is not None:
            kept[shard.id] = ShardDone(prev, counts)
        else:
            jobs.append(job)
    return jobs, kept


def _annotate(cfg: AnnotateConfig) -> AnnotateResult:
    start = time.perf_counter()
    manifest = load_manifest(cfg.out)
    previous = load_attributes(manifest, cfg.out, check=False)  # a rerun brings stale records up to date
    runnable, fingerprints = _scorers(cfg, previous)
    shards = manifest.shards_of(source_format(manifest))
    records = {i.id: i for i in previous.infos()} if previous is not None else {}
    infos = {s.id: info for s in shards if (info := _existing(records, cfg.out, s)) is not None}
    keep_dedup = DEDUP in fingerprints and all(
        s.id in infos and infos[s.id].scorers.get(DEDUP) == fingerprints[DEDUP] for s in shards)
    if DEDUP in fingerprints and not keep_dedup:
        log.warning("the dedup step's columns (exact_dup, duplicate, near_dup_cluster) are dropped: some shards "
                    "changed since `build --dedup --annotate`; that build records them again")
        fingerprints.pop(DEDUP)
    scorers = [s for s in runnable if s.name in fingerprints]
    lay = layout(scorers, keep_dedup)
    lay.update({n: previous.columns_of(n) for n in fingerprints if n not in lay})  # only copied: not runnable
    lay = dict(sorted(lay.items()))
    old = previous.columns if previous else {}
    columns = {c: column_specs(scorers, keep_dedup).get(c) or old[c] for cols in lay.values() for c in cols}
    types = {c: spec["type"] for c, spec in columns.items()}
    selections = sorted(set(previous.selections if previous else ()) | {Where(t, types).text for t in cfg.select})
    if TEXT_FIELD not in manifest.fields and scorers:
        raise ConfigError(f"{cfg.out} has no text field ({TEXT_FIELD}): the scorers score documents' text")
    ctx = AnnotateContext(cfg.out, manifest.fields, tuple(scorers), lay, fingerprints, types, tuple(selections))
    jobs, kept = _plan(shards, infos, ctx, {s.name for s in scorers}, previous, records)
    with background_client(cfg.scheduler, cfg.workers, start=False) as pending:
        with progress_bar(len(shards), initial=len(kept), desc="annotate", unit="shard", enabled=cfg.progress) as bar:
            done = run_tasks(annotate_shard, jobs, client=pending, bar=bar, name="annotate", shared=(ctx,))
    kept.update({d.info.id: d for d in done})
    return _finish(cfg, manifest, [kept[s.id] for s in shards], columns, fingerprints, selections, start)


def _finish(cfg, manifest, done: list[ShardDone], columns, fingerprints, selections, start) -> AnnotateResult:
    """The attributes record and table, then the manifest (last), when anything changed."""
    kept = {w: np.array([d.kept[w] for d in done], np.int64) for w in selections}  # shards in id order
    scorers = {n: {"fingerprint": fp} for n, fp in sorted(fingerprints.items())}
    attributes = Attributes.of([d.info for d in done], columns, scorers, kept)
    changed = manifest.extra.get("attributes") != attributes.record(attributes.blob())
    if changed:  # OUT is a local folder (annotate refuses a store); the job's policy goes along all the same
        attach(cfg.out, manifest, attributes, remote_policy(cfg))
        write_manifest(cfg.out, manifest, remote_policy(cfg))
    failed: dict = {}
    for d in done:
        for k, v in d.failed.items():
            failed[k] = failed.get(k, 0) + v
    return AnnotateResult(cfg.out, len(done), sum(d.written for d in done), columns,
                          {w: int(k.sum()) for w, k in kept.items()}, failed, time.perf_counter() - start, changed)


def verify_attributes(root: str, manifest) -> tuple[list[str], int]:
    """(problems, files checked) of a dataset's attribute tables, as `shardkit verify` prints them: each
    file's size and sha256 against the manifest, its rows' keys against its shard's, and each table
    computed from the shard content the manifest names."""
    from shardkit.errors import ManifestError, ShardError
    from shardkit.manifest import safe_relpath
    from shardkit.reader.selection import read_columns

    try:
        attributes = load_attributes(manifest, root, check=False)
    except ManifestError as e:
        return [f"attributes {e}"], 1
    if attributes is None:
        return [], 0
    problems, by_id = [], {s.id: s for s in manifest.shards_of(source_format(manifest))}
    for info in attributes.infos():
        shard = by_id.get(info.id)
        path = os.path.join(root, safe_relpath(info.path))
        if shard is None:
            problems.append(f"attributes {info.path}: no shard {info.id} in the manifest")
        elif info.source != shard.sha256:
            problems.append(f"attributes {info.path}: computed from other content than {shard.path}")
        elif not os.path.isfile(path):
            problems.append(f"missing   {info.path}")
        else:
            try:
                keys = read_columns(root, info, ["__key__"]).column("__key__").to_pylist()
                if keys != shard_texts(root, shard, {})[0]:
                    problems.append(f"attributes {info.path}: its rows' keys differ from {shard.path}'s")
            except ShardError as e:
                problems.append(f"checksum  {info.path}: {e}")
    missing = sorted(set(by_id) - set(attributes.ids.tolist()))
    problems += [f"attributes shard {i} has no attribute table" for i in missing[:8]]
    return problems, len(attributes) + 1
