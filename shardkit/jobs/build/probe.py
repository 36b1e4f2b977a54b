"""Threads or processes for a build's embedded cluster: whether its work is images (which threads
may share), and the probe of how much of its per-image work holds the GIL (jobs/pool.py decides)."""

from __future__ import annotations

import contextlib
import logging
import os

import numpy as np

import shardkit.store as store
from shardkit.config import BuildConfig, remote_policy
from shardkit.store.remote import RemoteError
from shardkit.jobs.pool import PoolChoice, choose_pool, gil_share_median
from shardkit.sources import walk as W
from shardkit.sources.tar_rows import first_images

log = logging.getLogger("shardkit.build")


def build_pool(cfg: BuildConfig, listing) -> PoolChoice:
    """Threads or processes for an embedded cluster (pool.choose_pool), said at --debug."""
    if cfg.workers == 0 or cfg.scheduler:
        return PoolChoice(False, "no embedded cluster")
    workers = cfg.workers or max(1, os.cpu_count() or 1)
    choice = choose_pool(cfg.worker_pool, image_work(listing, cfg), workers, lambda: probe(cfg, listing))
    log.info("worker pool: %s", choice.reason)
    return choice


PROBE_IMAGES = 8  # inputs the pool probe cycles over (the first image files in key order)


def probe(cfg: BuildConfig, listing) -> tuple[float, float]:
    """(GIL share, seconds) of this build's per-image work on a worker thread, over its first few
    image files (read once here; one that does not decode costs its failed try, as in the build)."""
    from shardkit.stages.image import keep_image, process_image

    table = listing.files
    kinds = table.column("kinds").to_numpy() if len(table) else np.zeros(0, np.int8)
    datas, policy = [], remote_policy(cfg)
    for i in np.flatnonzero(kinds & W.IMAGE)[:PROBE_IMAGES].tolist():
        rel = next(f for f in table.column("files")[i].as_py() if os.path.splitext(f)[1].lower() in W.IMAGE_EXTS)
        with contextlib.suppress(OSError, RemoteError):  # unreadable: the build's to reject, not the probe's
            datas.append(store.read_source(store.join(cfg.src, rel), policy=policy))
    if not datas:  # SRC's images may all be inside WebDataset tars
        datas = first_images(cfg.src, [rf.rel for rf in listing.row_files if rf.kind == "tar"], PROBE_IMAGES, policy)
    if not datas:
        return 1.0, 1.0  # nothing to measure: worker processes, which never lose to the GIL
    turn = iter(range(1 << 62))

    def work():
        data = datas[next(turn) % len(datas)]
        try:
            return keep_image(data) if cfg.encode == "keep" else process_image(data, cfg)
        except Exception:  # noqa: BLE001 — a bad input is the build's to reject
            return None

    return gil_share_median(work)


def image_work(listing, cfg: BuildConfig) -> bool:
    """Whether the build's work is images (from files or WebDataset tars: the probe finds out), which
    threads share well: no .jsonl/.parquet rows to parse and no tokenizer (both hold the GIL), and
    inputs on a local disk (the HTTP client of a store spends ~8 ms of GIL-held time on each object:
    a process per worker, each with its own client, reads them in parallel)."""
    tars = {rf.kind for rf in listing.row_files} == {"tar"}
    images = (listing.images > 0 or tars) and (tars or not listing.row_files)
    return images and not cfg.tokenizer and not store.is_url(cfg.src)
