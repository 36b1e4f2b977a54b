"""A shard replaced by another build's (same path, same size) is an error or is fetched again, never
read as this build's: remote tar and Parquet, by ds[i] and by the loader, and cached copies of an
earlier build, over the throttled store on 127.0.0.1 (tests/throttled.py)."""

import hashlib
import os
import shutil

import pytest
import torch
from factory import make_samples, read_epoch, write_dataset
from throttled import Store

from shardkit.errors import ShardError
from shardkit.manifest import load_manifest
from shardkit.reader.dataset import StreamingDataset


def build(root, seed: int, fmt: str) -> str:
    """60 samples in 3 shards; another seed gives other pixels under the same keys and sizes."""
    write_dataset(root, make_samples(60, fields=("raw", "cls", "txt"), seed=seed), shards=3, fmt=fmt)
    return str(root)


def rebuilt_in_place(old: str, new: str) -> list[int]:
    """Copy `new`'s shard files over `old`'s where they have the same size (what a rebuild of the
    same samples leaves), keeping `old`'s manifest: the ids of the shards replaced."""
    replaced = []
    for a, b in zip(load_manifest(old).shards, load_manifest(new).shards):
        files = [(a.path, b.path)] + ([(a.index["path"], b.index["path"])] if a.index else [])
        if all(os.path.getsize(f"{old}/{x}") == os.path.getsize(f"{new}/{y}") for x, y in files):
            for x, y in files:
                shutil.copyfile(f"{new}/{y}", f"{old}/{x}")
            replaced.append(a.id)
    return replaced


def without_sums(root: str) -> None:
    """The manifest as a build before ShardInfo.sums wrote it."""
    import dataclasses

    from shardkit.manifest import write_manifest
    from shardkit.manifest.table import ShardTable

    manifest = load_manifest(root)
    manifest.shards = ShardTable.from_infos([dataclasses.replace(s, sums=None) for s in manifest.shards])
    write_manifest(root, manifest)


@pytest.fixture
def store():
    stores = []
    yield lambda root: stores.append(Store(root, latency=0.0, rate=None)) or stores[-1]
    for s in stores:
        s.close()


@pytest.mark.parametrize("fmt, where", [("parquet", "remote"), ("tar", "remote"), ("parquet", "local"),
                                        ("tar", "local"), ("parquet", "remote, manifest without sums")])
def test_a_shard_replaced_under_an_old_manifest_is_an_error_never_other_samples(tmp_path, store, fmt, where):
    old, new = build(tmp_path / "old", 0, fmt), build(tmp_path / "new", 1, fmt)
    if "without sums" in where:  # a build of an earlier version: the remote copy's sha256 is checked
        without_sums(old)
    replaced = rebuilt_in_place(old, new)
    assert replaced  # the same sizes: only a checksum the manifest vouches for can tell
    shard = load_manifest(old).shards[replaced[0]]
    first = sum(s.samples for s in load_manifest(old).shards[:replaced[0]])
    url = old if where == "local" else store(old).url
    ds = StreamingDataset(url, cache_dir=str(tmp_path / "lookup"))
    with pytest.raises(ShardError, match=rf"shard {url}/{shard.path}.*(changed since the build|replaced)"):
        ds[first]
    with pytest.raises(ShardError, match=rf"shard {url}/{shard.path}.*(changed since the build|replaced)"):
        StreamingDataset(url, cache_dir=str(tmp_path / "get")).get(shard.keys[1])
    with pytest.raises(ShardError, match=rf"shard {url}/{shard.path}.*(changed since the build|replaced)"):
        read_epoch(url, tmp_path / "loader")


@pytest.mark.parametrize("fmt", ["parquet", "tar"])
def test_a_cached_copy_of_an_earlier_build_is_fetched_again(tmp_path, store, fmt):
    served = tmp_path / "served"
    build(served, 0, fmt)
    url, cache = store(served).url, tmp_path / "cache"
    read_epoch(url, cache)
    [cached] = cache.rglob(f"data-00000.{fmt}")  # the shard, cached
    before = cached.read_bytes()
    shutil.rmtree(served)  # the dataset is rebuilt where it is served: same paths, mostly same sizes
    build(served, 1, fmt)
    _, got = read_epoch(url, cache)
    _, expected = read_epoch(str(served), tmp_path / "unused")
    assert [b["__key__"] for b in got] == [b["__key__"] for b in expected]
    for a, b in zip(got, expected):
        assert torch.equal(a["raw"], b["raw"])
    assert cached.read_bytes() != before  # replaced by the new build's


