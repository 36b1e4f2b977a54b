"""run_tasks: ordered results, a step per group as soon as its items are done, and a head start in
this process while the cluster starts."""

from __future__ import annotations

import os
import time

import pytest

from shardkit.cluster import PendingClient
from shardkit.tasks import Then, run_tasks


def _item(i: int, delay: float) -> tuple[int, int]:
    time.sleep(delay)
    return i, os.getpid()


def _group(name: str, parts: list, delay: float) -> tuple[str, list[int], set[int]]:
    return name, [i for i, _ in parts], {pid for _, pid in parts}


def _check(result) -> None:
    if result[0] == "bad":
        raise ValueError("group 'bad' failed its check")


def test_groups_in_order_in_process_and_with_a_cluster_still_starting():
    items = list(range(24))
    members = [list(range(g * 4, g * 4 + 4)) for g in range(6)]
    then = Then(_group, [f"g{g}" for g in range(6)], members)
    here = run_tasks(_item, items, then=then, shared=(0.0,))
    assert [(n, ids) for n, ids, _ in here] == [(f"g{g}", members[g]) for g in range(6)]
    pending = PendingClient(None, 1)
    try:
        seen = []
        out = run_tasks(_item, items, client=pending, then=then, shared=(0.15,), bar=_Bar(seen))
    finally:
        pending.close()
    assert [(n, ids) for n, ids, _ in out] == [(f"g{g}", members[g]) for g in range(6)]
    pids = set().union(*(p for _, _, p in out))
    assert os.getpid() in pids and len(pids) == 2  # a head start here, the rest on the worker
    assert len(seen) == 6


def test_a_failed_check_stops_the_run():
    then = Then(_group, ["ok", "bad", "later"], [[0], [1], [2]])
    with pytest.raises(ValueError, match="'bad' failed"):
        run_tasks(_item, [0, 1, 2], then=then, check=_check, shared=(0.0,))
    pending = PendingClient(None, 1)
    try:
        with pytest.raises(ValueError, match="'bad' failed"):
            run_tasks(_item, [0, 1, 2], client=pending, then=then, check=_check, shared=(0.0,))
    finally:
        pending.close()


class _Bar:
    def __init__(self, seen: list):
        self.seen = seen

    def update(self, n: int) -> None:
        self.seen.append(n)
