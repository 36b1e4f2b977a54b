"""make_loader with real DataLoader workers: exactly-once over ranks, order, epochs, resume."""

from collections import Counter

import numpy as np
import pytest
import torch
from factory import keys_of, loader_for, make_dataset
from resume import check_save_load_state

from shardkit.errors import ConfigError
from shardkit.loader import make_loader
from shardkit.reader.dataset import StreamingDataset
from shardkit.reader.partition import rank_sequence

BS = 4


@pytest.fixture(scope="module")
def datasets(tmp_path_factory):
    many = make_dataset(tmp_path_factory.mktemp("many"), 61, shards=12, fields=("raw", "cls"))
    few = make_dataset(tmp_path_factory.mktemp("few"), 11, shards=2, fields=("raw", "cls"))
    return {"many": many, "few": few}


@pytest.mark.parametrize("name", ["many", "few"])
@pytest.mark.parametrize("workers", [0, 2])
def test_exactly_once_with_real_workers(datasets, monkeypatch, name, workers):
    root, expected = datasets[name]
    for world in (1, 2, 3):
        seen, counts, nbatches = Counter(), [], []
        for rank in range(world):
            ds, loader = loader_for(root, monkeypatch, rank=rank, world=world, workers=workers)
            batches = list(loader)
            assert len(batches) == len(loader)
            for b in batches:  # each batch is one tensor per field, matching its keys
                assert b["raw"].shape[0] == len(b["__key__"])
                assert b["cls"].tolist() == [expected[k].fields["cls"] for k in b["__key__"]]
            seen.update(keys_of(batches))
            counts.append(len(keys_of(batches)))
            nbatches.append(len(batches))
        assert len(set(counts)) == 1 and len(set(nbatches)) == 1
        assert set(seen) == set(expected)
        assert sum(seen.values()) - len(expected) == ds.padding <= world - 1


@pytest.mark.filterwarnings("ignore:This DataLoader will create")
@pytest.mark.parametrize("workers", [3, 4])
def test_order_is_rank_sequence_for_any_worker_count(datasets, monkeypatch, workers):
    root, _ = datasets["many"]  # 61 samples / 4 = 16 batches: not a multiple of 3, last one short
    ds0, ref = loader_for(root, monkeypatch, workers=0)
    ds, loader = loader_for(root, monkeypatch, workers=workers)
    got = keys_of(loader)
    assert got == keys_of(ref)
    all_keys = sorted(datasets["many"][1])
    seq = rank_sequence(ds.counts, ds.plan, 0, 0, 1)
    assert got == [all_keys[i] for i in seq]


def test_epochs_deterministic_and_different(datasets, monkeypatch):
    root, _ = datasets["many"]
    _, a = loader_for(root, monkeypatch, workers=2, seed=9)
    _, b = loader_for(root, monkeypatch, workers=0, seed=9)
    a0, a1 = keys_of(a), keys_of(a)  # the second iter() advances to epoch 1
    b.dataset.set_epoch(0)
    b0 = keys_of(b)
    b.dataset.set_epoch(1)
    b1 = keys_of(b)
    assert a0 == b0 and a1 == b1 and a0 != a1 and sorted(a0) == sorted(a1)
    _, c = loader_for(root, monkeypatch, workers=0, seed=10)
    assert keys_of(c) != a0


def key_stream(loader, start=0):
    """Each batch's keys, epoch after epoch, as the training loop sees them."""
    while True:
        for batch in loader:
            yield batch["__key__"]


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("stop", [5, 16, 20])  # mid-epoch 0, the epoch boundary, mid-epoch 1
def test_resume_equals_uninterrupted(datasets, monkeypatch, workers, stop):
    root, _ = datasets["many"]
    check_save_load_state(lambda: loader_for(root, monkeypatch, workers=workers, seed=3)[1], key_stream,
                          total=3 * 16, stop=stop)


