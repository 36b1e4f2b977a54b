"""StarvationMeter: how much of a training run is spent waiting for data (the advice lives in meter.advice)."""

from __future__ import annotations

import json
import logging
import math
import os
import time
from array import array
from dataclasses import dataclass

from shardkit.errors import ConfigError
from shardkit.store.local import atomic_write
from shardkit.identity import rank_world
from shardkit.meter import transfer as _transfer
from shardkit.meter.advice import (FINE_BELOW, INPUT_BOUND_FROM, DataProfile, advice, band, cost_line,
                                   profile_of)
from shardkit.meter.planned import compare, load_plan
from shardkit.meter.stages import straggler
from shardkit.meter.trace import DEFAULT_STEPS, shares_line, start_trace, stop_trace
from shardkit.meter.workers import SAMPLE_EVERY, WorkerCpu, network_wait_s, worker_pids
from shardkit.reader import spans

__all__ = ["StarvationMeter", "MeterConfig", "CudaGapTimer", "DataProfile", "advice", "band", "cost_line",
           "profile_of", "batch_size_of", "percentile", "mixture_line", "FINE_BELOW", "INPUT_BOUND_FROM"]

log = logging.getLogger("shardkit.meter")

DEVICES = ("cpu", "cuda")
MAX_WINDOWS = 1000  # per-window figures kept in summary(); older ones are dropped to bound memory


