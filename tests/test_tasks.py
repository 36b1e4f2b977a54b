"""run_tasks: ordered results, a step per group as soon as its items are done, and a head start in
this process while the cluster starts."""

from __future__ import annotations

import os
import threading
import time

import pytest

from shardkit.jobs.cluster import PendingClient
from shardkit.jobs.tasks import Then, run_tasks


def _item(i: int, delay: float) -> tuple[int, int]:
    time.sleep(delay)
    return i, os.getpid()


def _item_after(i: int, delay: float, flag: str) -> tuple[int, int]:
    """_item; a worker marks `flag`, and the head start's items wait for it (a loaded machine may
    start the cluster later than all of the head start's work takes)."""
    if threading.current_thread().name == "shardkit-head-start":
        deadline = time.monotonic() + 60
        while not os.path.exists(flag) and time.monotonic() < deadline:
            time.sleep(0.02)
    else:
        open(flag, "a").close()
    return _item(i, delay)


def _group(name: str, parts: list, *_shared) -> tuple[str, list[int], set[int]]:
    return name, [i for i, _ in parts], {pid for _, pid in parts}


def _check(result) -> None:
    if result[0] == "bad":
        raise ValueError("group 'bad' failed its check")


def test_groups_in_order_in_process_and_with_a_cluster_still_starting(tmp_path):
    items = list(range(24))
    members = [list(range(g * 4, g * 4 + 4)) for g in range(6)]
    then = Then(_group, [f"g{g}" for g in range(6)], members)
    here = run_tasks(_item, items, then=then, shared=(0.0,))
    assert [(n, ids) for n, ids, _ in here] == [(f"g{g}", members[g]) for g in range(6)]
    pending = PendingClient(None, 1)
    try:
        seen = []
        out = run_tasks(_item_after, items, client=pending, then=then, shared=(0.15, str(tmp_path / "up")),
                        bar=_Bar(seen))
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


# ---- _Run's states (see its docstring): one test per transition that a fix touched ----

@pytest.fixture
def watched(monkeypatch):
    """(runs, submitted keys): every _Run and every task key it submitted, in order."""
    from shardkit.jobs import tasks

    runs, keys = [], []
    real_run, real_submit = tasks._Run.run, tasks._Run.submit

    def run(self, *a):
        runs.append(self)
        return real_run(self, *a)

    def submit(self, f, key, *args):
        keys.append(key)
        return real_submit(self, f, key, *args)
    monkeypatch.setattr(tasks._Run, "run", run)
    monkeypatch.setattr(tasks._Run, "submit", submit)
    return runs, keys


def _threads(workers=2) -> PendingClient:
    pending = PendingClient(None, workers, start=False)
    pending.use_threads(True)
    return pending


_LATE = threading.Event()  # an item ran on a worker thread


def _late_item(i: int) -> tuple[int, str]:
    """The head start's item finishes only after the cluster ran the others: its group's step waits."""
    if threading.current_thread().name == "shardkit-head-start":
        _LATE.wait(60)
        time.sleep(0.3)
    else:
        _LATE.set()
    return i, threading.current_thread().name


def _names(group, parts):
    return [i for i, _ in parts], [name for _, name in parts]


def test_a_step_the_head_start_finishes_after_up_wakes_the_loop_and_releases_its_group(watched):
    runs, keys = watched
    _LATE.clear()
    pending = _threads()
    try:
        out = run_tasks(_late_item, list(range(4)), client=pending, then=Then(_names, ["g"], [[0, 1, 2, 3]]))
    finally:
        pending.close()
    assert out[0][0] == [0, 1, 2, 3] and out[0][1][0] == "shardkit-head-start"
    assert runs[0].trail == ["head", "up", "done"]
    # up: items 1-3 on Dask, the group deferred; the head start's item woke the loop, then the step ran
    assert [k for k in keys if not k.startswith("0000")] == ["wake-item-0-0", "then-000000"], keys


