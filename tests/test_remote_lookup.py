"""One sample of a remote dataset by range, never its shard: ds[i], ds.get(key) and `shardkit show`
over the throttled store on 127.0.0.1 (tests/throttled.py), counted by the store."""

import random
import tarfile

import pytest
import torch
from click.testing import CliRunner
from factory import make_dataset
from throttled import Store

from shardkit.errors import ChecksumMismatch
from shardkit.manifest import load_manifest
from shardkit.reader.dataset import StreamingDataset


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """2,000 samples of 64x64 raw images (12 KB each) in 16 tar shards."""
    return make_dataset(tmp_path_factory.mktemp("lookup"), 2000, shards=16, fields=("raw", "cls", "txt"),
                        size=(64, 64))


@pytest.fixture
def store(data):
    with Store.instant(data[0]) as s:
        yield s


def dataset_bytes(root) -> int:
    return sum(s.bytes + s.index["bytes"] for s in load_manifest(root).shards)


def same(a: dict, b: dict) -> bool:
    return a["__key__"] == b["__key__"] and torch.equal(a["raw"], b["raw"]) and a["cls"] == b["cls"] and \
        a["txt"] == b["txt"]


def test_random_access_fetches_its_samples_and_their_indexes_not_their_shards(data, store, tmp_path):
    root, _ = data
    local = StreamingDataset(root)
    ds = StreamingDataset(store.url, cache_dir=str(tmp_path / "cache"))
    picks = random.Random(0).sample(range(2000), 20)
    for i in picks[:10]:
        assert same(ds[i], local[i])
    for i in picks[10:]:
        key = local[i]["__key__"]
        assert same(ds.get(key), local[i])
    total = dataset_bytes(root)
    samples = sum(total // 2000 for _ in picks)  # 1% of the dataset
    assert store.shard_bytes() <= 0.02 * total, (store.shard_bytes() / total, samples / total)
    # The same samples again: nothing more from the store (their rows and indexes are here).
    before = store.shard_bytes()
    for i in picks:
        assert same(ds[i], local[i])
    assert store.shard_bytes() == before
    assert not list((tmp_path / "cache").rglob("*.tar"))  # no shard fetched whole


def test_a_flipped_byte_in_a_sample_read_by_range_is_a_checksum_mismatch(tmp_path):
    root, _ = make_dataset(tmp_path / "data", 200, shards=4, fields=("raw", "cls", "txt"), size=(32, 32))
    shard = load_manifest(root).shards[2]
    path = f"{root}/{shard.path}"
    with tarfile.open(path) as tar:
        member = next(m for m in tar.getmembers() if m.name.endswith(".raw"))
    data = bytearray(open(path, "rb").read())
    data[member.offset_data + 100] ^= 0x01  # same size, one bit of one value
    open(path, "wb").write(bytes(data))
    key = member.name.split(".")[0]
    store = Store.instant(root)
    try:
        ds = StreamingDataset(store.url, cache_dir=str(tmp_path / "cache"))
        with pytest.raises(ChecksumMismatch, match=rf"shard {store.url}/{shard.path} \(rows read by range\): field "
                                                   rf"'raw' of 1 sample\(s\) \('{key}'\)"):
            ds.get(key)
        index = ds.lookup.index_of(key)
        with pytest.raises(ChecksumMismatch, match=key):
            ds[index]  # never the wrong bytes, however it is asked for
        assert ds[index + 1]["__key__"] != key  # the rest of the shard reads
    finally:
        store.close()


@pytest.mark.parametrize("how", ["#1234", "key"])
def test_show_of_one_sample_on_a_cold_cache_is_three_round_trips(data, store, tmp_path, how):
    """The manifest, the sample's shard index, the sample: three requests to the store."""
    from shardkit.cli import main

    root, _ = data
    which = StreamingDataset(root, shuffle=False)[1234]["__key__"] if how == "key" else how
    result = CliRunner().invoke(main, ["show", store.url, which, "--cache-dir", str(tmp_path / "cache")])
    assert result.exit_code == 0, result.output
    assert "sample #1234" in result.output
    assert store.requests() == 3, (dict(store.gets), dict(store.heads))
    shard = next(s for s in load_manifest(root).shards if s.path in "".join(store.gets))
    assert store.shard_bytes() < shard.index["bytes"] + 2 * shard.bytes / shard.samples  # not the shard


def test_user_threads_sharing_one_remote_dataset_read_right_samples_while_an_epoch_runs(data, tmp_path):
    """ds[i] and ds.get from 8 threads on one dataset, and an epoch read in this process (num_workers=0)
    beside them: every sample is the local one. Before, the threads' rows read by range landed in
    each other's buffers (ChecksumMismatch: "the shard is corrupt") and an open shard was closed
    under another thread (KeyError)."""
    import threading

    import numpy as np

    from shardkit.loader import make_loader

    root, _ = data
    local = StreamingDataset(root, seed=3)
    with Store(root, latency=0.02, rate=None) as store:
        ds = StreamingDataset(store.url, cache_dir=str(tmp_path / "cache"), seed=3, connections=1, fetch_ahead=0)
        errors, read = [], []
        picks = np.random.default_rng(0).choice(2000, 160, replace=False).tolist()

        def user(t):
            try:
                for i in picks[t::8]:
                    assert same(ds[i], local[i]), i
                    assert same(ds.get(local[i]["__key__"]), local[i]), i
                    read.append(i)
            except BaseException as e:  # noqa: BLE001 — reported below
                errors.append(repr(e))

        def epoch():
            try:
                keys = [k for b in make_loader(ds, batch_size=50, num_workers=0) for k in b["__key__"]]
                assert keys == [k for b in make_loader(local, batch_size=50, num_workers=0) for k in b["__key__"]]
                read.append("epoch")
            except BaseException as e:  # noqa: BLE001
                errors.append(repr(e))

        threads = [threading.Thread(target=user, args=(t,)) for t in range(8)] + [threading.Thread(target=epoch)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == [] and len(read) == 161
