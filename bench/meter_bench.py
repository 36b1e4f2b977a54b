"""Meter benchmark: overhead vs step time, and starved% against an injected loader delay (one run)."""

from __future__ import annotations

import argparse
import time

from shardkit.meter import StarvationMeter


def spin(seconds: float) -> None:
    """Busy CPU work of a fixed duration (a stand-in for a training step that keeps a core busy)."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def loop(batches, step_s: float, meter: StarvationMeter | None) -> float:
    t0 = time.perf_counter()
    for _ in (meter.wrap(batches) if meter else batches):
        spin(step_s)
    return time.perf_counter() - t0


def overhead(steps: int, step_ms: float, rounds: int) -> None:
    batches = [{"__key__": ["k"] * 64}] * steps
    bare = metered = 0.0
    for _ in range(rounds):  # A and B interleaved on the same data
        bare += loop(batches, step_ms / 1e3, None)
        metered += loop(batches, step_ms / 1e3, StarvationMeter(warmup=0, log_every=100))
    # The meter's own cost per step, measured with an empty step so it is not lost in noise.
    n = 100_000
    empty_bare = loop([{"__key__": ["k"] * 64}] * n, 0.0, None)
    empty_metered = loop([{"__key__": ["k"] * 64}] * n, 0.0, StarvationMeter(warmup=0, log_every=1000))
    per_step_us = (empty_metered - empty_bare) / n * 1e6
    print(f"overhead, {rounds} x {steps} steps of {step_ms} ms (interleaved): "
          f"metered/bare = {metered / bare:.4f} ({100 * (metered / bare - 1):+.2f}%)")
    print(f"meter cost per step: {per_step_us:.2f} us = {100 * per_step_us / (step_ms * 1e3):.3f}% "
          f"of a {step_ms} ms step (target <= 1%)")


def sleeping(n: int, wait_s: float):
    for _ in range(n):
        time.sleep(wait_s)
        yield [0] * 32


def accuracy(steps: int) -> None:
    worst = 0.0
    for wait_ms, step_ms in [(0, 20), (1, 20), (5, 20), (10, 10), (20, 5), (30, 10)]:
        meter = StarvationMeter(warmup=3, log_every=0)
        for _ in meter.wrap(sleeping(steps + 3, wait_ms / 1e3)):
            time.sleep(step_ms / 1e3)
        s = meter.summary()
        injected = 100 * wait_ms / (wait_ms + step_ms)
        worst = max(worst, abs(s["starved_pct"] - injected))
        print(f"wait {wait_ms:>2} ms, step {step_ms:>2} ms: injected {injected:5.1f}%  measured "
              f"{s['starved_pct']:5.1f}%  diff {s['starved_pct'] - injected:+.2f} points  ({s['band']})")
    print(f"largest difference: {worst:.2f} points (target <= 3)")


def workers(batches: int) -> None:
    """Host wait per step as DataLoader workers rise (a dataset that sleeps 20 ms an item, 4 a
    batch; a 10 ms step): ~80 ms in-process, ~30 ms with 2 workers, ~10 ms with 4."""
    import torch
    from torch.utils.data import DataLoader, Dataset

    class Slow(Dataset):
        def __len__(self):
            return 4 * batches

        def __getitem__(self, i):
            time.sleep(0.02)
            return torch.tensor([i])

    wait = {}
    for n in (0, 2, 4):
        meter = StarvationMeter(warmup=3, log_every=0)
        for _ in meter.wrap(DataLoader(Slow(), batch_size=4, num_workers=n, prefetch_factor=2 if n else None)):
            time.sleep(0.01)
        s = meter.summary()
        wait[n] = s["wait_s"] / s["steps"]
        print(f"workers {n}: wait {1e3 * wait[n]:.1f} ms per step, starved {s['starved_pct']:.1f}%")
    print(f"wait ratio 0/2 workers: {wait[0] / wait[2]:.2f} (expected ~2.7), 2/4: {wait[2] / wait[4]:.2f} (~3)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--step-ms", type=float, default=10.0)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    overhead(args.steps, args.step_ms, args.rounds)
    accuracy(args.steps // 2)
    workers(16)


if __name__ == "__main__":
    main()
