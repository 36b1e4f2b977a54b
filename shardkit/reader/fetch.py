"""Fetch ahead: a process's remote shards downloaded in the order its epoch plan reads them, several
at a time, and pinned in the shared cache until the reader opens them; and the network counters.

The plan says which shards a worker reads and when, so the download list is known before the
first batch: a planner thread walks the worker's batches and starts each shard at its first use,
keeping at most `fetch_ahead` shards started and not yet opened (within `cache_limit`); a batch's
own shards start at once whatever the window (`want`). Each fetch runs in a thread of its own and
its GETs on the cache's connection pool (reader.cache), so a large shard arrives as parallel
ranged GETs. A shard that another process is fetching is left to it, once this process has taken
the parts of it its connections have room for (reader.parts_board): the reader then waits on
that fetch's lock (one download per node).
"""

from __future__ import annotations

import sys
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np
import torch

from shardkit.identity import worker_identity
from shardkit.reader.partition import locate

COUNTED_WORKERS = 256  # one row of counters per DataLoader worker: no two processes add to one
POLL_S = 0.05  # how often a planner waiting for cache room looks again (other processes evict too)
# Fetches running at once: the window plus a batch's own shards (a 64-sample batch of one shuffle
# block may touch 64 shards). They wait on the connections, which bound the GETs in flight.
MAX_FETCHES = 80


class NetStats:
    """Bytes and files fetched, seconds readers waited for shards, and the CPU seconds the remote
    path took (fetch threads and the client's event loop), per DataLoader worker in shared memory:
    the main process sums what every worker process did."""

    COLUMNS = ("bytes_fetched", "files_fetched", "network_wait_s", "fetch_cpu_s", "loop_cpu_s")

    def __init__(self):
        self.table = torch.zeros((COUNTED_WORKERS, len(self.COLUMNS)), dtype=torch.float64).share_memory_()
        self._lock = threading.Lock()

    def _add(self, column: int, value: float) -> None:
        row = worker_identity()[0] % COUNTED_WORKERS
        with self._lock:  # fetch threads of one process add to the same row
            self.table[row, column] += value

    def fetched(self, nbytes: int) -> None:
        self._add(0, nbytes)
        self._add(1, 1)

    def ranged(self, nbytes: int) -> None:
        """Bytes of rows read by range, besides the files fetched."""
        self._add(0, nbytes)

    def waited(self, seconds: float) -> None:
        self._add(2, seconds)

    def cpu(self, seconds: float) -> None:
        """CPU seconds a fetch thread spent on a GET (its own clock: what it waits for is not counted)."""
        self._add(3, seconds)

    def loop(self) -> None:
        """This process's event-loop thread's CPU so far (fsspec runs every GET's I/O there), as a total."""
        seconds = loop_cpu()
        if seconds is not None:
            with self._lock:
                self.table[worker_identity()[0] % COUNTED_WORKERS, 4] = seconds

    def totals(self) -> dict:
        """{'bytes_fetched', 'files_fetched', 'network_wait_s', 'fetch_cpu_s'} over every worker so far."""
        b, f, w, cpu, loop = self.table.sum(0).tolist()
        return {"bytes_fetched": int(b), "files_fetched": int(f), "network_wait_s": w, "fetch_cpu_s": cpu + loop}

    def reset(self) -> None:
        self.table.zero_()

    def forked(self) -> None:
        """In a forked child: a lock of its own (the parent's may have been copied held)."""
        self._lock = threading.Lock()

    def __getstate__(self):
        return {"table": self.table}

    def __setstate__(self, state):
        self.table, self._lock = state["table"], threading.Lock()


def loop_cpu() -> float | None:
    """CPU seconds of fsspec's event-loop thread in this process (None when it has none)."""
    asyn = sys.modules.get("fsspec.asyn")
    thread = getattr(asyn, "iothread", [None])[0] if asyn is not None else None
    if thread is None or not thread.is_alive():
        return None
    try:
        return time.clock_gettime(time.pthread_getcpuclockid(thread.ident))
    except (OSError, AttributeError):  # the thread ended meanwhile, or no per-thread clocks here
        return None


def on_cpu(stats: NetStats, work):
    """work(), the CPU time of the thread that runs it counted as the remote path's."""
    start = time.thread_time()
    try:
        return work()
    finally:
        stats.cpu(time.thread_time() - start)


class EpochWalk:
    """One walk over a worker's batches of an epoch (arrays of ids), in a thread of its own so the
    first batch does not wait for it: the shards in the order the batches first read them (for
    fetching ahead), and the batch after which each is read no more (to close it: under a
    cache_limit that unpins it, so a worker holds about the shards of its current shuffle block).
    O(shards read) memory."""

    def __init__(self, batches, offsets: np.ndarray):
        self._first: list[int] = []
        self._last: dict[int, int] = {}
        self._ends: list | None = None  # (last batch, shard) once the walk is done, sorted
        self._done = self._closed = False
        self._cond = threading.Condition()
        threading.Thread(target=self._walk, args=(batches, offsets), name="shardkit-walk", daemon=True).start()

    def _walk(self, batches, offsets) -> None:
        try:
            for j, ids in enumerate(batches):
                if self._closed:
                    return
                read = dict.fromkeys(locate(np.asarray(ids, np.int64), offsets)[0].tolist())
                new = [s for s in read if s not in self._last]
                self._last.update(dict.fromkeys(read, j))
                if new:
                    with self._cond:
                        self._first.extend(new)
                        self._cond.notify_all()
        finally:  # a plan that fails fails in the reader's own walk too, which raises it
            with self._cond:
                self._ends = sorted((j, s) for s, j in self._last.items())
                self._done = True
                self._cond.notify_all()

    def first_uses(self):
        """Shard indexes in first-use order, as the walk finds them."""
        i = 0
        while True:
            with self._cond:
                while i >= len(self._first) and not self._done and not self._closed:
                    self._cond.wait()
                if i >= len(self._first) or self._closed:
                    return
                s = self._first[i]
            i += 1
            yield s

    def finished(self, j: int) -> list[int]:
        """Shards read for the last time in batch j or before, each once; none before the walk is done."""
        with self._cond:
            if not self._done:
                return []
        k = 0
        while k < len(self._ends) and self._ends[k][0] <= j:
            k += 1
        out, self._ends = [s for _, s in self._ends[:k]], self._ends[k:]
        return out

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()


