"""The epoch plan without the epoch: global order, resume layers at a new world size, memory at 1e9."""

import tracemalloc
from collections import Counter

import numpy as np
import pytest

from shardkit.errors import ConfigError
from shardkit.reader.order import EpochOrder
from shardkit.reader.partition import EpochPlan, Plan, Stream, padding, rank_sequence

COUNTS = [50, 49, 51, 50, 50, 48, 52, 50, 50, 47, 53, 50, 13]  # 613 samples, uneven shards


def run_rank(plan_, consumed, workers, stop=None):
    """What one rank's loader returns from `consumed` on: workers' batches, round-robin; `stop`
    batches at most (the run stops there)."""
    parts = [list(plan_.batches(consumed, w, workers)) for w in range(workers)]
    out = []
    for j in range(max(map(len, parts), default=0)):
        for part in parts:
            if j < len(part):
                out.append(part[j])
    return out if stop is None else out[:stop]


def epoch_run(counts, plan, epoch, world, layers=(), consumed=0, workers=1, stop=None):
    """Ids each rank yields (a list per rank), from `consumed`, stopping after `stop` batches."""
    ranks = [EpochPlan.of(counts, plan, epoch, r, world, layers) for r in range(world)]
    return [np.concatenate(run_rank(p, consumed, workers, stop) or [np.empty(0, np.int64)]) for p in ranks], ranks


def test_order_is_a_permutation_independent_of_world_size():
    plan = Plan(seed=3, shuffle_buffer=64)
    order = plan.order(COUNTS, 2)
    g = order.ids(np.arange(len(order)))
    assert sorted(g.tolist()) == list(range(sum(COUNTS)))
    for world in (1, 2, 5, 7):  # ranks take consecutive pieces of the same order (pads aside)
        runs = [EpochPlan.of(COUNTS, plan, 2, r, world) for r in range(world)]
        assert np.array_equal(np.concatenate([p.ids(0, p.real) for p in runs]), g)


def test_blocks_are_computed_on_demand_and_match_a_full_computation():
    order = EpochOrder(COUNTS, seed=1, epoch=0, block=100)
    whole = order.ids(np.arange(len(order)))
    rng = np.random.default_rng(0)
    fresh = EpochOrder(COUNTS, seed=1, epoch=0, block=100)
    for _ in range(20):  # random access, more blocks than are kept
        p = rng.integers(0, len(order), 17)
        assert np.array_equal(fresh.ids(p), whole[p])
    assert len(fresh._blocks) <= 4


def stop_and_resume(world, new_world, workers, stop, plan, counts=COUNTS, epoch=1, layers=()):
    """Run `stop` batches at `world`, resume at `new_world` to the end of the epoch."""
    before, ranks = epoch_run(counts, plan, epoch, world, layers, workers=workers, stop=stop)
    consumed = len(before[0])
    assert all(len(b) == consumed for b in before)  # equal per-rank counts
    new_layers = tuple(layers) + ((world, consumed),)
    after, new_ranks = epoch_run(counts, plan, epoch, new_world, new_layers, workers=workers)
    assert len({len(a) for a in after}) == 1
    return before, after, ranks, new_ranks, new_layers


@pytest.mark.parametrize("world, new_world", [(4, 3), (4, 6), (2, 1), (1, 3)])
@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("drop_remainder", [False, True])
def test_elastic_resume_yields_the_rest_exactly_once(world, new_world, workers, drop_remainder):
    plan = Plan(seed=5, shuffle_buffer=64, batch_size=8, drop_remainder=drop_remainder)
    total = sum(COUNTS)
    before, after, ranks, new_ranks, layers = stop_and_resume(world, new_world, workers, 3, plan)
    seen = Counter(np.concatenate(before + after).tolist())
    assert not set(np.concatenate(before).tolist()) & set(np.concatenate(after).tolist())
    pad = new_ranks[0].padding  # the first layer stopped mid-run: its pads were never reached
    if drop_remainder:
        dropped = padding(total, world, True)
        assert max(seen.values()) == 1 and len(seen) == total - dropped - pad
    else:
        assert set(seen) == set(range(total)) and sum(seen.values()) == total + pad
        assert pad <= new_world - 1
    # The next epoch is a normal epoch at the new world size.
    nxt, _ = epoch_run(COUNTS, plan, 2, new_world)
    fresh = [rank_sequence(COUNTS, plan, 2, r, new_world) for r in range(new_world)]
    assert all(np.array_equal(a, b) for a, b in zip(nxt, fresh))


