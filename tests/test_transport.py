"""The shared-slot transport's fallbacks give the same batches, and workers start under spawn."""

import numpy as np
import pytest
import torch
from factory import keys_of, loader_for, make_dataset

import shardkit.loader as loader_module


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return make_dataset(tmp_path_factory.mktemp("transport"), 37, shards=5, fields=("raw", "cls"))


def epochs(loader, n=2):
    """Each batch's keys, pixels and labels (copied out) over n epochs; slot tensors are dropped."""
    out = []
    for _ in range(n):
        for b in loader:
            out.append((b["__key__"], b["raw"].clone(), b["cls"].clone()))
            del b
    return out


def same_batches(a, b):
    assert [k for k, _, _ in a] == [k for k, _, _ in b]
    assert all(torch.equal(x, y) and torch.equal(p, q) for (_, x, p), (_, y, q) in zip(a, b))


def test_without_storage_use_counts_batches_are_copied_out(data, monkeypatch):
    root, _ = data
    _, ref = loader_for(root, monkeypatch, workers=0, seed=2)
    want = epochs(ref)
    monkeypatch.delattr(torch._C, "_storage_Use_Count")
    _, loader = loader_for(root, monkeypatch, workers=2, seed=2)
    transport = loader._transport
    assert transport.copy_out
    held = []
    for _ in range(2):  # batches held past the slots' reuse keep their pixels: they are copies
        for b in loader:
            held.append((b["__key__"], b["raw"], b["cls"]))
    same_batches(held, want)
    slot_ptrs = {st.data_ptr() for st in transport._main.values()}
    assert slot_ptrs and not any(raw.untyped_storage().data_ptr() in slot_ptrs for _, raw, _ in held)
    assert int(transport.flags.sum()) == 0 and transport._lent == []


def test_with_storage_use_counts_batches_are_slot_views(data, monkeypatch):
    root, _ = data
    _, loader = loader_for(root, monkeypatch, workers=2, seed=2)
    batch = next(iter(loader))
    slot_ptrs = {st.data_ptr() for st in loader._transport._main.values()}
    assert not loader._transport.copy_out and batch["raw"].untyped_storage().data_ptr() in slot_ptrs


def test_with_no_free_slot_dataloaders_own_path_gives_the_same_batches(data, monkeypatch):
    root, _ = data
    _, ref = loader_for(root, monkeypatch, workers=0, seed=5)
    want = epochs(ref)
    monkeypatch.setattr(loader_module, "_slots", lambda *args: 0)
    _, loader = loader_for(root, monkeypatch, workers=2, seed=5)
    assert loader._transport.flags.shape == (2, 0)
    same_batches(epochs(loader), want)
    assert loader._transport._main == {}  # nothing went through a slot


@pytest.mark.parametrize("private", [True, False])
def test_slots_are_shared_storages_with_or_without_the_private_constructor(data, monkeypatch, private):
    root, _ = data
    if not private:
        monkeypatch.delattr(torch.storage._StorageBase, "_new_shared")
    _, loader = loader_for(root, monkeypatch, workers=1, seed=1)
    batch = next(iter(loader))
    assert batch["raw"].untyped_storage().is_shared()


@pytest.mark.filterwarnings("ignore:This DataLoader will create")
def test_spawned_workers_give_the_same_batches_and_resume(data, monkeypatch):
    root, expected = data
    _, ref = loader_for(root, monkeypatch, workers=0, seed=7)
    want = [keys for keys, _, _ in epochs(ref)]
    _, spawned = loader_for(root, monkeypatch, workers=2, seed=7, multiprocessing_context="spawn")
    got = epochs(spawned)
    assert [keys for keys, _, _ in got] == want
    for keys, raw, _ in got[:3]:
        for key, img in zip(keys, raw):
            stored = np.frombuffer(expected[key].fields["raw"], np.uint8).reshape(12, 16, 3)
            assert torch.equal(img, torch.from_numpy(stored.copy()).permute(2, 0, 1))
    it = iter(spawned)  # epoch 2, stopped after 2 batches and resumed in a fresh spawned loader
    first = keys_of(next(it) for _ in range(2))
    state = spawned.state_dict()
    del it
    _, resumed = loader_for(root, monkeypatch, workers=2, seed=7, multiprocessing_context="spawn")
    resumed.load_state_dict(state)
    ref.source.set_epoch(2)
    assert first + keys_of(resumed) == keys_of(ref)


def test_unknown_start_method_is_named(data, monkeypatch):
    from shardkit.errors import ConfigError

    with pytest.raises(ConfigError, match="multiprocessing_context='thread'"):
        loader_for(data[0], monkeypatch, workers=1, multiprocessing_context="thread")


def test_make_loader_leaves_the_dataset_as_given(data):
    from shardkit.loader import make_loader
    from shardkit.reader.dataset import StreamingDataset

    ds = StreamingDataset(data[0], fields=["raw", "cls"], seed=3)
    before = dict(vars(ds))
    loader = make_loader(ds, batch_size=8, num_workers=2)
    assert vars(ds) == before and loader.source is ds  # no transport or batch size set on it
    sample = next(iter(ds))  # still a dataset of samples, as a plain DataLoader expects
    assert sample["raw"].shape == (3, 12, 16) and isinstance(sample["__key__"], str)