@dataclass(frozen=True)
class MeterConfig:
    """How the meter measures: warm-up steps left out, log period, window length, device."""

    warmup: int = 5
    log_every: int = 100
    window: int = 100
    device: str = "cpu"

    def __post_init__(self):
        for name in ("warmup", "log_every", "window"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ConfigError(f"{name}={value!r}: expected an integer >= 0 (StarvationMeter({name}=...))")
        if self.window == 0:
            raise ConfigError("window=0: expected a positive number of steps (StarvationMeter(window=...))")
        if self.device not in DEVICES:
            raise ConfigError(
                f"device={self.device!r}: expected one of {', '.join(DEVICES)} (StarvationMeter(device=...))"
            )


def batch_size_of(batch) -> int:
    """Samples in a batch: dict (its '__key__' list or first tensor), tensor, or tuple/list."""
    if isinstance(batch, dict):
        if "__key__" in batch:
            return len(batch["__key__"])
        batch = next(iter(batch.values()), None)
    elif isinstance(batch, (list, tuple)) and batch and hasattr(batch[0], "shape"):
        batch = batch[0]
    shape = getattr(batch, "shape", None)
    if shape is not None and len(shape) > 0:
        return int(shape[0])
    try:
        return len(batch)
    except TypeError:
        return 1


def percentile(values, q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of a sequence; 0.0 when empty."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, math.ceil(q / 100 * len(ordered)) - 1))
    return ordered[rank]


def _figures(waits, steps, samples: int, gpu_idle: float | None, gpu_busy: float | None) -> dict:
    wait_s, step_s = float(sum(waits)), float(sum(steps))
    total = wait_s + step_s
    starved = 100.0 * wait_s / total if total > 0 else 0.0
    out = {
        "steps": len(waits), "samples": samples, "wait_s": wait_s, "step_s": step_s,
        "samples_per_s": samples / total if total > 0 else 0.0,
        "steps_per_s": len(waits) / total if total > 0 else 0.0,
        "starved_pct": starved,
        "wait_p50_ms": 1e3 * percentile(waits, 50), "wait_p95_ms": 1e3 * percentile(waits, 95),
        "step_p50_ms": 1e3 * percentile(steps, 50),
    }
    if gpu_idle is not None and gpu_busy is not None:
        gpu_total = gpu_idle + gpu_busy
        out.update(gpu_idle_s=gpu_idle, gpu_busy_s=gpu_busy,
                   gpu_idle_pct=100.0 * gpu_idle / gpu_total if gpu_total > 0 else 0.0)
    return out


class CudaGapTimer:
    """GPU idle gap between steps from CUDA events, read without syncing every step.

    An event recorded when a batch arrives (start) and one when the next batch is asked for
    (end) complete on the GPU in stream order: start(i+1) - end(i) is the time the GPU had
    nothing queued, end(i) - start(i) the time it was busy with step i. `event_factory` makes
    the events (torch.cuda.Event(enable_timing=True) by default); tests pass a fake class.
    """

    def __init__(self, event_factory=None):
        if event_factory is None:
            import torch

            if not torch.cuda.is_available():
                raise ConfigError("StarvationMeter(device='cuda') but no CUDA device is visible; use device='cpu'")
            event_factory = lambda: torch.cuda.Event(enable_timing=True)  # noqa: E731
        self._make = event_factory
        self._pending = _transfer.EventPairs(self._folded)  # (start, end, previous end or None)
        self._last_end = None
        self._start = None
        self.idle_s = 0.0
        self.busy_s = 0.0

    def batch_arrived(self) -> None:
        self._start = self._make()
        self._start.record()

    def step_ended(self, counted: bool) -> None:
        end = self._make()
        end.record()
        if counted and self._start is not None:  # record() alone (no wrap) has no start event
            self._pending.add(self._start, end, self._last_end)
        self._last_end, self._start = end, None
        self._pending.trim()

    def _folded(self, start, end, prev) -> None:
        self.busy_s += start.elapsed_time(end) / 1e3
        if prev is not None:
            self.idle_s += max(0.0, prev.elapsed_time(start) / 1e3)

    def resolve(self, block: bool = True) -> None:
        """Fold finished event pairs into idle/busy totals (block=True waits for the last one)."""
        self._pending.resolve(block)


def mixture_line(shares: dict) -> str:
    """'mixture (observed / target): web 70.1% / 70.0%, code 29.9% / 30.0%' from Mixture.proportions()."""
    def pct(v):
        return "n/a" if v is None else f"{100 * v:.1f}%"
    return "mixture (observed / target): " + ", ".join(
        f"{name} {pct(v['observed'])} / {pct(v['target'])}" for name, v in shares.items())


class StarvationMeter:
    """Measures host wait in next(loader) vs step time; reports starved%, band, advice and cost.

    `for batch in meter.wrap(loader): ...` - the time blocked in next() is the wait, the time from
    receiving a batch to asking for the next is the step. The first `warmup` steps are left out.
    """

    def __init__(self, warmup: int = 5, log_every: int = 100, window: int = 100, device: str = "cpu",
                 *, data: DataProfile | None = None, event_factory=None, clock=time.perf_counter,
                 worker_cpu: WorkerCpu | None = None, pin: bool = False, copy=None, lock=None,
                 trace: str | None = None, trace_steps: int = DEFAULT_STEPS, plan: str | None = None,
                 gpu_hour_price: float | None = None):
        self.config = MeterConfig(warmup=warmup, log_every=log_every, window=window, device=device)
        self._clock = clock
        self._cpu = worker_cpu or WorkerCpu()  # the loader's workers' CPU, for the advice's levers
        self._io = None  # the dataset whose io_stats() may report network waits
        self._gpu = CudaGapTimer(event_factory) if device == "cuda" else None
        # The copy to the device, when it goes through the meter (wrap(to=...), to_device): meter/transfer.py
        self._moves = _transfer.TransferTimer(clock, copy=copy, lock=lock, pin=pin, events=(
            self._gpu._make if self._gpu is not None else None))
        self.num_workers: int | None = None
        self.data = data  # None: read from the loader wrap() is given (profile_of)
        self._epoch_start = False  # the next recorded step is the first of a wrap() (an epoch start)
        self._starts = array("q")  # indices of counted steps that were an epoch's first batch
        self.rank, self.world_size = rank_world()
        self._seen = 0  # steps seen, warm-up included
        self._warm_left = warmup  # warm-up again after a restart: workers start, caches are cold
        self._skipped = 0
        self._waits, self._steps = array("d"), array("d")
        self._samples = 0
        self._wait_sum = self._step_sum = 0.0
        self._window_start = (0, 0)  # (index into the arrays, samples) where the window began
        self.windows: list[dict] = []
        self._proportions = None  # a mixture loader's proportions(): observed vs target share per source
        self._wraps = 0  # wrap() calls in this process: epochs, for telling a tiny dataset's restarts apart
        # plan.json (shardkit plan): the run's stage costs against the planned ones, from the same spans
        self._plan, self._price = (None if plan is None else load_plan(plan)), gpu_hour_price
        tracing = trace is not None or self._plan is not None
        self._trace = start_trace(trace, trace_steps, self.rank, self.world_size) if tracing else None

    # -- measuring ---------------------------------------------------------------------------
    def wrap(self, iterable, to: str | None = None):
        """Yield the batches of `iterable`, timing each wait and each step; with `to` (a device),
        each batch is moved there first, the copy timed apart (meter/transfer.py)."""
        self.num_workers = getattr(iterable, "num_workers", self.num_workers)
        if self.data is None:
            self.data = profile_of(iterable)
        self._proportions = getattr(iterable, "proportions", self._proportions)
        self._io = next((d for d in (getattr(iterable, "source", None), getattr(iterable, "dataset", None), self._io)
                         if d is not None), None)
        clock, tr = self._clock, self._trace
        started = tr.now() if tr is not None else 0
        it = iter(iterable)
        self._cpu.watch(worker_pids(it) or worker_pids(getattr(iterable, "_iterator", None)))
        self._epoch_start = True
        self._wraps += 1
        if tr is not None:  # iter(): workers take up the new epoch (started, or reset when persistent)
            tr.span("epoch start", started, tr.now())
        while True:
            if tr is not None:
                tr.waiting()
            t0 = clock()
            try:
                batch = next(it)
            except StopIteration:
                if tr is not None:  # the file holds the last steps even if summary() never comes
                    tr.ended()
                    tr.write_now_and_then()
                return
            t1 = clock()
            if tr is not None:
                tr.arrived()
            if self._gpu is not None:
                self._gpu.batch_arrived()
            try:
                yield batch if to is None else self.to_device(batch, to)
            finally:
                # Runs on resume and also when the loop breaks (generator closed): the step ends here.
                samples = batch_size_of(batch)
                self.record(t1 - t0, clock() - t1, samples)
                if tr is not None:
                    tr.stepped(samples)

    def record(self, wait_s: float, step_s: float, samples: int) -> None:
        """Add one step measured elsewhere (a custom loop); wrap() calls this for every batch."""
        self._seen += 1
        counted = self._warm_left == 0
        if self._gpu is not None:
            self._gpu.step_ended(counted)
        self._moves.step_done(counted)
        if not counted:
            self._epoch_start = False
            self._warm_left -= 1
            self._skipped += 1
            return
        if self._epoch_start:
            self._starts.append(len(self._waits))
        self._epoch_start = False
        self._waits.append(wait_s)
        self._steps.append(step_s)
        self._wait_sum += wait_s
        self._step_sum += step_s
        self._samples += samples
        n = len(self._waits)
        if n % SAMPLE_EVERY == 0 or n & (n - 1) == 0:  # every 100 steps, and often in a short run:
            self._cpu.sample()  # a non-persistent loader's workers are gone when its epoch ends
        if len(self._waits) - self._window_start[0] >= self.config.window:
            self._close_window()
        if self.config.log_every and len(self._waits) % self.config.log_every == 0 and log.isEnabledFor(logging.INFO):
            log.info(self.log_line())

    def to_device(self, batch, device: str):
        """The batch moved to `device` (page-locked first with pin=True), timed as this step's
        transfer: the meter then splits the step into waiting, page-lock + copy, and the rest (and a
        trace shows it as the main process's "copy" span)."""
        with spans.main("copy"):
            return self._moves.move(batch, device)

    def _close_window(self) -> None:
        i, samples = self._window_start
        fig = _figures(self._waits[i:], self._steps[i:], self._samples - samples, None, None)
        fig["first_step"] = i  # counted steps, warm-up excluded
        self.windows.append(fig)
        del self.windows[:-MAX_WINDOWS]
        self._window_start = (len(self._waits), self._samples)

    # -- reporting ---------------------------------------------------------------------------
    def summary(self) -> dict:
        """Whole-run figures (warm-up excluded), band, advice, cost line, per-window figures."""
        gpu_idle = gpu_busy = None
        if self._gpu is not None:
            self._gpu.resolve(block=True)
            gpu_idle, gpu_busy = self._gpu.idle_s, self._gpu.busy_s
        out = _figures(self._waits, self._steps, self._samples, gpu_idle, gpu_busy)
        # On CUDA the event gap is the truer figure: host wait overstates starvation while
        # kernels of the previous step are still queued.
        pct = out.get("gpu_idle_pct", out["starved_pct"])
        out.update(self._epoch_start_figures(out["wait_s"]))
        stats = getattr(self._io, "io_stats", None)
        if callable(stats):  # remote datasets; warm-up included: the workers count from their start
            io = stats() or {}
            out.update(network_wait_s=io.get("network_wait_s", 0.0), bytes_fetched=io.get("bytes_fetched", 0),
                       fetch_cpu_s=io.get("fetch_cpu_s", 0.0))
        out.update(self._worker_figures(out["wait_s"] + out["step_s"], out.get("fetch_cpu_s", 0.0)))
        out.update(self._moves.figures(out["wait_s"], out["step_s"]))
        if self._wraps:
            out["epochs"] = self._wraps
        if self._trace is not None:  # per-stage shares of the same spans the trace file shows
            out.update(stages=self._trace.shares())
            if self._trace.path is not None:
                out["trace"] = self._trace.write()
        out.update(
            rank=self.rank, world_size=self.world_size, device=self.config.device,
            warmup_steps=self._skipped, num_workers=self.num_workers,
            band=band(pct), advice=advice(out, num_workers=self.num_workers, data=self.data),
            cost=cost_line(pct), windows=list(self.windows),
        )
        self._judge(out)
        mixture = self._proportions() if self._proportions is not None else None
        if mixture:  # what a mixture loader yielded per source, against what its plan targets
            out["mixture"] = mixture
        return out

    def _judge(self, out: dict) -> None:
        """The advice's additions from the transfer split and the machine, and the run against its plan."""
        if "transfer" in out:
            out["advice"] = _transfer.with_transfer(out["advice"], out["transfer"])
        note = _transfer.crowded(out, os.cpu_count() or 1)
        if note is not None:  # the machine, not the loader: too few cores left to the training loop
            out["advice"] = f"{note}; {out['advice']}"
        if self._plan is not None:  # the feed-rate contract
            out["plan"] = compare(self._plan, out["stages"], list(self._trace.batches()), out, self._price)

    def _worker_figures(self, run_s: float, fetch_cpu_s: float = 0.0) -> dict:
        """Cores the workers kept busy (psutil), the share of their time spent waiting on the
        network and the share of their CPU spent fetching, where the dataset reports them (io_stats())."""
        out = self._cpu.figures()
        net = network_wait_s(self._io)
        if net is not None and self.num_workers and run_s > 0:
            out["network_wait_pct"] = min(100.0, 100.0 * net / (self.num_workers * run_s))
        used = out.get("worker_cpu_cores", 0.0) * run_s
        if net is not None and fetch_cpu_s > 0 and used > 0:
            out["fetch_cpu_pct"] = min(100.0, 100.0 * fetch_cpu_s / used)
        return out

    def _epoch_start_figures(self, wait_s: float) -> dict:
        """The share of waiting spent on epochs' first batches (workers refilling their queues),
        and the p95 wait and starved% without them: epoch starts are not steady loading."""
        starts = set(self._starts)
        steady = [w for i, w in enumerate(self._waits) if i not in starts] if starts else self._waits
        start_wait = sum(self._waits[i] for i in starts)
        steady_wait = wait_s - start_wait
        steady_total = steady_wait + self._step_sum
        return {"epoch_start_wait_pct": 100.0 * start_wait / wait_s if wait_s > 0 else 0.0,
                "steady_wait_p95_ms": 1e3 * percentile(steady, 95),
                "steady_starved_pct": 100.0 * steady_wait / steady_total if steady_total > 0 else 0.0}

    def all_ranks(self) -> dict:
        """Every rank's summary (a collective under torch.distributed: call it on all ranks).

        The slowest rank sets the pace of synchronous data-parallel training, so the run's
        figure is the highest starved% of any rank.
        """
        import sys

        mine = self.summary()
        dist = sys.modules.get("torch.distributed")
        ranks = [mine]
        if dist is not None and dist.is_available() and dist.is_initialized():
            ranks = [None] * dist.get_world_size()
            dist.all_gather_object(ranks, mine)
        key = "gpu_idle_pct" if "gpu_idle_pct" in mine else "starved_pct"
        slowest = max(ranks, key=lambda s: s[key])
        return {"ranks": ranks, "slowest_rank": slowest["rank"], "max_starved_pct": slowest[key],
                "band": band(slowest[key]), **straggler(ranks)}

    def log_line(self) -> str:
        """The periodic line: rank, steps, throughput, starved%, p50/p95 wait, band."""
        i = max(0, len(self._waits) - self.config.log_every)
        fig = _figures(self._waits[i:], self._steps[i:], 0, None, None)
        # Whole-run figures from running sums: re-summing the arrays every log line would make
        # the meter's cost grow with the run's length.
        total = self._wait_sum + self._step_sum
        run_pct = 100.0 * self._wait_sum / total if total > 0 else 0.0
        rate = self._samples / total if total > 0 else 0.0
        head = f"[rank {self.rank}] step {self._seen}: {rate:.1f} samples/s, "
        host = (f"starved {fig['starved_pct']:.1f}% last {fig['steps']} steps "
                f"({run_pct:.1f}% run, {band(run_pct)}), "
                f"wait p50 {fig['wait_p50_ms']:.1f} ms p95 {fig['wait_p95_ms']:.1f} ms")
        gpu = self._gpu_idle_pct()
        if gpu is None:
            return head + host
        # On the GPU the event gap is the figure that matters: host wait overstates starvation
        # while the previous step's kernels are still queued.
        return head + f"GPU idle {gpu:.2f}% (CUDA events, {band(gpu)}); host " + host

    def _gpu_idle_pct(self) -> float | None:
        """GPU idle % so far from the events already finished (never blocks), None without CUDA events."""
        if self._gpu is None:
            return None
        self._gpu.resolve(block=False)
        total = self._gpu.idle_s + self._gpu.busy_s
        return 100.0 * self._gpu.idle_s / total if total > 0 else 0.0

    def report(self) -> str:
        """A few human lines: figures, band, advice and the cost view."""
        s = self.summary()
        lines = [f"rank {s['rank']}/{s['world_size']}: {s['steps']} steps ({s['warmup_steps']} warm-up left out), "
                 f"{s['samples_per_s']:.1f} samples/s, {s['steps_per_s']:.2f} steps/s"]
        if "gpu_idle_pct" in s:  # the headline on a GPU; host wait follows as a detail
            lines.append(f"GPU idle between steps {s['gpu_idle_pct']:.2f}% (CUDA events)")
        lines.append(f"host wait {s['starved_pct']:.1f}% of step time (p50 {s['wait_p50_ms']:.1f} ms, "
                     f"p95 {s['wait_p95_ms']:.1f} ms)")
        if "worker_cpu_cores" in s:
            lines.append(f"workers kept {s['worker_cpu_cores']:.1f} cores busy ({s['workers_measured']} measured)"
                         + (f", waited on the network {s['network_wait_pct']:.0f}% of the time"
                            if "network_wait_pct" in s else "")
                         + (f", spent {s['fetch_cpu_pct']:.0f}% of their CPU fetching" if "fetch_cpu_pct" in s else ""))
        if "stages" in s:
            lines.append(shares_line(s["stages"]) + (f" (trace: {s['trace']})" if "trace" in s else ""))
        if "plan" in s:
            lines.append(s["plan"]["line"])
        if "mixture" in s:
            lines.append(mixture_line(s["mixture"]))
        if "transfer" in s:
            lines.append(_transfer.split_line(s["transfer"]))
        lines += [f"{s['band']}: {s['advice']}", s["cost"]]
        return "\n".join(lines)

    def to_json(self, path) -> dict:
        """Write summary() as JSON (atomically) and return it."""
        s = self.summary()
        atomic_write(path, json.dumps(s, indent=2, sort_keys=True) + "\n")
        return s

    def close_trace(self) -> str | None:
        """Write the trace file one last time and turn the spans off; its path (None: not tracing)."""
        if self._trace is None:
            return None
        path = self._trace.write()
        stop_trace()
        return path

    # -- checkpointing -----------------------------------------------------------------------
    def state_dict(self) -> dict:
        """Counters and per-step timings, so whole-run figures survive a restart."""
        return {"seen": self._seen, "skipped": self._skipped, "samples": self._samples,
                "waits": self._waits.tobytes(), "steps": self._steps.tobytes(), "window_start": self._window_start,
                "windows": list(self.windows), "epoch_starts": self._starts.tobytes(),
                "gpu": None if self._gpu is None else (self._gpu.idle_s, self._gpu.busy_s),
                "transfer": self._moves.state()}

    def load_state_dict(self, state: dict) -> None:
        self._seen, self._skipped, self._samples = state["seen"], state["skipped"], state["samples"]
        self._warm_left = self.config.warmup
        self._waits, self._steps = array("d"), array("d")
        self._waits.frombytes(state["waits"])
        self._steps.frombytes(state["steps"])
        self._wait_sum, self._step_sum = sum(self._waits), sum(self._steps)
        self._window_start = tuple(state["window_start"])
        self.windows = list(state["windows"])
        self._starts = array("q")
        self._starts.frombytes(state.get("epoch_starts", b""))  # absent from states saved before it was kept
        self._moves.load(state.get("transfer"))
        if self._gpu is not None and state.get("gpu") is not None:
            self._gpu.idle_s, self._gpu.busy_s = state["gpu"]
