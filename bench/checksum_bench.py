"""Checksum benchmark: the raw uint8 loader with per-member checksums checked (the default) vs off.

    .venv/bin/python bench/checksum_bench.py              # 3,000 samples of 224x224x3, 6 rounds (~2 min)
    .venv/bin/python bench/checksum_bench.py --rounds 2   # quick check

Both variants read the same shards in the same run, interleaved (on, off, off, on, ...), so each
round's ratio shares that moment's machine load. Prints samples/s per variant, the cost of the
check as the median of the per-round ratios (target: <= 10% on the tar loader), and the single-core
speed of the candidate hashes on one 150 KB member. Data is kept in $TMPDIR/shardkit-checksum-bench-N.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import zlib

import numpy as np

SIZE = 224
SHARD = 500  # samples per shard, as in bench/loader_bench.py


def make_data(root: str, n: int) -> None:
    """n raw 224x224x3 uint8 samples + a label, in tar and Parquet shards of SHARD samples."""
    from shardkit.manifest import Manifest, write_manifest
    from shardkit.sample import Sample
    from shardkit.writers import get_writer

    fields = {"raw": {"kind": "image", "encoding": "raw", "dtype": "uint8", "shape": [SIZE, SIZE, 3]},
              "cls": {"kind": "int", "dtype": "int64"}}
    rng, infos = np.random.default_rng(0), []
    for sid, lo in enumerate(range(0, n, SHARD)):
        samples = [Sample(f"s{i:07d}", {"raw": rng.integers(0, 256, SIZE * SIZE * 3, np.uint8).tobytes(),
                                        "cls": i % 10}) for i in range(lo, min(n, lo + SHARD))]
        infos += [get_writer(fmt)(samples, root, sid, fields) for fmt in ("tar", "parquet")]
    write_manifest(root, Manifest(samples=n, fields=fields, shards=infos, classes=[str(c) for c in range(10)]))


def cpu_seconds() -> float:
    """CPU time of this process and its children (the DataLoader workers) so far."""
    import psutil

    me = psutil.Process()
    return sum(sum(p.cpu_times()[:2]) for p in [me] + me.children(recursive=True))


def timed(loader, min_seconds: float) -> tuple[float, float]:
    """(samples/s, CPU microseconds per sample over all processes), whole epochs, >= min_seconds.

    CPU time per sample moves much less than wall time when other work shares the cores."""
    n, t0, c0 = 0, time.perf_counter(), cpu_seconds()
    while True:
        for batch in loader:
            n += len(batch["__key__"])
        elapsed = time.perf_counter() - t0
        if elapsed >= min_seconds:
            return n / elapsed, 1e6 * (cpu_seconds() - c0) / n


def hash_rates(member: bytes, seconds: float = 0.5) -> dict[str, float]:
    """Members/s of each candidate hash on one core."""
    import xxhash

    rates = {}
    for name, fn in (("xxhash.xxh3_64 (used)", xxhash.xxh3_64_intdigest), ("zlib.crc32", zlib.crc32),
                     ("zlib.adler32", zlib.adler32), ("xxhash.xxh64", xxhash.xxh64_intdigest)):
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            for _ in range(100):
                fn(member)
            n += 100
        rates[name] = n / (time.perf_counter() - t0)
    return rates


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=3000, help="samples (default 3000)")
    p.add_argument("--rounds", type=int, default=6, help="interleaved rounds (default 6)")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--seconds", type=float, default=2.0, help="minimum timed seconds per variant per round")
    p.add_argument("--work", default=None, help="data folder (default: $TMPDIR/shardkit-checksum-bench-N)")
    args = p.parse_args(argv)

    from shardkit.demo.datagen import generated
    from shardkit.loader import make_loader
    from shardkit.reader.dataset import StreamingDataset

    root = args.work or os.path.join(tempfile.gettempdir(), f"shardkit-checksum-bench-{args.n}")
    generated(root, lambda folder: make_data(folder, args.n), f"{args.n} raw {SIZE}x{SIZE} samples")
    variants = {f"{fmt} checksums {'on' if on else 'off'}": make_loader(
        StreamingDataset(root, format=fmt, seed=0, checksums=on), batch_size=args.batch, num_workers=args.workers)
        for fmt in ("tar", "parquet") for on in (True, False)}
    for loader in variants.values():  # start the workers, fill the page cache
        timed(loader, 0)
    rates, cpu = {name: [] for name in variants}, {name: [] for name in variants}
    for r in range(args.rounds):
        for fmt in ("tar", "parquet"):  # on, off then off, on: neither side always runs first
            pair = [f"{fmt} checksums on", f"{fmt} checksums off"]
            for name in pair if r % 2 == 0 else pair[::-1]:
                rate, us = timed(variants[name], args.seconds)
                rates[name].append(rate)
                cpu[name].append(us)
        print(f"round {r + 1}/{args.rounds} done", flush=True)
    report(rates, cpu, args, hash_rates(np.random.default_rng(1).bytes(SIZE * SIZE * 3)))
    return 0


def report(rates: dict, cpu: dict, args, hashes: dict) -> None:
    print(f"\n{args.n} samples of {SIZE}x{SIZE}x3 uint8, batch {args.batch}, {args.workers} workers, "
          f"{args.rounds} rounds of >= {args.seconds:.0f} s per variant")
    for name, values in rates.items():
        print(f"  {name:24s} {statistics.median(values):9,.0f} samples/s  (rounds {min(values):,.0f}-"
              f"{max(values):,.0f})  {statistics.median(cpu[name]):5.1f} CPU us/sample, all processes")
    for fmt in ("tar", "parquet"):
        on, off = f"{fmt} checksums on", f"{fmt} checksums off"
        per_round = [a / b for a, b in zip(rates[on], rates[off])]
        cost = 1 - statistics.median(per_round)
        cpu_cost = statistics.median([a / b for a, b in zip(cpu[on], cpu[off])]) - 1
        target = "  target <= 10%: " + ("met" if cost <= 0.10 else "NOT met") if fmt == "tar" else ""
        print(f"  {fmt:8s} cost of checking = {100 * cost:5.1f}% of throughput (on/off per round "
              f"{min(per_round):.3f}-{max(per_round):.3f}), {100 * cpu_cost:+5.1f}% CPU per sample{target}")
    member = SIZE * SIZE * 3
    print(f"\nhashes on one {member / 1000:.0f} KB member, one core:")
    for name, rate in hashes.items():
        print(f"  {name:24s} {rate:9,.0f} members/s  {rate * member / 1e9:5.1f} GB/s  {1e6 / rate:6.1f} us/member")


if __name__ == "__main__":
    sys.exit(main())
