"""`shardkit dedup SRC OUT`: chooses its path up front — a built dataset is filtered shard by shard,
a raw folder is built once with a dedup step (its images' bytes kept as they are)."""

from __future__ import annotations

import os
import shutil
from dataclasses import replace

import numpy as np

import shardkit.store as store
from shardkit.config import DedupConfig, remote_policy
from shardkit.jobs import durable
from shardkit.jobs.dedup_tasks import ShardReader, find_duplicates, shard_sources
from shardkit.errors import ConfigError, Rejection, ShardError, count_by_reason
from shardkit.store.local import is_url
from shardkit.duplicates.review import DedupResult, dedup_record, write_report
from shardkit.store.lease import out_lock
from shardkit.jobs.cluster import lazy_client, plan_execution
from shardkit.jobs.tasks import progress_bar, run_tasks

# Single-core bytes per second of a dataset dedup (signatures of stored samples + the filtered
# copy), what `plan_execution` weighs an embedded cluster against.
DATASET_BYTES_PER_SECOND = 40e6


def _filter_shard(task: tuple, root: str, manifest, out: str, policy=None, curation=None):
    """The Dask task of the output stage: one input shard minus the dropped rows (and, with a curation,
    minus what its filters remove), same format, made durable in OUT (fsync'd, or uploaded): (its
    ShardInfo or None when nothing is left, the curation's counters). A shard that loses nothing and
    keeps its id is copied byte for byte."""
    shard, new_id, drop = task
    if not len(drop) and new_id == shard.id and not curation:
        for rel, _ in durable.files_of([shard]):  # streamed: from a store, to a store, or both
            with store.open_source(store.join(root, rel), policy) as f, \
                    store.writer(store.join(out, rel), policy=policy) as g:
                shutil.copyfileobj(f, g, 4 << 20)
        return shard, {}
    stats, removed = {}, []
    info = _filtered(shard, new_id, drop, (root, manifest, policy), store.staged(out), (curation, stats, removed))
    for rel, _ in durable.files_of([info] if info else []):
        store.publish(out, rel, policy=policy)
    if curation and shard.format == _first_format(manifest):  # one list per shard, whatever its formats
        from shardkit.jobs.build.tasks import write_filtered

        write_filtered(out, new_id, removed, policy)
        return info, stats
    return info, {}


def _filtered(shard, new_id: int, drop, src: tuple, staged: str, curating: tuple = (None, None, None)):
    """One shard minus the dropped rows, written under `staged` (OUT, or its staging folder); with a
    curation (curating: the Curation, the counters and the list of removed samples it adds to), its
    kept text goes through stages.filters.curate, the stage build and build_map run. None when
    nothing is left."""
    from shardkit.reader.shards import read_shard_samples
    from shardkit.stages.filters import curate
    from shardkit.writers import get_writer
    from shardkit.writers.parquet import write_parquet_table

    root, manifest, policy = src
    curation, stats, removed = curating
    if shard.format == "parquet" and not is_url(root) and not curation:
        kept = _filter_parquet(os.path.join(root, shard.path), shard, drop, manifest.fields)
        if kept is not None:
            return write_parquet_table(kept, staged, new_id, manifest.fields, durable=False)
    samples = read_shard_samples(root, manifest, shard, policy)
    recorded = shard_sources(root, shard, policy)
    if recorded is not None:  # carry each sample's source over to the new shard
        for s, path, row in zip(samples, *recorded):
            s.meta.update(source_path=path, source_row=row)
    dropped = set(np.asarray(drop).tolist())
    kept = [s for i, s in enumerate(samples) if i not in dropped]
    if curation:
        kept = list(curate(kept, curation=curation, stats=stats, dropped=removed))
        if not kept:  # as a build's shard the filters empty: no files (shard ids may then have gaps)
            return None
    return get_writer(shard.format)(kept, staged, new_id, manifest.fields)


def _first_format(manifest) -> str:
    """The format whose shards count the samples (and, under a curation, list what it removed)."""
    return "parquet" if "parquet" in manifest.formats else "tar"


