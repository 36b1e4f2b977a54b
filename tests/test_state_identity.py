"""A loader state knows its dataset: a state of another dataset with the same shard counts is
refused (naming both), the same shard files copied elsewhere resume, and None or garbage is a
clear ConfigError."""

from __future__ import annotations

import shutil

import pytest

from shardkit.errors import ConfigError

from factory import keys_of, loader_for, make_samples, write_dataset


@pytest.fixture
def two_datasets(tmp_path):
    """Same keys, same shard counts, other contents: only a content digest tells them apart."""
    a, b = tmp_path / "a", tmp_path / "b"
    write_dataset(a, make_samples(40, seed=1), shards=4)
    write_dataset(b, make_samples(40, seed=2), shards=4)
    return a, b


def _state_after(root, monkeypatch, batches: int):
    ds, loader = loader_for(root, monkeypatch)
    it = iter(loader)
    seen = [next(it) for _ in range(batches)]
    return loader.state_dict(), keys_of(seen), keys_of(it)


def test_a_state_of_another_dataset_is_refused_naming_both(two_datasets, monkeypatch):
    a, b = two_datasets
    state, _, _ = _state_after(a, monkeypatch, 3)
    _, other = loader_for(b, monkeypatch)
    with pytest.raises(ConfigError) as e:
        other.load_state_dict(state)
    assert str(a) in str(e.value) and str(b) in str(e.value) and "other shards" in str(e.value)


def test_the_same_shards_copied_elsewhere_resume(two_datasets, monkeypatch, tmp_path):
    a, _ = two_datasets
    state, _, rest = _state_after(a, monkeypatch, 3)
    copy = tmp_path / "moved" / "a"
    shutil.copytree(a, copy)
    _, moved = loader_for(copy, monkeypatch)
    moved.load_state_dict(state)
    assert keys_of(moved) == rest and rest


def test_a_state_saved_before_digests_still_loads(two_datasets, monkeypatch):
    a, _ = two_datasets
    state, _, rest = _state_after(a, monkeypatch, 2)
    old = {k: v for k, v in state.items() if k not in ("checksums", "dataset")}
    _, loader = loader_for(a, monkeypatch)
    loader.load_state_dict(old)
    assert keys_of(loader) == rest


@pytest.mark.parametrize("garbage", [None, "step-000000040.pt", [1, 2], {}, {"model": {}},
                                     "partial"], ids=["none", "str", "list", "empty", "checkpoint", "partial"])
def test_none_or_garbage_is_a_config_error(two_datasets, monkeypatch, garbage):
    a, _ = two_datasets
    state, _, _ = _state_after(a, monkeypatch, 1)
    if garbage == "partial":
        garbage = dict(state, consumed="12")
    _, loader = loader_for(a, monkeypatch)
    with pytest.raises(ConfigError, match="load_state_dict"):
        loader.load_state_dict(garbage)
