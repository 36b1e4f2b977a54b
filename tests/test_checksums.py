"""Per-member checksums: a flipped byte in a shard is an error naming shard and key, not wrong data."""

import json
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from factory import make_dataset

from shardkit.errors import ShardError
from shardkit.store.local import sha256_file
from shardkit.loader import make_loader
from shardkit.manifest import load_manifest
from shardkit.reader.dataset import StreamingDataset
from shardkit.reader.shards import read_shard_samples

CHECKSUM_SUFFIX = ".xxh3"  # the column beside each field that holds its checksums

KEY = "class1/s00013"  # in shard 1 of 4 (the factory's split of 40 samples)


def flip(path, offset: int) -> None:
    data = bytearray(open(path, "rb").read())
    data[offset] ^= 0x55
    open(path, "wb").write(bytes(data))


def flip_tar_member(root, key: str, field: str) -> str:
    """Flip one byte in the middle of member `key.field` of whichever tar shard holds it."""
    for shard in load_manifest(root).shards_of("tar"):
        index = pq.read_table(os.path.join(root, shard.index["path"])).to_pylist()
        for row in index:
            if row["__key__"] == key:
                flip(os.path.join(root, shard.path), row[f"{field}.offset"] + row[f"{field}.size"] // 2)
                return shard.path
    raise AssertionError(f"{key} not found")


def flip_parquet_value(root, value: bytes) -> str:
    """Flip one byte in the middle of `value` where it lies in a Parquet data page."""
    for shard in load_manifest(root).shards_of("parquet"):
        path = os.path.join(root, shard.path)
        at = open(path, "rb").read().find(value)
        if at >= 0:
            flip(path, at + len(value) // 2)
            return shard.path
    raise AssertionError("value not found in any Parquet shard")


def read_all(root, fmt, **options):
    ds = StreamingDataset(root, format=fmt, shuffle=False, **options)
    return ds, list(make_loader(ds, batch_size=8, num_workers=0))


@pytest.mark.parametrize("fmt,field", [("tar", "raw"), ("tar", "jpg"), ("parquet", "raw"), ("parquet", "jpg")])
def test_flipped_byte_names_shard_and_key(tmp_path, fmt, field):
    root, expected = make_dataset(tmp_path / "d", 40, fmt="both", fields=("jpg", "raw", "cls"))
    if fmt == "tar":
        rel = flip_tar_member(root, KEY, field)
    else:
        rel = flip_parquet_value(root, expected[KEY].fields[field])
    with pytest.raises(ShardError, match=rf"shard {root}/{rel}: field '{field}' of 1 sample\(s\) \('{KEY}'\)"):
        read_all(root, fmt, fields=(field,))


@pytest.mark.parametrize("fmt", ["tar", "parquet"])
def test_skip_leaves_out_the_sample_and_counts_it(tmp_path, fmt):
    root, expected = make_dataset(tmp_path / "d", 40, fmt="both", fields=("raw", "cls"))
    if fmt == "tar":
        flip_tar_member(root, KEY, "raw")
    else:
        flip_parquet_value(root, expected[KEY].fields["raw"])
    ds = StreamingDataset(root, format=fmt, shuffle=False, on_error="skip")
    batches = list(make_loader(ds, batch_size=8, num_workers=2))
    keys = [k for b in batches for k in b["__key__"]]
    assert sorted(keys) == sorted(set(expected) - {KEY})  # one sample out, the rest of its shard in
    assert ds.skipped_samples == 1 and ds.skipped_shards == []
    for b in batches:
        for k, raw in zip(b["__key__"], b["raw"]):
            assert raw.permute(1, 2, 0).numpy().tobytes() == expected[k].fields["raw"]


def test_opt_out_reads_without_checking(tmp_path):
    root, expected = make_dataset(tmp_path / "d", 40, fields=("raw", "cls"))
    flip_tar_member(root, KEY, "raw")
    _, batches = read_all(root, "tar", checksums=False)
    got = {k: raw for b in batches for k, raw in zip(b["__key__"], b["raw"])}
    assert len(got) == 40
    assert got[KEY].permute(1, 2, 0).numpy().tobytes() != expected[KEY].fields["raw"]  # wrong, unchecked


def spoil_tar_member(root, key: str, field: str) -> None:
    """Set the first byte of member `key.field` to 0xff: neither UTF-8, JSON nor an int."""
    for shard in load_manifest(root).shards_of("tar"):
        for row in pq.read_table(os.path.join(root, shard.index["path"])).to_pylist():
            if row["__key__"] == key:
                with open(os.path.join(root, shard.path), "r+b") as f:
                    f.seek(row[f"{field}.offset"])
                    f.write(b"\xff")
                return
    raise AssertionError(f"{key} not found")


def spoil_parquet_text(root, key: str, field: str) -> None:
    """Rewrite the Parquet shard holding `key` with bytes that are not UTF-8 in its `field` value
    (the checksum column kept), and the manifest's size and sha256 to match."""
    m = json.load(open(os.path.join(root, "manifest.json")))
    for shard in m["shards"]:
        path = os.path.join(root, shard["path"])
        if shard["format"] != "parquet" or key not in pq.read_table(path, columns=["__key__"])[0].to_pylist():
            continue
        t = pq.read_table(path)
        values = [b"\xff" + v.encode() if k == key else v.encode() for k, v in zip(t["__key__"].to_pylist(),
                                                                                  t[field].to_pylist())]
        t = t.set_column(t.schema.get_field_index(field), field, pa.array(values, pa.binary()).view(pa.string()))
        pq.write_table(t, path)
        shard["bytes"], shard["sha256"] = os.path.getsize(path), sha256_file(path)
    json.dump(m, open(os.path.join(root, "manifest.json"), "w"))


@pytest.mark.parametrize("fmt,field", [("tar", "txt"), ("tar", "json"), ("tar", "cls"), ("parquet", "txt"),
                                       ("parquet", "json")])
def test_bytes_that_do_not_parse_are_a_checksum_mismatch(tmp_path, fmt, field):
    """A damaged text, JSON or int value is checked before it is parsed: a ChecksumMismatch (or a
    counted skip), never a UnicodeDecodeError out of the reader."""
    root, expected = make_dataset(tmp_path / "d", 40, fmt=fmt, fields=("cls", "txt", "json"))
    (spoil_tar_member if fmt == "tar" else spoil_parquet_text)(root, KEY, field)
    with pytest.raises(ShardError, match=rf"field '{field}' of 1 sample\(s\) \('{KEY}'\) differs from the checksum"):
        read_all(root, fmt)
    ds, batches = read_all(root, fmt, on_error="skip")
    assert sorted(k for b in batches for k in b["__key__"]) == sorted(set(expected) - {KEY})
    assert ds.skipped_samples == 1
    # Unchecked, the bytes still never reach a batch as a value: an error naming the sample.
    with pytest.raises(ShardError, match=rf"field '{field}' of sample '{KEY}' is not valid"):
        read_all(root, fmt, checksums=False)


@pytest.mark.parametrize("column", ["__key__", "txt"])
def test_a_string_column_stored_as_binary_is_refused(tmp_path, column):
    """One flipped byte in a Parquet footer can drop a column's string annotation: its values would
    pass their checksums and reach the batch as bytes instead of str."""
    root, _ = make_dataset(tmp_path / "d", 12, shards=1, fmt="parquet", fields=("cls", "txt"))
    m = json.load(open(os.path.join(root, "manifest.json")))
    path = os.path.join(root, m["shards"][0]["path"])
    t = pq.read_table(path)
    t = t.set_column(t.schema.get_field_index(column), column, t[column].cast(pa.binary()))
    pq.write_table(t, path)
    m["shards"][0].update(bytes=os.path.getsize(path), sha256=sha256_file(path))
    json.dump(m, open(os.path.join(root, "manifest.json"), "w"))
    with pytest.raises(ShardError, match=rf"column '{column}' has Arrow type binary, expected string: the shard's "
                                         "footer is corrupt"):
        read_all(root, "parquet")


@pytest.mark.parametrize("damage", ["offset", "name"])
def test_a_damaged_tar_index_is_refused(tmp_path, damage):
    """A flipped byte in the index sidecar can make an offset negative (read as 'sample lacks the
    field') or rename a column (the whole field absent): the values would silently be None."""
    root, _ = make_dataset(tmp_path / "d", 12, shards=1, fields=("cls", "txt"))
    path = os.path.join(root, load_manifest(root).shards_of("tar")[0].index["path"])
    t = pq.read_table(path)
    if damage == "offset":
        offsets = t["txt.offset"].to_pylist()
        offsets[5] = -2089670227099851776
        t = t.set_column(t.schema.get_field_index("txt.offset"), "txt.offset", pa.array(offsets, pa.int64()))
    else:
        t = t.rename_columns([n.replace("txt.offset", "txu.offset") for n in t.column_names])
    pq.write_table(t, path)
    with pytest.raises(ShardError, match=r"the index of shard .*data-00000.tar \(shards/data-00000.tar.idx.parquet, "
                                         r"\d+ bytes\) does not match the manifest's sha256"):
        read_all(root, "tar")
    if damage == "offset":  # unchecked, the value is silently gone: what the check prevents
        _, batches = read_all(root, "tar", checksums=False)
        assert None in [t for b in batches for t in b["txt"]]


def test_read_shard_samples_checks_too(tmp_path):
    root, _ = make_dataset(tmp_path / "d", 40, fields=("raw", "txt"))
    flip_tar_member(root, KEY, "txt")
    m = load_manifest(root)
    with pytest.raises(ShardError, match=f"field 'txt' of 1 sample.*'{KEY}'"):
        read_shard_samples(root, m, m.shards_of("tar")[1])


def _drop_checksums(root) -> None:
    """Rewrite a dataset as shardkit wrote it before checksums existed (no .xxh3 columns)."""
    m = json.load(open(os.path.join(root, "manifest.json")))
    for shard in m["shards"]:
        shard.pop("sums", None)  # recorded since, with the checksum columns it digests
        entry = shard.get("index") or shard
        path = os.path.join(root, entry["path"])
        t = pq.read_table(path)
        t = t.select([n for n in t.column_names if not n.endswith(CHECKSUM_SUFFIX)])
        pq.write_table(t, path)
        entry["bytes"], entry["sha256"] = os.path.getsize(path), sha256_file(path)
    json.dump(m, open(os.path.join(root, "manifest.json"), "w"))


@pytest.mark.parametrize("fmt", ["tar", "parquet"])
def test_datasets_without_checksums_stay_readable(tmp_path, fmt):
    root, expected = make_dataset(tmp_path / "d", 40, fmt=fmt, fields=("raw", "cls", "txt"))
    _drop_checksums(root)
    _, batches = read_all(root, fmt)
    got = {k: (raw, t) for b in batches for k, raw, t in zip(b["__key__"], b["raw"], b["txt"])}
    assert set(got) == set(expected)
    for k, (raw, t) in got.items():
        assert raw.permute(1, 2, 0).numpy().tobytes() == expected[k].fields["raw"] and t == expected[k].fields["txt"]


def test_writers_record_a_checksum_per_member(tmp_path):
    root, _ = make_dataset(tmp_path / "d", 12, shards=1, fmt="both", fields=("raw", "cls", "txt"))
    m = load_manifest(root)
    index = pq.read_table(os.path.join(root, m.shards_of("tar")[0].index["path"]))
    table = pq.read_table(os.path.join(root, m.shards_of("parquet")[0].path))
    for t in (index, table):
        for field in ("raw", "cls", "txt"):
            sums = t.column(field + CHECKSUM_SUFFIX)
            assert sums.type == pa.uint64() and sums.null_count == 0
            assert len(np.unique(sums.to_numpy())) > 1
    # Formats store raw bytes alike: the same value, the same checksum.
    assert index.column("raw.xxh3").equals(table.column("raw.xxh3"))


def test_parquet_keys_are_covered_by_page_crcs(tmp_path):
    root, _ = make_dataset(tmp_path / "d", 40, fmt="parquet", fields=("raw", "cls"))
    shard = load_manifest(root).shards_of("parquet")[1]
    path = os.path.join(root, shard.path)
    meta = pq.ParquetFile(path).metadata
    names = [meta.schema.column(i).name for i in range(meta.num_columns)]
    chunk = meta.row_group(0).column(names.index("__key__"))
    start = chunk.dictionary_page_offset or chunk.data_page_offset
    flip(path, start + chunk.total_compressed_size - 4)  # inside the column chunk's last page
    with pytest.raises(ShardError, match=rf"shard {root}/{shard.path}: cannot read keys.*CRC"):
        read_all(root, "parquet")


def test_a_missing_local_shard_says_the_folder_is_incomplete(tmp_path):
    root, _ = make_dataset(tmp_path / "d", 40)
    os.remove(os.path.join(root, "shards", "data-00002.tar"))
    with pytest.raises(ShardError, match=r"shard .*/shards/data-00002.tar is missing \(No such file or directory"):
        read_all(root, "tar")
    m = load_manifest(root)
    with pytest.raises(ShardError, match=r"data-00002.tar is missing .* rebuild it with `shardkit build`"):
        read_shard_samples(root, m, m.shards_of("tar")[2])
