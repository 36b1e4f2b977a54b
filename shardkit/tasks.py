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


def progress_bar(total: int, *, desc: str, unit: str, enabled: bool = True, initial: int = 0):
    """A tqdm bar on stderr (hidden when not a terminal unless forced, off when `enabled` is False)."""
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, unit=unit, desc=desc, disable=None if enabled else True)


def run_tasks(fn: Callable, items: Sequence, *, client=None, bar=None, name: str = "task",
              check: Callable | None = None, shared: tuple = ()) -> list:
    """`fn(item, *shared)` for every item, results in the order of `items`.

    client None: one after another in this process. Else on Dask, `RETRIES` retries per task for
    failures that may pass (a worker died, a network file system hiccup), none for those that
    cannot (is_final: a full disk, no permission, shardkit's own errors); `shared` values go to
    every worker once (not once per task). `check(result)` may raise to stop the run (e.g. a
    FailFast result); the first exception cancels the tasks still pending.
    """
    results: list = [None] * len(items)
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
