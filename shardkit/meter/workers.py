"""What the loader's worker processes do with their CPU (psutil) and what its dataset waited for
on the network: the measured side of the meter's levers."""

from __future__ import annotations

import time

SAMPLE_EVERY = 100  # steps between CPU samples: psutil reads ~20 us per worker, noise beside a step


def worker_pids(iterator) -> list[int]:
    """PIDs of the worker processes behind a DataLoader iterator (torch's private `_workers`),
    or [] where there are none or this torch names them otherwise: the meter then says the
    workers' CPU was not measured rather than guess."""
    procs = getattr(iterator, "_workers", None)
    if not isinstance(procs, list):
        return []
    return [p.pid for p in procs if isinstance(getattr(p, "pid", None), int)]


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of one process so far, None once it is gone."""
    import psutil

    try:
        t = psutil.Process(pid).cpu_times()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None
    return t.user + t.system


class WorkerCpu:
    """Cores the loader's workers kept busy, from their CPU time over wall time.

    watch() starts on a set of worker pids (each iteration of a loader without persistent
    workers brings new ones); sample() reads them; figures() gives the latest set's total.
    `cpu` and `clock` are injectable so tests can play any workload.
    """

    def __init__(self, cpu=cpu_seconds, clock=time.perf_counter):
        self._cpu, self._clock = cpu, clock
        self._first: dict[int, tuple[float, float]] = {}  # pid -> (wall, cpu) when watched
        self._last: dict[int, tuple[float, float]] = {}   # pid -> latest (wall, cpu) read

    def watch(self, pids: list[int]) -> None:
        if not pids or set(pids) == set(self._first):
            return
        self.sample()  # the outgoing set's last reading counts if nothing newer replaces it
        first = {}
        for pid in pids:
            used = self._cpu(pid)
            if used is not None:
                first[pid] = (self._clock(), used)
        if first:
            self._first, self._last = first, dict(first)

    def sample(self) -> None:
        for pid in self._first:
            used = self._cpu(pid)
            if used is not None:
                self._last[pid] = (self._clock(), used)

    def figures(self) -> dict:
        """{worker_cpu_cores, workers_measured}: {} when nothing was measured for long enough."""
        self.sample()
        busy = [(self._last[p][1] - c0) / (self._last[p][0] - t0)
                for p, (t0, c0) in self._first.items() if self._last[p][0] - t0 > 0]
        if not busy:
            return {}
        return {"worker_cpu_cores": sum(busy), "workers_measured": len(busy)}


def network_wait_s(dataset) -> float | None:
    """Seconds the dataset's workers waited on the network, where it reports them through
    `io_stats()` (a dict with 'network_wait_s'); None where it does not."""
    stats = getattr(dataset, "io_stats", None)
    if not callable(stats):
        return None
    figures = stats() or {}
    value = figures.get("network_wait_s")
    if not isinstance(value, (int, float)) or (value == 0 and not figures.get("bytes_fetched")):
        return None  # not reported, or a local dataset: nothing was fetched, nothing to say
    return float(value)
