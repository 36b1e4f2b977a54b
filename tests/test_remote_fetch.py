"""Fetch ahead over a throttled store on 127.0.0.1 (tests/throttled.py): plan order, ranged GETs, the
window, exactly-once and resume at another world size, network counters, a store that dies."""

import hashlib
import os
import time
from collections import Counter

import pytest
import torch
from factory import keys_of, make_dataset, read_epoch, same_batches
from throttled import Store

from shardkit.errors import ShardError
from shardkit.loader import make_loader
from shardkit.manifest import load_manifest
from shardkit.reader import download as download_module
from shardkit.reader.dataset import StreamingDataset
from shardkit.store.remote import forget_filesystems


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """36 samples of 32x32 raw images in 4 tar shards (~40 KB each)."""
    return make_dataset(tmp_path_factory.mktemp("fetch"), 36, shards=4, fields=("raw", "cls", "txt"))


@pytest.fixture
def store(data):
    s = Store(data[0], latency=0.01, rate=4e6)
    yield s
    s.close()


def dataset_bytes(root) -> int:
    return sum(s.bytes + s.index["bytes"] for s in load_manifest(root).shards)


read = read_epoch
same = same_batches


def shard_gets(counter: Counter) -> dict:
    return {p: n for p, n in counter.items() if p.endswith(".tar")}


