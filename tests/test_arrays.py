"""Float .npy arrays: kept as arrays, float16 under --half (round trip, error bound), bad arrays rejected."""

from __future__ import annotations

import json

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from shardkit.config import BuildConfig
from shardkit.errors import ConfigError
from shardkit.jobs.build import build
from shardkit.loader import make_loader
from shardkit.manifest import load_manifest
from shardkit.reader.dataset import StreamingDataset

SHAPE = (6, 8)


@pytest.fixture
def features(tmp_path):
    """10 float32 feature arrays in two class folders, a float64 one, and three bad ones."""
    rng = np.random.default_rng(7)
    root = tmp_path / "raw"
    arrays = {}
    for i in range(10):
        (root / f"c{i % 2}").mkdir(parents=True, exist_ok=True)
        arrays[f"c{i % 2}/f{i:02d}"] = a = (rng.standard_normal(SHAPE) * 3).astype(np.float32)
        np.save(root / f"c{i % 2}" / f"f{i:02d}.npy", a)
    arrays["c0/wide"] = w = rng.standard_normal(SHAPE)  # float64: stored in the dataset's dtype
    np.save(root / "c0" / "wide.npy", w)
    np.save(root / "c1" / "zz_shape.npy", np.zeros((3, 3), np.float32))
    np.save(root / "c1" / "zz_huge.npy", np.full(SHAPE, 1e6, np.float32))
    np.save(root / "c1" / "zz_pickle.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    return root, arrays


def _build(src, out, **kw):
    return build(BuildConfig(src=str(src), out=str(out), workers=0, progress=False, **kw))


def _errors(out) -> dict[str, str]:
    lines = (out / "errors.jsonl").read_text(encoding="utf-8").splitlines()
    return {json.loads(x)["path"]: json.loads(x)["reason"] for x in lines}


def test_half_round_trip_and_error_bound(features, tmp_path):
    src, arrays = features
    full, half = tmp_path / "full", tmp_path / "half"
    _build(src, full, format="both")
    _build(src, half, format="both", half=True)
    mf, mh = load_manifest(str(full)), load_manifest(str(half))
    assert mf.fields["array"] == {"kind": "array", "dtype": "float32", "shape": list(SHAPE), "source_dtype": "float32"}
    assert mh.fields["array"]["dtype"] == "float16" and mh.build["config"]["half"] is True
    for fmt in ("tar", "parquet"):
        got16, got32 = {}, {}
        for m, out, got in ((mh, half, got16), (mf, full, got32)):
            ds = StreamingDataset(str(out), format=fmt, shuffle=False)
            for batch in make_loader(ds, batch_size=4, num_workers=0):
                assert batch["array"].shape[1:] == SHAPE
                got.update(zip(batch["__key__"], batch["array"]))
        assert set(got16) == set(arrays) and set(got32) == set(arrays) | {"c1/zz_huge"}
        for key, a in arrays.items():
            assert got16[key].dtype == torch.float16 and got32[key].dtype == torch.float32
            assert np.array_equal(got32[key].numpy(), a.astype(np.float32))
            assert np.array_equal(got16[key].numpy(), a.astype(np.float16))  # one rounding, nothing else
            err = np.abs(got16[key].numpy().astype(np.float32) - a.astype(np.float32)).max()
            assert err <= np.abs(a).max() * 2.0 ** -11  # float16's half-ulp bound
    # the array column's bytes (the files' fixed parts, footer and page index, are the same in both)
    bytes_of = {o: _column_bytes(o, "array") for o in (full, half)}
    assert bytes_of[half] < 0.7 * bytes_of[full], bytes_of


def _column_bytes(out, column: str) -> int:
    total = 0
    for s in load_manifest(str(out)).shards_of("parquet"):
        meta = pq.ParquetFile(str(out / s.path)).metadata
        for g in range(meta.num_row_groups):
            group = meta.row_group(g)
            total += sum(group.column(c).total_compressed_size for c in range(group.num_columns)
                         if group.column(c).path_in_schema.split(".")[0] == column)
    return total


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("dtype", [torch.float32, "float32", "bfloat16", "float16"])
def test_reader_casts_with_dtype(features, tmp_path, dtype, workers):
    src, arrays = features
    out = tmp_path / "half"
    _build(src, out, format="parquet", half=True)
    ds = StreamingDataset(str(out), shuffle=False, dtype=dtype)
    want = getattr(torch, str(dtype).removeprefix("torch."))
    seen = {}
    loader = make_loader(ds, batch_size=3, num_workers=workers)
    held = list(loader)
    if workers:  # the cast batches travel in the workers' shared slots
        assert int((loader._transport.flags != 0).sum()) == len(held)
    for batch in held:
        assert batch["array"].dtype == want and batch["array"].shape[1:] == SHAPE
        seen.update(zip(batch["__key__"], batch["array"]))
    assert set(seen) == set(arrays)
    for key, a in arrays.items():
        stored = torch.from_numpy(a.astype(np.float16))
        assert torch.equal(seen[key], stored.to(want))  # exactly one cast of the stored value


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_cast_batches_also_travel_when_every_slot_is_taken(features, tmp_path, dtype):
    """Held batches outnumber the slots: later ones go DataLoader's way, small ones by value."""
    src, arrays = features
    out = tmp_path / "half"
    _build(src, out, format="parquet", half=True)
    loader = make_loader(StreamingDataset(str(out), shuffle=False, dtype=dtype), batch_size=1, num_workers=1,
                         prefetch_factor=1)
    held = list(loader)
    assert len(held) > loader._transport.flags.numel()
    want = getattr(torch, dtype)
    for batch in held:
        stored = torch.from_numpy(arrays[batch["__key__"][0]].astype(np.float16))
        assert batch["array"].dtype == want and torch.equal(batch["array"][0], stored.to(want))


def test_zero_dim_arrays_round_trip_and_cast(tmp_path):
    root = tmp_path / "raw"
    root.mkdir()
    for i in range(5):
        np.save(root / f"s{i}.npy", np.float32(i + 0.25))
    out = tmp_path / "out"
    _build(root, out, format="both", half=True, labels=False)
    for fmt in ("tar", "parquet"):
        for dtype, want in ((None, torch.float16), ("float64", torch.float64)):
            ds = StreamingDataset(str(out), format=fmt, shuffle=False, dtype=dtype)
            batch = next(iter(make_loader(ds, batch_size=5, num_workers=0)))
            assert batch["array"].dtype == want and batch["array"].tolist() == [0.25, 1.25, 2.25, 3.25, 4.25]


def test_dtype_option_is_checked_and_leaves_other_fields_alone(tmp_path):
    from shardkit.demo.datagen import image_folder

    src = tmp_path / "raw"
    image_folder(str(src), n=4, classes=1, size=(40, 30), seed=2)
    for i in range(4):
        np.save(src / "class_00" / f"{i:06d}.npy", np.full(SHAPE, i + 0.5, np.float32))
    out = tmp_path / "out"
    _build(src, out, format="parquet", image_size=16, resize_mode="center-crop", encode="raw")
    batch = next(iter(make_loader(StreamingDataset(str(out), shuffle=False, dtype="float64"),
                                  batch_size=4, num_workers=0)))
    assert batch["array"].dtype == torch.float64 and batch["array"][:, 0, 0].tolist() == [0.5, 1.5, 2.5, 3.5]
    assert batch["raw"].dtype == torch.uint8 and batch["cls"].dtype == torch.int64  # not float arrays
    with pytest.raises(ConfigError, match="dtype='int8'.*float16, bfloat16, float32, float64"):
        StreamingDataset(str(out), dtype="int8")
    for alias, name in (("half", "float16"), (torch.half, "float16"), (np.float32, "float32"), ("double", "float64")):
        assert StreamingDataset(str(out), dtype=alias).config.dtype == name


def test_bad_arrays_are_rejected_with_reasons(features, tmp_path):
    src, _ = features
    out = tmp_path / "half"
    result = _build(src, out, format="parquet", half=True)
    errors = _errors(out)
    assert errors["c1/zz_shape.npy"].startswith("array shape [3, 3] differs from the dataset's [6, 8]")
    assert errors["c1/zz_huge.npy"].startswith("array values overflow float16") and "without --half" in errors["c1/zz_huge.npy"]
    assert errors["c1/zz_pickle.npy"].startswith("unreadable .npy array")
    assert result.samples == 11
    # without --half the big values fit: only the shape and the pickle are rejected
    _build(src, tmp_path / "full", format="parquet")
    assert set(_errors(tmp_path / "full")) == {"c1/zz_shape.npy", "c1/zz_pickle.npy"}


def test_array_sidecar_joins_its_image_and_half_changes_markers(tmp_path):
    from shardkit.demo.datagen import image_folder

    src = tmp_path / "raw"
    image_folder(str(src), n=4, classes=1, size=(40, 30), seed=2)
    for i in range(4):
        np.save(src / "class_00" / f"{i:06d}.npy", np.full(SHAPE, i, np.float32))
    out = tmp_path / "out"
    _build(src, out, format="parquet", image_size=16)
    rows = pq.read_table(out / load_manifest(str(out)).shards_of("parquet")[0].path).to_pylist()
    assert all(r["jpg"] and np.frombuffer(r["array"], "<f4")[0] == int(r["__key__"][-1]) for r in rows)
    assert _build(src, out, format="parquet", image_size=16).reused_shards == 1
    assert _build(src, out, format="parquet", image_size=16, half=True).reused_shards == 0
