"""run_tasks: ordered results, a step per group as soon as its items are done, and a head start in
this process while the cluster starts."""

from __future__ import annotations

import os
import threading
import time

import pytest

from shardkit.cluster import PendingClient
from shardkit.tasks import Then, run_tasks


def _item(i: int, delay: float) -> tuple[int, int]:
    time.sleep(delay)
    return i, os.getpid()


def _group(name: str, parts: list, delay: float) -> tuple[str, list[int], set[int]]:
    return name, [i for i, _ in parts], {pid for _, pid in parts}


def _check(result) -> None:
    if result[0] == "bad":
        raise ValueError("group 'bad' failed its check")


def test_groups_in_order_in_process_and_with_a_cluster_still_starting():
    items = list(range(24))
    members = [list(range(g * 4, g * 4 + 4)) for g in range(6)]
    then = Then(_group, [f"g{g}" for g in range(6)], members)
    here = run_tasks(_item, items, then=then, shared=(0.0,))
    assert [(n, ids) for n, ids, _ in here] == [(f"g{g}", members[g]) for g in range(6)]
    pending = PendingClient(None, 1)
    try:
        seen = []
        out = run_tasks(_item, items, client=pending, then=then, shared=(0.15,), bar=_Bar(seen))
    finally:
        pending.close()
    assert [(n, ids) for n, ids, _ in out] == [(f"g{g}", members[g]) for g in range(6)]
    pids = set().union(*(p for _, _, p in out))
    assert os.getpid() in pids and len(pids) == 2  # a head start here, the rest on the worker
    assert len(seen) == 6


def test_a_failed_check_stops_the_run():
    then = Then(_group, ["ok", "bad", "later"], [[0], [1], [2]])
    with pytest.raises(ValueError, match="'bad' failed"):
        run_tasks(_item, [0, 1, 2], then=then, check=_check, shared=(0.0,))
    pending = PendingClient(None, 1)
    try:
        with pytest.raises(ValueError, match="'bad' failed"):
            run_tasks(_item, [0, 1, 2], client=pending, then=then, check=_check, shared=(0.0,))
    finally:
        pending.close()


class _Bar:
    def __init__(self, seen: list):
        self.seen = seen

    def update(self, n: int) -> None:
        self.seen.append(n)


_MADE: dict = {}  # item -> the value it returned (worker threads share this process)
_ON_DASK = threading.Event()  # an item ran on a worker thread: the cluster is up


def _big_item(i: int) -> bytes:
    """64 KB; the head start's first item waits until the cluster runs items, so that its group's
    step runs on the cluster with a result made here."""
    if threading.current_thread().name == "shardkit-head-start":
        _ON_DASK.wait(60)
    else:
        _ON_DASK.set()
    _MADE[i] = bytes([i]) * 65536
    return _MADE[i]


def _same_objects(name: str, parts: list) -> list[bool]:
    return [threading.current_thread().name != "shardkit-head-start"] + [p is _MADE[i] for i, p in enumerate(parts)]


def test_a_cluster_of_threads_gets_the_head_starts_results_as_they_are():
    """Not pickled into the task graph (a copy, and Dask's 'Sending large graph' warning on stderr
    once they pass 10 MB: a few units of raw images)."""
    import warnings

    import dask

    _MADE.clear()
    _ON_DASK.clear()
    pending = PendingClient(None, 2, start=False)
    pending.use_threads(True)
    try:
        with warnings.catch_warnings(record=True) as caught, \
                dask.config.set({"distributed.admin.large-graph-warning-threshold": "16kB"}):
            warnings.simplefilter("always")
            out = run_tasks(_big_item, list(range(4)), client=pending, then=Then(_same_objects, ["g"], [[0, 1, 2, 3]]))
    finally:
        pending.close()
    assert out == [[True] * 5]  # the step ran on the cluster, with every item's own object
    assert not [w for w in caught if "large graph" in str(w.message)], [str(w.message) for w in caught]
