"""The remote side of reading, one per reading process: the shard caches, the connections, fetching
ahead, rows read by range, the network counters, and every decision that depends on whether a
dataset is remote or its cache bounded. A BatchReader asks it for the pinned files of a batch's
shards, and tells it when it closes one; the epoch's batches come in through `start`.

What it makes (threads, pools, locks, mappings) belongs to one process: in a forked or spawned
DataLoader worker it is made again on first use.
"""

from __future__ import annotations

import logging
import os
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from shardkit.errors import ShardError
from shardkit.store import objstore
from shardkit.store.remote import RangeIgnored
from shardkit.store.local import is_url
from shardkit.reader import download, ranged
from shardkit.reader.cache import PinnedShard, ShardCache
from shardkit.reader.fetch import EpochWalk, Fetcher, NetStats, on_cpu
from shardkit.reader.order import shard_offsets
from shardkit.reader.values import values_checked

log = logging.getLogger(__name__)

# A batch reads the rows of shards not cached yet by range when those shards hold more than this, or
# more than one round of whole-shard GETs on the connections (connections x download.PART): 64 MiB
# take ~0.3 s over 8 connections of 25 MB/s, about what a batch of range reads costs (an index and a
# GET per run of rows, mostly round trips). Below both (JPEG shards of a few MB), whole shards came
# sooner: 0.87 s vs 1.48 s to a first batch of 19 JPEG shards (17 MB).
RANGED_FROM = 64 << 20
# Rows read by range are downloaded twice (their whole shard follows), so an epoch reads at most this
# share of a worker's bytes by range, and at most RANGED_MAX bytes (they are held in memory until
# their shard is whole): the first batches, which would otherwise wait for every shard they touch.
RANGED_SHARE = 0.1
RANGED_MAX = 256 << 20
RANGE_THREADS = 8  # threads for rows read by range, per connection
# Whole-shard GETs a process may have queued on its connections, per connection: what it fetches is
# claimed (other processes take only the parts their connections have room for, reader.parts_board),
# so it claims little more than it downloads; twice, so that a connection finds its next GET queued
# as a shard ends (the next shard's index and claim take a round trip). Once (each process claims
# only what its connections start at once) was slower: JPEG 3,190/s against 3,804/s in one run.
FETCH_QUEUE = 2