@pytest.mark.parametrize("workers", [0, 2])
def test_drop_last_epochs_follow_each_other(datasets, monkeypatch, workers):
    """With drop_last the short rest of an epoch ends it: the next iter() starts the next epoch,
    in a loop that never calls set_epoch and after a restore from the epoch's end."""
    root, expected = datasets["many"]  # 61 samples, batches of 4: 15 full ones, 1 left over
    ds, loader = loader_for(root, monkeypatch, workers=workers, seed=6, drop_last=True)
    epochs = [keys_of(loader) for _ in range(3)]
    assert [len(e) for e in epochs] == [60, 60, 60] and ds.epoch == 2
    assert len({tuple(e) for e in epochs}) == 3 and all(set(e) <= set(expected) for e in epochs)
    check_save_load_state(lambda: loader_for(root, monkeypatch, workers=workers, seed=6, drop_last=True)[1],
                          key_stream, total=3 * 15, stop=15)


@pytest.mark.filterwarnings("ignore:This DataLoader will create")
@pytest.mark.parametrize("before, after", [(2, 0), (0, 3)])
def test_resume_contract_across_worker_counts(datasets, monkeypatch, before, after):
    root, _ = datasets["many"]
    check_save_load_state(lambda: loader_for(root, monkeypatch, workers=before, seed=4)[1], key_stream,
                          total=20, stop=7, make_restored=lambda: loader_for(root, monkeypatch, workers=after,
                                                                             seed=4)[1])


def test_resume_with_set_epoch_loop_at_boundary(datasets, monkeypatch):
    root, _ = datasets["many"]
    _, ref = loader_for(root, monkeypatch, seed=5)
    full = []
    for epoch in range(2):
        ref.dataset.set_epoch(epoch)
        full += keys_of(ref)
    _, first = loader_for(root, monkeypatch, seed=5)
    first.dataset.set_epoch(0)
    done = keys_of(first)
    state = first.state_dict()
    assert state["epoch"] == 0 and state["consumed"] == 61
    _, fresh = loader_for(root, monkeypatch, seed=5)
    fresh.load_state_dict(state)
    rest = []
    for epoch in range(state["epoch"], 2):  # the training loop restarts its own epoch counter
        fresh.dataset.set_epoch(epoch)
        rest += keys_of(fresh)
    assert done + rest == full


@pytest.mark.filterwarnings("ignore:This DataLoader will create")
@pytest.mark.parametrize("before, after", [(2, 0), (0, 3), (2, 1)])
def test_resume_with_other_worker_count_yields_exactly_the_rest(datasets, monkeypatch, before, after):
    root, expected = datasets["many"]
    _, first = loader_for(root, monkeypatch, workers=before, seed=1)
    it = iter(first)
    done = keys_of([next(it) for _ in range(7)])
    state = first.state_dict()
    assert state["consumed"] == 7 * BS
    _, fresh = loader_for(root, monkeypatch, workers=after, seed=1, bs=5)  # batch size may change too
    fresh.load_state_dict(state)
    rest = keys_of(fresh)
    assert sorted(done + rest) == sorted(expected) and not set(done) & set(rest)


def test_skipped_shard_count_reaches_the_main_process(tmp_path, monkeypatch):
    root, expected = make_dataset(tmp_path, 30, shards=3, fields=("raw", "cls"))
    (tmp_path / "shards" / "data-00001.tar").write_bytes(b"not a tar")
    _, loader = loader_for(root, monkeypatch, workers=2, on_error="skip")
    got = keys_of(loader)
    assert loader.source.skipped_shards == ["shards/data-00001.tar"]
    assert 0 < len(got) < 30 and set(got) < set(expected)
    assert loader.state_dict()["consumed"] == 30  # planned samples: resume is not shifted


def test_state_mismatch_is_explained(datasets, monkeypatch):
    root, _ = datasets["many"]
    _, a = loader_for(root, monkeypatch, seed=1)
    next(iter(a))
    _, b = loader_for(root, monkeypatch, seed=2)
    with pytest.raises(ConfigError, match="seed=1"):
        b.load_state_dict(a.state_dict())
    _, c = loader_for(root, monkeypatch, seed=1, shuffle_buffer=8)
    with pytest.raises(ConfigError, match="shuffle_buffer=16 then, 8 now"):
        c.load_state_dict(a.state_dict())
    _, d = loader_for(datasets["few"][0], monkeypatch, seed=1)
    with pytest.raises(ConfigError, match="samples=61 then, 11 now"):
        d.load_state_dict(a.state_dict())