def _filter_parquet(path: str, shard, drop, fields: dict):
    """The kept rows of a Parquet shard as an Arrow table, when the file holds exactly the columns
    the writer makes of its samples (else None: the caller goes through samples). Rows are taken
    as stored, no Python object per sample; the writer then makes the same bytes as from the
    samples. Stored values are not checked against their xxh3 sums again: the signature stage read
    and checked every one of them; the pages' CRCs are. A rerun that reuses the signature files
    reads the shard here first, so a damaged one is a ShardError naming it, as the reader's."""
    import pyarrow.parquet as pq

    from shardkit.writers.parquet import samples_table

    expected = samples_table([], fields).schema
    try:
        with open(path, "rb") as f:
            pf = pq.ParquetFile(f, page_checksum_verification=True)
            if not pf.schema_arrow.remove_metadata().equals(expected):
                return None
            table = pf.read()
    except (OSError, ValueError) as e:  # pyarrow's errors for a broken file (a CRC mismatch: OSError)
        raise ShardError(f"shard {path}: cannot read ({type(e).__name__}: {e}); restore or rebuild the dataset "
                         "(`shardkit verify` names the damaged shards)") from e
    if table.num_rows != shard.samples:
        return None
    keep = np.ones(table.num_rows, bool)
    keep[np.asarray(drop, np.int64)] = False
    return table.filter(keep)


def _merge_errors(errors: dict, rejections: list[Rejection]) -> dict:
    by_reason = dict(errors.get("by_reason", {}))
    for k, v in count_by_reason(rejections).items():
        by_reason[k] = by_reason.get(k, 0) + v
    return {"count": errors.get("count", 0) + len(rejections), "by_reason": dict(sorted(by_reason.items()))}


def _shard_tasks(manifest, drop_ids: np.ndarray) -> list[tuple]:
    """(shard, new id, rows to drop) for every shard of every format that keeps a sample; ids of
    shards left empty are closed up so they stay dense and in order."""
    shards = manifest.shards_of()
    bounds = np.concatenate([[0], np.cumsum([s.samples for s in shards])])
    drop_ids = np.sort(drop_ids)
    drops, survivors = {}, []
    for s, lo, hi in zip(shards, bounds[:-1].tolist(), bounds[1:].tolist()):
        rows = drop_ids[np.searchsorted(drop_ids, lo):np.searchsorted(drop_ids, hi)] - lo
        drops[s.id] = rows
        if len(rows) < s.samples:
            survivors.append(s.id)
    new_id = {old: new for new, old in enumerate(survivors)}
    return [(s, new_id[s.id], drops[s.id]) for s in manifest.shards if s.id in new_id]


def write_dataset(src: str, out: str, manifest, result: DedupResult, client=None, progress: bool = True,
                  curation=None, policy=None):
    """OUT as a dataset: the same shard formats, fields and classes, without the removed and the
    unreadable samples (and, with a curation, what its filters removed). errors.jsonl = SRC's + this run's.
    `policy` (the job's RemotePolicy) goes to every task with the shared arguments."""
    from shardkit.jobs.build.tasks import add_stats
    from shardkit.manifest import Manifest
    from shardkit.stages.filters import STAT

    tasks = _shard_tasks(manifest, np.concatenate([result.removed_ids, result.rejected_ids]))
    with progress_bar(len(tasks), desc="dedup write", unit="shard", enabled=progress) as bar:
        done = run_tasks(_filter_shard, tasks, client=client, bar=bar, name="dedup-write",
                         shared=(src, manifest, out, policy, curation or None))
    infos, stats = [info for info, _ in done if info is not None], {}
    for _, counts in done:
        add_stats(stats, counts)
    try:
        old_errors = store.read(store.join(src, "errors.jsonl"), policy).decode("utf-8")
    except FileNotFoundError:
        old_errors = ""
    durable.write_errors(out, result.rejections, old_errors, policy)
    samples = sum(i.samples for i in infos if i.format == _first_format(manifest))
    build = dict(manifest.build, dedup=dedup_record(result.summary, samples))
    if curation:  # what `build --filter` records, this run's filters and counts
        build["curation"] = {"filters": curation.record(), "counts": dict(sorted(stats.items())),
                             "filtered": "curation/filtered-*.parquet"}
        result.summary["curation"] = {k: v for k, v in sorted(stats.items()) if k.startswith(STAT + ".")}
    out_manifest = Manifest(samples=samples, fields=manifest.fields, shards=infos, classes=manifest.classes,
                            build=build, errors=_merge_errors(manifest.errors, result.rejections),
                            extra={k: v for k, v in manifest.extra.items() if k != "attributes"})  # SRC's rows
    return durable.finish(out, out_manifest, policy)


