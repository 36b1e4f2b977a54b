"""Cost of where=: the loader's samples/s with and without it, and the memory its masks take.

    flock /tmp/shardkit-bench.lock .venv/bin/python bench/where_bench.py            # 200k documents, 3 rounds
    .venv/bin/python bench/where_bench.py --n 40000 --rounds 1 --seconds 1          # quick check

Data (built once into --work, reused): a .jsonl corpus of --n documents of 0-600 characters, built
twice into tar shards of 10,000: `filtered` with `--filter text-length` (what it keeps) and
`annotated` with `--filter text-length --annotate` (every sample, plus attribute tables), then
`shardkit annotate --select text_length` (the kept counts stored with the dataset).

Throughput (every run a fresh process: make_loader, --workers workers, batch --batch, shuffle on,
one warm-up epoch, then whole epochs for at least --seconds; variants interleaved, rounds rotated),
as samples/s and as samples per CPU-second of the process and its DataLoader workers (psutil): on
a shared machine the second is the steadier measure of what where= costs:
  where / filtered   the annotated dataset with where="text_length" against the --filter build: the
                     same samples in the same order; what where= costs over a dataset built without them.
  where-all / all    where="text_chars >= 1" (keeps all but the ~1% empty documents) against no
                     where= on the same dataset: per sample the same work but for the mask path
                     itself (attribute reads, masks, kept id -> stored id).
Text samples are the cheapest to load, so the mask path's share is as large as it gets. Target:
both ratios >= 0.95.

The same pairs in one process (num_workers=0), after a whole epoch of each, alternating slices of
--slice batches, --slices times: samples per CPU-second of each slice, ratio per slice pair (the
steadiest figure here), and a second loader without where= against the first: the noise floor.

Memory, in one process (num_workers=0), one epoch of where="text_length" (~83% kept) and of
where="text_chars < 300" (about half kept: the largest masks, 2 x min(kept, dropped) bytes a row):
the bytes the masks held at the end take per row of the shards they cover (Selection.mask_bytes),
and, independently, tracemalloc's peak over the epoch minus the peak without where= on the same
dataset (both after one where= lookup, so that the modules the path imports count in neither),
per sample of the dataset. Target: <= 1 byte per sample.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys

CHILD = r"""
import json, sys, time
import psutil
from shardkit import StreamingDataset, make_loader
root, where, seconds, workers, batch = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
ds = StreamingDataset(root, fields=["txt"], seed=0, where=where or None)
loader = make_loader(ds, batch_size=batch, num_workers=workers)
for _ in loader:  # warm-up epoch: workers started, shards opened, masks made, page cache filled
    pass
me = psutil.Process()
def cpu():  # this process and its DataLoader workers
    return sum(sum(p.cpu_times()[:2]) for p in [me] + me.children(recursive=True))
n, c0, t0 = 0, cpu(), time.perf_counter()
while time.perf_counter() - t0 < seconds:
    for b in loader:
        n += len(b["__key__"])
wall, spent = time.perf_counter() - t0, cpu() - c0
print(json.dumps({"rate": n / wall, "cpu_rate": n / spent, "samples": len(ds)}))
"""

MEMORY = r"""
import json, sys, tracemalloc
from shardkit import StreamingDataset, make_loader
root, where, batch = sys.argv[1], sys.argv[2], int(sys.argv[3])
once = StreamingDataset(root, fields=["txt"], where="text_chars >= 0")  # every module the where= path imports,
once[0]                                                                # in both runs: imports are not the masks
del once
tracemalloc.start()
ds = StreamingDataset(root, fields=["txt"], seed=0, where=where or None)
n = sum(len(b["__key__"]) for b in make_loader(ds, batch_size=batch, num_workers=0))
held, rows = ds.selection.mask_bytes() if ds.selection is not None else (0, 0)
print(json.dumps({"peak": tracemalloc.get_traced_memory()[1], "samples": n, "mask_bytes": held, "mask_rows": rows,
                  "dataset_rows": int(ds.shards.samples.sum())}))
