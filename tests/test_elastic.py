"""make_loader resumes at another world size: the rest of the epoch exactly once, then normal epochs."""

from collections import Counter

import pytest
from factory import keys_of, loader_for, make_dataset

STOP = 3  # batches each rank yields before the run is stopped


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return make_dataset(tmp_path_factory.mktemp("elastic"), 61, shards=7, fields=("raw", "cls"))


def ranks(root, monkeypatch, world, workers=0, state=None, **options):
    """One loader per rank of `world` (each restored from `state` when given)."""
    out = []
    for rank in range(world):
        ds, loader = loader_for(root, monkeypatch, rank=rank, world=world, workers=workers, seed=11, **options)
        if state is not None:
            loader.load_state_dict(state)
        out.append(loader)
    return out


def stop_after(loaders, n):
    """Every rank yields n batches (in lockstep, as DDP runs them); the state all ranks share."""
    got = []
    for loader in loaders:
        it = iter(loader)
        got.append(keys_of(next(it) for _ in range(n)))
        del it
    states = [loader.state_dict() for loader in loaders]
    assert all(s == states[0] for s in states[1:])  # any rank's state is the run's state
    return got, states[0]


def check_rest_of_epoch(before, after, loaders, expected):
    """`before` + `after` hold every sample once, plus the new split's reported padding."""
    assert len({len(a) for a in after}) == 1  # equal per-rank counts
    seen = Counter(k for keys in before + after for k in keys)
    assert set(seen) == set(expected)
    assert sum(seen.values()) - len(expected) == loaders[0].source.padding
    assert not {k for b in before for k in b} & {k for a in after for k in a}


@pytest.mark.filterwarnings("ignore:This DataLoader will create")
@pytest.mark.parametrize("world, new_world", [(4, 3), (4, 6), (2, 1), (1, 3)])
@pytest.mark.parametrize("workers", [0, 2])
def test_resume_at_another_world_size(data, monkeypatch, world, new_world, workers):
    root, expected = data
    before, state = stop_after(ranks(root, monkeypatch, world, workers), STOP)
    assert state["consumed"] == STOP * 4 and state["world_size"] == world
    resumed = ranks(root, monkeypatch, new_world, workers, state)
    after = [keys_of(loader) for loader in resumed]
    check_rest_of_epoch(before, after, resumed, expected)
    assert resumed[0].state_dict()["layers"] == [[world, STOP * 4]]
    # The next epoch is the normal epoch at the new world size.
    following = [keys_of(loader) for loader in resumed]
    fresh = ranks(root, monkeypatch, new_world)
    for loader in fresh:
        loader.source.set_epoch(1)
    assert following == [keys_of(loader) for loader in fresh]
    assert resumed[0].state_dict()["layers"] == []


def test_resume_twice_in_one_epoch(data, monkeypatch):
    root, expected = data
    first, state = stop_after(ranks(root, monkeypatch, 4), 2)
    second, state = stop_after(ranks(root, monkeypatch, 2, state=state), 3)
    assert state["layers"] == [[4, 8]] and state["consumed"] == 12
    last = ranks(root, monkeypatch, 3, state=state)
    rest = [keys_of(loader) for loader in last]
    check_rest_of_epoch(first + second, rest, last, expected)


@pytest.mark.parametrize("new_world", [2, 3])
def test_state_after_an_epochs_last_batch_starts_the_next_epoch(data, monkeypatch, new_world):
    root, _ = data
    done = ranks(root, monkeypatch, 2)
    for loader in done:
        keys_of(loader)  # the whole of epoch 0
    state = done[0].state_dict()
    assert (state["epoch"], state["consumed"]) == (0, state["samples_per_rank"])
    resumed = ranks(root, monkeypatch, new_world, state=state)
    fresh = ranks(root, monkeypatch, new_world)
    for loader in fresh:
        loader.source.set_epoch(1)
    want = [keys_of(loader) for loader in fresh]
    assert [keys_of(loader) for loader in resumed] == want  # epoch 1: none dropped, none repeated
    assert resumed[0].source.epoch == 1
    # A set_epoch loop that restarts at the saved epoch sees it finished, then goes on.
    looped = ranks(root, monkeypatch, new_world, state=state)
    for loader in looped:
        loader.source.set_epoch(0)
    assert all(keys_of(loader) == [] for loader in looped)
    for loader in looped:
        loader.source.set_epoch(1)
    assert [keys_of(loader) for loader in looped] == want