class Fetcher:
    """Fetches shards ahead of one worker's reads. `pin(s)` fetches shard s if needed and returns
    it pinned (None when another process is fetching it); `reserve(s)` holds room for s in the
    cache (None when there is none now), and `release(reservation)` gives it back once s landed;
    `order` yields shard indexes in first-use order; `skip`: shards already open. Nothing starts
    before the first `want` (the reader's first batch, which asks for its shards before it reads its
    rows by range: see Remote.pinned).

    `cost(s)`: the GETs shard s's download queues on the process's connections, of which `slots`
    may be queued at once: pins run in the order they were started while that holds (one always
    may). A pin claims its shard for this process (others wait for it), so a process claims only
    what its connections are about to download: when a first batch wanted all 19 shards of a
    dataset at once, the first worker there claimed them all and fetched them on its 8 connections
    while the other worker's 8 stayed idle (half the rate over a 25 MB/s-per-connection store)."""

    def __init__(self, pin, reserve, release, order, ahead: int, skip=(), cost=None, slots: int | None = None):
        self._pin, self._reserve, self._release, self._order, self.ahead = pin, reserve, release, iter(order), ahead
        self._started: dict[int, Future] = {}  # fetched or fetching, not yet taken by the reader
        self._taken: set[int] = set(skip)
        self._cond = threading.Condition()
        self._closed = self._going = False
        self._cost, self._slots = cost or (lambda s: 1), slots
        self._tickets = self._next = self._busy = 0  # pins started / let run, in order; their cost running
        self._pool = ThreadPoolExecutor(MAX_FETCHES, thread_name_prefix="shardkit-fetch")
        self._planner = threading.Thread(target=self._plan, name="shardkit-fetch-plan", daemon=True)
        self._planner.start()

    def _plan(self) -> None:
        """Start shards in first-use order while the window and the cache have room."""
        with self._cond:
            while not self._going and not self._closed:
                self._cond.wait()
        for s in self._order:
            while True:
                with self._cond:
                    if self._closed:
                        return
                    if s in self._taken or s in self._started:
                        break
                    if len(self._started) >= self.ahead:
                        self._cond.wait(POLL_S)
                        continue
                reservation = self._reserve(s)  # evicts and lists the cache folder: outside the lock
                if reservation is not None:
                    with self._cond:
                        future = self._start(s)
                    if future is None:
                        self._release(reservation)
                    else:
                        future.add_done_callback(lambda _, r=reservation: self._release(r))
                    break
                with self._cond:
                    self._cond.wait(POLL_S)

    def _start(self, s: int) -> Future | None:  # under the lock
        if not self._closed and s not in self._started and s not in self._taken:
            cost = self._cost(s) if self._slots else 0  # here: an error raises to the caller, leaves no gap
            self._started[s] = self._pool.submit(self._run, s, self._tickets, cost)
            self._tickets += 1
            return self._started[s]
        return None

    def _run(self, s: int, ticket: int, cost: int):
        """pin(s) once the pins started before it run and the connections have room for its GETs."""
        with self._cond:
            while not self._closed and (ticket != self._next or (self._busy and self._busy + cost > self._slots)):
                self._cond.wait()
            if self._closed:
                return None
            self._next, self._busy = self._next + 1, self._busy + cost
            self._cond.notify_all()
        try:
            return self._pin(s)
        finally:
            with self._cond:
                self._busy -= cost
                self._cond.notify_all()

    def want(self, shards) -> None:
        """Start these shards now (a batch about to be read needs them), whatever the window."""
        with self._cond:
            for s in shards:
                self._start(int(s))
            self._going = True
            self._cond.notify_all()

    def take(self, s: int):
        """Shard s pinned, once its fetch is done (its error raised here); None when this fetcher
        did not start it, or another process fetches it: the reader then pins it itself."""
        with self._cond:
            future = self._started.pop(s, None)
            self._taken.add(s)
            self._cond.notify_all()
        return None if future is None else future.result()

    def close(self) -> None:
        """Stop starting fetches; unpin what was fetched and never taken (when its fetch ends)."""
        with self._cond:
            self._closed = True
            left, self._started = list(self._started.values()), {}
            self._cond.notify_all()
        for future in left:
            future.add_done_callback(_release)
        self._pool.shutdown(wait=False, cancel_futures=True)


def _release(future: Future) -> None:
    if not future.cancelled() and future.exception() is None and future.result() is not None:
        future.result().release()