@pytest.mark.parametrize("worlds", [(4, 3, 6), (2, 5, 1), (3, 3, 2)])
def test_resuming_twice_in_one_epoch(worlds):
    plan = Plan(seed=2, shuffle_buffer=32, batch_size=5)
    a, b, c = worlds
    first, second, _, _, layers = stop_and_resume(a, b, 2, 4, plan)
    second, _ = epoch_run(COUNTS, plan, 1, b, layers, workers=2, stop=3)  # stop the second run too
    rest, last = epoch_run(COUNTS, plan, 1, c, layers + ((b, len(second[0])),), workers=1)
    got = Counter(np.concatenate(first + second + rest).tolist())
    assert set(got) == set(range(sum(COUNTS)))
    assert sum(got.values()) - sum(COUNTS) == last[0].padding
    assert len(Stream(sum(COUNTS), layers + ((b, len(second[0])),)).layers) == 2


def test_a_run_that_saw_its_whole_epoch_leaves_an_empty_stream():
    plan = Plan(seed=0, batch_size=7)
    full = EpochPlan.of(COUNTS, plan, 0, 0, 4)
    after = EpochPlan.of(COUNTS, plan, 0, 1, 3, layers=((4, len(full)),))
    assert len(after) == 0 and list(after.batches(0, 0, 1)) == []
    with pytest.raises(ConfigError, match="consumed=999"):
        Stream(sum(COUNTS), ((4, 999),))


def test_plan_for_a_billion_samples_stays_small():
    counts = np.full(100_000, 10_000)  # 1e9 samples in 100k shards, as counts only
    plan = Plan(seed=0, batch_size=64)
    tracemalloc.start()
    try:
        p = EpochPlan.of(counts, plan, 3, 5, 64)
        first = [next(p.batches(0, w, 2)) for w in range(2)]
        resumed = EpochPlan.of(counts, plan, 3, 40, 48, layers=((64, 1_000_000), (96, 777)))
        mid = next(resumed.batches(12_345, 1, 8))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 50 * 2**20, f"peak {peak / 2**20:.1f} MiB"
    assert len(p) == 15_625_000 and [len(b) for b in first] == [64, 64] and len(mid) == 64
    assert len(set(np.concatenate(first).tolist())) == 128
    # Rank 5 of 64 reads its own 1/64 of the shards (plus at most a block each side).
    shards = set((np.concatenate(first) // 10_000).tolist())
    own = set(p.order.shards_at(p.start, p.start + p.size).tolist())
    assert shards <= own and len(own) <= 15_625_000 // 10_000 + 5


def test_ids_of_positions_in_any_order_and_across_many_blocks():
    """`ids` of any positions equals the ids of each position alone, whether the positions run in a
    few blocks (a worker's batches: one pass per block run) or in many, unsorted (one per block)."""
    order = EpochOrder(COUNTS, seed=4, epoch=2, block=7)
    one_by_one = np.array([order.ids([p])[0] for p in range(len(order))])
    rng = np.random.default_rng(0)
    for positions in (np.arange(len(order)), np.arange(30, 61), rng.permutation(len(order)),
                      np.concatenate([np.arange(40, 48), np.arange(5, 9), np.arange(40, 44)])):
        assert np.array_equal(order.ids(positions), one_by_one[positions])
    assert sorted(one_by_one.tolist()) == list(range(len(order)))
