"""One home for running offline work: the Dask client (embedded or remote) and the task loop.

`run_tasks` runs a function over items in this process (no client) or on Dask, with a progress
bar, and cancels what is left at the first failure. Build and dedup both run through it.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import time
from dataclasses import dataclass
from typing import Callable, Sequence

# Applied while the embedded cluster starts; None unsets a nanny default (see dask_client).
EMBEDDED_CLUSTER_CONFIG = {"distributed.nanny.pre-spawn-environ.MALLOC_TRIM_THRESHOLD_": None}
RETRIES = 2  # a task that raised is tried this many more times (a worker may have died under it)
# OS errors that another try cannot fix: a full disk or quota, no permission, a read-only file system.
FINAL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EACCES, errno.EPERM, errno.EROFS})
worker_log_level = logging.ERROR  # what embedded Dask workers log; `shardkit --debug` lowers it


def is_final(error: BaseException) -> bool:
    """Whether retrying the task that raised `error` is pointless: shardkit's own errors (bad input,
    config or data) and FINAL_ERRNOS."""
    from shardkit.errors import ShardkitError

    return isinstance(error, ShardkitError) or (isinstance(error, OSError) and error.errno in FINAL_ERRNOS)


class _Final:
    """A task's final failure, returned instead of raised so that Dask does not retry it."""

    def __init__(self, error: BaseException):
        import pickle

        try:  # it travels back to the client: keep it whole if it pickles, else its message
            pickle.loads(pickle.dumps(error))
            self.error = error
        except Exception:
            from shardkit.errors import ShardkitError

            self.error = ShardkitError(f"{type(error).__name__}: {error}")


class _Task:
    """fn wrapped for Dask: failures that a retry cannot fix come back as _Final results."""

    def __init__(self, fn: Callable):
        self.fn = fn

    def __call__(self, item, *shared):
        try:
            return self.fn(item, *shared)
        except Exception as e:
            if is_final(e):
                return _Final(e)
            raise


@contextlib.contextmanager
def dask_client(scheduler: str | None, workers: int | None):
    """None for workers=0 (run in-process), else an existing cluster (`--scheduler ADDRESS`) or an
    embedded LocalCluster closed on exit."""
    if workers == 0:
        yield None
        return
    from distributed import Client, LocalCluster

    if scheduler:
        client = Client(scheduler, timeout="30s")
        try:
            yield client
        finally:
            client.close()
        return
    import dask

    n = workers or max(1, os.cpu_count() or 1)
    # One thread per worker process: PIL and the tokenizer hold the GIL for part of their work.
    # ":0": a free port for the dashboard, so two builds on one machine never collide on 8787.
    # The nanny's default MALLOC_TRIM_THRESHOLD_ also switches off glibc's adaptive mmap threshold,
    # so every decoded image buffer (> 128 KiB) becomes an mmap + munmap + page faults: 25-30% of
    # the per-image time (bench/RESULTS.md). Workers of this short-lived cluster keep the default.
    # A failing task reaches the caller as its exception; the workers' own multi-line reports of it
    # are shown only with `shardkit --debug` (or SHARDKIT_DEBUG=1).
    quiet = logging.WARNING if os.environ.get("SHARDKIT_DEBUG") else worker_log_level
    with dask.config.set(EMBEDDED_CLUSTER_CONFIG), \
            LocalCluster(n_workers=n, threads_per_worker=1, processes=True, dashboard_address=":0",
                         silence_logs=quiet) as cluster, Client(cluster) as client:
        yield client


# Seconds an embedded cluster costs before its first task runs and after its last (start-up,
# worker imports, close), measured at 2-2.5 s on a loaded 2-core machine: the work a cluster of n
# workers saves, seconds x (1 - 1/n), must exceed this for the cluster to pay off.
CLUSTER_START_SECONDS = 2.5


@dataclass(frozen=True)
class Execution:
    """Where a job's tasks run, and why (recorded in reports)."""

    mode: str  # "in-process", "embedded cluster" or "cluster"
    workers: int | None  # for dask_client: 0 in-process, None one per core
    reason: str

    def record(self) -> dict:
        n = self.workers if self.workers else (1 if self.workers == 0 else max(1, os.cpu_count() or 1))
        return {"mode": self.mode, "workers": n, "reason": self.reason}


