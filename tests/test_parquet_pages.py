"""Parquet values sliced by offset from the mapped file: same bytes as pyarrow, no row-group decode."""

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from factory import make_dataset

from shardkit.contract import ShardInfo
from shardkit.store.local import sha256_file
from shardkit.manifest import load_manifest
from shardkit.reader import shards as shards_module
from shardkit.reader.dataset import StreamingDataset
from shardkit.reader.shards import ByteLRU, ParquetShard

SPECS = {"raw": {"kind": "image", "encoding": "raw", "dtype": "uint8", "shape": [4, 5, 3]},
         "jpg": {"kind": "image", "encoding": "jpeg"}}


def write(path, rows: int, **options) -> ParquetShard:
    """A Parquet file with a fixed-size and a variable-size binary column, some values null."""
    rng = np.random.default_rng(1)
    raw = [None if i % 7 == 3 else rng.integers(0, 256, 60, dtype=np.uint8).tobytes() for i in range(rows)]
    jpg = [None if i % 5 == 1 else rng.bytes(int(rng.integers(0, 300))) for i in range(rows)]
    table = pa.table({"__key__": [f"k{i:04d}" for i in range(rows)], "raw": pa.array(raw, pa.binary(60)),
                      "jpg": pa.array(jpg, pa.binary())})
    pq.write_table(table, path, **options)
    info = ShardInfo(0, "parquet", "x.parquet", rows, path.stat().st_size, sha256_file(path))
    return ParquetShard(str(path), info, SPECS, str(path), ByteLRU(1 << 20)), raw, jpg


PLAIN = {"compression": "none", "use_dictionary": ["__key__"]}


@pytest.mark.parametrize("options", [
    dict(PLAIN, row_group_size=50),                                  # what shardkit writes
    dict(PLAIN, row_group_size=200, data_page_size=2000),            # many pages per chunk
    dict(PLAIN, row_group_size=64, data_page_version="2.0"),        # version-2 data pages
])
def test_offsets_give_the_values_pyarrow_reads(tmp_path, options):
    shard, raw, jpg = write(tmp_path / "x.parquet", 333, **options)
    assert shard.direct("raw") is not None and shard.direct("jpg") is not None
    rows = np.random.default_rng(0).permutation(333)
    out = np.zeros((333, 60), np.uint8)
    present = shard.fill("raw", rows, out, np.arange(333))
    for i, r in enumerate(rows.tolist()):
        assert present[i] == (raw[r] is not None)
        assert raw[r] is None or out[i].tobytes() == raw[r]
    assert shard.values("jpg", rows) == [jpg[r] for r in rows.tolist()]
    assert shard.cache.bytes == 0  # no row group was decoded


@pytest.mark.parametrize("options", [
    {"compression": "zstd", "row_group_size": 50},                   # compressed
    {"compression": "none", "row_group_size": 50},                   # dictionary-encoded (the default)
])
def test_other_layouts_fall_back_to_row_groups(tmp_path, options):
    shard, raw, jpg = write(tmp_path / "x.parquet", 120, **options)
    assert shard.direct("raw") is None and shard.direct("jpg") is None
    out = np.zeros((120, 60), np.uint8)
    present = shard.fill("raw", np.arange(120), out, np.arange(120))
    assert [out[i].tobytes() if p else None for i, p in enumerate(present)] == raw
    assert shard.values("jpg", np.arange(120)) == jpg and shard.cache.bytes > 0


def test_shuffled_epoch_reads_media_without_row_groups(tmp_path, monkeypatch):
    root, _ = make_dataset(tmp_path, 60, shards=2, fmt="both", fields=("jpg", "raw", "cls", "txt"),
                           text_only_every=5)
    decoded = []
    original = ParquetShard._group
    monkeypatch.setattr(ParquetShard, "_group", lambda self, i, field: decoded.append(field) or
                        original(self, i, field))
    par = list(StreamingDataset(root, format="parquet", seed=2).batches(8))
    assert decoded and not {"raw", "jpg"} & set(decoded)  # labels and text still go through row groups
    tar = list(StreamingDataset(root, format="tar", seed=2).batches(8))
    for a, b in zip(par, tar):
        assert a["__key__"] == b["__key__"] and a["txt"] == b["txt"]
        for name in ("raw", "jpg", "cls"):
            x, y = (a[name], b[name]) if isinstance(a[name], list) else ([a[name]], [b[name]])
            assert all(same(u, v) for u, v in zip(x, y))


def same(u, v) -> bool:
    return torch.equal(u, v) if isinstance(u, torch.Tensor) else u == v


def test_a_damaged_page_header_falls_back_and_names_the_shard(tmp_path):
    from shardkit.errors import ShardError

    root, _ = make_dataset(tmp_path, 20, shards=1, fmt="parquet", fields=("raw", "cls"))
    shard = load_manifest(root).shards_of("parquet")[0]
    path = tmp_path / shard.path
    meta = pq.ParquetFile(path).metadata
    column = [meta.schema.column(i).path for i in range(meta.num_columns)].index("raw")
    at = meta.row_group(0).column(column).data_page_offset
    data = bytearray(path.read_bytes())
    data[at:at + 8] = b"\xff" * 8
    path.write_bytes(bytes(data))
    reader = shards_module.open_shard(str(path), shard, load_manifest(root).fields, str(path))
    assert reader.direct("raw") is None
    with pytest.raises(ShardError, match="data-00000.parquet"):
        list(StreamingDataset(root, format="parquet", shuffle=False).batches(4))


def test_both_formats_stream_from_tar_unless_asked(tmp_path):
    root, _ = make_dataset(tmp_path, 12, shards=2, fmt="both", fields=("raw", "cls", "txt"))
    assert StreamingDataset(root).shards.formats == ["tar"]
    assert StreamingDataset(root, fields=["txt", "cls"]).shards.formats == ["tar"]
    assert StreamingDataset(root, format="parquet").shards.formats == ["parquet"]
    only, _ = make_dataset(tmp_path / "p", 12, shards=2, fmt="parquet", fields=("raw", "cls"))
    assert StreamingDataset(only).shards.formats == ["parquet"]
