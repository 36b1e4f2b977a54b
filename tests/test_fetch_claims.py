"""Fetching ahead claims a shard for one process only when that process's connections are about to
download it: a process that claimed every shard a batch wanted left the other workers' connections
idle while it fetched them all on its own (half the rate with 2 workers)."""

from __future__ import annotations

import threading
import time

import pytest
from factory import make_dataset, read_epoch, same_batches
from throttled import Store

from shardkit.manifest import load_manifest
from shardkit.reader import download as download_module
from shardkit.reader.fetch import Fetcher

HANG = 120  # a hang guard: each wait below ends on its condition


class Claims:
    """A cache shared by processes, as the fetchers see it: pin(s) claims shard s for one of them
    (None when another has it, as ShardCache.pin_shard(wait=False) answers), then downloads until
    `gate` opens."""

    def __init__(self):
        self.owner: dict[int, str] = {}
        self.order: dict[str, list[int]] = {}
        self.lock, self.gate = threading.Lock(), threading.Event()

    def pin(self, who: str):
        def pin(s: int):
            with self.lock:
                if self.owner.setdefault(s, who) != who:
                    return None
                self.order.setdefault(who, []).append(s)
            self.gate.wait(HANG)
            return f"{who}:{s}"
        return pin

    def of(self, who: str) -> list[int]:
        with self.lock:
            return list(self.order.get(who, []))

    def until(self, who: str, n: int) -> list[int]:
        deadline = time.monotonic() + HANG
        while len(self.of(who)) < n and time.monotonic() < deadline:
            time.sleep(0.01)
        return self.of(who)


def fetcher(claims: Claims, who: str, slots: int = 16) -> Fetcher:
    # 4 GETs a shard (16 MB shards in 4 MiB parts) and 8 connections queueing 16: 4 shards at once
    return Fetcher(claims.pin(who), lambda s: "room", lambda r: None, iter(()), ahead=8,
                   cost=lambda s: 4, slots=slots)


def test_a_worker_claims_only_what_its_connections_download_and_the_next_worker_takes_the_rest():
    claims = Claims()
    first, second = fetcher(claims, "first"), fetcher(claims, "second")
    try:
        wanted = [7, 3, 18, 0, 11, 5, 9, 14, 1, 16, 2, 12, 4, 17, 6, 10, 13, 8, 15]  # a batch's 19 shards
        first.want(wanted)
        assert claims.until("first", 4) == wanted[:4]  # in the order wanted
        second.want(wanted)  # the other worker's first batch, while the first's shards still download
        assert claims.until("second", 4) == wanted[4:8]
        time.sleep(0.2)  # nothing more is claimed while those download
        assert claims.of("first") == wanted[:4] and claims.of("second") == wanted[4:8]
        claims.gate.set()
        got = {s: (first.take(s), second.take(s)) for s in wanted}
        assert sorted(claims.of("first") + claims.of("second")) == sorted(wanted)  # each shard once
        for s, (a, b) in got.items():  # fetched by one, the other told another process has it
            owner = "first" if s in claims.of("first") else "second"
            assert (a, b) == ((f"first:{s}", None) if owner == "first" else (None, f"second:{s}"))
    finally:
        claims.gate.set()
        first.close()
        second.close()


def test_a_shard_larger_than_the_queue_is_fetched_alone_and_the_fetches_keep_their_order():
    claims = Claims()
    one = fetcher(claims, "one", slots=3)  # a shard's 4 GETs exceed the 3 queued: one shard at a time
    try:
        one.want([5, 2, 8])
        assert claims.until("one", 1) == [5]
        time.sleep(0.2)
        assert claims.of("one") == [5]
        claims.gate.set()
        assert [one.take(s) for s in (5, 2, 8)] == ["one:5", "one:2", "one:8"] and claims.of("one") == [5, 2, 8]
    finally:
        claims.gate.set()
        one.close()


def test_a_closed_fetcher_claims_nothing_more():
    claims = Claims()
    one = fetcher(claims, "one")
    one.want(list(range(10)))
    assert claims.until("one", 4) == [0, 1, 2, 3]
    one.close()
    claims.gate.set()
    time.sleep(0.2)
    assert claims.of("one") == [0, 1, 2, 3]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return make_dataset(tmp_path_factory.mktemp("claims"), 36, shards=4, fields=("raw", "cls", "txt"))


