"""ShardWriter: every field kind round-trips through StreamingDataset, webdataset and pyarrow read
its shards, shards roll over by size and count, bad samples are refused before anything is written,
and a writer that fails writes no manifest."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile

import numpy as np
import pytest
from PIL import Image

from shardkit import ShardWriter, StreamingDataset
from shardkit.manifest import load_manifest
from shardkit.jobs.shard_writer import BadSample


def _png(seed: int, size=(16, 12)) -> bytes:
    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (size[1], size[0], 3), np.uint8)).save(buf, "PNG")
    return buf.getvalue()


def _samples(n: int = 12):
    rng = np.random.default_rng(0)
    out = []
    for i in range(n):
        pixels = rng.integers(0, 255, (8, 10, 3), np.uint8)
        out.append({"__key__": f"s{i:04d}", "png": _png(i), "wav": bytes(rng.integers(0, 255, 50 + i, np.uint8)),
                    "image": Image.fromarray(pixels), "mel": rng.standard_normal((4, 6)).astype(np.float32),
                    "cls": i % 3, "txt": f"caption {i} é", "json": {"i": i, "boxes": [[0.5, 1.0, 2.0, 3.5]]}})
    return out


def _write(out, samples, **options):
    with ShardWriter(str(out), **options) as w:
        for s in samples:
            w.write(s)
    return w.manifest


@pytest.mark.parametrize("fmt", ["tar", "parquet"])
def test_every_field_kind_round_trips(tmp_path, fmt):
    samples = _samples()
    manifest = _write(tmp_path / "out", samples, format="both", encode="raw", max_samples_per_shard=5)
    assert manifest.samples == 12 and len(manifest.shards_of("tar")) == 3
    assert manifest.fields["png"] == {"kind": "image", "encoding": "keep"}
    assert manifest.fields["wav"] == {"kind": "bytes"}
    assert manifest.fields["image"]["encoding"] == "raw" and manifest.fields["mel"]["shape"] == [4, 6]
    ds = StreamingDataset(str(tmp_path / "out"), shuffle=False, format=fmt)
    got = list(ds)
    assert [g["__key__"] for g in got] == [s["__key__"] for s in samples]
    for s, g in zip(samples, got):
        assert np.array_equal(g["png"].permute(1, 2, 0).numpy(), np.asarray(Image.open(io.BytesIO(s["png"]))))
        assert g["wav"] == s["wav"]
        assert np.array_equal(g["image"].permute(1, 2, 0).numpy(), np.asarray(s["image"]))
        assert np.array_equal(g["mel"].numpy(), s["mel"])
        assert g["cls"] == s["cls"] and g["txt"] == s["txt"] and g["json"] == s["json"]
    # stored bytes too, and ds.get by key
    assert ds.lookup.stored(7, "png") == samples[7]["png"]
    assert ds.get("s0009")["txt"] == "caption 9 é"


def test_png_and_jpeg_images(tmp_path):
    pixels = np.random.default_rng(1).integers(0, 255, (20, 30, 3), np.uint8)
    _write(tmp_path / "png", [{"__key__": "a", "image": Image.fromarray(pixels).convert("RGBA")}], encode="png")
    got = StreamingDataset(str(tmp_path / "png"), shuffle=False)[0]
    assert np.array_equal(got["image"].permute(1, 2, 0).numpy(), pixels)  # stored as RGB, lossless
    _write(tmp_path / "jpg", [{"__key__": "a", "image": Image.fromarray(pixels)}], encode="jpeg", quality=95)
    assert load_manifest(str(tmp_path / "jpg")).fields["image"] == {"kind": "image", "encoding": "jpeg"}
    got = StreamingDataset(str(tmp_path / "jpg"), shuffle=False)[0]["image"]
    assert got.shape == (3, 20, 30)


def test_webdataset_and_pyarrow_read_it(tmp_path):
    import pyarrow.parquet as pq
    import webdataset as wds

    samples = _samples(6)
    _write(tmp_path / "out", samples, format="both", encode="png")
    manifest = load_manifest(str(tmp_path / "out"))
    tar = [s for s in manifest.shards if s.format == "tar"][0]
    rows = list(wds.WebDataset(str(tmp_path / "out" / tar.path), shardshuffle=False))
    assert [r["__key__"] for r in rows] == [s["__key__"] for s in samples]
    assert rows[2]["png"] == samples[2]["png"] and rows[2]["cls"] == b"2"
    assert json.loads(rows[2]["json"]) == samples[2]["json"] and rows[2]["txt"].decode() == samples[2]["txt"]
    assert np.frombuffer(rows[2]["mel"], np.float32).reshape(4, 6).tolist() == samples[2]["mel"].tolist()
    pq_shard = [s for s in manifest.shards if s.format == "parquet"][0]
    table = pq.read_table(tmp_path / "out" / pq_shard.path)
    assert table.column("__key__").to_pylist() == [s["__key__"] for s in samples]
    assert table.column("wav").to_pylist()[4] == samples[4]["wav"]


def test_shards_roll_over_by_size_and_count_and_sort_keys(tmp_path):
    samples = [{"__key__": f"k{i:03d}", "bin": bytes(1000)} for i in reversed(range(30))]
    m = _write(tmp_path / "size", samples, shard_size=10 * 1768)  # 1000 + one member's overhead
    assert [s.samples for s in m.shards] == [10, 10, 10]
    for s in m.shards:  # each shard holds its samples in key order (the lookups rely on it)
        names = tarfile.open(tmp_path / "size" / s.path).getnames()
        assert names == sorted(names)
    ds = StreamingDataset(str(tmp_path / "size"), shuffle=False)
    assert ds.get("k005")["bin"] == bytes(1000) and ds.get("k029")["__key__"] == "k029"
    m = _write(tmp_path / "count", samples, max_samples_per_shard=7)
    assert [s.samples for s in m.shards] == [7, 7, 7, 7, 2]


def test_same_writes_give_the_same_bytes(tmp_path):
    for name in ("a", "b"):
        _write(tmp_path / name, _samples(), format="both", max_samples_per_shard=4)
    for rel in sorted(os.listdir(tmp_path / "a" / "shards")):
        assert (tmp_path / "a" / "shards" / rel).read_bytes() == (tmp_path / "b" / "shards" / rel).read_bytes()


def test_verify_and_inspect_accept_it(tmp_path):
    _write(tmp_path / "out", _samples(), format="both", max_samples_per_shard=5)
    env = dict(os.environ, PYTHONPATH=os.getcwd())
    for cmd in ("verify", "inspect"):
        r = subprocess.run([sys.executable, "-m", "shardkit.cli", cmd, str(tmp_path / "out")], capture_output=True,
                           text=True, env=env)
        assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.parametrize("bad, words", [
    ({"__key__": "x1", "png": _png(0), "cls": "three"}, ["'x1'", "'cls'", "expected an int, got a text"]),
    ({"__key__": "x1", "png": Image.new("RGB", (4, 4)), "cls": 1}, ["'x1'", "'png'", "expected encoded image bytes"]),
    ({"png": _png(0), "cls": 1}, ["no '__key__'"]),
    ({"__key__": "s0", "png": _png(0), "cls": 1}, ["'s0'", "written before"]),
    ({"__key__": "a.b", "png": _png(0), "cls": 1}, ["no dot"]),
    ({"__key__": "x1", "png": _png(0), "cls": 1, "new": "x"}, ["'new'", "does not have"]),
    ({"__key__": "x1", "png": _png(0), "cls": True}, ["'cls'", "bool"]),
])
def test_bad_samples_are_refused_and_nothing_corrupt_is_written(tmp_path, bad, words):
    with ShardWriter(str(tmp_path / "out")) as w:
        w.write({"__key__": "s0", "png": _png(1), "cls": 0})
        with pytest.raises(BadSample) as e:
            w.write(bad)
        for word in words:
            assert word in str(e.value)
        w.write({"__key__": "s1", "png": _png(2), "cls": 1})  # the writer goes on
    ds = StreamingDataset(str(tmp_path / "out"), shuffle=False)
    assert [s["__key__"] for s in ds] == ["s0", "s1"] and ds.manifest.samples == 2


def test_array_shape_and_raw_size_misfits(tmp_path):
    with ShardWriter(str(tmp_path / "out"), encode="raw") as w:
        w.write({"__key__": "a", "m": np.zeros((2, 3), np.float32), "im": Image.new("RGB", (4, 4))})
        with pytest.raises(BadSample, match=r"'b', field 'm': array of shape \[3, 3\]"):
            w.write({"__key__": "b", "m": np.zeros((3, 3), np.float32), "im": Image.new("RGB", (4, 4))})
        with pytest.raises(BadSample, match=r"field 'm': array of dtype float64"):
            w.write({"__key__": "b", "m": np.zeros((2, 3)), "im": Image.new("RGB", (4, 4))})
        with pytest.raises(BadSample, match=r"field 'im': image of 5x4"):
            w.write({"__key__": "b", "m": np.zeros((2, 3), np.float32), "im": Image.new("RGB", (5, 4))})


def test_declared_fields_and_missing_values(tmp_path):
    fields = {"txt": {"kind": "text"}, "cls": {"kind": "int", "dtype": "int64"}}
    with ShardWriter(str(tmp_path / "out"), fields=fields, format="parquet") as w:
        w.write({"__key__": "a", "txt": "only text"})
        w.write({"__key__": "b", "txt": "both", "cls": 4})
    ds = StreamingDataset(str(tmp_path / "out"), shuffle=False)
    assert ds[0] == {"__key__": "a", "txt": "only text"}
    assert ds[1] == {"__key__": "b", "txt": "both", "cls": 4}


def test_an_exception_leaves_no_manifest_and_old_manifest_is_retired(tmp_path):
    _write(tmp_path / "out", _samples(4))
    assert (tmp_path / "out" / "manifest.json").exists()
    with pytest.raises(RuntimeError):
        with ShardWriter(str(tmp_path / "out"), max_samples_per_shard=1) as w:
            w.write(_samples(1)[0])
            w.write(_samples(2)[1])
            raise RuntimeError("crash")
    assert not (tmp_path / "out" / "manifest.json").exists()
    assert not (tmp_path / "out" / "manifest.shards.parquet").exists()


def test_kill_9_leaves_no_manifest(tmp_path):
    script = (f"import numpy as np, os, signal\nfrom shardkit import ShardWriter\n"
              f"w = ShardWriter({str(tmp_path / 'out')!r}, max_samples_per_shard=2)\n"
              "for i in range(5):\n    w.write({'__key__': f'k{i}', 'bin': bytes(10)})\n"
              "os.kill(os.getpid(), signal.SIGKILL)\n")
    r = subprocess.run([sys.executable, "-c", script], env=dict(os.environ, PYTHONPATH=os.getcwd()))
    assert r.returncode == -9
    assert os.listdir(tmp_path / "out" / "shards") and not (tmp_path / "out" / "manifest.json").exists()


def test_arrays_in_key_order_and_reversed_give_the_same_bytes(tmp_path):
    """Samples written in key order take the shard-buffer path for arrays, others samples_table's:
    the same bytes either way; and a reused array buffer is copied at write()."""
    rng = np.random.default_rng(3)
    arrays = [rng.standard_normal((5, 7)).astype(np.float32) for _ in range(20)]
    buf = np.empty((5, 7), np.float32)
    with ShardWriter(str(tmp_path / "sorted"), format="both", max_samples_per_shard=6) as w:
        for i, a in enumerate(arrays):
            buf[:] = a  # the caller reuses one buffer: each write must keep its own values
            w.write({"__key__": f"k{i:03d}", "m": buf, "cls": i})
    ds = StreamingDataset(str(tmp_path / "sorted"), shuffle=False)
    for i, a in enumerate(arrays):
        assert np.array_equal(ds.get(f"k{i:03d}")["m"].numpy(), a)
    with ShardWriter(str(tmp_path / "sorted2"), format="both", max_samples_per_shard=6) as w:
        for i in range(20):
            w.write({"__key__": f"k{i:03d}", "m": arrays[i], "cls": i})
    with ShardWriter(str(tmp_path / "reversed"), format="both", max_samples_per_shard=6) as w:
        for lo, hi in ((0, 6), (6, 12), (12, 18), (18, 20)):
            for i in reversed(range(lo, hi)):
                w.write({"__key__": f"k{i:03d}", "m": arrays[i], "cls": i})
    names = sorted(os.listdir(tmp_path / "sorted2" / "shards"))
    assert len(names) == 12
    for name in names:
        a = (tmp_path / "sorted2" / "shards" / name).read_bytes()
        assert a == (tmp_path / "reversed" / "shards" / name).read_bytes() == (tmp_path / "sorted" / "shards" / name).read_bytes()


def test_a_missing_array_takes_the_general_path(tmp_path):
    with ShardWriter(str(tmp_path / "out"), fields={"m": {"kind": "array", "dtype": "int16", "shape": [2]},
                                                    "cls": {"kind": "int", "dtype": "int64"}}) as w:
        w.write({"__key__": "a", "m": np.array([1, 2], np.int16), "cls": 0})
        w.write({"__key__": "b", "cls": 1})
    ds = StreamingDataset(str(tmp_path / "out"), shuffle=False)
    assert ds[0]["m"].tolist() == [1, 2] and "m" not in ds[1] and ds[1]["cls"] == 1


def test_a_refused_first_sample_fixes_no_fields(tmp_path):
    with ShardWriter(str(tmp_path / "out")) as w:
        with pytest.raises(BadSample, match="not JSON"):
            w.write({"__key__": "a", "json": {"x": float("nan")}, "cls": 1})
        w.write({"__key__": "b", "txt": "text", "cls": 2})
    assert set(load_manifest(str(tmp_path / "out")).fields) == {"txt", "cls"}