def test_state_of_the_same_samples_in_other_shards_is_refused(tmp_path, monkeypatch):
    """A rebuild with another shard size keeps the sample count but changes the epoch's order:
    resuming its state would repeat some samples and never show others."""
    twelve, _ = make_dataset(tmp_path / "a", 61, shards=12, fields=("raw", "cls"))
    five, _ = make_dataset(tmp_path / "b", 61, shards=5, fields=("raw", "cls"))
    _, a = loader_for(twelve, monkeypatch, seed=1)
    next(iter(a))
    _, b = loader_for(five, monkeypatch, seed=1)
    with pytest.raises(ConfigError, match="shards='12 shards, counts [0-9a-f]+' then, '5 shards, counts"):
        b.load_state_dict(a.state_dict())
    _, same = loader_for(make_dataset(tmp_path / "c", 61, shards=12, fields=("raw", "cls"))[0], monkeypatch, seed=1)
    same.load_state_dict(a.state_dict())  # the same layout elsewhere (a copy, another format) resumes


def test_worker_identity_override(datasets, monkeypatch):
    root, _ = datasets["few"]
    ds, _ = loader_for(root, monkeypatch)
    parts = []
    for w in range(3):
        monkeypatch.setenv("SHARDKIT_WORKER", str(w))
        monkeypatch.setenv("SHARDKIT_NUM_WORKERS", "3")
        parts.append(keys_of(ds.batches(BS)))
    assert [len(p) for p in parts] == [4, 4, 3]  # batches 0,3 / 1 / 2 of 11 samples in batches of 4
    assert sorted(sum(parts, [])) == sorted(datasets["few"][1])


def test_pinned_batches_keep_shapes(datasets, monkeypatch):
    root, _ = datasets["few"]
    _, loader = loader_for(root, monkeypatch, workers=1)
    b = next(iter(loader))
    assert isinstance(b["raw"], torch.Tensor) and b["raw"].shape == (BS, 3, 12, 16)
    assert np.asarray(b["cls"]).dtype == np.int64


def expected_raw(sample, h=12, w=16):
    return torch.from_numpy(np.frombuffer(sample.fields["raw"], np.uint8).reshape(h, w, 3).copy()).permute(2, 0, 1)


def test_held_batches_stay_intact_while_slots_are_reused(datasets, monkeypatch):
    root, expected = datasets["many"]
    _, loader = loader_for(root, monkeypatch, workers=2)
    held = [b for _ in range(3) for b in loader]  # 48 batches kept: more than the slots
    transport = loader._transport
    assert transport.flags.shape[1] < len(held)
    for b in held:
        assert b["raw"].shape == (len(b["__key__"]), 3, 12, 16)
        for key, img in zip(b["__key__"], b["raw"]):
            assert torch.equal(img, expected_raw(expected[key]))
    del held, b, img
    transport.release()
    assert int(transport.flags.sum()) == 0  # every slot came back once its batch was dropped


def test_batch_transform_output_travels_and_frees_slots(datasets, monkeypatch):
    root, expected = datasets["many"]
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    ds = StreamingDataset(root, fields=["raw", "cls"],
                          batch_transform=lambda b: {**b, "raw": b["raw"].float() / 255})
    loader = make_loader(ds, batch_size=8, num_workers=2)
    for _ in range(2):
        for b in loader:
            assert b["raw"].dtype == torch.float32
            want = torch.stack([expected_raw(expected[k]) for k in b["__key__"]]).float() / 255
            assert torch.equal(b["raw"], want)
    assert int(loader._transport.flags.sum()) == 0


def test_released_batches_reuse_slots_but_views_are_kept_safe(datasets, monkeypatch):
    root, expected = datasets["many"]
    _, loader = loader_for(root, monkeypatch, workers=2)
    kept = []
    for epoch in range(3):
        for i, batch in enumerate(loader):
            if i % 4 == 0:  # keep a view (or a numpy array) of some batches, drop the rest
                view = batch["raw"][0] if i % 8 else torch.from_numpy(batch["raw"].numpy()[0])
                kept.append((batch["__key__"][0], view))
            for key, img in zip(batch["__key__"], batch["raw"]):
                assert torch.equal(img, expected_raw(expected[key]))
            del batch, img
    for key, view in kept:
        assert torch.equal(view, expected_raw(expected[key]))
    transport = loader._transport
    assert len(transport._main) < 3 * len(loader)  # slots were reused: 48 batches
    slot_ptrs = {st.data_ptr() for st in transport._main.values()}
    in_slots = sum(v.untyped_storage().data_ptr() in slot_ptrs for _, v in kept)
    transport.release()
    assert in_slots >= 1 and int((transport.flags != 0).sum()) == in_slots  # viewed slots stay taken
    del kept, view
    transport.release()
    assert int(transport.flags.sum()) == 0