def _fails_here(i: int) -> int:
    if threading.current_thread().name == "shardkit-head-start":
        raise ValueError(f"item {i} failed in the head start")
    time.sleep(0.05)
    return i


def test_an_error_in_the_head_start_fails_the_run_and_drops_the_steps_left(watched):
    runs, keys = watched
    pending = _threads()
    try:
        with pytest.raises(ValueError, match="item 0 failed in the head start"):
            run_tasks(_fails_here, list(range(40)), client=pending)
    finally:
        pending.close()
    assert runs[0].trail[-1] == "failed" and not runs[0].steps
    assert len(keys) < 40  # what was left never reached Dask


def test_a_cluster_that_fails_to_start_fails_the_run_from_head(watched, monkeypatch):
    import contextlib

    from shardkit.jobs import cluster

    @contextlib.contextmanager
    def broken(*a, **kw):
        raise OSError("no cluster today")
        yield
    monkeypatch.setattr(cluster, "dask_client", broken)
    runs, keys = watched
    pending = PendingClient(None, 2, start=False)
    try:
        with pytest.raises(OSError, match="no cluster today"):
            run_tasks(_item, list(range(50)), client=pending, shared=(0.01,))
    finally:
        pending.close()
    assert runs[0].trail == ["head", "failed"] and not runs[0].steps and not keys


class _SlowStart(PendingClient):
    """Up only once the head start has done every item."""

    def __init__(self, all_done: threading.Event):
        super().__init__(None, 1, start=False)
        self.use_threads(True)
        self.all_done = all_done

    def get(self):
        assert self.all_done.wait(60)
        return super().get()


def test_a_head_start_that_did_everything_leaves_nothing_for_the_cluster(watched):
    runs, keys = watched
    done = threading.Event()

    def item(i):
        if i == 5:
            done.set()
        return i, threading.current_thread().name
    pending = _SlowStart(done)
    try:
        out = run_tasks(item, list(range(6)), client=pending, then=Then(_names, ["a", "b"], [[0, 1, 2], [3, 4, 5]]))
    finally:
        pending.close()
    assert [o[0] for o in out] == [[0, 1, 2], [3, 4, 5]]
    assert {n for o in out for n in o[1]} == {"shardkit-head-start"}
    assert runs[0].trail == ["head", "up", "done"] and keys == []


def test_several_head_start_threads_run_items_at_once_and_a_group_step_waits_for_its_items(watched):
    runs, keys = watched
    met, done, ran = threading.Barrier(3, timeout=30), threading.Event(), []

    def item(i):
        if i < 3:
            met.wait()  # three items in flight at once: one head-start thread alone breaks the barrier
        time.sleep(0.02 * (2 - i % 3))  # later items of a group finish first
        return i, threading.get_ident()

    def step(group, parts):
        ran.append(group)
        if len(ran) == 3:
            done.set()
        return group, [i for i, _ in parts], {ident for _, ident in parts}
    pending = _SlowStart(done)  # up only once every step ran here
    try:
        out = run_tasks(item, list(range(9)), client=pending, head_threads=3,
                        then=Then(step, ["a", "b", "c"], [[0, 1, 2], [3, 4, 5], [6, 7, 8]]))
    finally:
        pending.close()
    assert [(g, ids) for g, ids, _ in out] == [("a", [0, 1, 2]), ("b", [3, 4, 5]), ("c", [6, 7, 8])]
    assert len(set().union(*(idents for _, _, idents in out))) == 3
    assert runs[0].trail == ["head", "up", "done"] and keys == []


def test_the_pool_choice_gives_head_start_threads_by_the_gil_share():
    from shardkit.jobs.pool import choose_pool, head_threads

    assert head_threads(0.07, 16) == 7 and head_threads(0.5, 16) == 1 and head_threads(0.01, 4) == 4
    assert choose_pool("auto", True, 16, lambda: (0.07, 0.003)).head_threads == 7
    assert choose_pool("processes", True, 16).head_threads == 1  # no probe: one head-start thread
