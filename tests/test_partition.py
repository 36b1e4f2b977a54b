"""The pure partition function: exactly-once over ranks x workers, equal ranks, shuffle, resume."""

from collections import Counter
from itertools import product

import numpy as np
import pytest

from shardkit.errors import ConfigError
from shardkit.reader.partition import (Plan, batch_sizes, padding, partition, rank_sequence,
                                       worker_batches)

COUNTS = {
    "many_shards": [50, 49, 51, 50, 50, 48, 52, 50, 50, 47, 53, 50, 50, 50, 50, 50, 50, 50, 50, 50],
    "few_shards": [7, 6],          # fewer shards than ranks x workers: split inside shards
    "tiny": [2],                   # fewer samples than ranks
}


def round_robin(per_worker):
    """What DataLoader returns: worker 0's first batch, worker 1's first, ... skipping exhausted."""
    out, iters = [], [iter(b) for b in per_worker]
    active = list(range(len(iters)))
    while active:
        for w in list(active):
            batch = next(iters[w], None)
            if batch is None:
                active.remove(w)
            else:
                out.append(batch)
    return out


@pytest.mark.parametrize("name", sorted(COUNTS))
@pytest.mark.parametrize("drop_remainder", [False, True])
def test_exactly_once_grid(name, drop_remainder):
    counts = COUNTS[name]
    total = sum(counts)
    for world, workers, bs, shuffle in product([1, 2, 3], [0, 1, 2, 4], [1, 4, 5], [True, False]):
        if drop_remainder and total < world:
            with pytest.raises(ConfigError, match="drop_remainder"):
                rank_sequence(counts, Plan(drop_remainder=True), 0, 0, world)
            continue
        plan = Plan(seed=7, shuffle=shuffle, shuffle_buffer=64, drop_remainder=drop_remainder, batch_size=bs)
        W = max(1, workers)  # num_workers=0 iterates in the main process: one "worker"
        seen, per_rank, per_rank_batches = Counter(), [], []
        for rank in range(world):
            per_worker = [partition(counts, plan, epoch=3, rank=rank, world_size=world, worker=w,
                                    num_workers=W) for w in range(W)]
            batches = round_robin(per_worker)
            ids = np.concatenate(batches)
            # Round-robin over workers gives back the rank's sequence in order, for any W.
            assert np.array_equal(ids, rank_sequence(counts, plan, 3, rank, world))
            assert all(len(b) == bs for b in batches[:-1])
            seen.update(ids.tolist())
            per_rank.append(len(ids))
            per_rank_batches.append(len(batches))
        assert len(set(per_rank)) == 1 and len(set(per_rank_batches)) == 1, (per_rank, per_rank_batches)
        assert per_rank[0] > 0
        extra = padding(total, world, drop_remainder)
        assert extra <= world - 1
        if drop_remainder:
            assert set(seen) <= set(range(total)) and max(seen.values()) == 1
            assert len(seen) == total - extra
        else:
            assert set(seen) == set(range(total))
            assert sum(seen.values()) == total + extra
            assert sum(c - 1 for c in seen.values()) == extra


def test_drop_last_keeps_equal_batches_per_rank():
    counts = [10, 11, 12]
    plan = Plan(batch_size=4, drop_last=True)
    sizes = []
    for rank in range(2):
        batches = round_robin([partition(counts, plan, epoch=0, rank=rank, world_size=2, worker=w,
                                         num_workers=3) for w in range(3)])
        assert all(len(b) == 4 for b in batches)
        sizes.append(len(batches))
    assert sizes == [4, 4]  # 17 per rank -> 4 full batches, the partial one dropped
    assert batch_sizes(17, 4, drop_last=True) == [4, 4, 4, 4]
    assert batch_sizes(17, 4, drop_last=False) == [4, 4, 4, 4, 1]


