"""Shard readers and StreamingDataset read paths: round trips, fields, corrupt shards, interop."""

import json

import numpy as np
import pytest
import torch
from factory import make_dataset

from shardkit.errors import ConfigError, ShardError
from shardkit.manifest import load_manifest
from shardkit.reader.dataset import StreamingDataset
from shardkit.reader.decode import decode_image
from shardkit.reader.shards import read_shard_samples

ALL = ("jpg", "raw", "cls", "txt", "json")


def expect_image(sample, got):
    want = torch.from_numpy(np.array(decode_image(sample.fields["jpg"]))).permute(2, 0, 1)
    assert torch.equal(got, want)


@pytest.mark.parametrize("fmt", ["tar", "parquet"])
def test_read_shard_samples_round_trip(tmp_path, fmt):
    root, expected = make_dataset(tmp_path, 23, shards=3, fmt=fmt, fields=ALL, text_only_every=5)
    manifest = load_manifest(root)
    got = [s for shard in manifest.shards_of(fmt) for s in read_shard_samples(root, manifest, shard)]
    assert [s.key for s in got] == sorted(expected)
    for s in got:
        assert s.fields == expected[s.key].fields  # stored forms: bytes, int, str, dict


@pytest.mark.parametrize("fmt", ["tar", "parquet"])
def test_dataset_yields_decoded_samples(tmp_path, fmt):
    root, expected = make_dataset(tmp_path, 30, shards=4, fmt=fmt, fields=ALL, text_only_every=4)
    ds = StreamingDataset(root, shuffle=False)
    got = list(ds)
    assert [s["__key__"] for s in got] == sorted(expected)
    for s in got:
        want = expected[s["__key__"]]
        assert s["txt"] == want.fields["txt"] and s["json"] == want.fields["json"]
        if "jpg" not in want.fields:
            assert "jpg" not in s and "raw" not in s
            continue
        assert s["cls"] == want.fields["cls"]
        raw = np.frombuffer(want.fields["raw"], np.uint8).reshape(12, 16, 3)
        assert s["raw"].shape == (3, 12, 16) and s["raw"].dtype == torch.uint8
        assert torch.equal(s["raw"], torch.from_numpy(raw.copy()).permute(2, 0, 1))
        expect_image(want, s["jpg"])


@pytest.mark.parametrize("fmt", ["tar", "parquet"])
def test_batches_hold_one_tensor_per_field(tmp_path, fmt):
    root, expected = make_dataset(tmp_path, 20, shards=3, fmt=fmt)
    ds = StreamingDataset(root, seed=1, fields=["raw", "cls"])
    batches = list(ds.batches(8))
    assert [len(b["__key__"]) for b in batches] == [8, 8, 4]
    b = batches[0]
    assert set(b) == {"__key__", "raw", "cls"}
    assert b["raw"].shape == (8, 3, 12, 16) and b["raw"].dtype == torch.uint8
    assert b["cls"].dtype == torch.int64
    assert b["cls"].tolist() == [expected[k].fields["cls"] for k in b["__key__"]]
    for i, key in enumerate(b["__key__"]):
        raw = np.frombuffer(expected[key].fields["raw"], np.uint8).reshape(12, 16, 3)
        assert torch.equal(b["raw"][i], torch.from_numpy(raw.copy()).permute(2, 0, 1))


def test_both_formats_read_the_same(tmp_path):
    root, _ = make_dataset(tmp_path, 25, shards=3, fmt="both", fields=ALL)
    a = list(StreamingDataset(root, seed=4, format="tar"))
    b = list(StreamingDataset(root, seed=4, format="parquet"))
    assert [s["__key__"] for s in a] == [s["__key__"] for s in b]
    for x, y in zip(a, b):
        assert torch.equal(x["jpg"], y["jpg"]) and torch.equal(x["raw"], y["raw"])
        assert (x["cls"], x["txt"], x["json"]) == (y["cls"], y["txt"], y["json"])


def test_transforms(tmp_path):
    root, expected = make_dataset(tmp_path, 10, shards=2, fields=("raw", "cls"))
    ds = StreamingDataset(root, seed=2, transform=lambda s: {**s, "cls": s["cls"] * 10 + 1},
                          batch_transform=lambda b: {**b, "n": len(b["__key__"])})
    batches = list(ds.batches(4))
    assert [b["n"] for b in batches] == [4, 4, 2]
    for b in batches:
        assert b["cls"].tolist() == [expected[k].fields["cls"] * 10 + 1 for k in b["__key__"]]
        assert b["raw"].shape == (len(b["__key__"]), 3, 12, 16)


def test_bad_options_are_named(tmp_path):
    root, _ = make_dataset(tmp_path, 5, shards=1, fields=("cls",))
    with pytest.raises(ConfigError, match="nope"):
        StreamingDataset(root, fields=["nope"])
    with pytest.raises(ConfigError, match="valid options"):
        StreamingDataset(root, shufle=False)
    with pytest.raises(ConfigError, match="on_error='ignore'"):
        StreamingDataset(root, on_error="ignore")


def _corrupt(path, offset, data=b"\xff" * 64):
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)


@pytest.mark.parametrize("fmt", ["tar", "parquet"])
@pytest.mark.parametrize("damage", ["truncate", "overwrite"])
def test_corrupt_shard_names_the_shard(tmp_path, fmt, damage):
    root, _ = make_dataset(tmp_path, 20, shards=4, fmt=fmt)
    path = tmp_path / "shards" / f"data-00001.{fmt}"
    if damage == "truncate":
        path.write_bytes(path.read_bytes()[:-700])
    else:  # same size: a tar header, or the Parquet footer
        _corrupt(path, 0 if fmt == "tar" else path.stat().st_size - 60)
    with pytest.raises(ShardError, match=f"data-00001.{fmt}"):
        list(StreamingDataset(root, shuffle=False))