def test_stopping_early_does_not_leak_slots(datasets, monkeypatch):
    root, expected = datasets["many"]
    _, loader = loader_for(root, monkeypatch, workers=2)
    transport = loader._transport
    for _ in range(6):  # each stop leaves prefetched batches in slots that are never delivered
        it = iter(loader)
        batch = next(it)
        assert torch.equal(batch["raw"][0], expected_raw(expected[batch["__key__"][0]]))
        del it, batch
    rest = keys_of(loader)  # the epoch goes on after the 6 delivered batches
    assert len(rest) == 61 - 6 * BS
    transport.release()
    assert int(transport.flags.sum()) == 0


def test_plain_dataloader_over_samples_is_exactly_once(datasets, monkeypatch):
    from torch.utils.data import DataLoader

    root, expected = datasets["many"]
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    ds = StreamingDataset(root, fields=["raw", "cls"])
    batches = list(DataLoader(ds, batch_size=8, num_workers=2))
    keys = keys_of(batches)
    assert sorted(keys) == sorted(expected)
    assert batches[0]["raw"].shape == (8, 3, 12, 16) and batches[0]["cls"].dtype == torch.int64


def test_a_worker_slow_to_start_an_iteration_tags_its_slots_with_that_iteration(datasets, monkeypatch):
    """The cause of the old 1-in-8 failure above, made certain: a worker that takes up an iteration
    only after the training loop has already stopped it and started the next one must still tag
    the slots it fills with the iteration they belong to, or they pass for current ones and stay
    taken for a whole extra epoch (reclaim frees only older generations)."""
    import time

    from torch.utils.data._utils import fetch

    real_fetch = fetch._IterableDatasetFetcher.fetch

    def slow_first_fetch(self, index):  # runs in the forked workers: worker 1 lags at each iteration's start
        info = torch.utils.data.get_worker_info()
        if info is not None and info.id == 1 and not getattr(self, "_lagged", False):
            self._lagged = True
            time.sleep(0.3)
        return real_fetch(self, index)

    monkeypatch.setattr(fetch._IterableDatasetFetcher, "fetch", slow_first_fetch)
    root, expected = datasets["many"]
    _, loader = loader_for(root, monkeypatch, workers=2)
    transport = loader._transport
    for _ in range(3):
        it = iter(loader)
        batch = next(it)  # batch 0 comes from worker 0, before worker 1 has begun this iteration
        del it, batch
    rest = keys_of(loader)
    assert len(rest) == 61 - 3 * BS
    transport.release()
    assert transport.flags.tolist() == [[0] * transport.flags.shape[1]] * 2


@pytest.mark.parametrize("cores, ranks, want", [(16, 1, 8), (16, 8, 2), (16, 16, 1), (2, 1, 1), (64, 4, 8), (4, 3, 1)])
def test_default_workers_share_the_cores_among_the_ranks_of_the_machine(cores, ranks, want):
    from shardkit.loader import default_workers

    assert default_workers(cores, ranks) == want


@pytest.mark.filterwarnings("ignore:This DataLoader will create")
def test_make_loader_reads_ranks_per_machine_from_torchrun(datasets, monkeypatch):
    import shardkit.loader as loader_module

    monkeypatch.setattr(loader_module, "usable_cores", lambda: 16)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")  # torchrun --nproc-per-node 8
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "8")
    ds = StreamingDataset(datasets["many"][0], fields=["raw", "cls"])
    assert make_loader(ds, batch_size=BS).num_workers == 2
    monkeypatch.delenv("LOCAL_WORLD_SIZE")
    assert make_loader(ds, batch_size=BS).num_workers == 8
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "eight")
    with pytest.raises(ConfigError, match="LOCAL_WORLD_SIZE must be an integer"):
        make_loader(ds, batch_size=BS)


