"""One home for running offline work: the task loop over this process or a Dask client (shardkit.jobs.cluster).

`run_tasks` runs a function over items in this process (no client) or on Dask, with a progress
bar, and cancels what is left at the first failure. Build and dedup both run through it.
"""

from __future__ import annotations

import errno
import os
import time
from dataclasses import dataclass
from typing import Callable, Sequence

from shardkit.jobs.cluster import PendingClient

RETRIES = 2  # a task that raised is tried this many more times (a worker may have died under it)
IN_FLIGHT = 2  # tasks queued or running per worker thread: one running, one ready to start
# OS errors that another try cannot fix: a full disk or quota, no permission, a read-only file system.
FINAL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EACCES, errno.EPERM, errno.EROFS})


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


def progress_bar(total: int | None, *, desc: str, unit: str, enabled: bool = True, initial: int = 0,
                 delay: float = 0):
    """A tqdm bar on stderr (hidden when not a terminal unless forced, off when `enabled` is False);
    `total` None: a count and a rate; `delay`: shown only once the work has taken that many seconds."""
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, unit=unit, desc=desc, disable=None if enabled else True, delay=delay)


@dataclass(frozen=True)
class Then:
    """A second step per group of items: `fn(group, [results of its items], *shared)`, run as soon as
    that group's items are done (so it overlaps the next groups' work). `members[g]`: item indices."""

    fn: Callable
    groups: Sequence
    members: Sequence[Sequence[int]]


def run_tasks(fn: Callable, items: Sequence, *, client=None, bar=None, name: str = "task",
              check: Callable | None = None, shared: tuple = (), then: Then | None = None,
              head_threads: int | None = None) -> list:
    """`fn(item, *shared)` for every item, results in the order of `items`.

    client None: one after another in this process. Else on Dask, `RETRIES` retries per task for
    failures that may pass (a worker died, a network file system hiccup), none for those that
    cannot (is_final: a full disk, no permission, shardkit's own errors); `shared` values go to
    every worker once (not once per task). A PendingClient (a cluster started in the background, or
    on first use: LazyClient) starts its cluster when there is a task to run and gets a head start:
    items run in this process until the cluster is up. `check(result)` may raise to stop the run
    (e.g. a FailFast result); the first exception cancels the tasks still pending. With `then`, the
    results are those of `then.fn`, one per group, and `check` and `bar` see those. `head_threads`
    threads run the head start (default: the PendingClient's `head_threads`, which the pool choice
    sets for work that mostly releases the GIL, e.g. images: the cores would otherwise idle while
    worker processes start).
    """
    if isinstance(client, PendingClient) and (client.local or not items):
        client = None
    if client is None:
        return _run_here(fn, items, bar, check, shared, then)
    if head_threads is None:
        head_threads = getattr(client, "head_threads", 1)
    return _Run(fn, items, then, shared, name).run(client, bar, check, max(1, head_threads))


