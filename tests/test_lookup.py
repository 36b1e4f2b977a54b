"""Random access: ds[i] and ds.get(key) return what streaming yields, local and over http; key bounds."""

import json
import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from factory import make_dataset
from test_checksums import flip_parquet_value, flip_tar_member
from test_remote import served  # noqa: F401  (fixture)

from shardkit.config import BuildConfig
from shardkit.errors import ChecksumMismatch, IndexOutOfRange, SampleNotFound
from shardkit.jobs.build import build
from shardkit.store.local import sha256_file
from shardkit.manifest import ShardTable, load_manifest
from shardkit.reader.dataset import StreamingDataset

FIELDS = ("jpg", "raw", "cls", "txt", "json")


def same(a: dict, b: dict) -> bool:
    if a.keys() != b.keys():
        return False
    return all(torch.equal(a[k], b[k]) if isinstance(a[k], torch.Tensor) else a[k] == b[k] for k in a)


def streamed(root, **options) -> list[dict]:
    return list(StreamingDataset(root, shuffle=False, **options))


@pytest.mark.parametrize("fmt", ["tar", "parquet"])
def test_index_and_key_return_what_streaming_yields(tmp_path, fmt):
    root, _ = make_dataset(tmp_path / "d", 30, shards=4, fmt="both", fields=FIELDS)
    expected = streamed(root, format=fmt)
    ds = StreamingDataset(root, format=fmt, seed=3)  # shuffling streams does not change indices
    assert len(expected) == 30 and all("jpg" in s and "json" in s for s in expected)
    for i in (0, 6, 7, 17, 29):  # first, either side of a shard boundary, the last
        assert same(ds[i], expected[i])
        assert same(ds.get(expected[i]["__key__"]), expected[i])
    assert same(ds[-1], expected[-1]) and same(ds[-30], expected[0])
    assert [ds.lookup.index_of(s["__key__"]) for s in expected] == list(range(30))


def test_transform_and_fields_apply_as_when_streaming(tmp_path):
    root, _ = make_dataset(tmp_path / "d", 12, shards=2, fields=FIELDS)
    def tf(s):
        return {**s, "n": len(s["txt"])}
    ds = StreamingDataset(root, fields=["txt", "cls"], transform=tf, shuffle=False)
    assert same(ds[5], list(ds)[5]) and set(ds[5]) == {"__key__", "txt", "cls", "n"}


def test_bad_index_and_missing_key_are_clear_errors(tmp_path):
    root, _ = make_dataset(tmp_path / "d", 10, shards=2, fields=("txt",))
    ds = StreamingDataset(root)
    for bad in (10, -11, 10**12):
        with pytest.raises(IndexOutOfRange, match=r"valid indices are 0\.\.9 \(or -10\.\.-1"):
            ds[bad]
    with pytest.raises(IndexError):  # a Python sequence's error, for code that catches that
        ds[10]
    with pytest.raises(TypeError, match="use ds.get"):
        ds["class0/s00000"]
    with pytest.raises(SampleNotFound, match=f"'class9/nope' in dataset {root}") as e:
        ds.get("class9/nope")
    assert isinstance(e.value, KeyError) and "'class9/nope'" in str(e.value)
    with pytest.raises(SampleNotFound):  # a key between two shards' bounds, and one past the last
        ds.get("class0/s00000x")
    with pytest.raises(SampleNotFound):
        ds.get("zzz")
    assert ds.get("class9/nope", None) is None and ds.get("", "d") == "d"
    with pytest.raises(TypeError, match=r"use ds\[i\]"):
        ds.get(3)


def test_writers_record_key_bounds_that_the_manifest_keeps(tmp_path):
    root, samples = make_dataset(tmp_path / "d", 40, shards=4, fmt="both", fields=("txt",))
    manifest = load_manifest(root)
    for fmt in ("tar", "parquet"):
        table = manifest.shards_of(fmt)
        first, last = table.key_bounds()
        keys = sorted(samples)
        ends = [0] + table.samples.cumsum().tolist()
        assert first.tolist() == [keys[a] for a in ends[:-1]]
        assert last.tolist() == [keys[b - 1] for b in ends[1:]]
        assert [s.keys for s in table] == list(zip(first, last))


def test_a_build_records_ascending_key_bounds(tmp_path):
    from shardkit.demo.datagen import raw_folder

    raw_folder(str(tmp_path / "raw"), images_per_class=4, documents=3, seed=2)
    build(BuildConfig(src=str(tmp_path / "raw"), out=str(tmp_path / "out"), format="both", workers=0,
                      progress=False, shard_size=20_000))
    for fmt in ("tar", "parquet"):
        first, last = load_manifest(str(tmp_path / "out")).shards_of(fmt).key_bounds()
        assert len(first) > 2 and None not in first.tolist()
        assert all(a <= b < c for a, b, c in zip(first, last, first[1:]))
    ds = StreamingDataset(str(tmp_path / "out"))
    for i, sample in enumerate(ds):
        assert ds.get(sample["__key__"])["__key__"] == sample["__key__"]