def test_the_store_sees_at_most_the_shards_the_connections_queue(data, tmp_path, monkeypatch):
    root, _ = data
    shards = load_manifest(root).shards
    monkeypatch.setattr(download_module, "PART", min(s.bytes for s in shards) // 5)  # 5+ GETs a shard
    store = Store(root, latency=0.01, rate=4e6)
    try:
        # 2 connections queue 4 GETs: each shard (5+ parts) is fetched alone, its parts 2 at a time
        ds, remote = read_epoch(store.url, tmp_path / "cache", connections=2)
        # In the order the store received them, a shard's GETs all come before the next shard's: no
        # two shards interleave. (By arrival, not by when each answer ended: an answer's end is
        # stamped once its sender thread runs again, late on a loaded machine.)
        arrived = [p for _, _, p, _ in sorted(store.spans) if p.endswith(".tar")]
        runs = [p for i, p in enumerate(arrived) if i == 0 or p != arrived[i - 1]]
        assert len(runs) == len(set(runs)) == len(shards), runs
        assert all(store.range_gets["/" + s.path] >= 5 for s in shards)
    finally:
        store.close()
    same_batches(read_epoch(root, tmp_path / "unused")[1], remote)


def test_a_fetch_ahead_waits_for_an_index_this_process_is_fetching_and_then_takes_the_shard(data, tmp_path):
    """A lock on a file is held against this process's other threads too: while the rows of a first
    batch read by range fetched a shard's index, fetching that shard ahead (pin_shard(wait=False))
    found the index locked and left the shard to the reader, which then fetched the batch's shards
    one after another. The index is one round trip: it is waited for; only the shard itself is left
    to a process fetching it."""
    import fcntl
    import os

    from shardkit.reader.cache import LOCK, ShardCache

    root, _ = data
    shard = load_manifest(root).shards[0]
    store = Store(root)
    try:
        cache = ShardCache(store.url, str(tmp_path / "cache"))
        index_lock = os.path.join(cache.dir, shard.index["path"]) + LOCK
        os.makedirs(os.path.dirname(index_lock), exist_ok=True)
        fd = os.open(index_lock, os.O_RDWR | os.O_CREAT)
        fcntl.flock(fd, fcntl.LOCK_EX)  # another thread of this process is fetching the index
        threading.Timer(0.3, os.close, (fd,)).start()
        pinned = cache.pin_shard(shard, wait=False)
        assert pinned is not None, "the shard was left to another process: none is fetching it"
        try:
            with open(pinned.path, "rb") as f:
                assert len(f.read()) == shard.bytes
        finally:
            pinned.release()
        # the shard itself held by another fetch: left to it, at once
        shard_lock = os.path.join(cache.dir, load_manifest(root).shards[1].path) + LOCK
        fd = os.open(shard_lock, os.O_RDWR | os.O_CREAT)
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            assert cache.pin_shard(load_manifest(root).shards[1], wait=False) is None
        finally:
            os.close(fd)
    finally:
        store.close()


def test_a_shard_downloads_while_its_index_comes(data, tmp_path):
    """pin_shard asks for the shard's bytes at once and pins its index once they are in: over a
    store of 0.3 s a GET, the shard's GET is sent before the index's answer (an epoch's first shards
    started one index round trip late)."""
    import os

    from shardkit.reader.cache import ShardCache
    from shardkit.reader.values import values_checked

    root, _ = data
    shard = load_manifest(root).shards[0]
    store = Store(root, latency=0.3, rate=None)
    try:
        cache = ShardCache(store.url, str(tmp_path / "cache"))
        pinned = cache.pin_shard(shard, checked=lambda path, index: values_checked(shard, path, index))
        try:
            assert pinned.index and os.path.getsize(pinned.path) == shard.bytes
        finally:
            pinned.release()
        store.quiet()
        spans = {path: (received, answered) for received, answered, path, _ in store.spans}
        assert spans["/" + shard.path][0] < spans["/" + shard.index["path"]][1], spans
        assert cache.fetched == 2
    finally:
        store.close()


def test_an_index_that_fails_once_its_shard_came_leaves_nothing_pinned(data, tmp_path):
    """The shard came (its own sha256 checked, its index being unusable), then its index fails: the
    error is the index's, and neither file stays pinned (an evictor, or another process, may take them)."""
    import dataclasses
    import fcntl
    import os

    from shardkit.errors import ShardError
    from shardkit.reader.cache import LOCK, ShardCache
    from shardkit.reader.values import values_checked

    root, _ = data
    good = load_manifest(root).shards[1]
    shard = dataclasses.replace(good, index=dict(good.index, sha256="0" * 64))  # the index does not match
    store = Store(root, latency=0.0, rate=None)
    try:
        cache = ShardCache(store.url, str(tmp_path / "cache"))
        with pytest.raises(ShardError, match="idx.parquet"):
            cache.pin_shard(shard, checked=lambda path, index: values_checked(shard, path, index))
        assert store.gets["/" + shard.path] >= 1 and os.path.getsize(os.path.join(cache.dir, shard.path)) == shard.bytes
        for rel in (shard.path, shard.index["path"]):
            fd = os.open(os.path.join(cache.dir, rel) + LOCK, os.O_RDWR | os.O_CREAT)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # raises while anything pins it
            finally:
                os.close(fd)
    finally:
        store.close()


def test_an_index_already_failed_fails_the_shard_before_its_download(data, tmp_path):
    """A failure of the index recorded beside it (by any process since the epoch began) fails
    pin_shard at once: the shard is not downloaded for nothing."""
    import dataclasses

    from shardkit.errors import ShardError
    from shardkit.reader.cache import ShardCache

    root, _ = data
    good = load_manifest(root).shards[2]
    shard = dataclasses.replace(good, index=dict(good.index, sha256="0" * 64))
    store = Store(root, latency=0.0, rate=None)
    try:
        cache = ShardCache(store.url, str(tmp_path / "cache"))
        with pytest.raises(ShardError, match="idx.parquet"):  # another reader's fetch of the index fails
            cache.pin(shard.index["path"], shard.index["sha256"], shard.index.get("bytes"), direct=True)
        with pytest.raises(ShardError, match="idx.parquet.*failed .* ago in process"):
            cache.pin_shard(shard, wait=False)
        assert store.gets["/" + shard.path] == 0
    finally:
        store.close()


def test_an_error_of_checked_is_raised_not_taken_for_the_index_s(data, tmp_path):
    from shardkit.errors import ShardError
    from shardkit.reader.cache import ShardCache

    root, _ = data
    shard = load_manifest(root).shards[3]
    store = Store(root, latency=0.0, rate=None)

    def checked(path, index):
        raise ShardError("cannot tell")

    try:
        cache = ShardCache(store.url, str(tmp_path / "cache"))
        with pytest.raises(ShardError, match="cannot tell"):
            cache.pin_shard(shard, checked=checked)
    finally:
        store.close()