@pytest.mark.parametrize("private", [True, False])
def test_close_stops_the_persistent_workers_and_a_new_loader_continues(datasets, monkeypatch, private):
    """loader.close() (and loader.stop_workers for any DataLoader) through torch's private
    `_shutdown_workers` where it exists, and without it (as if a torch release dropped it). A closed
    loader refuses to iterate (its slots are gone); a new one continues from its state."""
    import multiprocessing

    from torch.utils.data import dataloader

    from shardkit.loader import stop_workers

    if not private:
        for cls in (dataloader._MultiProcessingDataLoaderIter,):
            monkeypatch.delattr(cls, "_shutdown_workers")
            monkeypatch.setattr(cls, "__del__", lambda self: _shutdown_without_the_private_call(self))
    root, expected = datasets["few"]
    before = set(multiprocessing.active_children())
    ds, loader = loader_for(root, monkeypatch, workers=2)
    first = keys_of(list(loader))
    workers = set(multiprocessing.active_children()) - before
    assert len(workers) == 2 and all(p.is_alive() for p in workers)  # persistent: alive between epochs
    loader.close()
    for p in workers:
        p.join(timeout=60)
    assert not any(p.is_alive() for p in workers)
    assert sorted(first) == sorted(expected)
    with pytest.raises(RuntimeError, match="was closed"):
        iter(loader)
    ds2, again = loader_for(root, monkeypatch, workers=2)
    again.load_state_dict(loader.state_dict())
    assert sorted(keys_of(list(again))) == sorted(expected)  # the next epoch, on new workers
    stop_workers(again)
    assert set(multiprocessing.active_children()) - before == set()


def _shutdown_without_the_private_call(iterator):
    """What a DataLoader iterator's finalizer must do if torch had no `_shutdown_workers`: stop its
    workers (here through the done event and the queues' sentinel, as torch's own code does)."""
    iterator._workers_done_event.set()
    for q in iterator._index_queues:
        q.put(None)
    for w in iterator._workers:
        w.join(timeout=30)


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_a_dropped_loader_leaves_no_queue_thread_to_free_its_semaphores_at_exit(datasets, monkeypatch, context):
    """The workers' index queues each have a feeder thread (a daemon). Dropped with the loader, such a
    thread could hold a queue's last reference and free its semaphores while the interpreter exits:
    stopped half-way, it left multiprocessing's resource tracker warning of a "leaked semaphore" after
    a preempted run's last line (tests/test_preempt_workers.py). Once the loader is gone, its feeder
    threads have ended, in the thread that dropped it."""
    import gc
    import threading
    import time
    from multiprocessing import queues

    feed = queues.Queue._feed

    def slow_to_end(*args):  # a feeder thread that lingers after its queue closed, as under load
        feed(*args)
        time.sleep(0.5)

    monkeypatch.setattr(queues.Queue, "_feed", staticmethod(slow_to_end))
    root, _ = datasets["few"]
    ds, loader = loader_for(root, monkeypatch, workers=2, multiprocessing_context=context)
    it = iter(loader)
    next(it)
    feeders = [q._thread for q in loader._iterator._index_queues]
    assert len(feeders) == 2 and all(t is not None and t.is_alive() for t in feeders)
    del it, loader, ds
    gc.collect()
    assert not any(t.is_alive() for t in feeders)
    assert not [t for t in threading.enumerate() if t in feeders]


EXIT_LATE = """
import os, sys
from shardkit import StreamingDataset, make_loader
ds = StreamingDataset(sys.argv[1])
loader = make_loader(ds, batch_size=4, num_workers=2, multiprocessing_context=sys.argv[2])
it = iter(loader)
next(it)
loader.close()
os._held = it  # kept by a module Python empties late, after threading's: freed as the interpreter ends
print("closed", flush=True)
"""


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_an_iterator_that_outlives_the_modules_ends_without_a_traceback(datasets, context):
    """An iterator whose workers were stopped (close) and that is freed only while the interpreter
    tears its modules down: torch's shutdown runs again from its finalizer and the wait for the
    queues' threads must not meet the emptied modules (it printed "Exception ignored ... TypeError")."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root, _ = datasets["few"]
    here = Path(__file__).resolve().parent
    done = subprocess.run([sys.executable, "-c", EXIT_LATE, str(root), context], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHONPATH": str(here.parent)})
    assert done.returncode == 0 and done.stdout == "closed\n", done.stderr[-3000:]
    assert done.stderr == "", done.stderr[-3000:]