"""


def alternating(variants: dict, batches: int, rounds: int, batch: int) -> dict:
    """In this process (num_workers=0): every variant's loader, `batches` batches at a time, the
    variants taken in turn `rounds` times; samples per CPU-second (time.process_time) of each slice.
    One process and short slices: the variants meet the same machine, which fresh processes a few
    seconds apart on a shared VM did not (their ratios swung 0.6-1.7)."""
    import time

    from shardkit import StreamingDataset, make_loader

    def endless(loader):
        while True:  # make_loader moves on to the next epoch when one runs out
            yield from loader

    loaders = {name: make_loader(StreamingDataset(root, fields=["txt"], seed=0, where=where or None),
                                 batch_size=batch, num_workers=0) for name, (root, where) in variants.items()}
    streams = {name: endless(loader) for name, loader in loaders.items()}
    for name, it in streams.items():  # a whole epoch first: every shard opened and its mask made, pages cached
        for _ in range(len(loaders[name])):
            next(it)
    out = {name: [] for name in variants}
    for _ in range(rounds):
        for name, it in streams.items():
            n, c0 = 0, time.process_time()
            for _ in range(batches):
                n += len(next(it)["__key__"])
            out[name].append(n / (time.process_time() - c0))
    return out


def prepared(work: str | None, n: int) -> str:
    """The data folder: corpus, the --filter build and the --annotate build (reused when present)."""
    from shardkit.config import AnnotateConfig, BuildConfig
    from shardkit.jobs.annotate import annotate
    from shardkit.jobs.build import build

    work = work or os.path.join(os.environ.get("TMPDIR", "/tmp"), f"shardkit-where-bench-{n}")
    raw = os.path.join(work, "raw")
    if not os.path.exists(os.path.join(raw, "docs.jsonl")):
        os.makedirs(raw, exist_ok=True)
        r = random.Random(0)
        with open(os.path.join(raw, "docs.jsonl"), "w") as f:
            for _ in range(n):
                words = " ".join(f"w{r.randint(0, 9999)}" for _ in range(r.randint(0, 100)))
                f.write(json.dumps({"text": words}) + "\n")
    for name, extra in (("filtered", {}), ("annotated", {"annotate": True})):
        out = os.path.join(work, name)
        if not os.path.exists(os.path.join(out, "manifest.json")):
            build(BuildConfig(raw, out, filter="text-length", progress=False, **extra))
    annotate(AnnotateConfig(os.path.join(work, "annotated"), select=("text_length",), progress=False))
    return work


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=200_000, help="documents (default 200,000)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--seconds", type=float, default=3.0, help="minimum timed seconds per variant per round")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--slice", type=int, default=40, help="batches per slice of the in-process comparison")
    p.add_argument("--slices", type=int, default=30, help="slices per variant of the in-process comparison")
    p.add_argument("--work", default=None, help="data folder (default: $TMPDIR/shardkit-where-bench-N)")
    args = p.parse_args(argv)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from loader_bench import run_child

    work = prepared(args.work, args.n)
    filtered, annotated = os.path.join(work, "filtered"), os.path.join(work, "annotated")
    variants = {"filtered": (filtered, ""), "where": (annotated, "text_length"),
                "all": (annotated, ""), "where-all": (annotated, "text_chars >= 1")}
    print(f"load average before: {os.getloadavg()[0]:.2f}", flush=True)
    runs = {name: [] for name in variants}
    names = list(variants)
    for r in range(args.rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            root, where = variants[name]
            got = run_child(CHILD, root, where, args.seconds, args.workers, args.batch)
            runs[name].append(got)
            print(f"round {r}: {name:<10} {got['rate']:>10,.0f} samples/s, {got['cpu_rate']:>10,.0f} samples per "
                  f"CPU-second ({got['samples']:,} samples a rank)", flush=True)
    for a, b in (("where", "filtered"), ("where-all", "all")):
        for key, what in (("rate", "samples/s"), ("cpu_rate", "samples per CPU-second")):
            ratios = [x[key] / y[key] for x, y in zip(runs[a], runs[b])]
            print(f"{a} / {b}, {what}: median {statistics.median(ratios):.3f} "
                  f"(rounds {', '.join(f'{x:.3f}' for x in ratios)})")
    slices = alternating({**variants, "all-again": (annotated, "")}, args.slice, args.slices, args.batch)
    for a, b in (("where", "filtered"), ("where-all", "all"), ("all-again", "all")):  # the last: the noise floor
        ratios = [x / y for x, y in zip(slices[a], slices[b])]
        print(f"in one process, alternating slices of {args.slice} batches: {a} / {b}, samples per CPU-second: "
              f"median {statistics.median(ratios):.3f} (quartiles {' '.join(f'{q:.3f}' for q in statistics.quantiles(ratios, n=4))};"
              f" {statistics.median(slices[a]):,.0f} / {statistics.median(slices[b]):,.0f})")
    plain = run_child(MEMORY, annotated, "", args.batch)
    for where in ("text_length", "text_chars < 300"):  # ~83% kept; about half kept, the largest masks
        got = run_child(MEMORY, annotated, where, args.batch)
        extra = got["peak"] - plain["peak"]
        print(f"where={where!r} ({got['samples']:,} of {got['dataset_rows']:,} samples): masks held at the end of an "
              f"epoch {got['mask_bytes']:,} bytes over {got['mask_rows']:,} rows = "
              f"{got['mask_bytes'] / max(1, got['mask_rows']):.3f} B per row; tracemalloc peak {got['peak']:,} vs "
              f"{plain['peak']:,} without where=: {extra:+,} bytes = {extra / got['dataset_rows']:+.3f} B per sample")
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
