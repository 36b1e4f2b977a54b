"""Threads or processes for an embedded cluster: the probe of how much of the build's per-image work
holds the GIL (gil_share), the choice it decides (choose_pool), and how many threads of this process
run tasks while worker processes start (head_threads)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable


# Threads are chosen only when their GIL cap leaves this much headroom over what the cores can do: near
# the cap, threads queue on the GIL and their rate flattens well before it. At 1.25, 2 threads whose
# probe read 35% (cap 1.4x the cores) built 12,000 images at 0.76-0.81 of Pool(2) in the calmer reps
# of bench/build_pool_bench.py, where 2 worker processes reached 1.03-1.07 (bench/RESULTS.md).
THREAD_HEADROOM = 2.0
PROBE_SECONDS = 0.15  # how long the probe watches the per-image work beside it, all rounds together


def gil_share(work: Callable[[], object], seconds: float = PROBE_SECONDS) -> tuple[float, float]:
    """(share of the wall time a worker thread running `work` in a loop holds the GIL, seconds per
    call): what caps a pool of threads at 1 / (share x seconds) calls per second, whatever the cores.

    This thread is the probe: it gives the GIL up (time.sleep(0)) and takes it back over and over,
    and sums how long each take waited beyond the median take with no worker running. It waits
    while the worker holds the GIL (at most a switch interval, then the worker is made to drop
    it), so waited / elapsed is the worker's share, less the share the probe waits alone just
    before and after (other processes taking the CPU from it). Measurable on any number of cores
    >= 2. Without other load it reads high rather than low: the probe takes the GIL back at once
    each time, so a worker coming back from C code waits up to a switch interval for it (a 3 ms
    hold + 3 ms sleep reads 0.65-0.72); that errs toward worker processes, which lose nothing to
    the GIL. Under heavy load (a 2-core machine at load 8-18) rounds scatter both ways (images:
    0 to 0.5 in one minute): gil_share_median takes the middle of three."""
    import threading

    waits, base = _gil_waits, _median_take()
    work()  # warm-up: first-call imports and allocations are not the steady state
    alone = waits(max(0.01, seconds / 4), base)
    calls, stop = [], threading.Event()

    def run():
        while not stop.is_set():
            t = time.perf_counter()
            work()
            calls.append(time.perf_counter() - t)

    worker = threading.Thread(target=run, name="shardkit-gil-probe", daemon=True)
    worker.start()
    try:
        beside = waits(seconds, base)
        while not calls:  # at least one whole call measured
            time.sleep(0.001)
    finally:
        stop.set()
        worker.join()
    alone = (alone + waits(max(0.01, seconds / 4), base)) / 2
    share = (beside - alone) / (1 - alone) if alone < 1 else 1.0
    return min(1.0, max(0.0, share)), sorted(calls)[len(calls) // 2]


def _median_take(takes: int = 200) -> float:
    """Seconds this thread takes to give the GIL up and take it back when nothing else wants it (median)."""
    times = []
    for _ in range(takes):
        t0 = time.perf_counter()
        time.sleep(0)
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


def _gil_waits(seconds: float, base: float) -> float:
    """Share of `seconds` this thread waited for the GIL beyond `base` per take."""
    waited, start = 0.0, time.perf_counter()
    while (t0 := time.perf_counter()) - start < seconds:
        time.sleep(0)
        waited += max(0.0, time.perf_counter() - t0 - base)
    return waited / (time.perf_counter() - start)


def gil_share_median(work: Callable[[], object], rounds: int = 3, seconds: float = PROBE_SECONDS) -> tuple[float, float]:
    """gil_share over `rounds` short rounds: the median round (share, seconds per call), so that one
    round that other load disturbed, either way, does not decide."""
    return sorted(gil_share(work, seconds / rounds) for _ in range(rounds))[rounds // 2]


@dataclass(frozen=True)
class PoolChoice:
    """Whether an embedded cluster's workers are threads of this process, and why (a --debug line);
    and how many threads of this process run tasks while the cluster starts (run_tasks' head start)."""

    threads: bool
    reason: str
    head_threads: int = 1


def choose_pool(pool: str, images: bool, workers: int, probe: Callable[[], tuple[float, float]] | None = None) -> PoolChoice:
    """--worker-pool: "threads" and "processes" as asked; "auto" picks threads only for image work
    whose measured GIL cap is above what `workers` cores do: `probe()` gives (GIL share, seconds per
    image) of one worker thread (gil_share); threads when 1 / (share x seconds) >= THREAD_HEADROOM x
    workers / seconds, i.e. share <= 1 / (THREAD_HEADROOM x workers). Threads pay no worker start-up
    and copy no task, result or unit table between processes; processes scale with the cores. Text
    work (tokenising, JSON) holds the GIL: processes, unprobed."""
    if pool != "auto":
        return PoolChoice(pool == "threads", f"--worker-pool {pool}")
    if not images:
        return PoolChoice(False, "text or rows to parse (the GIL is held): worker processes")
    if workers <= 1:
        return PoolChoice(True, "one worker: a thread (nothing to share the GIL with)")
    if probe is None:
        return PoolChoice(False, "image work, no probe: worker processes")
    share, seconds = probe()
    cores = workers / seconds
    cap = f"near {1 / (share * seconds):,.0f} images/s" if share * seconds > 1e-6 else "out of reach"
    verdict = "threads" if share <= 1 / (THREAD_HEADROOM * workers) else "worker processes"
    head = head_threads(share, workers)
    return PoolChoice(verdict == "threads",
                      f"{verdict}: one image takes {seconds * 1e3:.1f} ms, {share:.0%} of it holding the GIL, so "
                      f"threads cap {cap} against {cores:,.0f}/s for {workers} cores "
                      f"(threads need {THREAD_HEADROOM}x that); {head} head-start thread{'s' * (head > 1)}", head)


# The GIL share the head-start threads may take together while the cluster starts: the rest is left to
# this process's own start-up work (Dask's event loop spawning and greeting the workers).
HEAD_GIL_BUDGET = 0.5


def head_threads(share: float, workers: int) -> int:
    """Threads of this process that run image tasks while worker processes start: as many as keep
    their GIL-held time together under HEAD_GIL_BUDGET, at most one per worker. On 16 cores a worker
    process cluster takes ~2-3 s to start; one head-start thread used 1 of the 16 cores meanwhile."""
    return max(1, min(workers, int(HEAD_GIL_BUDGET / max(share, 1e-3))))
