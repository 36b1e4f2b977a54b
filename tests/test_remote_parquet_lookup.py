"""One sample of a remote Parquet-only dataset by range, never its shard: ds[i] over the throttled
store on 127.0.0.1 (tests/throttled.py), its round trips and bytes counted by the store."""

import dataclasses

import pytest
import torch
from factory import make_dataset
from throttled import Store

from shardkit.errors import ChecksumMismatch, ShardError
from shardkit.manifest import load_manifest, write_manifest
from shardkit.reader.dataset import StreamingDataset


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """300 samples of 224x224 raw images (150 KB each) in 2 Parquet shards of ~23 MB."""
    return make_dataset(tmp_path_factory.mktemp("pq"), 300, shards=2, fmt="parquet",
                        fields=("jpg", "raw", "cls", "txt"), size=(224, 224))


def round_trips(spans) -> int:
    """The longest chain of GETs each sent after the one before it was answered: requests sent
    together (in one wave) count once."""
    depth = {}
    for received, answered, path, _ in sorted(spans):
        depth[(received, answered, path)] = 1 + max(
            (d for (r, a, _), d in depth.items() if a <= received), default=0)
    return max(depth.values(), default=0)


def same(a: dict, b: dict) -> bool:
    return a["__key__"] == b["__key__"] and torch.equal(a["raw"], b["raw"]) and a["cls"] == b["cls"] and \
        a["txt"] == b["txt"] and a["jpg"].shape == b["jpg"].shape


def test_one_parquet_sample_is_two_round_trips_and_a_few_pages(data, tmp_path):
    root, _ = data
    local = StreamingDataset(root)
    store = Store(root, latency=0.25, rate=None)  # GETs sent together arrive well within a latency
    try:
        ds = StreamingDataset(store.url, cache_dir=str(tmp_path / "cache"))
        len(ds)  # the manifest
        shard = load_manifest(root).shards[1]
        for i in (170, 299, 150):
            store.spans.clear()
            store.sent.clear()
            assert same(ds[i], local[i])
            store.quiet()  # every GET of this lookup in the log, none left to land in the next one's
            trips, nbytes = round_trips(store.spans), store.shard_bytes()
            # Cold shard: its tail (footer, page index), then its keys, checksums and the row's pages.
            assert trips <= (2 if i == 170 else 1), store.spans
            assert nbytes < 2 << 20 and nbytes < shard.bytes / 10, nbytes
        store.sent.clear()
        assert same(ds.get(local[20]["__key__"]), local[20])  # by key: the other shard's keys, then its row
        assert store.shard_bytes() < 2 << 20
        assert not list((tmp_path / "cache").rglob("*.parquet"))  # no shard fetched whole
    finally:
        store.close()


def test_a_flipped_byte_in_a_parquet_value_read_by_range_is_a_checksum_mismatch(tmp_path):
    root, _ = make_dataset(tmp_path / "data", 100, shards=1, fmt="parquet", fields=("raw", "cls"), size=(224, 224))
    shard = load_manifest(root).shards[0]
    local = StreamingDataset(root)
    path = f"{root}/{shard.path}"
    data = bytearray(open(path, "rb").read())
    at = bytes(data).index(local.lookup.stored(40, "raw")[:64])
    data[at + 1000] ^= 0x01  # same size, one bit of one value: its page's CRC is not read by slicing
    open(path, "wb").write(bytes(data))
    store = Store.instant(root)
    try:
        ds = StreamingDataset(store.url, cache_dir=str(tmp_path / "cache"))
        with pytest.raises(ChecksumMismatch, match=r"\(rows read by range\): field 'raw'"):
            ds[40]
        assert ds[41]["__key__"] == local[41]["__key__"]  # the rest of the shard reads
    finally:
        store.close()


def test_a_parquet_shard_whose_keys_changed_is_refused_when_read_by_range(tmp_path):
    """Values that pass their own checksums but are not the build's: ShardInfo.sums, checked over
    the keys and checksum columns read by range, refuses the shard before a value is served."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from shardkit.writers.parquet import write_parquet_table

    root, _ = make_dataset(tmp_path / "a", 60, shards=1, fmt="parquet", fields=("raw", "cls"), size=(32, 32))
    manifest = load_manifest(root)
    shard = manifest.shards[0]
    table = pq.read_table(f"{root}/{shard.path}")
    keys = table.column("__key__").to_pylist()
    keys[3] = keys[3][:-1] + ("x" if keys[3][-1] != "x" else "y")  # same length, still sorted enough
    table = table.set_column(0, "__key__", pa.array(keys))
    new = write_parquet_table(table, root, 0, manifest.fields)
    # The manifest keeps the build's keys and checksums digest (sums); its size is the new file's, as
    # a same-size replacement would be.
    write_manifest(root, dataclasses.replace(manifest, shards=[dataclasses.replace(shard, bytes=new.bytes)]))
    store = Store.instant(root)
    try:
        ds = StreamingDataset(store.url, cache_dir=str(tmp_path / "cache"))
        with pytest.raises(ShardError, match="not those the manifest records"):
            ds[10]
    finally:
        store.close()
