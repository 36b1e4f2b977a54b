"""Remote reading for one BatchReader: the shard caches, fetching ahead, a first batch read by range."""

from __future__ import annotations

import os

import numpy as np

from shardkit.errors import ShardError
from shardkit.fs import is_remote
from shardkit.reader.cache import ShardCache
from shardkit.reader.download import RangeIgnored
from shardkit.reader.fetch import Fetcher, NetStats, first_uses, timed

# A first batch reads its samples by range when the shards it needs that are not cached yet hold
# more than this: 64 MiB take ~0.3 s over 8 connections of 25 MB/s, about what a batch of range
# reads costs (an index and a sample per shard, mostly round trips). Below it (JPEG shards of a
# few MB), whole shards came sooner: 0.87 s vs 1.48 s to a first batch of 19 JPEG shards.
RANGED_FROM = 64 << 20


class Remote:
    """The remote side of a BatchReader's reads (made in the reader's constructor; its caches,
    threads and pools are made again in a forked process)."""

    def __init__(self, shards, offsets, specs, config, tokens, tagged):
        self.shards, self.offsets, self.specs, self.config, self.tokens = shards, offsets, specs, config, tokens
        self._tagged = tagged
        self.net = NetStats()  # bytes fetched and time waited on the network, every worker's
        self._caches = {}  # dataset -> ShardCache, made in the process that reads
        self.fetcher = None  # a Fetcher while an epoch's batches are read (fetch_ahead > 0)
        self._pid = os.getpid()  # threads, pools and locks made here are this process's only
        self._ranged_left = 0  # batches still read by range where their shards are not cached yet

    def cache(self, s: int) -> ShardCache:
        """The cache of shard s's dataset (one per dataset root: its folder and limit are its own)."""
        return self._cache_of(int(self.shards.part(s)))

    def _cache_of(self, p: int) -> ShardCache:
        self._forked()
        if p not in self._caches:
            self._caches[p] = ShardCache(self.shards.roots[p], self.config.cache_dir, self.config.cache_limit,
                                         self.config.remote_policy(), self.config.connections, self.net.fetched)
        return self._caches[p]

    def _forked(self) -> None:
        """In a process forked from the one that made them (DataLoader workers under fork), the
        fetcher, the caches' connection pools and the counters' lock are copies without their
        threads (a lock may even be copied held): drop them, they are made again here."""
        if self._pid != os.getpid():
            self._pid, self.fetcher, self._caches, self._ranged_left = os.getpid(), None, {}, 0
            self.net.forked()

    def start_fetching(self, batches, ranged: int = 0, skip=()) -> None:
        """Fetch remote shards ahead in the order these batches (arrays of ids, this worker's rest of
        the epoch, computed in the fetch thread) first read them; local shards are left alone.
        The next `ranged` batches read the samples of shards not yet cached by range (reader.ranged)."""
        self._forked()
        self.stop_fetching()
        if self.config.fetch_ahead == 0 or not any(is_remote(r) for r in self.shards.roots):
            return
        self._ranged_left = ranged
        for p in range(len(self.shards.roots)):  # made here: the fetch threads only look them up
            self._cache_of(p)
        order = (s for s in first_uses(batches, self.offsets) if is_remote(self.shards.root(s)))
        # Whole shards download while the first batch is read by range. Starting them after it was
        # tried: the second batch then waited for all of them, and an epoch of 2,090 raw images ran
        # at ~0.65x the samples/s (two bench/remote_bench.py runs, not interleaved, shared VM).
        self.fetcher = Fetcher(self._prefetch, self._reserve, ShardCache.release, order, self.config.fetch_ahead,
                               skip=skip)

    def _read_by_range(self, needed, shard_idx: np.ndarray, rows: np.ndarray, skip=(), bad=()) -> dict:
        """Shard -> a RangedTar of this batch's rows, for each needed shard not open nor cached yet:
        all at once (each is an index and a few samples, mostly round trips)."""
        todo = [s for s in needed if s not in skip and not bad[s] and self._can_range(s)]
        if sum(self._nbytes(s) for s in todo) < RANGED_FROM:  # whole shards come about as soon
            return {}
        from concurrent.futures import ThreadPoolExecutor

        def one(s: int):
            try:
                return self._ranged(s, rows[shard_idx == s])
            except RangeIgnored:  # read whole from now on
                self.cache(s).ranges = False
                return None
            except ShardError as e:
                raise self._tagged(e, s)

        with ThreadPoolExecutor(len(todo), thread_name_prefix="shardkit-first") as pool:
            got = timed(self.net, lambda: list(pool.map(one, todo)))
        return dict(zip(todo, got))

    def _can_range(self, s: int) -> bool:
        shard, cache = self.shards[s], self.cache(s)
        return (cache.remote and cache.ranges is not False and shard.format == "tar" and bool(shard.index)
                and self.tokens is None and self.config.checksums and not cache.has(shard.path))

    def _ranged(self, s: int, rows: np.ndarray):
        from shardkit.reader.ranged import RangedTar

        cache, shard = self.cache(s), self.shards[s]
        index, pin = cache.pin(shard.index["path"], shard.index["sha256"], shard.index.get("bytes"), direct=True)
        try:
            reader = RangedTar(self.shards.url(s), index, shard, self.specs, rows, cache.member_pool, cache.policy)
        finally:
            pin.release()
        self.net.ranged(len(reader.mm))
        return reader

    def stop_fetching(self) -> None:
        self._ranged_left = 0
        if self.fetcher is not None:
            self.fetcher.close()
            self.fetcher = None

    def _prefetch(self, s: int):
        return self.cache(s).pin_shard(self.shards[s], wait=False)

    def _reserve(self, s: int) -> str | None:
        """Room in its cache for shard s and its index (ShardCache.reserve)."""
        return self.cache(s).reserve(self._nbytes(s))

    def _nbytes(self, s: int) -> int:
        shard = self.shards[s]
        return shard.bytes + ((shard.index.get("bytes") or 0) if shard.index else 0)

    def _pinned(self, s: int):
        """Shard s's files pinned: from the fetcher when it started them, else fetched here; the
        time it takes for a remote shard is time waited on the network."""
        cache, shard = self.cache(s), self.shards[s]
        if not cache.remote:
            return cache.pin_shard(shard)

        def get():
            got = self.fetcher.take(s) if self.fetcher is not None else None
            return got if got is not None else cache.pin_shard(shard)

        return timed(self.net, get)


    def __getstate__(self):
        state = self.__dict__.copy()
        state["_caches"], state["fetcher"] = {}, None
        return state
