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


def test_a_slot_tensor_inside_a_list_keeps_its_slot_until_the_next_iteration(monkeypatch):
    """A batch_transform may put slot tensors inside a list (or return a tuple): DataLoader pickles
    (copies) those later, in the worker's queue feeder thread, so their slot must stay taken until
    the next iteration, not be rebuilt under them by the worker's next batch."""
    import types

    import shardkit.loader.transport as transport_module
    from shardkit.loader.transport import SlotTransport

    monkeypatch.setattr(transport_module, "worker_info", lambda: types.SimpleNamespace(id=0))
    transport = SlotTransport(1, 3)
    transport.new_iteration()
    transport.start_iteration()

    def rows():
        return torch.from_numpy(transport.alloc((4, 64)).view(np.int64))

    nested = rows()
    sent = transport.pack({"pair": [nested[:, :-1], nested[:, 1:]]})
    assert sent["pair"][1].data_ptr() == nested.data_ptr() + 8 and transport.flags.tolist() == [[1, 0, 0]]
    replaced = rows()  # the next batch is built elsewhere
    assert replaced.data_ptr() != nested.data_ptr()
    transport.pack({"ids": replaced + 1})  # a batch_transform replaced the slot tensor: its slot is free
    assert transport.flags.tolist() == [[1, 0, 0]]
    as_tuple = rows()
    transport.pack((as_tuple, as_tuple.T))
    assert transport.flags.tolist() == [[1, 1, 0]] and transport._pending == []
    transport.new_iteration()
    transport.reclaim()
    assert transport.flags.tolist() == [[0, 0, 0]]


# -- private and CUDA-only APIs: each behind one function in loader/memory.py, the path it took recorded

def test_shared_slots_come_from_the_private_constructor_and_say_so(monkeypatch):
    from shardkit.loader import memory

    real, calls = torch.UntypedStorage._new_shared, []
    monkeypatch.setattr(torch.UntypedStorage, "_new_shared", lambda n: calls.append(n) or real(n))
    storage = memory.new_shared(1000)
    assert calls == [1000] and memory.PATHS["new_shared"] == "private" and storage.is_shared()


def test_without_the_private_constructor_share_memory_gives_the_slot(monkeypatch):
    from shardkit.loader import memory

    monkeypatch.delattr(torch.storage._StorageBase, "_new_shared")
    storage = memory.new_shared(1000)
    assert memory.PATHS["new_shared"] == "public" and storage.is_shared() and storage.nbytes() == 1000


def test_storage_use_counts_decide_when_lent_slots_come_back(data, monkeypatch):
    from shardkit.loader import memory

    real, calls = torch._C._storage_Use_Count, []
    monkeypatch.setattr(torch._C, "_storage_Use_Count", lambda cdata: calls.append(1) or real(cdata))
    root, _ = data
    _, loader = loader_for(root, monkeypatch, workers=2, seed=2)
    epochs(loader, 1)
    assert memory.PATHS["use_count"] == "private" and not loader._transport.copy_out and calls
    loader._transport.release()
    assert int(loader._transport.flags.sum()) == 0


@pytest.mark.parametrize("broken", ["missing", "miscounts"])
def test_a_missing_or_miscounting_use_count_means_copies(data, monkeypatch, broken):
    """A use count that does not count a new tensor over a storage would free slots under live
    tensors: it is probed once and, like a missing one, turns lending off."""
    from shardkit.loader import memory

    root, _ = data
    _, ref = loader_for(root, monkeypatch, workers=0, seed=2)
    want = epochs(ref)
    if broken == "missing":
        monkeypatch.delattr(torch._C, "_storage_Use_Count")
    else:
        monkeypatch.setattr(torch._C, "_storage_Use_Count", lambda cdata: 1)
    _, loader = loader_for(root, monkeypatch, workers=2, seed=2)
    assert loader._transport.copy_out and memory.PATHS["use_count"].startswith("none: ")
    assert broken in memory.PATHS["use_count"] or "missing" in memory.PATHS["use_count"]
    same_batches(epochs(loader), want)


# -- page-locked slots (pin_memory with CUDA): faked here, there is no GPU on the CPU test machines

class FakeFence:
    """A CUDA event stand-in: the copies before it are done from its second query on."""

    made = 0

    def __init__(self):
        FakeFence.made += 1
        self.asked = 0

    def query(self):
        self.asked += 1
        return self.asked > 1


