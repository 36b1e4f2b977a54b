"""JobOptions: how an offline job runs, whatever it computes (workers, cluster, bad inputs, progress, a
store's waits), declared once and checked once for the build, dedup and annotate configs."""

from __future__ import annotations

from dataclasses import dataclass

from shardkit.config.common import WORKER_POOLS, choice, remote_policy
from shardkit.errors import ON_ERROR_CHOICES
from shardkit.identity import check_embedded_workers


@dataclass(frozen=True, kw_only=True)
class JobOptions:
    """The options every job config embeds (a base class: its fields are keywords of each config)."""

    workers: int | None = None  # Dask workers of the embedded cluster; None: one per core; 0: in-process
    scheduler: str | None = None  # an existing Dask cluster's address
    worker_pool: str = "auto"  # embedded workers: "threads" of this process, "processes", or auto (jobs/pool.py)
    on_error: str = "skip"
    progress: bool = True
    timeout: float = 15.0  # SRC/OUT on a store: seconds to connect, and at most between two reads with data
    retries: int = 2  # SRC/OUT on a store: more tries after a timeout, reset or HTTP 5xx/429 (backoff 1, 2 s …)

    # None of them changes the bytes written (on_error decides whether a job stops, not what it writes).
    RUNTIME_ONLY = ("workers", "scheduler", "worker_pool", "progress", "timeout", "retries")

    def check_job(self, style: str = "--{}") -> None:
        """The checks of these options, the one copy (each config's __post_init__ calls it). `style`
        names an option in errors: "--{}" (a command's flag) or "{}=" (a keyword of a Python call)."""
        flag = lambda name: style.format(name.replace("_", "-") if style.startswith("--") else name)  # noqa: E731
        choice("on_error", self.on_error, ON_ERROR_CHOICES, flag("on_error"))
        choice("worker_pool", self.worker_pool, WORKER_POOLS, flag("worker_pool"))
        check_embedded_workers(self.workers, self.scheduler, flag("workers"))
        remote_policy(self)  # --timeout, --retries