class _Run:
    """Feeds Dask in order with at most IN_FLIGHT items per worker thread queued or running, and each
    group's `then` step right after its last item. Handing Dask everything at once let it place tasks
    up front and run later groups' items early (work stealing), which left a large group's `then`
    step alone at the end while the other workers idled.

    With a PendingClient, threads of this process run steps from the front meanwhile (`head`): the
    cluster's start-up is most of a small build's fixed cost, and it leaves the cores idle. With
    several head-start threads a group's step waits until its items are all done here
    (`_take_step`), while the other threads go on with later items.

    States (`self.state`; every change under `self.lock`, through `_to`, recorded in `self.trail`):

      "head"    the cluster is starting: the head-start threads take steps from the front of `steps`
                one at a time each; values wait in `local` (items) and `local_groups` (groups done).
      "up"      the client is up: the main loop feeds Dask from `steps`; the head start finishes
                the steps in hand and takes no other. A step it finishes now submits a `_wake` task,
                since the main loop may be waiting on Dask alone. A group whose items are partly in
                the head start's hands is `deferred` until they are in `local`; then its step gets
                them scattered (a cluster of this process's threads) or in the graph (processes).
      "done"    every group reported, in order of completion (results in group order).
      "failed"  an error (a task's, a check's, or the head start's, raised by the main loop): steps
                not started are dropped and Dask's pending tasks cancelled.

    Transitions: head -> up (client.get returned), up -> done | failed, head -> failed (the
    client failed to start). The head start stops on its own when `steps` is empty or it failed.
    """

    STATES = {"head": {"up", "failed"}, "up": {"done", "failed"}, "done": set(), "failed": set()}

    def __init__(self, fn, items, then, shared, name):
        import threading
        from collections import deque

        self.fn, self.items, self.then, self.raw_shared, self.name = fn, items, then, shared, name
        self.members = then.members if then is not None else [[i] for i in range(len(items))]
        self.steps = deque()
        for g, members in enumerate(self.members):
            self.steps.extend(("item", i, g) for i in members)
            if then is not None:
                self.steps.append(("then", None, g))
        self.lock, self.state, self.trail, self.error = threading.Lock(), "head", ["head"], None
        self.step_done = threading.Condition(self.lock)  # a head-start step finished (or the state changed)
        self.local, self.local_groups, self.futures, self.deferred, self.what = {}, {}, {}, [], {}
        self.results, self.reported, self.busy, self.priority = [None] * len(self.members), set(), 0, 0
        # Known once the client is up (state "up"):
        self.client = None  # the Dask client
        self.in_process = False  # its workers are threads of this process: results here are scattered as they are
        self.stamp = ""  # makes this run's task keys unique
        self.done = None  # distributed.as_completed over this run's futures
        self.shared = ()  # `raw_shared` scattered to every worker
        self.limit = 0  # items queued or running on Dask at most

    @property
    def up(self) -> bool:
        return self.state != "head"

    def _to(self, state: str) -> None:
        """Change state; the caller holds `self.lock`."""
        assert state in self.STATES[self.state], f"run_tasks: no transition {self.state} -> {state}"
        self.state = state
        self.trail.append(state)

    def _take_step(self):
        """The first step a head-start thread can run now (the caller holds `self.lock`): an item, or
        a group's step once all its items are done here. Waits while only group steps whose items
        other head-start threads still run are left; None when the head start is over."""
        while not (self.up or not self.steps or self.error):
            for n, (kind, i, g) in enumerate(self.steps):
                if kind == "item" or all(j in self.local for j in self.members[g]):
                    del self.steps[n]
                    return kind, i, g
            self.step_done.wait()
        return None

    def head(self, check) -> None:
        """Run steps here while the state is "head"; one finished after that wakes the main loop."""
        while True:
            with self.lock:
                step = self._take_step()
                if step is None:
                    return
                kind, i, g = step
            try:
                if kind == "item":
                    value = self.fn(self.items[i], *self.raw_shared)
                else:
                    value = self.then.fn(self.then.groups[g], [self.local[j] for j in self.members[g]],
                                         *self.raw_shared)
                if (kind == "then" or self.then is None) and check is not None:
                    check(value)
            except BaseException as e:  # noqa: BLE001 — raised again by the main loop
                self.error = e
                value = None
            with self.lock:
                if kind == "item":
                    self.local[i] = value
                if kind == "then" or self.then is None:
                    self.local_groups[g] = value
                self.step_done.notify_all()
                if self.state == "up":  # the main loop may be waiting on Dask alone: give it something to see
                    future = self.submit(_wake, f"wake-{kind}-{i}-{g}")
                    self.what[future.key] = ("wake", g, future)
                    self.done.add(future)

    def submit(self, f, key: str, *args):
        self.priority -= 1  # earlier submissions first, also among tasks already on a worker
        return self.client.submit(_Task(f), *args, *self.shared, retries=RETRIES, pure=False,
                                  priority=self.priority, key=f"{self.name}-{key}-{self.stamp}")

    def _then_parts(self, g):
        """The group's item results (values computed here, or futures); None while one still runs here.
        A value in the task graph is pickled with it: a copy, even for workers that are threads of this
        process, and Dask warns on stderr once the graph passes 10 MB (a few unit tables of raw images).
        So threads of this process get the values scattered, as they are; worker processes get them in
        the graph, where a retry after a lost worker still finds them (scattered, they die with it)."""
        parts = []
        for i in self.members[g]:
            if i in self.local:
                parts.append(self.local[i])
            elif i in self.futures:
                parts.append(self.futures[i])
            else:
                return None
        here = [j for j, i in enumerate(self.members[g]) if i in self.local and self.in_process]
        if here:
            for j, future in zip(here, self.client.scatter([parts[j] for j in here], hash=False)):
                parts[j] = future
        for i in self.members[g]:
            self.futures.pop(i, None)
            self.local.pop(i, None)  # the graph or the cluster holds it now
        return parts

    def _submit_then(self, g) -> bool:
        if g in self.local_groups:
            return True
        parts = self._then_parts(g)
        if parts is None:
            return False
        future = self.submit(_Then(self.then.fn), f"then-{g:06d}", self.then.groups[g], parts)
        self.what[future.key] = ("then", g, future)
        self.done.add(future)
        return True

    def feed(self) -> None:
        with self.lock:
            self.deferred = [g for g in self.deferred if not self._submit_then(g)]
            while self.steps and (self.steps[0][0] == "then" or self.busy < self.limit):
                kind, i, g = self.steps.popleft()
                if kind == "then":
                    if not self._submit_then(g):
                        self.deferred.append(g)
                    continue
                future = self.futures[i] = self.submit(self.fn, f"{i:06d}", self.items[i])
                self.what[future.key] = ("item", g, future)
                self.done.add(future)
                self.busy += 1

    def report(self, g, value, bar, check) -> None:
        if isinstance(value, _Final):
            raise value.error
        self.results[g] = value
        self.reported.add(g)
        if check is not None:
            check(value)
        if bar is not None:
            bar.update(1)

    def run(self, client, bar, check, head_threads: int = 1) -> list:
        client, helpers = _start(self, client, check, head_threads)
        try:
            while True:
                self.feed()
                for future in self.done:
                    kind, g, _ = self.what.pop(future.key)
                    self.busy -= kind == "item"
                    if kind == "then" or (kind == "item" and self.then is None):
                        self.report(g, future.result(), bar, check)
                    self._report_local(bar, check)
                    self.feed()
                if any(helper.is_alive() for helper in helpers):
                    for helper in helpers:
                        helper.join()
                    continue
                self._report_local(bar, check)
                if all(g in self.reported for g in range(len(self.members))):
                    with self.lock:
                        self._to("done")
                    return self.results
                assert self.steps or self.deferred, "run_tasks: groups left without a step to run them"
        except BaseException:
            with self.lock:
                self.steps.clear()
                self._to("failed")
                self.step_done.notify_all()
            client.cancel([f for _, _, f in self.what.values()])
            raise

    def _report_local(self, bar, check) -> None:
        """Results of groups the head start finished (or its error)."""
        if self.error is not None:
            raise self.error
        with self.lock:
            done_here = [g for g in self.local_groups if g not in self.reported]
        for g in done_here:
            self.report(g, self.local_groups[g], bar, check)


