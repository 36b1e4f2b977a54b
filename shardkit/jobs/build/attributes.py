"""What a build does with scores under `--annotate` (a `--filter` build drops in its work units:
stages.filters.curate): every sample is kept, and beside each shard goes the attribute table of its
scores and (with `--dedup`) of the dedup step's clusters, which the manifest then names.

The scoring modules are imported only by builds that use them: a plain build's tasks start without
pyarrow's compute functions and the readers' modules (~0.2 s per process).
"""

from __future__ import annotations

import hashlib
import os

import numpy as np

from shardkit.config import BuildConfig
from shardkit.contract import key_hash
from shardkit.stages.attributes import DEDUP


def scorers_of(cfg: BuildConfig) -> list:
    """What --annotate scores: the filters of --filter and --lang, built with their --filter-option
    values, in the order a --filter build runs them (stages.filters.Curation); ConfigError for an
    unknown name or option, or a column declared twice."""
    from shardkit.stages.attributes import check_columns
    from shardkit.stages.filters import Curation

    return check_columns(list(Curation.from_options(cfg.filter, cfg.filter_option, cfg.lang, cfg.lang_threshold,
                                                    cfg.mask_pii).steps))


def fingerprints(cfg: BuildConfig) -> dict:
    """{scorer: fingerprint} of what the build's attribute tables hold (the dedup step's columns under DEDUP)."""
    from shardkit.stages.attributes import fingerprint

    out = {s.name: fingerprint(s) for s in scorers_of(cfg)}
    if cfg.dedup:
        params = f"{cfg.dedup_threshold}|{cfg.dedup_verify}|{cfg.image_distance}"
        out[DEDUP] = hashlib.sha256(params.encode()).hexdigest()[:16]
    return out


def dedup_marks(plans, reader, result) -> dict:
    """{shard id: ((key, cluster, duplicate, exact), ...)} of every clustered sample, by shard. The
    cluster id is a stable hash of the key of the sample the cluster keeps (contract.key_hash), so it
    does not move when other clusters appear, and it joins with OUT/dedup/clusters.parquet by key.
    Shards are contiguous runs of the key order: each sample goes to the last shard whose first key
    is at most its own."""
    table = result.clusters
    keys, kept = table.column("key").to_pylist(), table.column("kept").to_pylist()
    firsts = [next(iter(reader.names([_first(p)])))[0] for p in plans]
    order = np.argsort(np.array(keys, dtype=object), kind="stable") if keys else np.zeros(0, np.int64)
    reasons, dup_of = table.column("reason").to_pylist(), table.column("duplicate_of").to_pylist()
    marks: dict = {}
    for i in order.tolist():
        shard = plans[max(0, _bisect(firsts, keys[i]) - 1)].id
        cluster = key_hash(keys[i] if kept[i] else dup_of[i])
        marks.setdefault(shard, []).append((keys[i], cluster, not kept[i], reasons[i] == "exact"))
    return {s: tuple(m) for s, m in marks.items()}


def _first(plan):
    from dataclasses import replace

    piece = plan.pieces[0]
    return replace(piece, stop=piece.start + 1)


def _bisect(sorted_keys: list, key: str) -> int:
    import bisect

    return bisect.bisect_right(sorted_keys, key)


def marked(fingerprint_: str, marks) -> str:
    """A shard's rerun fingerprint with its dedup marks in: a new cluster elsewhere that reaches this
    shard's samples rewrites it, with its attribute table."""
    if not marks:
        return fingerprint_
    return hashlib.sha256(f"{fingerprint_}|{marks!r}".encode()).hexdigest()


def after_write(table, infos: list, cfg: BuildConfig, marks, shard_id: int):
    """--annotate: the shard's attribute table, written beside it (fsync left to the caller), or None."""
    if not cfg.annotate or not infos:
        return None
    from shardkit.jobs.annotate_tasks import shard_attributes
    from shardkit.writers.attributes import write_attributes

    source = next(i for i in infos if i.format == ("parquet" if cfg.format != "tar" else "tar"))
    dedup = dict((k, (c, d, e)) for k, c, d, e in marks) if cfg.dedup else None
    attrs, _ = shard_attributes(table, scorers_of(cfg), dedup, source.sha256, fingerprints(cfg))
    import shardkit.store as store

    return write_attributes(attrs, store.staged(cfg.out), shard_id, durable=False)  # published with the shard


def manifest_attributes(cfg: BuildConfig, infos: list):
    """The manifest's attributes (manifest.attributes.Attributes) of an --annotate build, else None."""
    if not cfg.annotate:
        return None
    from shardkit.jobs.annotate_tasks import column_specs
    from shardkit.manifest.attributes import Attributes

    scorers = {n: {"fingerprint": fp} for n, fp in sorted(fingerprints(cfg).items())}
    return Attributes.of(infos, column_specs(scorers_of(cfg), cfg.dedup), scorers)


def unchanged(out: str, info, policy=None) -> bool:
    """Whether a shard's attribute table is still the one its build recorded (None: there is none)."""
    import shardkit.store as store
    from shardkit.store.local import sha256_file

    if info is None:
        return True
    if store.is_url(out):  # a store: its size (hashing would download it)
        return store.size(store.join(out, info.path), policy) == info.bytes
    path = os.path.join(out, info.path)
    return os.path.isfile(path) and os.path.getsize(path) == info.bytes and sha256_file(path) == info.sha256
