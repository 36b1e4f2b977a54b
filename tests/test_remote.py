"""Remote datasets over a local http.server: same samples, checksums, cache reuse and eviction."""

import functools
import os
import threading
from collections import Counter
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch
from factory import make_dataset

from shardkit.errors import ShardError
from shardkit.loader import make_loader
from shardkit.manifest import load_manifest
from shardkit.reader.dataset import StreamingDataset
from shardkit.reader.shards import read_shard_samples


@pytest.fixture
def served(tmp_path):
    """(local root, url, Counter of GET paths) for a dataset served on 127.0.0.1."""
    data = tmp_path / "data"
    root, expected = make_dataset(data, 36, shards=4, fields=("raw", "cls", "txt"))
    gets = Counter()

    class Handler(SimpleHTTPRequestHandler):
        def do_GET(self):
            gets[self.path] += 1
            super().do_GET()

        def log_message(self, *args):  # keep test output clean
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Handler, directory=root))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield root, f"http://127.0.0.1:{server.server_address[1]}", gets, expected
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def batches(src, cache_dir, workers=2, **options):
    ds = StreamingDataset(src, cache_dir=str(cache_dir), seed=7, shuffle_buffer=8, **options)
    return ds, list(make_loader(ds, batch_size=5, num_workers=workers))


def test_remote_streams_the_same_as_local(served, tmp_path):
    root, url, gets, _ = served
    _, local = batches(root, tmp_path / "unused")
    ds, remote = batches(url, tmp_path / "cache")
    assert [b["__key__"] for b in remote] == [b["__key__"] for b in local]
    for a, b in zip(local, remote):
        assert torch.equal(a["raw"], b["raw"]) and torch.equal(a["cls"], b["cls"]) and a["txt"] == b["txt"]
    # Two workers shared one cache: every shard and index fetched exactly once.
    shard_gets = {p: n for p, n in gets.items() if p.startswith("/shards/")}
    assert len(shard_gets) == 8 and set(shard_gets.values()) == {1}
    _, again = batches(url, tmp_path / "cache")
    assert [b["__key__"] for b in again] == [b["__key__"] for b in local]
    assert {p: n for p, n in gets.items() if p.startswith("/shards/")} == shard_gets  # served from cache


def test_corrupt_remote_shard_fails_its_checksum(served, tmp_path):
    root, url, _, _ = served
    path = os.path.join(root, "shards", "data-00002.tar")
    data = bytearray(open(path, "rb").read())
    data[700] ^= 0xFF  # same size, one byte flipped inside a member
    open(path, "wb").write(bytes(data))
    with pytest.raises(ShardError, match=f"checksum mismatch for shard {url}/shards/data-00002.tar"):
        batches(url, tmp_path / "cache", workers=0, shuffle=False)
    # Nothing unverified is left under the final name: a retry fetches again and fails again.
    assert not list((tmp_path / "cache").rglob("data-00002.tar"))
    assert list((tmp_path / "cache").rglob("data-00002.tar.idx.parquet"))  # the index was fine
    with pytest.raises(ShardError, match="checksum mismatch"):
        batches(url, tmp_path / "cache", workers=0, shuffle=False)


def test_missing_remote_shard_names_the_url(served, tmp_path):
    root, url, _, _ = served
    os.remove(os.path.join(root, "shards", "data-00001.tar"))
    with pytest.raises(ShardError, match=f"cannot fetch shard {url}/shards/data-00001.tar"):
        batches(url, tmp_path / "cache", workers=0, shuffle=False)


def test_cache_limit_evicts_least_recently_used(served, tmp_path):
    root, url, gets, expected = served
    manifest = load_manifest(root)
    biggest = max(s.bytes + s.index["bytes"] for s in manifest.shards)
    ds, got = batches(url, tmp_path / "cache", workers=0, shuffle=False, cache_limit=biggest + 1)
    assert sorted(k for b in got for k in b["__key__"]) == sorted(expected)
    held = sum(f.stat().st_size for f in (tmp_path / "cache").rglob("*") if f.is_file() and
               not f.name.endswith(".lock"))
    assert held <= biggest + 1 and len(list((tmp_path / "cache").rglob("*.idx.parquet"))) == 1
    assert ds.reader._cache.fetched == 8  # each file once: the order was sequential, so no refetch


def test_read_shard_samples_remote(served):
    root, url, _, expected = served
    manifest = load_manifest(url)
    shard = manifest.shards_of("tar")[3]
    got = read_shard_samples(url, manifest, shard)
    assert got and all(s.fields == expected[s.key].fields for s in got)
