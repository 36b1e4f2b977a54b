"""The first remote batch as soon as it can come: the main process fetches the index sidecars of the
workers' first batches while they start, and a worker's first batch reads its rows by range (one
round trip after the indexes), over the throttled store on 127.0.0.1 (tests/throttled.py)."""

import sys
import time

import numpy as np
import pytest
from factory import make_dataset
from throttled import Store

from shardkit.loader import make_loader
from shardkit.manifest import load_manifest
from shardkit.reader.dataset import StreamingDataset
from shardkit.reader import ranged
from shardkit.reader.partition import locate


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """96 samples of 224x224 raw images (150 KB each) in 2 tar shards of ~7 MB: more than one round
    of 4 MiB GETs on one connection, which the first batch does not wait for."""
    return make_dataset(tmp_path_factory.mktemp("first"), 96, shards=2, fields=("raw", "cls"), size=(224, 224))


def round_trips(spans) -> int:
    """The longest chain of GETs each sent after the one before it was answered."""
    depth = {}
    for received, answered, path, _ in sorted(spans):
        depth[(received, answered, path)] = 1 + max((d for (r, a, _), d in depth.items() if a <= received), default=0)
    return max(depth.values(), default=0)


def test_the_first_batch_is_its_indexes_fetched_by_the_main_process_then_its_rows(data, tmp_path):
    root, _ = data
    manifest = load_manifest(root)
    store = Store(root, latency=0.25, rate=None)  # GETs sent together arrive well within a latency
    try:
        ds = StreamingDataset(store.url, cache_dir=str(tmp_path / "cache"), seed=3, connections=1)
        loader = make_loader(ds, batch_size=4, num_workers=2)
        store.quiet()
        store.spans.clear()  # the manifest's GET
        plan = ds.epoch_plan(0, (), 4)
        firsts = np.concatenate(list(plan.batches(0, 0, 1))[:2])  # each worker's first batch
        shards = sorted(set(locate(firsts, ds.reader.offsets)[0].tolist()))
        indexes = {f"/shards/{manifest.shards[s].index['path'].split('/')[-1]}" for s in shards}
        it = iter(loader)
        assert loader.warming is not None
        loader.warming.join()  # the main process's fetches: done without any batch asked for
        cached = {p.name for p in (tmp_path / "cache").rglob("*.idx.parquet")}
        assert {p.split("/")[-1] for p in indexes} <= cached
        first = next(it)
        arrived = time.monotonic()
        assert len(first["__key__"]) == 4
        # the shards' GETs (a manifest GET still in flight at clear() lands in the log too)
        before = [span for span in store.spans if span[1] <= arrived and span[2].startswith("/shards/")]
        # Two round trips: the indexes, then the first batch's rows by range (its whole shards'
        # parts, asked for meanwhile, are one round trip after their own index).
        # (Counted over the index and row GETs: a whole shard's second part, a round trip after its
        # first, may land before `arrived` when the hand-over to this process is slow.)
        from shardkit.reader.download import PART

        assert round_trips([span for span in before if span[3] < PART]) == 2, sorted(before)
        assert any(n < manifest.shards[0].bytes / 4 for _, _, p, n in before if p.endswith(".tar"))
        rest = sum(len(b["__key__"]) for b in it)
        assert rest == 92
        assert all(store.gets[p] == 1 for p in indexes)  # each index fetched once, by one process
    finally:
        store.close()


def test_a_batch_s_whole_shards_download_while_its_rows_are_read_by_range(data, tmp_path):
    """A batch's whole shards start with its rows read by range, not after them, so that they
    download during those round trips; the batch comes from its rows, without waiting for them (on
    the remote bench: epochs 1.10x (JPEG) and 1.17x (raw) as fast as with the parts asked for once
    the rows were in)."""
    root, _ = data
    store = Store(root, latency=0.1, rate=2e6)  # a 4 MiB part takes ~2 s, a 150 KB row ~0.1 s
    try:
        ds = StreamingDataset(store.url, cache_dir=str(tmp_path / "cache"), seed=3, connections=1)
        store.quiet()
        store.spans.clear()  # the manifest's GET
        it = iter(make_loader(ds, batch_size=4, num_workers=1))
        first = next(it)
        arrived = time.monotonic()
        rest = sum(len(b["__key__"]) for b in it)
        assert len(first["__key__"]) + rest == 96
        tars = [(r, a, n) for r, a, p, n in store.spans if p.endswith(".tar")]
        rows = [a for r, a, n in tars if n < 1 << 20 and a <= arrived]
        parts = [(r, a) for r, a, n in tars if n >= 1 << 20]
        assert rows and parts
        assert min(r for r, _ in parts) < max(rows), "the whole shards were asked for only once the rows were in"
        assert arrived < min(a for _, a in parts), "the first batch waited for a whole shard's part"
    finally:
        store.close()


