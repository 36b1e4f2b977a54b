"""Sections of bench/gpu_bench.py that find what stands between the workers and the step.

  P  torch.profiler over >= 20 steps of section D with decode="cpu": a Chrome trace and the
     per-step breakdown (wait for the batch, page-lock, host->device copy, step), with the
     meter's transfer band measured over the same steps beside it
  S  sweep: workers (6, 8, 12, 15) x library threads in the workers (capped at 1 / not) x
     pin_memory (on / off), section D with decode="cpu", one window each
  W  section D, whole windows: synthetic, then default options (no decode=), decode="cuda",
     decode="nvjpeg"; every slot page-locked before timing, the median of --windows windows
  N  section C with decode="nvjpeg" beside a training step (a thread trains resnet18 on a
     resident batch meanwhile): images/s decoded into device memory
"""

from __future__ import annotations

import contextlib
import os
import statistics
import threading
import time

import torch

SWEEP_WORKERS = (6, 8, 12, 15)


def forever(ld):
    """The loader's batches epoch after epoch (persistent workers: an epoch start costs little)."""
    while True:
        yield from ld


def warm_slots(it, ld, device, at_least: int):
    """Pull batches until the loader's slots are all page-locked: no new registration for a while
    (a slot is registered the first time a batch in it reaches the main process)."""
    transport = ld._transport
    quiet, seen, last = 0, 0, -1
    while seen < at_least or quiet < 2 * max(1, ld.num_workers):
        batch = next(it)
        locks = len(transport._locks) if transport is not None else 0
        quiet = quiet + 1 if locks == last else 0
        last, seen = locks, seen + 1
        del batch
        if seen > 50 * at_least:
            break  # never quiet (e.g. slots keep growing): time anyway, and say so below
    if device.type == "cuda":
        torch.cuda.synchronize()
    return {"warm batches": seen, "page-locked slots": last}


def windows(it, step, device, *, window: float, count: int, meter=None):
    """img/s of `step` fed from `it` in `count` windows of `window` seconds (one sync per window)."""
    rates = []
    for _ in range(count):
        n, start = 0, time.perf_counter()
        while time.perf_counter() - start < window:
            t0 = time.perf_counter()
            batch = next(it)
            t1 = time.perf_counter()
            x, y = batch["jpg"], batch["cls"]
            if meter is not None:
                x = meter.to_device(x, str(device))
            step(x, y)
            if meter is not None:
                meter.record(t1 - t0, time.perf_counter() - t1, len(batch["__key__"]))
            n += len(batch["__key__"])
        if device.type == "cuda":
            torch.cuda.synchronize()
        rates.append(n / (time.perf_counter() - start))
    return rates


def _loader(bench, d, args, **options):
    return bench.loader(d.jpeg_root, "jpg", args, **options)


def _meter(device, ld):
    from shardkit.meter import StarvationMeter

    meter = StarvationMeter(warmup=0, log_every=0, device=device.type)
    meter.num_workers = ld.num_workers
    return meter


def synthetic(step, args, device, seconds):
    x = torch.randint(0, 255, (args.batch, 3, args.size, args.size), dtype=torch.uint8, device=device)
    y = torch.zeros(args.batch, dtype=torch.int64, device=device)
    step(x, y)
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        step(x, y)
        n += args.batch
    if device.type == "cuda":
        torch.cuda.synchronize()
    return n / (time.perf_counter() - start)


def section_w(bench, d, args, device):
    """D over whole windows: the default options, decode="cuda", decode="nvjpeg"."""
    from shardkit.loader import memory

    step = bench.model_step(args, device, len(d.classes))
    step.warm(args.batch, args.size)
    synth = synthetic(step, args, device, args.window)  # steady: one window
    out = {"synthetic": synth, "window s": args.window, "windows": args.windows}
    for name, options in (("default options", {}), ("decode=cuda", {"decode": "cuda"}),
                          ("decode=nvjpeg", {"decode": "nvjpeg"})):
        try:
            ld = _loader(bench, d, args, **options)
        except Exception as e:  # nvjpeg without the extra or a GPU: say so, go on
            out[name] = f"not run: {type(e).__name__}: {e}"
            continue
        it = forever(ld)
        warm = warm_slots(it, ld, device, at_least=4 * max(1, ld.num_workers))
        meter = _meter(device, ld)
        rates = windows(it, step, device, window=args.window, count=args.windows, meter=meter)
        s = meter.summary()
        med = statistics.median(rates)
        out[name] = {"img/s (median)": med, "of synthetic": med / synth, "windows": [round(r) for r in rates],
                     "workers": ld.num_workers, "decode path": memory.PATHS.get("decode"), **warm,
                     "images decoded by PIL instead": ld._ahead.cpu_fallbacks if ld._ahead is not None else None,
                     "GPU idle %": s.get("gpu_idle_pct"), "host wait %": s["starved_pct"],
                     "transfer": s.get("transfer"), "advice": s["advice"]}
        ld.close()
    return out


@contextlib.contextmanager
def _labelled_page_lock():
    """memory.page_lock inside a profiler range, so the trace shows registrations apart."""
    from torch.profiler import record_function

    from shardkit.loader import memory, transport

    real = memory.page_lock

    def labelled(storage):
        with record_function("page_lock"):
            return real(storage)
    memory.page_lock = transport.memory.page_lock = labelled
    try:
        yield
    finally:
        memory.page_lock = real


