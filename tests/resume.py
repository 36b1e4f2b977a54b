"""The resume contract every stateful part of a training loop passes (as torchdata's
run_test_save_load_state): stop after some outputs, save the state through a checkpoint's
serialisation, restore it into a fresh object, and the outputs go on exactly as in a run that
was never stopped."""

from __future__ import annotations

import io
from itertools import islice

import torch


def through_checkpoint(state):
    """The state as a checkpoint gives it back: torch.save, then torch.load."""
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=False)


def check_save_load_state(make, outputs, *, total: int, stop: int, make_restored=None):
    """Assert the contract; returns (uninterrupted outputs, outputs before the stop, after the restore).

    make(): a fresh object with state_dict()/load_state_dict(). outputs(obj, start): an iterator
    of comparable values, the `start`-th output on (inputs that a test drives by hand, such as a
    fake clock's waits, depend on the output's index; a loader ignores `start`).
    make_restored(): the object to restore into when it differs from make() (another number of
    workers, another batch size); the outputs must still be the same.
    """
    assert 0 < stop < total
    ref = list(islice(outputs(make(), 0), total))
    assert len(ref) == total, f"the uninterrupted run gave {len(ref)} outputs, {total} asked"
    first = make()
    before = list(islice(outputs(first, 0), stop))
    state = through_checkpoint(first.state_dict())
    fresh = (make_restored or make)()
    fresh.load_state_dict(state)
    after = list(islice(outputs(fresh, stop), total - stop))
    assert before == ref[:stop]
    assert after == ref[stop:], f"after a restore at output {stop} the outputs differ from an uninterrupted run"
    return ref, before, after