def test_ranks_touch_few_shards():
    counts = [100] * 40
    plan = Plan(seed=1, shuffle_buffer=256)
    for rank in range(4):
        shards = set((rank_sequence(counts, plan, 0, rank, 4) // 100).tolist())
        # The shuffle blocks belong to the global order, not to a rank: a run of 1000 samples
        # reaches into at most one block of 256 beyond each end, so 15.1 shards' worth, + 2 cuts.
        assert len(shards) <= 17
        assert shards <= set(plan.order(counts, 0).shards_at(1000 * rank, 1000 * (rank + 1)).tolist())


def test_determinism_and_epochs():
    counts = [500] * 20
    a = rank_sequence(counts, Plan(seed=5), 2, 0, 1)
    assert np.array_equal(a, rank_sequence(counts, Plan(seed=5), 2, 0, 1))
    assert not np.array_equal(a, rank_sequence(counts, Plan(seed=5), 3, 0, 1))
    assert not np.array_equal(a, rank_sequence(counts, Plan(seed=6), 2, 0, 1))
    assert np.array_equal(rank_sequence(counts, Plan(shuffle=False), 4, 0, 1), np.arange(10_000))


def spearman(x, y):
    rx, ry = np.argsort(np.argsort(x)), np.argsort(np.argsort(y))
    return float(np.corrcoef(rx, ry)[0, 1])


@pytest.mark.parametrize("seed", range(5))
def test_shuffle_mixes_across_shards(seed):
    counts = [500] * 20
    seq = rank_sequence(counts, Plan(seed=seed), 0, 0, 1)
    assert abs(spearman(seq, np.arange(len(seq)))) < 0.1
    # A small buffer still shuffles within its window: neighbours rarely stay neighbours.
    small = rank_sequence(counts, Plan(seed=seed, shuffle_buffer=100), 0, 0, 1)
    assert np.mean(np.abs(np.diff(small)) == 1) < 0.05


@pytest.mark.parametrize("workers", [1, 2, 3, 4])
def test_resume_any_worker_count(workers):
    counts = [13, 9, 21, 4]
    plan = Plan(seed=3, batch_size=5, shuffle_buffer=16)
    seq = rank_sequence(counts, plan, 1, 1, 2)
    for consumed in (0, 5, 10, 23, len(seq)):
        rest = round_robin([worker_batches(seq, plan, consumed, w, workers) for w in range(workers)])
        got = np.concatenate(rest) if rest else np.array([], dtype=np.int64)
        assert np.array_equal(got, seq[consumed:])
    with pytest.raises(ConfigError, match="consumed=999"):
        worker_batches(seq, plan, 999, 0, 1)


def test_bad_arguments_name_the_value():
    with pytest.raises(ConfigError, match="seed=-1"):
        Plan(seed=-1)
    with pytest.raises(ConfigError, match="batch_size=0"):
        Plan(batch_size=0)
    with pytest.raises(ConfigError, match="rank=2, world_size=2"):
        rank_sequence([3], Plan(), 0, 2, 2)
    with pytest.raises(ConfigError, match="worker=3, num_workers=2"):
        partition([3], Plan(), epoch=0, rank=0, world_size=1, worker=3, num_workers=2)


def test_rank_world_prefers_torch_distributed(tmp_path, monkeypatch):
    import torch.distributed as dist

    from shardkit.identity import rank_world, worker_identity

    monkeypatch.setenv("RANK", "5")
    monkeypatch.setenv("WORLD_SIZE", "8")
    assert rank_world() == (5, 8)
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        assert rank_world() == (0, 1)
    finally:
        dist.destroy_process_group()
    monkeypatch.setenv("WORLD_SIZE", "x")
    with pytest.raises(ConfigError, match="RANK/WORLD_SIZE"):
        rank_world()
    assert worker_identity() == (0, 1)
    monkeypatch.setenv("SHARDKIT_WORKER", "2")
    monkeypatch.setenv("SHARDKIT_NUM_WORKERS", "3")
    assert worker_identity() == (2, 3)


@pytest.mark.parametrize("name", sorted(COUNTS))
def test_a_lead_of_small_first_items_keeps_the_run_in_order(name):
    """Grouped worker items start with one small item per worker (`lead`): round-robin over the
    workers still gives the rank's run in order, from any position, for any worker count."""
    from shardkit.reader.partition import EpochPlan

    counts = COUNTS[name]
    for world, workers, bs, lead, consumed in product([1, 2], [1, 2, 3], [4, 5], [1, 3], [0, 7]):
        plan = EpochPlan.of(counts, Plan(seed=3, batch_size=bs), 1, 0, world, ())
        if consumed > len(plan):
            continue
        items = round_robin([list(plan.batches(consumed, w, workers, None, lead)) for w in range(workers)])
        assert np.array_equal(np.concatenate(items) if items else np.zeros(0, np.int64),
                              plan.ids(consumed, len(plan)))
        head = [len(i) for i in items[:workers]]
        assert all(n <= lead for n in head) and all(len(i) <= bs for i in items[workers:])