def test_a_cached_copy_of_another_build_that_another_reader_holds_is_refused(tmp_path, store):
    from shardkit.reader.cache import ShardCache

    served = tmp_path / "served"
    served.mkdir()
    (served / "f.bin").write_bytes(b"a" * 1000)
    url = store(served).url
    sha = lambda data: hashlib.sha256(data).hexdigest()  # noqa: E731
    reader = ShardCache(url, cache_dir=str(tmp_path / "cache"))
    path, pin = reader.pin("f.bin", sha(b"a" * 1000), 1000)  # a reader of the earlier build holds it
    try:
        (served / "f.bin").write_bytes(b"b" * 1000)  # rebuilt: same size
        other = ShardCache(url, cache_dir=str(tmp_path / "cache"))
        with pytest.raises(ShardError, match=rf"cached copy {path} of shard {url}/f.bin is of another build of the "
                                             r"dataset .*another process is reading it"):
            other.pin("f.bin", sha(b"b" * 1000), 1000)
    finally:
        pin.release()
    got, pin = other.pin("f.bin", sha(b"b" * 1000), 1000)  # let go of: fetched again
    pin.release()
    assert open(got, "rb").read() == b"b" * 1000


def test_a_copy_cached_before_stamps_is_hashed_once_and_kept_when_it_is_the_manifests(tmp_path, store):
    from shardkit.reader.cache import LOCK, ShardCache

    served = tmp_path / "served"
    served.mkdir()
    (served / "f.bin").write_bytes(b"a" * 1000)
    store_ = store(served)
    cache = ShardCache(store_.url, cache_dir=str(tmp_path / "cache"))
    path, pin = cache.pin("f.bin", hashlib.sha256(b"a" * 1000).hexdigest(), 1000)
    pin.release()
    open(path + LOCK, "w").close()  # what an earlier version left: an empty lock file
    path, pin = cache.pin("f.bin", hashlib.sha256(b"a" * 1000).hexdigest(), 1000)
    pin.release()
    assert store_.gets["/f.bin"] == 1  # not fetched again
    assert open(path + LOCK).read() == hashlib.sha256(b"a" * 1000).hexdigest()
    open(path + LOCK, "w").close()
    with pytest.raises(ShardError, match="checksum mismatch"):  # another build's sha256: hashed, fetched
        cache.pin("f.bin", hashlib.sha256(b"c" * 1000).hexdigest(), 1000)  # again, and the store's copy fails it
    assert store_.gets["/f.bin"] == 2 and not os.path.exists(path)


def test_a_disk_too_full_for_the_stamp_keeps_the_file_and_hashes_it_when_next_pinned(tmp_path, store, monkeypatch):
    """The stamp (a few bytes in the lock file) is the one write after a fetch: a disk that fills up
    just then must not turn into a raw OSError (the next write that matters names the disk), and a
    stamp cut short must not be read as another build's."""
    import errno

    import shardkit.reader.cache as cache_mod
    from shardkit.reader.cache import LOCK, ShardCache

    served = tmp_path / "served"
    served.mkdir()
    (served / "f.bin").write_bytes(b"a" * 1000)
    sha = hashlib.sha256(b"a" * 1000).hexdigest()
    store_ = store(served)
    cache = ShardCache(store_.url, cache_dir=str(tmp_path / "cache"))

    pwrite = os.pwrite

    def full(fd, data, offset):  # the disk fills up once the shard is in: at the lock file's stamp
        if os.readlink(f"/proc/self/fd/{fd}").endswith(LOCK):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return pwrite(fd, data, offset)

    with monkeypatch.context() as m:
        m.setattr(cache_mod.os, "pwrite", full)
        path, pin = cache.pin("f.bin", sha, 1000)
    pin.release()
    assert open(path, "rb").read() == b"a" * 1000 and open(path + LOCK).read() == ""
    with open(path + LOCK, "w") as f:
        f.write(sha[:10])  # a stamp the disk cut short
    path, pin = cache.pin("f.bin", sha, 1000)
    pin.release()
    assert store_.gets["/f.bin"] == 1 and open(path + LOCK).read() == sha  # hashed, kept, stamped


def test_a_remote_parquet_shard_whose_sums_the_manifest_records_is_not_hashed_again(tmp_path, store, monkeypatch):
    """One integrity check per byte: its values against checksums the manifest vouches for."""
    import shardkit.reader.download as download

    root = build(tmp_path / "data", 0, "parquet")
    assert all(s.sums for s in load_manifest(root).shards)
    monkeypatch.setattr(download, "sha256_file", lambda path: pytest.fail(f"{path} hashed whole"))
    _, got = read_epoch(store(root).url, tmp_path / "cache")
    _, expected = read_epoch(root, tmp_path / "unused")
    assert [b["__key__"] for b in got] == [b["__key__"] for b in expected]