def pinned_loader(root, monkeypatch, registered: bool, seed=2):
    """A pin_memory loader on a CPU machine: CUDA claimed present, cudaHostRegister faked."""
    from shardkit.loader import memory

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    calls = {"register": [], "unregister": []}

    def register(ptr, n):
        calls["register"].append(ptr)
        return registered, "" if registered else "refused by the test"

    monkeypatch.setattr(memory, "_register", register)
    monkeypatch.setattr(memory, "_unregister", calls["unregister"].append)
    monkeypatch.setattr(memory, "copy_fence", FakeFence)
    # No pinned memory without CUDA: the copy path's pinned buffers become plain ones.
    monkeypatch.setattr(memory, "pinned_empty",
                        lambda shape, stride, dtype, pin: torch.empty_strided(shape, stride, dtype=dtype))
    monkeypatch.setattr(memory, "pinned", lambda t, pin: t)
    _, loader = loader_for(root, monkeypatch, workers=2, seed=seed)
    assert loader._transport.pin
    return loader, calls


def test_refused_page_locking_falls_back_to_pinned_copies_with_the_same_batches(data, monkeypatch):
    from shardkit.loader import memory

    root, _ = data
    _, ref = loader_for(root, monkeypatch, workers=0, seed=2)
    want = epochs(ref)
    loader, _ = pinned_loader(root, monkeypatch, registered=False)
    transport = loader._transport
    held = [(b["__key__"], b["raw"], b["cls"]) for _ in range(2) for b in loader]
    same_batches(held, want)
    assert memory.PATHS["page_lock"] == "none: refused by the test"
    slot_ptrs = {st.data_ptr() for st in transport._main.values()}
    assert slot_ptrs and not any(raw.untyped_storage().data_ptr() in slot_ptrs for _, raw, _ in held)
    assert int(transport.flags.sum()) == 0 and transport._lent == [] and FakeFence.made == 0


def test_page_locked_slots_are_lent_without_a_copy_and_refilled_after_the_copy_fence(data, monkeypatch):
    from shardkit.loader import memory

    root, _ = data
    _, ref = loader_for(root, monkeypatch, workers=0, seed=2)
    want = epochs(ref)
    loader, calls = pinned_loader(root, monkeypatch, registered=True)
    transport = loader._transport
    FakeFence.made = 0
    same_batches(epochs(loader), want)  # every slot locked once, reused with no aliasing
    assert memory.PATHS["page_lock"] == "cudaHostRegister" and FakeFence.made > 0
    assert all(lock is not None and lock.storage is transport._main[key] for key, lock in transport._locks.items())
    it = iter(loader)
    batch = next(it)
    slot_ptrs = {st.data_ptr() for st in transport._main.values()}
    assert batch["raw"].untyped_storage().data_ptr() in slot_ptrs  # the slot itself, no copy
    (worker, slot), = [(w, s) for w, s, _ in transport._lent]
    del it, batch
    transport.release()  # let go, but its fence has not passed: the slot stays taken
    assert [e[:2] for e in transport._draining] == [(worker, slot)] and transport.flags[worker, slot] != 0
    transport.release()
    assert transport._draining == [] and transport.flags[worker, slot] == 0
    del loader, transport
    import gc

    gc.collect()
    # Every page-locked storage is unregistered once, when a grown slot replaces it or with the loader.
    assert calls["register"] and sorted(calls["unregister"]) == sorted(calls["register"])


def test_a_new_iteration_does_not_free_a_page_locked_slot_before_its_copy_fence(monkeypatch):
    """A let-go page-locked slot keeps its old generation until its fence passes; reclaim() at the
    next iteration must not take it for an undelivered batch and free it early (the worker would
    refill it under a running copy, and release() later would free it again under a new batch)."""
    import types

    import shardkit.loader.transport as transport_module
    from shardkit.loader import memory
    from shardkit.loader.transport import SlotTransport

    monkeypatch.setattr(transport_module, "worker_info", lambda: types.SimpleNamespace(id=0))
    monkeypatch.setattr(memory, "page_lock", lambda storage: types.SimpleNamespace(storage=storage))
    monkeypatch.setattr(memory, "copy_fence", FakeFence)
    # In one process the worker side's own handles hold the storage too: once the batch is
    # dropped, say nothing else does.
    monkeypatch.setattr(memory, "refs", lambda t: "unreferenced")
    transport = SlotTransport(1, 3, pin=True)
    transport.new_iteration()
    transport.start_iteration()
    sent = transport.pack({"x": torch.from_numpy(transport.alloc((4, 64)))})
    got = transport.unpack(sent)
    (_, slot), = [(w, s) for w, s, _ in transport._lent]
    del got
    transport.release()  # let go: waiting for its fence
    assert transport._lent == [] and [e[:2] for e in transport._draining] == [(0, slot)]
    transport.new_iteration()
    transport.reclaim()
    assert transport.flags[0, slot] == 1  # still taken: the copy from it may be running
    transport.release()
    assert transport.flags[0, slot] == 0 and transport._draining == []