def test_a_first_batch_s_rows_go_on_connections_opened_while_its_indexes_came(data, tmp_path, monkeypatch):
    """Over https a new connection costs a TLS handshake (a round trip, ~1 ms of CPU) before its GET:
    the threads that send a first batch's rows by range open theirs while its indexes come (over
    the throttled store with TLS: first batch local + 0.28 s against + 0.37 s; bench/RESULTS.md)."""
    root, _ = data
    manifest = load_manifest(root)
    store = Store(root, latency=0.25, rate=None, tls=str(tmp_path / "tls"))
    monkeypatch.setenv("SSL_CERT_FILE", store.cert)  # the client trusts the store's own certificate
    try:
        # 16 range threads: 14 beside the 2 index GETs, for the batch's 8 rows (an index thread may
        # carry no connection: it may wait for the index the whole shard's fetch brings)
        ds = StreamingDataset(store.url, cache_dir=str(tmp_path / "cache"), seed=3, connections=2)
        store.quiet()
        store.spans.clear()  # the manifest's GET
        first = next(iter(make_loader(ds, batch_size=8, num_workers=0)))
        expected = next(iter(make_loader(StreamingDataset(root, seed=3), batch_size=8, num_workers=0)))
        assert list(first["__key__"]) == list(expected["__key__"])
        assert np.array_equal(np.asarray(first["raw"]), np.asarray(expected["raw"]))
        store.quiet()
        shards = [span for span in store.spans if span[2].startswith("/shards/")]
        indexes = [span for span in shards if span[2].endswith(".parquet")]
        rows = [span for span in shards if span[2].endswith(".tar") and span[3] < manifest.shards[0].bytes / 4]
        assert indexes and len(rows) >= 4
        answered = min(a for _, a, _, _ in indexes)
        assert all(store.opened[(r, p)] < answered for r, _, p, _ in rows), (answered, rows, store.opened)
    finally:
        store.close()


def test_a_first_batch_whose_index_is_gone_fails_at_once_naming_it(data, tmp_path):
    """The threads held for the rows' GETs while the indexes come are let go when an index fails:
    the error comes at once, not after their wait (the policy's timeout)."""
    import shutil

    from shardkit.errors import ShardError

    root, _ = data
    copy = tmp_path / "copy"
    shutil.copytree(root, copy)
    store = Store(str(copy), latency=0.05, rate=None)
    try:
        ds = StreamingDataset(store.url, cache_dir=str(tmp_path / "cache"), seed=3, connections=1, fetch_ahead=0)
        for index in (copy / "shards").glob("*.parquet"):
            index.unlink()
        started = time.monotonic()
        with pytest.raises(ShardError, match="idx.parquet"):
            next(iter(make_loader(ds, batch_size=8, num_workers=0)))
        assert time.monotonic() - started < 5

        def held() -> int:  # threads still carrying (or waiting to carry) the rows' GETs
            frames = []
            for frame in sys._current_frames().values():
                while frame is not None:
                    frames.append(frame.f_code)
                    frame = frame.f_back
            return sum(code is ranged._Carriers._carry.__code__ for code in frames)

        deadline = time.monotonic() + 2
        while held() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert held() == 0  # let go, not left waiting for GETs that never come
    finally:
        store.close()


def test_a_store_that_never_finishes_the_tls_handshake_fails_within_one_timeout(data, tmp_path, monkeypatch):
    """Connections opened ahead are not opened before the index GET: a store that takes TCP and
    never answers the handshake fails a lookup after one timeout, not two."""
    from shardkit.errors import ShardkitError

    root, _ = data
    store = Store(root, latency=0.0, rate=None, tls=str(tmp_path / "tls"))
    monkeypatch.setenv("SSL_CERT_FILE", store.cert)

    class Silent:  # the store's side of each handshake waits until the store closes
        def wrap_socket(self, sock, server_side=True):
            store.closed.wait()
            raise OSError("closed")

    try:
        ds = StreamingDataset(store.url, cache_dir=str(tmp_path / "cache"), seed=3, connections=1, timeout=2,
                              retries=0)
        store.server.tls = Silent()
        started = time.monotonic()
        with pytest.raises(ShardkitError, match="tried 1 time"):
            ds[5]
        assert time.monotonic() - started < 3.2  # one timeout (2 s), not two
    finally:
        store.closed.set()
        store.close()


def test_rows_side_by_side_open_one_connection_ahead_not_one_per_row(data, tmp_path, monkeypatch):
    """24 consecutive rows are one run of bytes (one GET at most): the threads connected ahead of it
    are counted by runs of consecutive rows, not by rows (24 rows opened 24 TLS connections)."""
    root, _ = data
    store = Store(root, latency=0.05, rate=None, tls=str(tmp_path / "tls"))
    monkeypatch.setenv("SSL_CERT_FILE", store.cert)
    try:
        ds = StreamingDataset(store.url, cache_dir=str(tmp_path / "cache"), seed=3, connections=4, fetch_ahead=0)
        store.quiet()
        before = store.connections
        batch = ds.reader.read(np.arange(24), 0)  # shard 0's first 24 rows, read by range
        local = StreamingDataset(root).reader.read(np.arange(24), 0)
        assert list(batch["__key__"]) == list(local["__key__"]) and np.array_equal(batch["raw"], local["raw"])
        store.quiet()
        assert store.connections - before <= 2  # the index GET's, and one carrier for the run
    finally:
        store.close()


def test_workers_inherit_what_np_unique_imports():
    """np.unique imports numpy.ma on its first call (14 ms of CPU, traced on a worker's first batch):
    the loader's side imports it in the process that forks the workers, so a worker's first np.unique
    imports nothing."""
    import subprocess

    code = ("import sys\nfrom shardkit import StreamingDataset, make_loader\nimport numpy as np\n"
            "before = set(sys.modules)\nnp.unique(np.array([3, 1, 3]))\nprint(sorted(set(sys.modules) - before))")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    assert out.strip() == "[]", out
