"""Token loader benchmark: packed token rows through make_loader vs the memmap-gather ceiling, one shuffled
epoch each, start-up included, variants interleaved on the same rows; plus storage and first-batch time.

    flock /tmp/shardkit-bench.lock .venv/bin/python bench/token_loader_bench.py [--tokens 85_300_000] [--reps 5]

The corpus is synthetic (document lengths log-normal around --mean-doc ids, ids uniform below a GPT-2
sized vocabulary) and goes through the build's own packing and writers (10,000 documents per shard,
the build's default cap). Ceiling: the same uint16 rows in one .npy file, two forked processes that
each memory-map it, gather their half of a shuffled epoch in batches and widen them to int64, timed
from the permutation to both processes' end. shardkit: StreamingDataset + make_loader(num_workers=2),
timed from the StreamingDataset call to the epoch's last batch. Tokens/s counts the rows' ids (seq+1).

With --litdata (optional: pip install litdata), LitData's TokensLoader on the same documents joins the rounds.

Targets: the default loader (input_ids + labels) >= 0.30 of the ceiling at B=64 and >= 0.15 at B=16; >= 5x
LitData; first batch
<= 0.2 s on a local dataset; storage <= 1.05x the raw ids.
"""

from __future__ import annotations

import argparse
import gc
import json
import multiprocessing as mp
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

VOCAB, EOS = 50257, 50256
DOCS_PER_SHARD = 10_000