def test_large_shards_come_as_parallel_ranged_gets(data, store, tmp_path, monkeypatch):
    monkeypatch.setattr(download_module, "PART", 8192)  # ~40 KB shards -> 5-6 ranged GETs each
    root, _ = data
    _, local = read(root, tmp_path / "unused")
    ds, remote = read(store.url, tmp_path / "cache", connections=4)
    same(local, remote)
    shards = load_manifest(root).shards
    for s in shards:  # every byte once, in ranges, never the whole file in one GET
        parts = store.range_gets["/" + s.path]
        assert store.gets["/" + s.path] == parts
        # 8 KiB parts, all asked at once (shardkit's http client tells a refused range at its headers)
        assert parts == -(-s.bytes // 8192)
    assert store.shard_bytes() == dataset_bytes(root)
    stats = ds.io_stats()
    assert stats["bytes_fetched"] == dataset_bytes(root) and stats["files_fetched"] == 2 * len(shards)
    assert stats["network_wait_s"] > 0 and stats["fetch_cpu_s"] > 0  # the remote path's CPU, counted beside


def test_a_store_that_ignores_range_is_read_with_plain_gets(data, tmp_path, monkeypatch):
    monkeypatch.setattr(download_module, "PART", 8192)
    root, _ = data
    store = Store(root, latency=0.0, rate=None, ranges=False)
    try:
        _, local = read(root, tmp_path / "unused")
        _, remote = read(store.url, tmp_path / "cache", fetch_ahead=1)
        same(local, remote)
        # Shards fetched before the cache learnt that Range is ignored: their parts asked at once
        # (each answered whole: refused at its headers, the body left unread) and one plain GET;
        # after that, one plain GET each.
        gets, parts = shard_gets(store.gets), {"/" + s.path: -(-s.bytes // 8192) for s in load_manifest(root).shards}
        assert all(n <= 1 + parts[p] for p, n in gets.items()) and 1 in gets.values()
        assert any(n > 1 for n in gets.values())  # the first shard's parts were asked for, and refused
        assert sum(store.range_gets.values()) == 0
    finally:
        store.close()


def cached(cache_dir) -> set[str]:
    return {p.name for p in cache_dir.rglob("*.tar")}


def test_fetch_ahead_fetches_the_next_shards_in_plan_order_within_its_window(data, store, tmp_path):
    cache_dir = tmp_path / "cache"
    ds = StreamingDataset(store.url, cache_dir=str(cache_dir), shuffle=False, fetch_ahead=2)
    it = iter(make_loader(ds, batch_size=5, num_workers=0))
    first = next(it)
    deadline = time.monotonic() + 120  # a hang guard: the wait ends on the event
    while cached(cache_dir) != {"data-00000.tar", "data-00001.tar", "data-00002.tar"} and time.monotonic() < deadline:
        time.sleep(0.02)
    # Shard 0 is being read; the next two in plan order are fetched; the third waits for room.
    time.sleep(0.3)
    assert cached(cache_dir) == {"data-00000.tar", "data-00001.tar", "data-00002.tar"}
    assert "/shards/data-00003.tar" not in store.gets
    rest = list(it)
    assert len(keys_of([first] + rest)) == 36 and cached(cache_dir) == {f"data-0000{i}.tar" for i in range(4)}


def test_without_fetch_ahead_only_what_a_batch_needs_is_fetched(data, store, tmp_path):
    cache_dir = tmp_path / "cache"
    ds = StreamingDataset(store.url, cache_dir=str(cache_dir), shuffle=False, fetch_ahead=0)
    it = iter(make_loader(ds, batch_size=5, num_workers=0))
    next(it)
    time.sleep(0.5)
    assert cached(cache_dir) == {"data-00000.tar"}


def ranks(url, cache_dir, monkeypatch, world, state=None):
    from factory import loader_for

    out = []
    for rank in range(world):
        ds, loader = loader_for(url, monkeypatch, rank=rank, world=world, workers=2, seed=11,
                                cache_dir=str(cache_dir))
        if state is not None:
            loader.load_state_dict(state)
        out.append(loader)
    return out


def exactly_once_and_resume(url, cache_dir, monkeypatch, expected, world=4, new_world=3, stop=2):
    """Every rank yields `stop` batches, the run resumes at `new_world` ranks: the rest of the epoch
    exactly once (plus the reported padding), then a whole normal epoch exactly once."""
    loaders = ranks(url, cache_dir, monkeypatch, world)
    before = []
    for loader in loaders:
        it = iter(loader)
        before.append(keys_of(next(it) for _ in range(stop)))
        del it
    state = loaders[0].state_dict()
    resumed = ranks(url, cache_dir, monkeypatch, new_world, state)
    after = [keys_of(loader) for loader in resumed]
    seen = Counter(k for keys in before + after for k in keys)
    assert set(seen) == set(expected)
    assert sum(seen.values()) - len(expected) == resumed[0].source.padding
    following = Counter(k for loader in resumed for k in keys_of(loader))
    assert set(following) == set(expected)
    assert sum(following.values()) - len(expected) == resumed[0].source.padding
    return loaders + resumed


@pytest.mark.filterwarnings("ignore:This DataLoader will create")
def test_exactly_once_and_resume_at_another_world_size_with_fetch_ahead(data, store, tmp_path, monkeypatch):
    root, expected = data
    loaders = exactly_once_and_resume(store.url, tmp_path / "cache", monkeypatch, expected)
    stats = [loader.source.io_stats() for loader in loaders]  # each rank's workers, summed in its main process
    assert sum(s["network_wait_s"] for s in stats) > 0
    # One cache for all ranks: each file fetched once, whatever the ranks and workers.
    assert sum(s["bytes_fetched"] for s in stats) == dataset_bytes(root) == store.shard_bytes()
    assert set(shard_gets(store.gets).values()) == {1}


def test_a_store_killed_mid_epoch_fails_within_the_timeout_and_a_rerun_completes(tmp_path):
    root, expected = make_dataset(tmp_path / "data", 48, shards=6, fields=("raw", "cls"), size=(64, 64))
    store = Store(root, latency=0.01, rate=1e6)  # ~100 KB shards: ~0.1 s each
    cache_dir = tmp_path / "cache"
    ds = StreamingDataset(store.url, cache_dir=str(cache_dir), shuffle=False, timeout=2, retries=1,
                          fetch_ahead=1, connections=1)
    it = iter(make_loader(ds, batch_size=4, num_workers=0))
    got = keys_of([next(it)])
    store.kill()
    # Within the bound, counted rather than timed: the shard in flight gets retries + 1 tries, each
    # ending at the 2 s timeout at most.
    with pytest.raises(ShardError, match=rf"cannot fetch shard {store.url}/shards/data-0000\d\.tar(\.idx\.parquet)?: .*"
                                         r"\(tried 2 time\(s\) over [\d.]+ s, timeout 2 s"):
        for batch in it:
            got += batch["__key__"]
    del it
    # Nothing partial under a final name: every cached file is the verified copy.
    manifest = load_manifest(root)
    sums = {os.path.basename(s.path): s.sha256 for s in manifest.shards}
    for f in cache_dir.rglob("*.tar"):
        assert hashlib.sha256(f.read_bytes()).hexdigest() == sums[f.name]
    from fsspec.implementations.http import HTTPFileSystem

    # A rerun is a new process: it keeps no connection to the store that died (fsspec caches them).
    HTTPFileSystem.clear_instance_cache()
    forget_filesystems()  # shardkit's own, one per process and protocol
    again = Store(root, latency=0.01, rate=None, port=store.port)  # the store is back: same URL
    try:
        ds = StreamingDataset(again.url, cache_dir=str(cache_dir), shuffle=False, timeout=2, retries=1)
        assert sorted(keys_of(make_loader(ds, batch_size=4, num_workers=0))) == sorted(expected)
    finally:
        again.close()
    assert not [f for f in cache_dir.rglob("*") if ".tmp-" in f.name]


def test_the_meter_says_when_the_readers_wait_on_the_network(data, tmp_path):
    from shardkit.meter import StarvationMeter

    root, _ = data
    slow = Store(root, latency=0.1, rate=3e5)  # each shard fetched as needed: its index, then itself
    try:
        ds = StreamingDataset(slow.url, cache_dir=str(tmp_path / "cache"), shuffle=False, fetch_ahead=0,
                              connections=1)
        meter = StarvationMeter(warmup=2, log_every=0)
        for _ in meter.wrap(make_loader(ds, batch_size=1, num_workers=0)):
            time.sleep(0.005)  # a step that takes some time
        summary = meter.summary()
    finally:
        slow.close()
    # At least the store's latency for each of the 8 GETs (a lower bound: the store sleeps that long).
    assert summary["network_wait_s"] >= 8 * 0.1 and summary["bytes_fetched"] == dataset_bytes(root)
    assert summary["advice"].startswith("waiting on the network") and "fetch_ahead" in summary["advice"]


def test_network_advice_needs_the_network_to_be_most_of_the_wait():
    from shardkit.meter import advice

    base = {"starved_pct": 40.0, "wait_p50_ms": 10.0, "wait_p95_ms": 12.0, "step_p50_ms": 10.0, "steps": 100,
            "wait_s": 10.0, "step_s": 15.0}
    # 2 workers over 25 s each: 30 s waited on the network is 60% of their time.
    assert advice(dict(base, network_wait_s=30.0), num_workers=2, cpus=2).startswith("waiting on the network")
    assert not advice(dict(base, network_wait_s=10.0), num_workers=2, cpus=2).startswith("waiting on the network")
    assert not advice(base, num_workers=2, cpus=2).startswith("waiting on the network")  # local data: no figure


def tar_range_gets(store) -> int:
    return sum(n for p, n in store.range_gets.items() if p.endswith(".tar"))


def test_a_first_batch_reads_its_samples_by_range_while_whole_shards_download(tmp_path, monkeypatch):
    import shardkit.reader.remote as remote

    monkeypatch.setattr(remote, "RANGED_FROM", 100_000)  # the 4 shards of this batch: ~600 KB
    root, _ = make_dataset(tmp_path / "data", 200, shards=4, fields=("raw", "cls", "txt"))
    store = Store(root, latency=0.01, rate=5e4)  # ~150 KB shards: ~3 s each; a sample: ~0.06 s
    try:
        _, local = read(root, tmp_path / "unused")
        ds = StreamingDataset(store.url, cache_dir=str(tmp_path / "cache"), seed=7, shuffle_buffer=16)
        it = iter(make_loader(ds, batch_size=5, num_workers=0))
        first = next(it)
        # Served before any shard arrived: its index, then a ranged GET per run of adjacent samples
        # (a sample's members lie side by side), never a whole shard.
        assert cached(tmp_path / "cache") == set()
        assert 1 <= tar_range_gets(store) <= 5
        same(local, [first] + list(it))  # the same batches as a local read, the first one included
        stats = ds.io_stats()
        assert dataset_bytes(root) < stats["bytes_fetched"] < dataset_bytes(root) * 1.1
    finally:
        store.close()


def test_rows_are_read_by_range_only_within_a_share_of_the_epoch(tmp_path, monkeypatch):
    """Rows read by range are downloaded twice: a worker reads at most RANGED_SHARE of its epoch's
    bytes so. Rank 0 of 8 reads 25 samples, so a batch of 5 is over its 10% and waits for whole shards."""
    import shardkit.reader.remote as remote
    from factory import loader_for

    monkeypatch.setattr(remote, "RANGED_FROM", 1)
    root, _ = make_dataset(tmp_path / "data", 200, shards=4, fields=("raw", "cls", "txt"))
    store = Store.instant(root)
    try:
        ds, loader = loader_for(store.url, monkeypatch, rank=0, world=8, bs=5, cache_dir=str(tmp_path / "cache"))
        next(iter(loader))
        assert tar_range_gets(store) == 0
        ds, loader = loader_for(store.url, monkeypatch, rank=0, world=1, bs=5, cache_dir=str(tmp_path / "fresh"))
        next(iter(loader))  # one rank: 200 samples, a batch is 2.5%
        assert tar_range_gets(store) > 0
    finally:
        store.close()


def test_small_shards_are_fetched_whole_even_for_a_first_batch(tmp_path):
    root, _ = make_dataset(tmp_path / "data", 200, shards=4, fields=("raw", "cls", "txt"))
    store = Store.instant(root)
    try:
        ds = StreamingDataset(store.url, cache_dir=str(tmp_path / "cache"), seed=7, shuffle_buffer=16)
        next(iter(make_loader(ds, batch_size=5, num_workers=0)))
        assert tar_range_gets(store) == 0  # ~600 KB to fetch: below RANGED_FROM
    finally:
        store.close()


def test_reservations_hold_room_across_processes_and_die_with_theirs(tmp_path):
    from shardkit.reader.cache import RESERVE, ShardCache

    a = ShardCache("http://127.0.0.1:9/set", cache_dir=str(tmp_path), cache_limit=1000)
    b = ShardCache("http://127.0.0.1:9/set", cache_dir=str(tmp_path), cache_limit=1000)  # another process's
    first = a.reserve(600)
    assert first and b.reserve(600) is None  # the room is taken, whoever asks
    ShardCache.release(first)
    second = b.reserve(600)
    assert second
    ShardCache.release(second)
    # A killed process's reservation (no such pid) is removed when room is needed.
    with open(os.path.join(a.dir, f"{RESERVE}999999999-0123456789ab"), "wb") as f:
        f.truncate(900)
    assert a.reserve(600) and not [n for n in os.listdir(a.dir) if n.startswith(f"{RESERVE}999999999")]


@pytest.mark.filterwarnings("ignore:This DataLoader will create")
def test_workers_forked_after_the_main_process_fetched_make_their_own_connections(data, store, tmp_path):
    import multiprocessing

    if "fork" not in multiprocessing.get_all_start_methods():
        pytest.skip("no fork on this platform")
    root, expected = data
    ds = StreamingDataset(store.url, cache_dir=str(tmp_path / "cache"), seed=7, shuffle_buffer=16)
    assert ds[3]["__key__"]  # the main process fetched: its cache has connection threads now
    got = keys_of(make_loader(ds, batch_size=5, num_workers=2, multiprocessing_context="fork"))
    assert sorted(got) == sorted(expected)


def read_rows_by_range_while_shards_download(monkeypatch) -> None:
    """Every batch may read by range the rows of shards not cached yet (here shards are small)."""
    import shardkit.reader.remote as remote

    monkeypatch.setattr(remote, "RANGED_FROM", 1)
    monkeypatch.setattr(remote, "RANGED_SHARE", 1.0)


@pytest.mark.filterwarnings("ignore:This DataLoader will create")
def test_exactly_once_and_resume_with_rows_read_by_range(data, tmp_path, monkeypatch):
    read_rows_by_range_while_shards_download(monkeypatch)
    root, expected = data
    store = Store(root, latency=0.05, rate=2e5)  # ~15 KB shards: ~0.1 s each, so early rows come by range
    try:
        exactly_once_and_resume(store.url, tmp_path / "cache", monkeypatch, expected)
    finally:
        store.close()
    assert sum(n for p, n in store.range_gets.items() if p.endswith(".tar")) > 0  # rows were read by range
    whole = {p: store.gets[p] - store.range_gets[p] for p in store.gets if p.endswith(".tar")}
    assert set(whole.values()) == {1}  # and each shard was fetched whole once, for the rest


def test_a_shard_that_stops_mid_download_while_its_rows_are_read_is_a_clear_error(tmp_path, monkeypatch):
    from shardkit.reader import download

    read_rows_by_range_while_shards_download(monkeypatch)
    monkeypatch.setattr(download, "PART", 16384)
    root, _ = make_dataset(tmp_path / "data", 200, shards=2, fields=("raw", "cls", "txt"), size=(32, 32))
    local = {k: (raw, c, t) for b in read(root, tmp_path / "unused")[1]
             for k, raw, c, t in zip(b["__key__"], b["raw"], b["cls"], b["txt"])}
    store = Store(root, latency=0.01, rate=1e5)  # ~300 KB shards in 16 KB parts: ~3 s each
    try:
        ds = StreamingDataset(store.url, cache_dir=str(tmp_path / "cache"), seed=7, shuffle_buffer=64, retries=1,
                              connections=1)
        it = iter(make_loader(ds, batch_size=5, num_workers=0))
        got = [next(it)]  # read by range: the shards are still downloading
        assert cached(tmp_path / "cache") == set()
        store.cut("/shards/data-00001.tar", times=float("inf"))  # from now on every GET of it breaks off
        with pytest.raises(ShardError, match=rf"cannot fetch shard {store.url}/shards/data-00001.tar: the body broke "
                                             r"off before its end .*\(tried 2 time\(s\)"):
            for batch in it:
                got.append(batch)
    finally:
        store.close()
    keys = keys_of(got)
    assert len(keys) == len(set(keys))  # nothing yielded twice
    for b in got:  # and nothing wrong
        for k, raw, c, t in zip(b["__key__"], b["raw"], b["cls"], b["txt"]):
            assert torch.equal(raw, local[k][0]) and int(c) == int(local[k][1]) and t == local[k][2]
