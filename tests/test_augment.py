"""Offline augmentation: K distinct seeded variants, deterministic bytes, a new variant every epoch."""

from __future__ import annotations

import io

import numpy as np
import pyarrow.parquet as pq
import pytest
from PIL import Image

from shardkit.config import BuildConfig
from shardkit.errors import ConfigError
from shardkit.jobs.build import build
from shardkit.manifest import load_manifest
from shardkit.reader.dataset import StreamingDataset
from shardkit.reader.variants import choose

from conftest import tree_bytes

K = 3


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    from shardkit.demo.datagen import image_folder

    root = tmp_path_factory.mktemp("aug") / "raw"
    image_folder(str(root), n=8, classes=2, size=(80, 60), seed=5)
    return root


def _build(src, out, **kw):
    kw = {"workers": 0, "progress": False, "image_size": 32, "resize_mode": "center-crop", "augment": K,
          "augment_ops": "crop,flip,color", **kw}
    return build(BuildConfig(src=str(src), out=str(out), **kw))


def _rows(out) -> dict[str, dict]:
    m = load_manifest(str(out))
    return {r["__key__"]: r for s in m.shards_of("parquet") for r in pq.read_table(out / s.path).to_pylist()}


def _pixels(blob) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(blob)).convert("RGB"))


def test_k_variants_exist_differ_and_keep_original_is_the_plain_image(images, tmp_path):
    out = tmp_path / "out"
    _build(images, out, format="both")
    m = load_manifest(str(out))
    assert m.fields["jpg"]["variants"] == K and m.fields["jpg"]["augment"]["ops"] == ["crop", "flip", "color"]
    assert m.fields["1.jpg"]["variant_of"] == "jpg" and m.fields["2.jpg"]["variant"] == 2
    rows = _rows(out)
    assert len(rows) == 8
    for row in rows.values():
        px = [_pixels(row[name]) for name in ("jpg", "1.jpg", "2.jpg")]
        assert all(p.shape == (32, 32, 3) for p in px)
        assert not any(np.array_equal(px[i], px[j]) for i in range(K) for j in range(i + 1, K))
    kept, plain = tmp_path / "kept", tmp_path / "plain"
    _build(images, kept, format="parquet", augment_keep_original=True)
    _build(images, plain, format="parquet", augment=0)
    for key, row in _rows(kept).items():
        assert row["jpg"] == _rows(plain)[key]["jpg"] and row["1.jpg"] != row["jpg"]
    # WebDataset interop: variant 0 is `jpg`, the others decode by their last extension
    import webdataset as wds

    sample = next(iter(wds.WebDataset(str(out / m.shards_of("tar")[0].path), shardshuffle=False).decode("rgb8")))
    assert sample["jpg"].shape == sample["1.jpg"].shape == (32, 32, 3)


def test_same_seed_same_bytes_any_worker_count_and_options_change_markers(images, tmp_path):
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    _build(images, a, format="both", max_samples_per_shard=3)
    _build(images, b, format="both", max_samples_per_shard=3, workers=2)
    assert tree_bytes(a) == tree_bytes(b)
    _build(images, c, format="parquet", augment_seed=1)
    assert _rows(c)[next(iter(_rows(c)))]["jpg"] != _rows(a)[next(iter(_rows(c)))]["jpg"]
    assert _build(images, a, format="both", max_samples_per_shard=3).reused_shards == 3
    for change in ({"augment": 2}, {"augment_ops": "flip,blur"}, {"augment_seed": 7}, {"augment_keep_original": True}):
        assert _build(images, a, format="both", max_samples_per_shard=3, **change).reused_shards == 0, change


@pytest.mark.parametrize("encode", ["jpeg", "raw"])
def test_each_epoch_shows_another_variant_and_k_epochs_show_all(images, tmp_path, encode):
    out = tmp_path / "out"
    _build(images, out, format="both", encode=encode, max_samples_per_shard=5)
    field = "raw" if encode == "raw" else "jpg"
    rows = _rows(out)
    names = [field] + [f"{k}.{field}" for k in range(1, K)]
    stored = {key: [_pixels(r[n]) if encode == "jpeg" else np.frombuffer(r[n], np.uint8).reshape(32, 32, 3)
                    for n in names] for key, r in rows.items()}
    for fmt in ("tar", "parquet"):
        ds = StreamingDataset(str(out), format=fmt, seed=3)
        assert sorted(ds.fields) == sorted([field, "cls"])  # the variants are read through `field`
        seen = {key: [] for key in rows}
        for epoch in range(K):
            ds.set_epoch(epoch)
            for sample in ds:
                shown = sample[field].permute(1, 2, 0).numpy()
                matches = [k for k, px in enumerate(stored[sample["__key__"]]) if np.array_equal(px, shown)]
                assert len(matches) == 1
                seen[sample["__key__"]].append(matches[0])
        for key, variants in seen.items():
            assert sorted(variants) == list(range(K)), (key, variants)  # every variant once over K epochs
            assert all(variants[e] != variants[e + 1] for e in range(K - 1))