def test_corrupt_image_data_names_the_shard(tmp_path):
    root, expected = make_dataset(tmp_path, 12, shards=2, fields=("jpg",))
    _corrupt(tmp_path / "shards" / "data-00000.tar", 512, b"\x00" * 32)  # first JPEG's SOI marker
    with pytest.raises(ShardError, match="data-00000.tar.*'jpg'"):
        list(StreamingDataset(root, shuffle=False))


@pytest.mark.parametrize("fmt", ["tar", "parquet"])
def test_on_error_skip_skips_and_counts(tmp_path, fmt):
    root, expected = make_dataset(tmp_path, 40, shards=4, fmt=fmt)
    manifest = load_manifest(root)
    bad = manifest.shards_of(fmt)[2]
    lost = {s.key for s in read_shard_samples(root, manifest, bad)}
    (tmp_path / bad.path).write_bytes(b"garbage")
    ds = StreamingDataset(root, on_error="skip", seed=3)
    keys = [k for b in ds.batches(6) for k in b["__key__"]]
    assert sorted(keys) == sorted(set(expected) - lost)
    assert ds.skipped_shards == [bad.path]


def test_interop_with_webdataset(tmp_path):
    import webdataset as wds

    root, expected = make_dataset(tmp_path, 21, shards=3, fields=("jpg", "raw", "cls", "txt"))
    manifest = load_manifest(root)
    urls = [str(tmp_path / s.path) for s in manifest.shards_of("tar")]
    theirs = list(wds.WebDataset(urls, shardshuffle=False))
    ours = list(StreamingDataset(root, shuffle=False))
    assert [s["__key__"] for s in theirs] == [s["__key__"] for s in ours] == sorted(expected)
    for t, o in zip(theirs, ours):
        assert int(t["cls"]) == o["cls"] and t["txt"].decode() == o["txt"]
        raw = torch.frombuffer(bytearray(t["raw"]), dtype=torch.uint8).reshape(12, 16, 3).permute(2, 0, 1)
        assert torch.equal(raw, o["raw"])
        assert torch.equal(torch.from_numpy(np.array(decode_image(t["jpg"]))).permute(2, 0, 1), o["jpg"])


def test_interop_on_a_shardkit_build(tmp_path):
    """A mixed folder (images with captions, documents, jsonl) built by `shardkit build`."""
    import webdataset as wds

    from shardkit.config import BuildConfig
    from shardkit.demo.datagen import raw_folder
    from shardkit.jobs.build import build

    raw_folder(str(tmp_path / "raw"), images_per_class=4, classes=("a", "b"), documents=3, bad=False)
    out = tmp_path / "out"
    build(BuildConfig(src=str(tmp_path / "raw"), out=str(out), format="tar", image_size=32,
                      max_samples_per_shard=5, workers=0, progress=False))
    manifest = load_manifest(str(out))
    urls = [str(out / s.path) for s in manifest.shards_of("tar")]
    theirs = list(wds.WebDataset(urls, shardshuffle=False))
    ours = list(StreamingDataset(str(out), shuffle=False))
    assert len(manifest.shards_of("tar")) > 2 and len(ours) == manifest.samples
    assert [s["__key__"] for s in theirs] == [s["__key__"] for s in ours]
    for t, o in zip(theirs, ours):
        assert set(t) - {"__key__", "__url__", "__local_path__"} == set(o) - {"__key__"}
        for name, value in o.items():
            if name == "__key__":
                continue
            spec = manifest.fields[name]
            if spec["kind"] == "image":
                assert torch.equal(torch.from_numpy(np.array(decode_image(t[name]))).permute(2, 0, 1), value)
            elif spec["kind"] == "int":
                assert int(t[name]) == value
            elif spec["kind"] == "json":
                assert json.loads(t[name]) == value
            else:
                assert t[name].decode("utf-8") == value


@pytest.mark.parametrize("mode, fmt, options", [
    ("RGB", "JPEG", {}), ("RGB", "JPEG", {"progressive": True}), ("RGB", "JPEG", {"subsampling": 0}),
    ("RGB", "JPEG", {"optimize": True, "comment": b"made by a test", "icc_profile": b"\x00" * 200}),
    ("L", "JPEG", {}), ("CMYK", "JPEG", {}), ("RGBA", "PNG", {}), ("P", "PNG", {}), ("RGB", "WEBP", {})])
def test_decode_image_matches_pil(mode, fmt, options):
    import io

    from PIL import Image

    rng = np.random.default_rng(0)
    im = Image.fromarray(rng.integers(0, 256, (37, 53, 3), dtype=np.uint8)).convert(mode)
    buf = io.BytesIO()
    im.save(buf, fmt, **options)
    got = decode_image(buf.getvalue())
    want = np.asarray(Image.open(io.BytesIO(buf.getvalue())).convert("RGB"))
    assert got.shape == (37, 53, 3) and got.dtype == np.uint8 and np.array_equal(got, want)


def test_decode_image_rejects_truncated_and_corrupt_jpeg():
    from factory import jpeg_bytes

    data = jpeg_bytes(np.zeros((40, 40, 3), np.uint8))
    for bad in (data[: len(data) // 2], data[:200], b"\xff\xd8" + b"\x00" * 64):
        with pytest.raises(Exception) as info:
            decode_image(bad)
        assert isinstance(info.value, (OSError, SyntaxError, ValueError))