def section_p(bench, d, args, device):
    """torch.profiler over --profile-steps steps of D with decode="cpu"; the trace goes to --out."""
    from torch.profiler import ProfilerActivity, profile, record_function

    step = bench.model_step(args, device, len(d.classes))
    step.warm(args.batch, args.size)
    ld = _loader(bench, d, args, decode="cpu")
    it = forever(ld)
    warm = warm_slots(it, ld, device, at_least=2)  # cold start left in on purpose only up to here
    meter = _meter(device, ld)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with _labelled_page_lock(), profile(activities=activities) as prof:
        for _ in range(args.profile_steps):
            t0 = time.perf_counter()
            with record_function("wait_for_batch"):
                batch = next(it)
            t1 = time.perf_counter()
            with record_function("h2d_copy"):
                x = meter.to_device(batch["jpg"], str(device))
                y = batch["cls"].to(device, non_blocking=True)
            with record_function("step"):
                step(x, y)
            meter.record(t1 - t0, time.perf_counter() - t1, len(batch["__key__"]))
        if device.type == "cuda":
            torch.cuda.synchronize()
    trace = os.path.join(args.out, "trace_d_cpu.json")
    prof.export_chrome_trace(trace)
    import gzip
    import shutil

    with open(trace, "rb") as src, gzip.open(trace + ".gz", "wb") as dst:  # a device call brings back small files
        shutil.copyfileobj(src, dst)
    os.remove(trace)
    trace += ".gz"
    ld.close()
    ms = _breakdown(prof, args.profile_steps)
    total = ms["wait_for_batch"] + ms["h2d_copy"] + ms["step"]
    split = meter.summary().get("transfer", {})
    prof_copy_pct = 100.0 * ms["h2d_copy"] / total if total else 0.0
    return {"trace": trace, "steps": args.profile_steps, **warm,
            "ms per step: wait for batch (page-lock inside)": ms["wait_for_batch"],
            "ms per step: page-lock (cudaHostRegister)": ms["page_lock"],
            "ms per step: host->device copy (host)": ms["h2d_copy"],
            "ms per step: host->device copy (device, Memcpy HtoD)": ms["memcpy_device"],
            "ms per step: step": ms["step"],
            "profiler: copy % of the host side": prof_copy_pct,
            "meter: transfer % (page-lock + copy)": split.get("transfer_pct"),
            "meter - profiler, points": (split.get("transfer_pct", 0.0) - prof_copy_pct) if split else None,
            "meter split": split}


def _breakdown(prof, steps: int) -> dict:
    """ms per step of each labelled range (CPU time) and of the device's HtoD copies."""
    out = {k: 0.0 for k in ("wait_for_batch", "page_lock", "h2d_copy", "step", "memcpy_device")}
    for e in prof.key_averages():
        if e.key in out:
            out[e.key] = e.cpu_time_total / 1e3 / steps
        if "Memcpy HtoD" in e.key:
            dev = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0.0)
            out["memcpy_device"] += dev / 1e3 / steps
    return out


def section_s(bench, d, args, device):
    """Workers x library threads x pin_memory, D with decode="cpu", one window each."""
    step = bench.model_step(args, device, len(d.classes))
    step.warm(args.batch, args.size)
    synth = synthetic(step, args, device, args.sweep_seconds)
    out, best = {"synthetic": synth}, None
    for workers in args.sweep_workers:
        for threads in ("1", "none"):
            for pin in (True, False):
                os.environ["SHARDKIT_WORKER_THREADS"] = threads  # read by the workers as they start
                ld = _loader(bench, d, args, workers=workers, pin_memory=pin and device.type == "cuda")
                it = forever(ld)
                warm_slots(it, ld, device, at_least=workers)
                (rate,) = windows(it, step, device, window=args.sweep_seconds, count=1)
                ld.close()
                name = f"workers={workers} threads={'1' if threads == '1' else 'library default'} pin={pin}"
                out[name] = rate / synth
                print(f"  {name}: {rate:,.0f} img/s, {rate / synth:.2f} of synthetic", flush=True)
                best = max(best or (0, ""), (rate / synth, name))
    os.environ.pop("SHARDKIT_WORKER_THREADS", None)
    from shardkit.loader import default_workers

    out["best"] = f"{best[1]}: {best[0]:.2f} of synthetic"
    out["default num_workers here"] = default_workers()
    return out


def section_n(bench, d, args, device):
    """C with decode="nvjpeg" while a thread trains on a resident batch (the step beside the decode)."""
    try:
        ld = _loader(bench, d, args, decode="nvjpeg")
    except Exception as e:
        return {"decode=nvjpeg": f"not run: {type(e).__name__}: {e}"}
    step = bench.model_step(args, device, len(d.classes))
    step.warm(args.batch, args.size)
    stop, steps = threading.Event(), [0]
    x = torch.randint(0, 255, (args.batch, 3, args.size, args.size), dtype=torch.uint8, device=device)
    y = torch.zeros(args.batch, dtype=torch.int64, device=device)

    def train():
        stream = torch.cuda.Stream() if device.type == "cuda" else None
        with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
            while not stop.is_set():
                step(x, y)
                steps[0] += 1
                if stream is not None and steps[0] % 8 == 0:
                    stream.synchronize()  # keep the queue short: the step runs beside, not ahead
    it = forever(ld)
    warm = warm_slots(it, ld, device, at_least=4 * max(1, ld.num_workers))
    trainer = threading.Thread(target=train, daemon=True)
    trainer.start()
    rates = []
    try:
        for _ in range(args.windows):
            n, start = 0, time.perf_counter()
            while time.perf_counter() - start < args.c_window:
                batch = next(it)
                n += len(batch["__key__"])
                del batch
            if device.type == "cuda":
                torch.cuda.current_stream().synchronize()
            rates.append(n / (time.perf_counter() - start))
    finally:
        stop.set()
        trainer.join()
        ld.close()
    return {"decode=nvjpeg beside a step, img/s (median)": statistics.median(rates),
            "windows": [round(r) for r in rates], "training steps meanwhile": steps[0], **warm}
