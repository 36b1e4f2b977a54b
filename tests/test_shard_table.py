"""The shard table beside manifest.json: columnar shard records, version 1 inline below a size, 2 above."""

import json

import pytest
import torch
from factory import make_dataset

import shardkit.manifest as manifest_module
from shardkit.contract import ShardInfo
from shardkit.errors import ManifestError
from shardkit.manifest import TABLE_NAME, Manifest, ShardTable, load_manifest, write_manifest
from shardkit.reader.dataset import StreamingDataset


def read(root, **options):
    return [(s["__key__"], s["raw"]) for s in StreamingDataset(root, seed=3, **options)]


def test_small_datasets_stay_readable_by_version_1_readers(tmp_path):
    root, _ = make_dataset(tmp_path, 20, shards=3, fmt="both")
    d = json.loads((tmp_path / "manifest.json").read_text())
    assert d["version"] == 1 and len(d["shards"]) == 6  # what an older shardkit reads
    assert d["shard_table"]["rows"] == 6 and (tmp_path / TABLE_NAME).stat().st_size == d["shard_table"]["bytes"]
    m = load_manifest(root)
    assert list(m.shards) == [ShardInfo.from_dict(s) for s in d["shards"]]


def test_large_datasets_keep_shards_only_in_the_table(tmp_path, monkeypatch):
    root, _ = make_dataset(tmp_path / "inline", 30, shards=4, fmt="both")
    want = read(root)
    monkeypatch.setattr(manifest_module, "INLINE_SHARDS", 3)
    m = load_manifest(root)
    write_manifest(str(tmp_path / "inline"), m)  # rewritten: now above the inline limit
    d = json.loads((tmp_path / "inline" / "manifest.json").read_text())
    assert d["version"] == 2 and "shards" not in d
    again = load_manifest(root)
    assert list(again.shards) == list(m.shards) and again.formats == ["parquet", "tar"]
    got = read(root)
    assert [k for k, _ in got] == [k for k, _ in want]
    assert all(torch.equal(a, b) for (_, a), (_, b) in zip(got, want))
    assert [s.id for s in again.shards_of("tar")] == [0, 1, 2, 3]


def test_same_records_give_the_same_table_bytes(tmp_path):
    infos = [ShardInfo(i, "tar", f"shards/data-{i:05d}.tar", 10 + i, 100, "ab" * 32,
                       {"path": f"shards/data-{i:05d}.tar.idx.parquet", "bytes": 7, "sha256": "cd" * 32})
             for i in range(2500)]
    a, b = ShardTable.from_infos(infos), ShardTable.from_infos(list(reversed(infos)))
    assert a.to_parquet() == b.to_parquet() and a == b
    assert list(a.samples[:3]) == [10, 11, 12] and a[2400] == infos[2400] and a[-1] == infos[-1]
    assert a[3:5] == infos[3:5] and len(a) == 2500


def test_fields_beyond_the_typed_columns_travel_as_json():
    info = ShardInfo(3, "tar", "shards/data-00003.tar", 5, 9, "ff",
                     {"path": "shards/data-00003.tar.idx.parquet", "bytes": 1, "sha256": "ee", "checksum": "crc32c"})
    plain = ShardInfo(4, "parquet", "shards/data-00004.parquet", 5, 9, "dd")
    table = ShardTable.from_infos([info, plain])
    assert list(table) == [info, plain]
    assert table.of("parquet")[0] == plain and len(table.of("tar")) == 1


@pytest.mark.parametrize("damage", ["replaced", "missing"])
def test_a_damaged_or_missing_table_is_named(tmp_path, monkeypatch, damage):
    monkeypatch.setattr(manifest_module, "INLINE_SHARDS", 1)
    root, _ = make_dataset(tmp_path, 12, shards=3)
    table = tmp_path / TABLE_NAME
    if damage == "missing":
        table.unlink()
        match = "cannot read the shard table"
    else:
        table.write_bytes(ShardTable.from_infos(list(load_manifest(root).shards)[:2]).to_parquet())
        match = "does not match manifest.json"
    with pytest.raises(ManifestError, match=match):
        load_manifest(root)


@pytest.mark.parametrize("bad", ["../outside.tar", "/etc/passwd", "shards/../../x.tar", "c:\\x.tar", None])
@pytest.mark.parametrize("column", ["path", "index_path"])
def test_unsafe_paths_in_the_table_are_rejected(tmp_path, monkeypatch, bad, column):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from shardkit.store.local import sha256_bytes

    monkeypatch.setattr(manifest_module, "INLINE_SHARDS", 0)
    root, _ = make_dataset(tmp_path, 12, shards=3)
    table = pq.read_table(tmp_path / TABLE_NAME)  # a table written by hand, around shardkit's checks
    values = table.column(column).to_pylist()
    values[1] = bad
    table = table.set_column(table.column_names.index(column), column, pa.array(values, pa.string()))
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    blob = sink.getvalue().to_pybytes()
    (tmp_path / TABLE_NAME).write_bytes(blob)
    d = json.loads((tmp_path / "manifest.json").read_text())
    d["shard_table"].update(bytes=len(blob), sha256=sha256_bytes(blob))
    (tmp_path / "manifest.json").write_text(json.dumps(d))
    if bad is None and column == "index_path":
        assert load_manifest(root).shards[1].index is None  # no index record: a legal tar shard
        return
    with pytest.raises(ManifestError, match="shard path"):
        load_manifest(root)
    with pytest.raises(ManifestError, match="shard path"):  # nor can a manifest be made with one
        Manifest(samples=1, fields={}, shards=[ShardInfo(0, "tar", bad or "", 1, 1, "00")])


def test_a_version_2_manifest_needs_its_folder():
    d = {"format": "shardkit", "version": 2, "samples": 1, "fields": {},
         "shard_table": {"path": TABLE_NAME, "rows": 1, "bytes": 1, "sha256": "00"}}
    with pytest.raises(ManifestError, match="load_manifest"):
        Manifest.from_dict(d)