def make_dataset(out: Path, tokens: int, seq_len: int, mean_doc: int) -> dict:
    """Synthetic documents packed and written by the build's own stage functions and writers."""
    from shardkit.manifest import Manifest, write_manifest
    from shardkit.sample import Sample
    from shardkit.stages.tokenize import TokenizerInfo, pack_stream
    from shardkit.writers import get_writer

    rng = np.random.default_rng(0)
    sigma = 1.0
    lengths = np.maximum(1, rng.lognormal(np.log(mean_doc) - sigma ** 2 / 2, sigma, tokens // mean_doc * 2))
    lengths = lengths.astype(np.int64)
    lengths = lengths[:np.searchsorted(np.cumsum(lengths), tokens) + 1]
    info = TokenizerInfo("tokenizer.json", "0" * 64, "synthetic", VOCAB, EOS, "<|endoftext|>")
    fields = info.fields(seq_len)
    shards = []
    for sid, lo in enumerate(range(0, len(lengths), DOCS_PER_SHARD)):
        part = lengths[lo:lo + DOCS_PER_SHARD]
        flat = rng.integers(0, EOS, int(part.sum()), dtype=np.uint16)
        flat[np.cumsum(part) - 1] = EOS
        rows, offsets, _ = pack_stream(flat, part, seq_len, "pad", info.pad_id)
        sample = Sample(f"tokens-{sid:05d}", {"tokens": rows, "doc_offsets": offsets})
        shards += [get_writer(fmt)([sample], str(out), sid, fields) for fmt in ("tar", "parquet")]
    samples = sum(s.samples for s in shards if s.format == "tar")
    write_manifest(str(out), Manifest(samples=samples, fields=fields, shards=shards,
                                      extra={"tokenizer": dict(info.to_dict(), stats={"tokens": int(lengths.sum())})}))
    return {"tokens": int(lengths.sum()), "documents": len(lengths), "rows": samples,
            "bytes": {f: sum(s.bytes for s in shards if s.format == f) for f in ("tar", "parquet")}}


def ceiling_rows(out: Path, path: Path) -> None:
    """The dataset's rows (tar shards, in order) as one (rows, seq+1) uint16 .npy file."""
    import webdataset as wds

    from shardkit.manifest import load_manifest

    parts = []
    for shard in load_manifest(str(out)).shards_of("tar"):
        (sample,) = list(wds.WebDataset(str(out / shard.path), shardshuffle=False).decode())
        parts.append(sample["tokens.npy"])
    np.save(path, np.concatenate(parts))


def _gather(path: str, batches: list, queue) -> None:
    import torch

    rows = np.load(path, mmap_mode="r")
    total = 0
    for idx in batches:
        total += torch.from_numpy(rows[np.sort(idx)].astype(np.int64)).numel()
    queue.put(total)


def ceiling(path: Path, batch_size: int, seed: int) -> tuple[float, int]:
    """Seconds and ids for one shuffled epoch gathered by two forked processes (the memmap limit)."""
    ctx = mp.get_context("fork")
    start = time.perf_counter()
    n = np.load(path, mmap_mode="r").shape[0]
    perm = np.random.default_rng(seed).permutation(n)
    batches = [perm[i:i + batch_size] for i in range(0, n, batch_size)]
    queue = ctx.Queue()
    procs = [ctx.Process(target=_gather, args=(str(path), batches[w::2], queue)) for w in range(2)]
    for p in procs:
        p.start()
    total = queue.get() + queue.get()
    for p in procs:
        p.join()
    return time.perf_counter() - start, total


def shardkit_epoch(out: Path, batch_size: int, seed: int, **options) -> tuple[float, int, float]:
    """Seconds, ids delivered (rows x (seq+1)) and first-batch seconds for one epoch, start-up included."""
    from shardkit.loader import make_loader
    from shardkit.reader.dataset import StreamingDataset

    start = time.perf_counter()
    ds = StreamingDataset(str(out), seed=seed, **options)
    loader = make_loader(ds, batch_size=batch_size, num_workers=2, pin_memory=False)
    rows, first = 0, None
    width = ds.manifest.fields["tokens"]["seq_len"] + 1
    for batch in loader:
        rows += len(next(iter(batch.values())))
        if first is None:
            first = time.perf_counter() - start
    seconds = time.perf_counter() - start
    del loader, batch
    gc.collect()  # persistent workers end with their loader
    return seconds, rows * width, first


def _documents(path: str):
    """One shard's documents as uint16 tensors (LitData's optimize input), from the stored rows."""
    import torch
    import webdataset as wds

    (sample,) = list(wds.WebDataset(path, shardshuffle=False).decode())
    rows, offsets = sample["tokens.npy"], sample["doc_offsets.npy"].astype(np.int64)
    stream = np.concatenate([rows[0], rows[1:, 1:].reshape(-1)])  # rows overlap by one id
    for lo, hi in zip(offsets[:-1], offsets[1:]):
        yield torch.from_numpy(stream[lo:hi].copy())


def litdata_prepare(out: Path, lit: Path) -> None:
    """The same documents optimized for LitData's TokensLoader (uint16, the reference comparison's layout)."""
    from litdata import TokensLoader, optimize

    from shardkit.manifest import load_manifest

    if (lit / "index.json").exists():
        return
    paths = [str(out / s.path) for s in load_manifest(str(out)).shards_of("tar")]
    method = mp.get_start_method(allow_none=True)
    optimize(fn=_documents, inputs=paths, output_dir=str(lit), chunk_size=2049 * 8192, item_loader=TokensLoader(),
             num_workers=2)
    mp.set_start_method(method or "fork", force=True)  # optimize() switches every later process to spawn


def litdata_epoch(lit: Path, batch_size: int, seed: int) -> tuple[float, int, float]:
    """LitData StreamingDataset + TokensLoader(block 2049) + StreamingDataLoader, 2 workers, shuffled;
    the loop widens inputs and targets as litgpt's does (`.long()` of the two slices)."""
    from litdata import StreamingDataLoader, StreamingDataset, TokensLoader

    start = time.perf_counter()
    ds = StreamingDataset(str(lit), item_loader=TokensLoader(block_size=2049), shuffle=True, seed=seed)
    rows, first = 0, None
    for batch in StreamingDataLoader(ds, batch_size=batch_size, num_workers=2):
        inputs, targets = batch[:, :-1].long(), batch[:, 1:].long()
        rows += len(inputs)
        if first is None:
            first = time.perf_counter() - start
    return time.perf_counter() - start, rows * 2049, first


FIRST_BATCH = """
import sys, time, torch
from shardkit import StreamingDataset, make_loader
start = time.perf_counter()
loader = make_loader(StreamingDataset(sys.argv[1], format=sys.argv[2]), batch_size=64, num_workers=2)
next(iter(loader))
print(time.perf_counter() - start)
"""


def first_batch(out: Path, fmt: str) -> float:
    """First-batch seconds in a fresh process that has imported torch and shardkit (as a training script has)."""
    proc = subprocess.run([sys.executable, "-c", FIRST_BATCH, str(out), fmt], capture_output=True, text=True,
                          check=True)
    return float(proc.stdout.strip().splitlines()[-1])


def prepare(work: Path, out: Path, rows_path: Path, args) -> dict:
    """The dataset and the ceiling's rows file, made once per (tokens, seq_len, mean_doc)."""
    stamp = work / "dataset.json"
    key = {"tokens": args.tokens, "seq_len": args.seq_len, "mean_doc": args.mean_doc}
    if not stamp.exists() or json.loads(stamp.read_text()).get("key") != key:
        import shutil

        shutil.rmtree(work, ignore_errors=True)
        out.mkdir(parents=True)
        data = make_dataset(out, args.tokens, args.seq_len, args.mean_doc)
        ceiling_rows(out, rows_path)
        stamp.write_text(json.dumps({"key": key, "data": data}))
    return json.loads(stamp.read_text())["data"]


VARIANTS = {  # name -> StreamingDataset options
    "tar, input_ids + labels (default)": {"format": "tar"},
    "tar, + position_ids + document_ids": {"format": "tar", "fields": ["input_ids", "labels", "position_ids",
                                                                      "document_ids"]},
    "tar, stored rows as int64 (tokens='rows')": {"format": "tar", "tokens": "rows"},
    "parquet, input_ids + labels (default)": {"format": "parquet"},
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=85_300_000, help="corpus size (the reference run: 85.3M)")
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--mean-doc", type=int, default=2843, help="mean document length in ids (85.3M / 30,000)")
    ap.add_argument("--batch-sizes", default="64,16")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--workdir", default="bench/out/token_loader")
    ap.add_argument("--litdata", action="store_true", help="also LitData's TokensLoader (pip install litdata)")
    args = ap.parse_args()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    work = Path(args.workdir)
    out, rows_path = work / "dataset", work / "rows.npy"
    data = prepare(work, out, rows_path, args)
    raw = data["tokens"] * 2
    print(f"corpus: {data['tokens']:,} ids in {data['documents']:,} documents, {data['rows']:,} rows of "
          f"{args.seq_len + 1}; {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}")
    for fmt in ("tar", "parquet"):
        print(f"storage {fmt}: {data['bytes'][fmt] / 1e6:,.1f} MB = {data['bytes'][fmt] / raw:.4f} x the raw uint16 "
              f"ids ({raw / 1e6:,.1f} MB)  (target <= 1.05)")
    results: dict = {}
    if args.litdata:
        litdata_prepare(out, work / "litdata")
        litdata_epoch(work / "litdata", 64, 99)
    ceiling(rows_path, 64, seed=99)  # warm-up, untimed: both files in the page cache before any timing
    shardkit_epoch(out, 64, 99, format="tar")
    shardkit_epoch(out, 64, 99, format="parquet")
    for rep in range(args.reps):
        for bs in map(int, args.batch_sizes.split(",")):
            runs = [("ceiling", None)] + list(VARIANTS.items()) + ([(LITDATA, None)] if args.litdata else [])
            for name, options in runs[rep % len(runs):] + runs[:rep % len(runs)]:  # rotate the order
                if name == LITDATA:
                    seconds, ids, first = litdata_epoch(work / "litdata", bs, rep)
                elif options is None:
                    seconds, ids = ceiling(rows_path, bs, seed=rep)
                    first = None
                else:
                    seconds, ids, first = shardkit_epoch(out, bs, rep, **options)
                results.setdefault((bs, name), []).append((ids / seconds, first))
        shown = [(bs, n, v[-1][0]) for (bs, n), v in results.items() if n.startswith("tar, input") or n == "ceiling"]
        print(f"rep {rep}: " + ", ".join(f"B={bs} {n.split(',')[0]} {rate / 1e6:,.0f}M" for bs, n, rate in shown))
    report(results, args)
    for fmt in ("tar", "parquet"):
        firsts = [first_batch(out, fmt) for _ in range(3)]
        print(f"first batch, fresh process, {fmt}: median {statistics.median(firsts):.3f} s "
              f"({', '.join(f'{f:.3f}' for f in firsts)})  (target <= 0.2)")
    return 0


LITDATA = "litdata TokensLoader, .long() in the loop"


def report(results: dict, args) -> None:
    targets = {64: 0.30, 16: 0.15}
    for bs in map(int, args.batch_sizes.split(",")):
        ceil = [r for r, _ in results[(bs, "ceiling")]]
        print(f"\nB={bs}: memmap-gather ceiling (uint16 rows -> int64, 2 processes): median "
              f"{statistics.median(ceil) / 1e6:,.0f}M ids/s ({min(ceil) / 1e6:,.0f}-{max(ceil) / 1e6:,.0f})")
        for name in list(VARIANTS) + ([LITDATA] if args.litdata else []):
            rates = [r for r, _ in results[(bs, name)]]
            ratios = [r / c for r, c in zip(rates, ceil)]  # each run against the ceiling of its own rep
            firsts = [f for _, f in results[(bs, name)]]
            target = f"  (target >= {targets[bs]:.2f})" if name.startswith("tar, input_ids") else ""
            print(f"  {name:<44} {statistics.median(rates) / 1e6:7,.0f}M ids/s  ratio median "
                  f"{statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f}), first batch "
                  f"{statistics.median(firsts):.3f} s{target}")
        if args.litdata:
            default = [r for r, _ in results[(bs, "tar, input_ids + labels (default)")]]
            lit = [r for r, _ in results[(bs, LITDATA)]]
            print(f"  default / LitData: median {statistics.median([a / b for a, b in zip(default, lit)]):.1f}x "
                  "(target >= 5)")


if __name__ == "__main__":
    sys.exit(main())
