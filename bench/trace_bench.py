"""Cost of the pipeline trace: loader throughput with StarvationMeter(trace=...) on vs off, interleaved.

    .venv/bin/python bench/trace_bench.py                    # 1,536 JPEG 224x224, 2 workers, 7 rounds
    .venv/bin/python bench/trace_bench.py --n 512 --rounds 3 # quick check

Each round reads one epoch with the trace off, then one with it on (order alternating), fresh loaders,
same data; prints samples/s per mode (median over rounds) and the median of the per-round on/off
ratios (target: >= 0.98). 'off' also prices the hooks that stay in the code: the cost of one
disabled hook call against the batch time.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import timeit

import numpy as np


def prepare(root: str, n: int, size: int = 224, shard: int = 256) -> str:
    from shardkit.demo.datagen import _jpeg, photo_like
    from shardkit.manifest import Manifest, write_manifest
    from shardkit.sample import Sample
    from shardkit.writers import get_writer

    if os.path.exists(os.path.join(root, "manifest.json")):
        return root
    fields = {"jpg": {"kind": "image", "encoding": "jpeg"}, "cls": {"kind": "int", "dtype": "int64"}}
    infos = []
    for sid, lo in enumerate(range(0, n, shard)):
        samples = [Sample(f"{i:06d}", {"jpg": _jpeg(photo_like(np.random.default_rng(i), size, size), 90), "cls": i % 10})
                   for i in range(lo, min(n, lo + shard))]
        infos.append(get_writer("tar")(samples, root, sid, fields))
    write_manifest(root, Manifest(samples=n, fields=fields, shards=infos, classes=[f"c{c}" for c in range(10)]))
    return root


def epoch(root: str, workers: int, batch: int, traced: bool, out: str) -> float:
    from shardkit.loader import make_loader
    from shardkit.meter import StarvationMeter
    from shardkit.reader.dataset import StreamingDataset

    meter = StarvationMeter(warmup=0, log_every=0, trace=os.path.join(out, "bench.trace.json") if traced else None)
    loader = make_loader(StreamingDataset(root, seed=0), batch_size=batch, num_workers=workers)
    try:
        it, n = iter(meter.wrap(loader)), 0
        n += len(next(it)["__key__"])  # workers started: the clock runs from the first batch
        t0 = time.perf_counter()
        for b in it:
            n += len(b["__key__"])
        return (n - batch) / (time.perf_counter() - t0)
    finally:
        meter.close_trace()
        loader.close()


def hook_cost_us() -> float:
    from shardkit.reader import spans

    return 1e6 * min(timeit.repeat(lambda: spans.within("decode").__enter__(), number=100_000, repeat=5)) / 100_000


def record_cost_us() -> float:
    """What tracing adds to one batch in a worker: its spans recorded (8 stage switches, a note)
    and shipped (pickled with the batch), over a batch that does nothing else."""
    import pickle

    from shardkit.reader import spans

    def batches():
        while True:
            spans.note("shards", [0, 1])
            for stage in ("fetch", "decode", "fetch", "decode"):
                with spans.within(stage):
                    pass
            yield {"__key__": ["k"] * 64}

    spans.enable()
    try:
        it = spans.traced(batches(), lambda b: b, True, 0)
        best = min(timeit.repeat(lambda: pickle.dumps(next(it)[spans.KEY]), number=20_000, repeat=5))
    finally:
        spans.disable()
    return 1e6 * best / 20_000


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=1536)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--work", default=None)
    a = p.parse_args(argv)
    work = a.work or os.path.join(tempfile.gettempdir(), f"shardkit-trace-bench-{a.n}")
    root = prepare(os.path.join(work, "jpeg"), a.n)
    rates: dict = {"off": [], "on": []}
    ratios = []
    for r in range(a.rounds):
        got = {}
        for mode in (("off", "on") if r % 2 == 0 else ("on", "off")):
            got[mode] = epoch(root, a.workers, a.batch, mode == "on", work)
            rates[mode].append(got[mode])
        ratios.append(got["on"] / got["off"])
        print(f"round {r}: off {got['off']:.0f}  on {got['on']:.0f} samples/s  on/off {ratios[-1]:.3f}", file=sys.stderr)
    size = os.path.getsize(os.path.join(work, "bench.trace.json"))
    per_batch_ms = 1e3 * a.batch / statistics.median(rates["off"])
    hook = hook_cost_us()
    print(f"JPEG 224x224, n={a.n}, batch {a.batch}, {a.workers} workers, {a.rounds} rounds (interleaved)")
    print(f"samples/s  off {statistics.median(rates['off']):.0f}  on {statistics.median(rates['on']):.0f}")
    print(f"on/off (median of per-round ratios): {statistics.median(ratios):.3f}  (target >= 0.98)")
    print(f"off: one disabled hook {hook:.3f} us; ~6 hooks a batch = {100 * 6 * hook / 1e3 / per_batch_ms:.4f}% "
          f"of a {per_batch_ms:.1f} ms batch (per worker)")
    cost = record_cost_us()
    print(f"on: recording and shipping a batch's spans {cost:.1f} us = {100 * cost / 1e3 / (a.workers * per_batch_ms):.3f}% "
          f"of a worker's {a.workers * per_batch_ms:.1f} ms batch")
    print(f"trace file (ring of {300} steps): {size / 1e3:.0f} KB")


if __name__ == "__main__":
    main()