def _shown_variants(ds, stored, field, epoch, workers) -> dict[str, int]:
    """Which stored variant each key shows in `epoch`, read through make_loader with `workers`."""
    from shardkit.loader import make_loader

    ds.set_epoch(epoch)
    shown = {}
    for batch in make_loader(ds, batch_size=3, num_workers=workers):
        for key, image in zip(batch["__key__"], batch[field]):
            px = image.permute(1, 2, 0).numpy()
            matches = [k for k, stored_px in enumerate(stored[key]) if np.array_equal(stored_px, px)]
            assert len(matches) == 1
            shown[key] = matches[0]
    return shown


def test_seeded_random_variant_choice_through_the_loader(images, tmp_path):
    out = tmp_path / "out"
    _build(images, out, format="parquet", encode="raw", max_samples_per_shard=5)
    rows = _rows(out)
    names = ["raw"] + [f"{k}.raw" for k in range(1, K)]
    stored = {key: [np.frombuffer(r[n], np.uint8).reshape(32, 32, 3) for n in names] for key, r in rows.items()}
    keys = sorted(rows)
    by_epoch = {}
    for epoch in range(6):
        ds = StreamingDataset(str(out), variant="random", seed=11)
        shown = _shown_variants(ds, stored, "raw", epoch, workers=2 if epoch == 0 else 0)
        assert sorted(shown) == keys
        # exactly the seeded draw, whatever the worker count, not the cycle
        assert [shown[k] for k in keys] == choose(keys, epoch, K, "random", seed=11).tolist()
        by_epoch[epoch] = shown
    assert [by_epoch[0][k] for k in keys] != choose(keys, 0, K, "cycle").tolist()
    again = _shown_variants(StreamingDataset(str(out), variant="random", seed=11), stored, "raw", 0, workers=0)
    assert again == by_epoch[0]
    other_seed = _shown_variants(StreamingDataset(str(out), variant="random", seed=12), stored, "raw", 0, workers=0)
    assert other_seed != by_epoch[0]
    with pytest.raises(ConfigError, match="variant='sometimes'.*cycle, random"):
        StreamingDataset(str(out), variant="sometimes")


def test_variant_choice_policies():
    keys = [f"k{i}" for i in range(200)]
    epochs = np.stack([choose(keys, e, 4) for e in range(8)])
    assert (np.diff(epochs, axis=0) != 0).all()
    assert all(sorted(epochs[e:e + 4, j]) == [0, 1, 2, 3] for e in range(5) for j in range(200))
    assert len(set(epochs[0].tolist())) == 4  # keys start at different variants
    r1, r2 = choose(keys, 2, 4, "random", seed=1), choose(keys, 2, 4, "random", seed=1)
    assert np.array_equal(r1, r2) and not np.array_equal(r1, choose(keys, 3, 4, "random", seed=1))
    assert set(r1.tolist()) == {0, 1, 2, 3}
    with pytest.raises(ConfigError, match="cycle, random"):
        choose(keys, 0, 4, "sometimes")


def test_bad_augment_options_say_what_to_do(images, tmp_path):
    with pytest.raises(ConfigError, match="crop, flip, rotate, color, blur"):
        BuildConfig(src=str(images), out=str(tmp_path), augment=2, augment_ops="flip,sharpen")
    with pytest.raises(ConfigError, match="K >= 2"):
        BuildConfig(src=str(images), out=str(tmp_path), augment=1, augment_keep_original=True)


def test_every_op_keeps_the_size_and_is_seeded():
    from shardkit.stages.augment import OP_ORDER, apply_ops, variant_rng

    im = Image.fromarray(np.random.default_rng(0).integers(0, 255, (24, 40, 3), dtype=np.uint8))
    for op in OP_ORDER:
        a = apply_ops(im, (op,), variant_rng(0, "key", 1))
        b = apply_ops(im, (op,), variant_rng(0, "key", 1))
        assert a.size == im.size and a.tobytes() == b.tobytes(), op
    outs = {apply_ops(im, OP_ORDER, variant_rng(0, "key", k)).tobytes() for k in range(6)}
    assert len(outs) == 6
