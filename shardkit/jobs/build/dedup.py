"""The dedup steps of a build, between listing and shard planning: near-duplicates (--dedup),
exact copies (--dedup-exact), repeated paragraphs (--dedup-paragraphs), and their reports."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import replace

import shardkit.store as store
from shardkit.config import BuildConfig, DedupConfig, remote_policy
from shardkit.errors import ConfigError
from shardkit.store.remote import RemoteError
from shardkit.jobs.build.tasks import STATE_DIR
from shardkit.jobs.cluster import Execution, plan_execution
from shardkit.jobs.dedup_tasks import dedup_inventory, estimate_inventory_seconds
from shardkit.jobs.paragraph_tasks import dedup_paragraphs
from shardkit.duplicates.review import write_report
from shardkit.manifest import Manifest
from shardkit.sources.inventory import Inventory, without
from shardkit.sources.read import SourceReader, save_atoms


def source_reader(inv: Inventory) -> SourceReader:
    digest = hashlib.sha256(inv.atoms.column("stamp").to_numpy().tobytes() if len(inv.atoms) else b"").hexdigest()
    return SourceReader(inv.opts, tuple(inv.row_files), inv.counts, inv.row_labels, inv.label_index,
                        save_atoms(inv.atoms, inv.labels, inv.opts.state_dir, digest[:24], inv.opts.policy))


def dedup_step(inv: Inventory, cfg: BuildConfig, dcfg: DedupConfig, client):
    """The dedup step: drop duplicates before shards are assigned. Returns (the inventory without
    them, DedupResult). Partitions of the inventory's pieces are read and signed on the workers; this
    process holds compact columns, as for the build."""
    removed, result = dedup_inventory(inv, source_reader(inv), dcfg, client, store.join(cfg.out, STATE_DIR, "dedup"))
    return (inv if cfg.annotate else without(inv, removed)), result  # --annotate: marked, not removed


def exact_dedup(inv: Inventory, cfg: BuildConfig, pending):
    """--dedup-exact: documents whose normalised texts are equal keep the one with the smallest key,
    on the dedup step's partition files and hash-range buckets (content digests only, no MinHash)."""
    dcfg = replace(cfg.dedup_config(), modality="text", exact_only=True)
    execution = plan_execution(cfg.scheduler, cfg.workers, estimate_inventory_seconds(inv, cfg.encode))
    if execution.mode == "in-process":
        pending.prefer_local()
    removed, result = dedup_inventory(inv, source_reader(inv), dcfg, pending, store.join(cfg.out, STATE_DIR, "dedup-exact"))
    result.summary["execution"].update(execution_of(cfg, pending, execution).record())
    return without(inv, removed), result


def write_exact_report(folder: str, result, policy=None) -> None:
    """OUT/dedup/exact/: written when what it reports changed (its timings aside), so that a rerun
    with nothing changed writes nothing."""
    try:
        old = json.loads(store.read(store.join(folder, "summary.json"), policy))
    except (OSError, ValueError, RemoteError):
        old = None
    if old is None or {k: v for k, v in old.items() if k != "execution"} != json.loads(json.dumps(
            {k: v for k, v in result.summary.items() if k != "execution"}, sort_keys=True)):
        write_report(folder, result, policy)


def paragraph_copies(inv: Inventory, cfg: BuildConfig, pending):
    """--dedup-paragraphs: the later copies of each repeated paragraph (jobs/paragraph_tasks.py)."""
    if store.is_url(cfg.out):
        raise ConfigError(f"--dedup-paragraphs keeps its working files in OUT/.shardkit on a local disk, and OUT "
                          f"{cfg.out!r} is on a store: build into a local folder, then copy it")
    execution = plan_execution(cfg.scheduler, cfg.workers, estimate_inventory_seconds(inv, cfg.encode))
    if execution.mode == "in-process":
        pending.prefer_local()
    return dedup_paragraphs(inv, source_reader(inv), DedupConfig.partition_size, pending,
                            os.path.join(cfg.out, STATE_DIR, "paragraphs"), cfg.progress)


def finish_dedup(cfg: BuildConfig, result, manifest: Manifest, rejected: int) -> None:
    """OUT/dedup/: the report of the dedup step, written once, with what the build wrote."""
    encode = "original bytes kept" if cfg.encode == "keep" else f"re-encoded: {cfg.encode}" + (
        f" q{cfg.quality}" if cfg.encode in ("jpeg", "webp") else "") + (
        f", {cfg.resize_mode} {cfg.image_size}" if cfg.image_size else "") + (
        f", crop {cfg.crop_size}" if cfg.crop_size else "")
    result.summary["output"] = {"samples": manifest.samples, "shards": len({s.id for s in manifest.shards}),
                                "images": encode, "rejected_by_build": rejected}
    write_report(store.join(cfg.out, "dedup"), result, remote_policy(cfg))


def execution_of(cfg: BuildConfig, pending, planned: Execution) -> Execution:
    """Where the tasks ran (the plan, unless a cluster had already started for counting rows)."""
    if planned.mode == "in-process" and not pending.local:
        return Execution("embedded cluster", cfg.workers, "started earlier, to count .jsonl/.parquet rows")
    return planned