class Remote:
    """Pinned local files for a batch's shards (`pinned`), from a shared cache when the dataset is
    remote. Between `start(batches, samples)` and `stop()` it fetches the epoch's shards ahead in
    plan order, reads rows by range while their shards download, and says after each batch which
    shards are read no more (`finished`); outside an epoch (ds[i], ds.get) it reads rows by range."""

    def __init__(self, shards, config, tokens=None, tag=None, specs=None):
        self.shards, self.config, self.tokens, self._tag = shards, config, tokens, tag or _untagged
        self.specs = specs or {}  # the dataset's fields: which columns of a Parquet shard a row needs
        self.offsets = shard_offsets(shards.samples)
        self.remote = any(is_url(r) for r in shards.roots)
        self.bounded = self.remote and config.cache_limit is not None  # close shards after their last use
        self.per_sample = sum(int(np.sum(t.nbytes)) for t in shards.tables) / max(1, int(np.sum(shards.samples)))
        self.net = NetStats()  # bytes fetched, time waited and CPU spent on the network, every worker's
        self._pid = None  # the process the state below belongs to (made by _forked)

    def _forked(self) -> None:
        """Per-process state, made afresh in a process other than the one that made it: a forked
        worker's copies of threads, pools and locks are not its own (a lock may even be copied held)."""
        if self._pid == os.getpid():
            return
        self._pid = os.getpid()
        self.net.forked()
        self._caches: dict[int, ShardCache] = {}
        self._walk = self._fetcher = None
        self._held: set[int] = set()  # shards handed out whole and not closed: not fetched again
        self._budget = None  # bytes this epoch may still read by range (None: no limit, outside an epoch)
        self._since = time.time()
        # Threads are started on first use. Rows read by range get connections of their own,
        # RANGE_THREADS as many: a row's GET is mostly the store's latency, and it must not queue
        # behind 4 MiB parts (a first batch's 64 rows then take one round trip, not eight).
        self._pool = _Counted(ThreadPoolExecutor(self.config.connections, thread_name_prefix="shardkit-get"), self.net)
        threads = RANGE_THREADS * self.config.connections
        self._rows = ranged.RangedRows(_Counted(ThreadPoolExecutor(threads, thread_name_prefix="shardkit-range"),
                                                self.net), self.config.remote_policy(), self._tag, self.specs, threads)

    def cache(self, s: int) -> ShardCache:
        """The cache of shard s's dataset (one per dataset root: its folder and limit are its own)."""
        self._forked()
        p = int(self.shards.part(s))
        if p not in self._caches:
            c = self.config
            self._caches[p] = ShardCache(self.shards.roots[p], c.cache_dir, c.cache_limit, c.remote_policy(),
                                         self._pool, self.net.fetched)
            self._caches[p].since = self._since
        return self._caches[p]

    def start(self, batches, samples: int) -> None:
        """A worker's epoch begins: `batches()` gives its batches (arrays of ids) on a plan of the
        walk's own (its order caches blocks: not for two threads), `samples` how many it reads."""
        self._forked()
        self.stop()
        if not self.remote:
            return
        objstore.reading_here()  # this process reads the epoch: a reader's calls may start obstore in it
        self._since = time.time()  # fetches that failed before this are tried again
        for first in self.shards.first[:-1].tolist():  # made here: the fetch threads only look them up
            self.cache(first).since = self._since
        self._budget = min(RANGED_SHARE * samples * self.per_sample, RANGED_MAX)
        if not self.config.fetch_ahead and not self.bounded:
            return
        self._walk = EpochWalk(batches(), self.offsets)
        if self.config.fetch_ahead:
            order = (s for s in self._walk.first_uses() if is_url(self.shards.root(s)))
            self._fetcher = Fetcher(lambda s: on_cpu(self.net, lambda: self._fetch(s, wait=False)),
                                    lambda s: self.cache(s).reserve(nbytes(self.shards[s])), ShardCache.release, order,
                                    self.config.fetch_ahead, skip=set(self._held), cost=self._parts,
                                    slots=FETCH_QUEUE * self.config.connections)

    def pinned(self, needs: dict) -> dict:
        """{shard: PinnedShard} for {shard: rows a batch reads of it}: the whole file (local, or a
        cached copy), or, for a remote shard still downloading, those rows read by range. All the
        batch's remote shards at once; the time it takes is time waited on the network."""
        self._forked()
        remote = [s for s in needs if self.cache(s).remote]
        out = {s: self.cache(s).pin_shard(self.shards[s]) for s in needs if s not in remote}
        if self._fetcher is not None and not remote:  # a batch of local shards only: fetch ahead now
            self._fetcher.want([])
        if remote:
            start = time.perf_counter()
            try:
                # All of this batch's shards at once, not one by one, their whole files started before
                # its rows are read by range (when they are: see _by_range), so that they download
                # during those round trips. Over the throttled store, 4 rounds against the whole files
                # started after the rows: epochs 1.10x (JPEG, 6,000) and 1.17x (raw, 2,000) as fast,
                # the first batch 0.02-0.03 s later (the parts' bytes share this machine's 2 cores
                # with the rows and with the store itself: bench/RESULTS.md, "When the whole shards start").
                missing = [s for s in remote if not self.cache(s).has(self.shards[s].path)]
                if self._fetcher is not None:
                    self._fetcher.want(missing)
                out.update(on_cpu(self.net, lambda: self._by_range({s: needs[s] for s in remote})))
                for s in remote:
                    if s in out:
                        continue
                    try:  # whole: from the fetcher when it started it, else fetched here
                        got = self._fetcher.take(s) if self._fetcher is not None else None
                        out[s] = got if got is not None else self._fetch(s)
                    except ShardError as e:
                        raise self._tag(e, s)
                    self._held.add(s)
            finally:
                self.net.waited(time.perf_counter() - start)
                self.net.loop()
        return out

    def warm(self, shards) -> None:
        """Main process, while the loader's workers start: the index sidecars of `shards` (remote tar
        shards not cached) fetched into the shared cache at once, on the range connections; a worker
        that reads one meanwhile waits for it (its lock), so each is fetched once. Its first batch
        then takes one round trip: its rows (read by range: see `_by_range`)."""
        self._forked()
        todo = [s for s in shards if self._warmable(s)]
        for s, error in zip(todo, self._rows.pool.map(self._warm_one, todo)):
            if error is not None:  # the worker reading shard s meets it (recorded beside the file) and reports it
                log.debug("fetching the index of shard %s ahead failed: %s", self.shards.url(s), error)

    def _warmable(self, s: int) -> bool:
        shard, cache = self.shards[s], self.cache(s)
        return (cache.remote and shard.format == "tar" and bool(shard.index) and self.tokens is None
                and self.config.checksums and not cache.has(shard.path) and not cache.has(shard.index["path"]))

    def _warm_one(self, s: int):
        index = self.shards[s].index
        try:
            self.cache(s).pin(index["path"], index["sha256"], index.get("bytes"), direct=True)[1].release()
        except ShardError as e:
            return e
        return None

    def finished(self, j: int) -> list[int]:
        """Shards read for the last time by batch j of the epoch (or before), to close: under a
        cache_limit that unpins them. Closing needs the whole epoch walked (in a thread): until
        then, none."""
        walk = getattr(self, "_walk", None)  # None before this process's first start()
        return walk.finished(j) if walk is not None and self.bounded else []

    def closed(self, s: int, pinned: PinnedShard) -> None:
        """The reader closed shard s, opened from `pinned`: unpinned, it may be evicted now."""
        pinned.release()
        self._forked()
        self._held.discard(s)
        self._rows.drop(s, pinned)
        if self.bounded:
            self.cache(s).evict()

    def stop(self) -> None:
        """The epoch's reading ended (or stopped early): fetch nothing more for it."""
        if self._pid != os.getpid():
            return
        self._budget = None
        for part in (self._fetcher, self._walk):
            if part is not None:
                part.close()
        self._walk = self._fetcher = None

    def _waiting(self, shards) -> int:
        """Bytes of `shards` not in the cache yet."""
        return sum(nbytes(self.shards[s]) for s in shards if not self.cache(s).has(self.shards[s].path))

    def _parts(self, s: int) -> int:
        """The GETs fetching shard s whole queues on the connections (its index is fetched apart)."""
        return max(1, -(-self.shards[s].bytes // download.PART))

    def _fetch(self, s: int, wait: bool = True) -> PinnedShard | None:
        shard = self.shards[s]
        checked = None
        if self.config.checksums and self.tokens is None:  # values checked on read: no sha256 pass
            checked = lambda path, index: values_checked(shard, path, index)  # noqa: E731
        return self.cache(s).pin_shard(shard, wait, checked)

    def _by_range(self, needs: dict) -> dict:
        """{shard: PinnedShard of rows read by range} for the shards of `needs` whose rows are read
        so: rows of a tar shard not cached yet, for a lookup (always) or while it downloads (when the
        shards waited for are large, within the epoch's budget). Indexes first, then rows: two round
        trips (a Parquet shard: its tail, then its rows, keys and checksums: reader.ranged_parquet)."""
        rows = self._rows
        todo = {s: r for s, r in needs.items() if self._rangeable(s)}
        ready = {s for s in todo if rows.ready(s, todo[s])}
        if self._budget is not None and len(ready) < len(todo):  # streaming: by range, or wait for whole shards?
            cost = sum(len(r) for s, r in todo.items() if s not in ready) * self.per_sample
            waiting = self._waiting(needs)
            # Whole shards, when they come in one round of GETs on the connections (at most
            # connections x PART) and below RANGED_FROM; else the rows by range (within the budget):
            # 4 JPEG shards of 16 MB came whole in 0.76 s from iter(loader) to a first batch, its
            # rows by range in 0.3-0.36 s, and later batches need not wait for them either.
            soon = waiting < RANGED_FROM and waiting <= self.config.connections * download.PART
            if soon or cost > self._budget:
                todo = {s: todo[s] for s in ready}
        if not todo:
            return {}
        try:
            got, fetched = rows.read([(s, self.cache(s), self.shards[s], self.shards.url(s), r) for s, r in todo.items()])
        except RangeIgnored:  # the store sends whole files: read whole from now on
            for s in todo:
                self.cache(s).ranges = False
            return {}
        if self._budget is not None:
            self._budget -= fetched
        self.net.ranged(fetched)
        return got

    def _rangeable(self, s: int) -> bool:
        """Whether rows of shard s may be read by range (see _by_range)."""
        shard, cache = self.shards[s], self.cache(s)
        # A Parquet shard's rows are read by range for a lookup only (streaming reads it whole), and
        # only when the manifest records its sums: without them only the whole file's sha256 tells
        # that the file is the build's.
        kind = shard.format == "tar" and bool(shard.index) or (shard.format == "parquet" and bool(shard.sums)
                                                               and self._budget is None)
        return (cache.ranges is not False and kind and self.tokens is None
                and self.config.checksums and s not in self._rows.unchecked and not cache.has(shard.path))

    def stats(self) -> dict:
        """io_stats(): bytes and files fetched, seconds waited on the network and the remote path's
        CPU seconds, over every worker of this dataset so far."""
        return self.net.totals()

    def __getstate__(self):  # what a spawned worker gets: no threads, pools or pins
        kept = ("shards", "config", "tokens", "_tag", "offsets", "specs", "remote", "bounded", "per_sample", "net")
        return {k: v for k, v in self.__dict__.items() if k in kept} | {"_pid": None}


def _untagged(error: ShardError, s: int) -> ShardError:
    return error


def nbytes(shard) -> int:
    """A shard's bytes with its index sidecar's: what fetching it whole puts in the cache."""
    return shard.bytes + ((shard.index.get("bytes") or 0) if shard.index else 0)


class _Counted:
    """A thread pool whose tasks' CPU time is counted as the remote path's (NetStats.cpu)."""

    def __init__(self, pool: ThreadPoolExecutor, net: NetStats):
        self.pool, self.net = pool, net

    def submit(self, fn, *args):
        return self.pool.submit(on_cpu, self.net, lambda: fn(*args))

    def map(self, fn, items):
        return self.pool.map(lambda item: on_cpu(self.net, lambda: fn(item)), items)
