"""The interleaved runner: every variant x worker count, repeated in rotating order, one epoch each."""

from __future__ import annotations

import gc
import os
import threading
import time

from shardkit.loaderbench.settings import BenchConfig
from shardkit.loaderbench.data import BenchData, prepare
from shardkit.loaderbench.summary import build_report, label_checksum, write_outputs
from shardkit.loaderbench.loaders import ALL_VARIANTS
from shardkit.loader import stop_workers

RSS_PERIOD_S = 0.05


class RssSampler:
    """Peak resident memory of this process plus its children (the loader workers), sampled.

    RSS counts pages shared between a forked worker and its parent in both, so the sum is an
    upper bound; it is the figure `top` users compare against their RAM.
    """

    def __init__(self, period: float = RSS_PERIOD_S):
        import psutil

        self._proc, self._period = psutil.Process(), period
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="bench-rss", daemon=True)

    def sample(self) -> int:
        import psutil

        total = self._proc.memory_info().rss
        for child in self._proc.children(recursive=True):
            try:
                total += child.memory_info().rss
            except psutil.Error:  # a worker that just exited has nothing left to count
                pass
        self.peak = max(self.peak, total)
        return total

    def _loop(self) -> None:
        while not self._stop.wait(self._period):
            self.sample()

    def __enter__(self):
        self.sample()
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.sample()


def _close(loader) -> None:
    # Every loader here keeps persistent workers alive after the epoch; stop them now so they
    # neither hold memory nor count in the next run's RSS.
    close = getattr(loader, "close", None)  # shardkit's loader: its workers and their slots
    close() if close is not None else stop_workers(loader)


def _read(loader, variant, meter, epochs: int, step, classes: int) -> tuple[int, str, float | None]:
    """Read `epochs` epochs through the meter; (samples per epoch, label checksum, first-batch s).
    Every epoch must read the same samples: when they differ the figures say so and fail the checks."""
    import numpy as np

    seen, first_batch, start = [], None, time.perf_counter()
    for _ in range(epochs):
        counts = np.zeros(classes + 1, np.int64)  # the last slot counts unlabelled (-1) samples
        for batch in meter.wrap(loader):
            if first_batch is None:
                first_batch = time.perf_counter() - start
            images, labels = variant.split(batch)
            slots = np.where(labels.numpy() < 0, len(counts) - 1, labels.numpy())
            counts += np.bincount(slots, minlength=len(counts))[: len(counts)]
            step(images, labels)
        seen.append((int(counts.sum()), label_checksum(counts)))
    if len(set(seen)) == 1:
        return seen[0][0], seen[0][1], first_batch
    return sum(n for n, _ in seen), "epochs differ: " + " ".join(c for _, c in seen), first_batch


def measure_once(name: str, data: BenchData, workers: int, cfg: BenchConfig, step) -> dict:
    """One run of variant `name` with `workers` workers: cfg.epochs_per_run epochs through the StarvationMeter."""
    import torch

    from shardkit.meter import StarvationMeter

    variant = ALL_VARIANTS[name]
    pin = cfg.gpu and torch.cuda.is_available()
    loader = variant.loader(data, workers, cfg.batch_size, pin)
    meter = StarvationMeter(warmup=cfg.warmup, log_every=0, device="cuda" if cfg.gpu else "cpu", data=variant.data,
                            trace=trace_path(cfg.trace, name, workers))
    epochs = cfg.epochs_per_run(data.samples)
    with RssSampler() as rss:
        start = time.perf_counter()
        samples, checksum, first_batch = _read(loader, variant, meter, epochs, step, len(data.classes))
        wall = time.perf_counter() - start
        s = meter.summary()
        meter.close_trace()
        _close(loader)
    del loader
    gc.collect()
    per_sample = data.bytes[name] / max(data.samples, 1)
    return {
        "variant": name, "workers": workers, "epochs": epochs, "samples": samples, "label_checksum": checksum,
        "samples_per_s": s["samples_per_s"], "mb_per_s": s["samples_per_s"] * per_sample / 1e6,
        "starved_pct": s.get("gpu_idle_pct", s["starved_pct"]), "host_wait_pct": s["starved_pct"],
        "first_batch_s": first_batch or 0.0, "peak_rss_bytes": rss.peak, "wall_s": wall,
        "measured_steps": s["steps"], "warmup_steps": s["warmup_steps"],
        "wait_p50_ms": s["wait_p50_ms"], "wait_p95_ms": s["wait_p95_ms"], "step_p50_ms": s["step_p50_ms"],
        "epoch_start_wait_pct": s["epoch_start_wait_pct"], "steady_wait_p95_ms": s["steady_wait_p95_ms"],
        "steady_starved_pct": s["steady_starved_pct"], "band": s["band"], "advice": s["advice"],
        **({"mixture": s["mixture"]} if "mixture" in s else {}),  # observed vs target share per source
        **({"trace": s["trace"], "stages": s["stages"]["loader"]} if "trace" in s else {}),  # --trace
    }


def trace_path(path: str | None, variant: str, workers: int) -> str | None:
    """--trace run.trace.json -> run.shardkit-jpeg-tar.w2.trace.json (the last repeat's run is kept)."""
    if path is None:
        return None
    head = path[:-len(".trace.json")] if path.endswith(".trace.json") else os.path.splitext(path)[0]
    return f"{head}.{variant}.w{workers}.trace.json"


def _step(cfg: BenchConfig, data: BenchData):
    from shardkit.loaderbench.model import ModelStep, simulated_step

    if not cfg.gpu:
        return simulated_step(cfg.step_ms), {"kind": "simulated", "step_ms": cfg.step_ms}
    step = ModelStep(len(data.classes), "cuda")
    step.warm(cfg.batch_size, data.image_size)
    return step, {"kind": "small_resnet", "precision": step.precision.name, "device": str(step.device)}


def schedule(cfg: BenchConfig) -> list[tuple[int, int, str]]:
    """(repetition, workers, variant) in run order: variants rotate each repetition so none is
    always first (cold caches) or last (a warm machine); repetitions interleave all cells."""
    order = []
    for rep in range(cfg.repeat):
        for workers in cfg.workers:
            k = rep % len(cfg.variants)
            for name in cfg.variants[k:] + cfg.variants[:k]:
                order.append((rep, workers, name))
    return order


def run(cfg: BenchConfig) -> dict:
    """Prepare the data, measure every cell, write bench.json, bench.md and bench.png; return the report."""
    from tqdm.auto import tqdm

    data = prepare(cfg)
    step, step_info = _step(cfg, data)
    runs = []
    order = schedule(cfg)
    with tqdm(total=len(order), desc="measure", unit="run", disable=None if cfg.progress else True) as bar:
        for rep, workers, name in order:
            bar.set_postfix_str(f"{name} w={workers} rep {rep + 1}/{cfg.repeat}")
            result = measure_once(name, data, workers, cfg, step)
            result["repetition"] = rep
            runs.append(result)
            bar.update(1)
    report = build_report(cfg, data, runs, step_info)
    os.makedirs(cfg.out, exist_ok=True)
    outputs = write_outputs(report, cfg.out)
    if cfg.plot:
        from shardkit.loaderbench.plot import plot_file

        outputs["png"] = plot_file(outputs["json"], os.path.join(cfg.out, "bench.png"))
    report["outputs"] = outputs  # not in bench.json: where this run wrote its files
    return report