def _start(run: _Run, client, check, head_threads: int) -> tuple:
    """Starts `run` on `client` (a PendingClient is waited for, head-start threads reading the first items
    meanwhile); returns (the Dask client, those threads), the run then "up", or "failed" and the error raised."""
    import threading

    helpers, run.in_process = [], isinstance(client, PendingClient) and client.in_process
    try:
        # An embedded cluster's start-up is worth a head start (begun before importing Dask here: that
        # waits on the cluster's import); a --scheduler's workers are up, and its client reads no input.
        if isinstance(client, PendingClient) and client.embedded:
            helpers = [threading.Thread(target=run.head, args=(check,), name="shardkit-head-start", daemon=True)
                       for _ in range(head_threads)]
            for helper in helpers:
                helper.start()
        if isinstance(client, PendingClient):
            client = client.get()
        from distributed import as_completed

        run.client, run.stamp = client, f"{os.getpid()}-{time.time_ns()}"
        run.done = as_completed(loop=client.loop)
        run.shared = tuple(client.scatter(list(run.raw_shared), broadcast=True)) if run.raw_shared else ()
        run.limit = IN_FLIGHT * max(1, sum(client.nthreads().values()))
    except BaseException:
        with run.lock:
            run.steps.clear()
            run._to("failed")
            run.step_done.notify_all()
        raise
    with run.lock:
        run._to("up")
        run.step_done.notify_all()  # head-start threads waiting on a group's items: stop
    return client, helpers


class _Then:
    """A group step for Dask: an item's final failure (a _Final) is the group's result, as is."""

    def __init__(self, fn: Callable):
        self.fn = fn

    def __call__(self, group, parts, *shared):
        failed = next((p for p in parts if isinstance(p, _Final)), None)
        return failed if failed is not None else self.fn(group, parts, *shared)


def _wake(*_shared):
    """A no-op task: its completion tells the main loop that the head start finished a step."""
    return None


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