def dataset_curation(cfg: DedupConfig, manifest):
    """The curation a built dataset's text goes through after the dedup (stages.filters.Curation,
    empty when cfg.curation curates nothing), checked before any worker starts."""
    from shardkit.config.build import MAX_DOC_BYTES
    from shardkit.stages.filters import Curation

    c = dict(cfg.curation or {})
    if c.get("dedup_exact"):
        raise ConfigError(f"{cfg.src} is a built dataset, whose dedup already links texts equal once normalised "
                          "(reason exact in dedup/clusters.parquet): leave out --dedup-exact")
    if c.get("dedup_paragraphs"):
        raise ConfigError(f"{cfg.src} is a built dataset: --dedup-paragraphs runs while building, before the "
                          "filters; give dedup the raw folder, or build it with --dedup-paragraphs")
    curation = Curation.from_options(c.get("filter"), c.get("filter_option") or (), c.get("lang"),
                                     c.get("lang_threshold", 0.65), c.get("mask_pii", False),
                                     c.get("filter_max_bytes", MAX_DOC_BYTES))
    if curation and "txt" not in manifest.fields:
        raise ConfigError(f"{cfg.src} has no text field (txt) for --filter, --lang or --mask-pii to read; its "
                          f"fields: {', '.join(manifest.fields)}")
    return curation


def dedup_dataset(cfg: DedupConfig) -> DedupResult:
    """A built dataset in, a dataset out: signatures of each shard's stored samples, then each shard
    filtered into OUT (unchanged shards copied), the report written once at the end."""
    from shardkit.manifest import load_manifest

    policy = remote_policy(cfg)
    manifest = load_manifest(cfg.src, policy)
    curation = dataset_curation(cfg, manifest)
    if manifest.fields.get("tokens", {}).get("layout") == "packed":
        raise ConfigError(f"{cfg.src} holds packed token rows (a --seq-len build): its documents are no longer "
                          "samples to compare; dedup the raw text instead: shardkit build RAW OUT --tokenizer ... "
                          "--seq-len ... --dedup")
    store.makedirs(store.join(cfg.out, "shards"))
    store.remove_tree(store.join(cfg.out, "curation"), policy)  # an earlier run's lists of what its filters removed
    durable.retire_manifest(cfg.out, policy)  # until this run ends, no manifest may name shards it replaces
    execution = plan_execution(cfg.scheduler, cfg.workers,
                               sum(s.bytes for s in manifest.shards_of()) / DATASET_BYTES_PER_SECOND)
    shards = manifest.shards_of()
    # Whole shards per signature task, about --partition-size samples each (fewer, larger
    # partitions when a corpus has many small shards: every bucket task reads from each one).
    per_partition = max(1, cfg.partition_size * len(shards) // max(1, manifest.samples))
    with lazy_client(cfg.scheduler, execution.workers) as client:
        result = find_duplicates(shards, cfg, client, store.join(cfg.out, ".shardkit", "dedup"),
                                 reader=ShardReader(cfg.src, manifest, policy), specs=manifest.fields,
                                 per_partition=per_partition)
        out = write_dataset(cfg.src, cfg.out, manifest, result, client, cfg.progress, curation, policy)
    result.summary["execution"].update(execution.record())
    result.summary["output"] = {"samples": out.samples, "shards": len(out.shards_of()),
                                "images": "stored bytes kept"}
    write_report(store.join(cfg.out, "dedup"), result, policy)
    return result


def dedup(cfg: DedupConfig, curation: dict | None = None) -> DedupResult:
    """`shardkit dedup SRC OUT`: SRC a raw folder or a built dataset; OUT a dataset without the duplicates,
    with OUT/dedup/clusters.parquet and OUT/dedup/summary.json.

    `cfg.curation` (BuildConfig's curation fields: filter, filter_option, lang, lang_threshold, mask_pii,
    dedup_exact, dedup_paragraphs) runs as `shardkit build` runs it: a raw SRC's build runs it, a built
    dataset's text goes through the same stage (stages.filters.curate) after the dedup. `curation`,
    the older way to pass it, is merged into cfg.curation."""
    from shardkit.jobs.build import build
    from shardkit.manifest import MANIFEST_NAME

    if curation:
        cfg = replace(cfg, curation={**(cfg.curation or {}), **curation})
    cfg = replace(cfg, src=store.location(cfg.src, "SRC"), out=store.location(cfg.out, "OUT", write=True))
    policy = remote_policy(cfg)
    if store.same_location(cfg.src, cfg.out):
        raise ConfigError(f"OUT {cfg.out!r} is SRC: dedup writes a new dataset; choose another OUT folder")
    if not store.is_url(cfg.src) and not os.path.isdir(cfg.src):
        raise FileNotFoundError(f"SRC {cfg.src!r} is neither a dataset (manifest.json) nor a folder")
    store.check_source(cfg.src, policy)  # before OUT's lock: a SRC that is not there leaves nothing in OUT
    with out_lock(cfg.out, "shardkit dedup", policy=policy):  # one writer per OUT (a raw SRC's build takes it again)
        if store.exists(store.join(cfg.src, MANIFEST_NAME), policy):
            return dedup_dataset(cfg)
        return build(cfg.build_config(), dedup=cfg).dedup