def plan_execution(scheduler: str | None, workers: int | None, work_seconds: float | None) -> Execution:
    """In-process below the size where an embedded cluster cannot pay for its start; else a cluster.

    An address (`--scheduler`) and an explicit worker count are obeyed; only the default (workers
    None) is decided from `work_seconds`, the job's estimated single-process time (None: unknown).
    """
    if scheduler:
        return Execution("cluster", workers, f"--scheduler {scheduler}")
    if workers == 0:
        return Execution("in-process", 0, "--workers 0")
    if workers is not None:
        return Execution("embedded cluster", workers, f"--workers {workers}")
    n = max(1, os.cpu_count() or 1)
    if work_seconds is None:
        return Execution("embedded cluster", None, f"one worker per core ({n})")
    saved = work_seconds * (1 - 1 / n)
    if saved <= CLUSTER_START_SECONDS:
        return Execution("in-process", 0, f"about {work_seconds:.1f} s of work: {n} workers would save "
                         f"{saved:.1f} s, less than the {CLUSTER_START_SECONDS} s a cluster takes to start")
    return Execution("embedded cluster", None, f"about {work_seconds:.1f} s of work: {n} workers save ~{saved:.1f} s, "
                     f"more than the {CLUSTER_START_SECONDS} s a cluster takes to start")


class LazyClient:
    """A Dask client started on first use, or never: a job whose stages all run in-process or are
    all reused from an earlier run pays no cluster start. Pass it as `client=` to run_tasks."""

    def __init__(self, scheduler: str | None, workers: int | None):
        self.scheduler, self.workers = scheduler, workers
        self._stack, self._client, self.started = contextlib.ExitStack(), None, False

    def get(self):
        if not self.started:
            self._client = self._stack.enter_context(dask_client(self.scheduler, self.workers))
            self.started = True
        return self._client

    def close(self) -> None:
        self._stack.close()

    def unless_few(self, tasks: int, few: int = 4):
        """This client, or None (run in this process) for a handful of short tasks while no cluster
        is up yet: e.g. a rerun that reuses every signature file starts no cluster for its buckets."""
        return self if self.started or tasks > few else None


@contextlib.contextmanager
def lazy_client(scheduler: str | None, workers: int | None):
    """A LazyClient, closed (with its cluster, if it started one) on exit."""
    client = LazyClient(scheduler, workers)
    try:
        yield client
    finally:
        client.close()


def progress_bar(total: int, *, desc: str, unit: str, enabled: bool = True, initial: int = 0):
    """A tqdm bar on stderr (hidden when not a terminal unless forced, off when `enabled` is False)."""
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, unit=unit, desc=desc, disable=None if enabled else True)


def run_tasks(fn: Callable, items: Sequence, *, client=None, bar=None, name: str = "task",
              check: Callable | None = None, shared: tuple = ()) -> list:
    """`fn(item, *shared)` for every item, results in the order of `items`.

    client None: one after another in this process. Else on Dask (a LazyClient starts its cluster
    here, when there is a task to run), `RETRIES` retries per task for failures that may pass (a
    worker died, a network file system hiccup), none for those that cannot (is_final: a full disk,
    no permission, shardkit's own errors); `shared` values go to every worker once (not once per
    task). `check(result)` may raise to stop the run (e.g. a FailFast result); the first exception
    cancels the tasks still pending.
    """
    results: list = [None] * len(items)
    if isinstance(client, LazyClient):
        client = client.get() if items else None
    if client is None:
        for i, item in enumerate(items):
            results[i] = fn(item, *shared)
            if check is not None:
                check(results[i])
            if bar is not None:
                bar.update(1)
        return results
    from distributed import as_completed

    if shared:
        shared = tuple(client.scatter(list(shared), broadcast=True))
    stamp = f"{os.getpid()}-{time.time_ns()}"
    task = _Task(fn)
    futures = [client.submit(task, item, *shared, retries=RETRIES, pure=False, key=f"{name}-{i:06d}-{stamp}")
               for i, item in enumerate(items)]
    where = {f.key: i for i, f in enumerate(futures)}
    try:
        for future in as_completed(futures):
            result = future.result()
            if isinstance(result, _Final):
                raise result.error
            if check is not None:
                check(result)
            results[where[future.key]] = result
            if bar is not None:
                bar.update(1)
    except BaseException:
        client.cancel(futures)
        raise
    return results
