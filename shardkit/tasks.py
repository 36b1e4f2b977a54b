"""One home for running offline work: the Dask client (embedded or remote) and the task loop.

`run_tasks` runs a function over items in this process (no client) or on Dask, with a progress
bar, and cancels what is left at the first failure. Build and dedup both run through it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from dataclasses import dataclass
from typing import Callable, Sequence

# Applied while the embedded cluster starts; None unsets a nanny default (see dask_client).
EMBEDDED_CLUSTER_CONFIG = {"distributed.nanny.pre-spawn-environ.MALLOC_TRIM_THRESHOLD_": None}
RETRIES = 2  # a task that raised is tried this many more times (a worker may have died under it)


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
    with dask.config.set(EMBEDDED_CLUSTER_CONFIG), \
            LocalCluster(n_workers=n, threads_per_worker=1, processes=True, dashboard_address=":0",
                         silence_logs=logging.WARNING) as cluster, Client(cluster) as client:
        yield client


class PendingClient:
    """A Dask client started (and later closed) by a thread of its own: `get()` waits until it is up
    (None when running in-process). One thread enters and leaves dask_client: Dask keeps the current
    client in a context variable that must be reset where it was set."""

    def __init__(self, scheduler: str | None, workers: int | None):
        import threading

        self._box, self._ready, self._done = {}, threading.Event(), threading.Event()
        self._thread = threading.Thread(target=self._hold, args=(scheduler, workers), name="shardkit-cluster",
                                        daemon=True)
        self._thread.start()

    def _hold(self, scheduler, workers) -> None:
        try:
            with dask_client(scheduler, workers) as client:
                self._box["client"] = client
                self._ready.set()
                self._done.wait()
        except BaseException as e:  # noqa: BLE001 — handed to the thread that asks for the client
            self._box.setdefault("error", e)
        finally:
            self._ready.set()

    def get(self):
        self._ready.wait()
        if "client" not in self._box:
            raise self._box["error"]
        return self._box["client"]

    def close(self) -> None:
        self._done.set()
        self._thread.join()


@contextlib.contextmanager
def background_client(scheduler: str | None, workers: int | None):
    """dask_client, started in the background: the caller lists inputs and plans while workers start
    (start-up is most of a small build's fixed cost). Yields a PendingClient; closed on exit."""
    pending = PendingClient(scheduler, workers)
    try:
        yield pending
    finally:
        pending.close()


def progress_bar(total: int, *, desc: str, unit: str, enabled: bool = True, initial: int = 0):
    """A tqdm bar on stderr (hidden when not a terminal unless forced, off when `enabled` is False)."""
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, unit=unit, desc=desc, disable=None if enabled else True)


@dataclass(frozen=True)
class Then:
    """A second step per group of items: `fn(group, [results of its items], *shared)`, run as soon as
    that group's items are done (so it overlaps the next groups' work). `members[g]`: item indices."""

    fn: Callable
    groups: Sequence
    members: Sequence[Sequence[int]]


def run_tasks(fn: Callable, items: Sequence, *, client=None, bar=None, name: str = "task",
              check: Callable | None = None, shared: tuple = (), then: Then | None = None) -> list:
    """`fn(item, *shared)` for every item, results in the order of `items`.

    client None: one after another in this process. Else on Dask, `RETRIES` retries per task;
    `shared` values go to every worker once (not once per task). `check(result)` may raise to stop
    the run (e.g. a FailFast result); the first exception cancels the tasks still pending. With
    `then`, the results are those of `then.fn`, one per group, and `check` and `bar` see those.
    """
    if client is None:
        return _run_here(fn, items, bar, check, shared, then)
    from distributed import as_completed

    if shared:
        shared = tuple(client.scatter(list(shared), broadcast=True))
    stamp = f"{os.getpid()}-{time.time_ns()}"

    def submit(f, key, *args):
        return client.submit(f, *args, *shared, retries=RETRIES, pure=False, key=f"{name}-{key}-{stamp}")

    if then is None:
        futures = [submit(fn, f"{i:06d}", item) for i, item in enumerate(items)]
    else:  # each group's items, then the group: Dask runs earlier submissions first
        futures = []
        for g, (group, members) in enumerate(zip(then.groups, then.members)):
            parts = [submit(fn, f"{i:06d}", items[i]) for i in members]
            futures.append(submit(then.fn, f"then-{g:06d}", group, parts))
    results: list = [None] * len(futures)
    where = {f.key: i for i, f in enumerate(futures)}
    try:
        for future in as_completed(futures):
            result = future.result()
            if check is not None:
                check(result)
            results[where[future.key]] = result
            if bar is not None:
                bar.update(1)
    except BaseException:
        client.cancel(futures)
        raise
    return results


def _run_here(fn, items, bar, check, shared, then) -> list:
    """run_tasks without a client: in order, in this process."""
    groups = [(None, [i]) for i in range(len(items))] if then is None else list(zip(then.groups, then.members))
    results = []
    for group, members in groups:
        parts = [fn(items[i], *shared) for i in members]
        results.append(parts[0] if then is None else then.fn(group, parts, *shared))
        if check is not None:
            check(results[-1])
        if bar is not None:
            bar.update(1)
    return results