def _strip_bounds(root) -> None:
    """Rewrite the dataset's manifest (inline records and shard table) as a shardkit without key bounds
    wrote it."""
    meta = json.load(open(os.path.join(root, "manifest.json")))
    for record in meta.get("shards", []):
        del record["keys"]
    path = os.path.join(root, meta["shard_table"]["path"])
    table = pq.read_table(path).drop_columns(["first_key", "last_key"])
    pq.write_table(table, path)
    meta["shard_table"].update(bytes=os.path.getsize(path), sha256=sha256_file(path))
    json.dump(meta, open(os.path.join(root, "manifest.json"), "w"))


def test_dataset_without_key_bounds_is_scanned_once_per_shard(tmp_path, monkeypatch):
    root, samples = make_dataset(tmp_path / "d", 40, shards=4, fields=("txt", "cls"))
    _strip_bounds(root)
    table = load_manifest(root).shards_of("tar")
    assert all(s.keys is None for s in table)
    ds = StreamingDataset(root, shuffle=False)
    expected = list(ds)
    scanned = []
    shard = ds.reader.shard  # a key lookup opens the shard for its keys alone (no rows)
    monkeypatch.setattr(ds.reader, "shard", lambda s, rows=(): (len(rows) or scanned.append(s), shard(s, rows))[1])
    assert same(ds.get(expected[25]["__key__"]), expected[25])  # shards 0..2 scanned
    assert scanned == [0, 1, 2]
    with pytest.raises(SampleNotFound):
        ds.get("nope")  # the last shard scanned: every bound is known now
    assert scanned == [0, 1, 2, 3] and ds.lookup.held is not None
    assert same(ds.get(expected[3]["__key__"]), expected[3]) and scanned[-1] == 0  # one shard: binary search


def test_old_shard_table_without_bound_columns_loads(tmp_path):
    table = ShardTable.from_infos(load_manifest(make_dataset(tmp_path / "d", 8, shards=2, fields=("txt",))[0]).shards)
    old = pq.read_table(pa.BufferReader(table.blob)).drop_columns(["first_key", "last_key"])
    sink = pa.BufferOutputStream()
    pq.write_table(old, sink)
    loaded = ShardTable(sink.getvalue().to_pybytes())
    assert [s.keys for s in loaded] == [None, None] and loaded.key_bounds()[0].tolist() == [None, None]
    assert [s.path for s in loaded] == [s.path for s in table]


@pytest.mark.parametrize("fmt", ["tar", "parquet"])
def test_corrupt_byte_under_lookup_is_a_checksum_mismatch(tmp_path, fmt):
    root, samples = make_dataset(tmp_path / "d", 40, fmt="both", fields=("raw", "txt"))
    key = "class1/s00013"
    if fmt == "tar":
        flip_tar_member(root, key, "raw")
    else:
        flip_parquet_value(root, samples[key].fields["raw"])
    ds = StreamingDataset(root, format=fmt)
    with pytest.raises(ChecksumMismatch, match=f"'{key}'"):
        ds.get(key)
    assert ds.get("class1/s00016")["__key__"] == "class1/s00016"  # the rest of the shard reads


@pytest.mark.parametrize("fmt", ["tar", "parquet"])
def test_lookup_over_http_through_the_shard_cache(served, tmp_path, fmt):  # noqa: F811
    root, url, gets, _ = served
    # the served dataset is tar only; write its Parquet twin beside it for this format
    if fmt == "parquet":
        root, _ = make_dataset(os.path.join(root, "pq"), 36, shards=4, fmt="parquet", fields=("raw", "cls", "txt"))
        url += "/pq"
    expected = streamed(root)
    ds = StreamingDataset(url, cache_dir=str(tmp_path / "cache"))
    for i in (0, 20, -1):
        assert same(ds[i], expected[i])
        assert same(ds.get(expected[i]["__key__"]), expected[i])
    fetched = {p for p in gets if "/shards/" in p}
    # http.server ignores Range: the first tar sample's ranged GET came back whole, so from then on
    # shards are fetched whole, each once, and cached (over a store that honours Range a tar sample
    # is read alone: test_remote_lookup.py). A Parquet shard's tail is read by range first: these
    # shards are smaller than that tail, so the one GET brings the whole file (into memory, not the
    # cache), whether or not the store honours Range (test_remote_parquet_lookup.py).
    retried = {"/shards/data-00000.tar"} if fmt == "tar" else set()
    assert fetched and all(gets[p] == 1 + (p in retried) for p in fetched)
    assert list((tmp_path / "cache").rglob(f"*.{fmt}")) or fmt == "parquet"
    with pytest.raises(SampleNotFound, match=f"in dataset {url}"):
        ds.get("class0/missing")


def test_lookups_over_http_keep_the_cache_within_its_limit(served, tmp_path):  # noqa: F811
    root, url, _, _ = served
    expected = streamed(root)
    cache = tmp_path / "cache"
    largest = max(f.stat().st_size for f in (tmp_path / "data").rglob("*") if f.is_file())
    limit = int(largest * 1.5)  # room for about one shard: a lookup pins the shard it reads, no more
    ds = StreamingDataset(url, cache_dir=str(cache), cache_limit=limit)
    for i in (0, 12, 25, 35, 3, 20):  # every shard of 4, one after the other, and back
        assert same(ds[i], expected[i]) and same(ds.get(expected[i]["__key__"]), expected[i])
        held = sum(f.stat().st_size for f in cache.rglob("*") if f.is_file() and not f.name.endswith(".lock"))
        assert held <= limit + largest, f"the cache holds {held} bytes after a lookup, limit {limit}"
