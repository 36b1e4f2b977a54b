"""Tokenize benchmark: the build's tokenize stage vs raw `Tokenizer.encode_batch` on the same corpus
(interleaved, same process, same thread settings). The token loader has its own: token_loader_bench.py.

    .venv/bin/python bench/tokenize_bench.py [--docs 20000] [--reps 3] [--seq-len 2048]

Target (../shared/BENCHMARKS.md): stage >= 90% of encode_batch.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from shardkit.config import BuildConfig
from shardkit.demo.datagen import generated, words
from shardkit.jobs.build import build
from shardkit.sample import Sample
from shardkit.stages.tokenize import BATCH_DOCS, load_tokenizer, tokenize


def make_corpus(root: Path, docs: int) -> None:
    rng = np.random.default_rng(0)
    (root / "docs").mkdir(parents=True, exist_ok=True)
    for i in range(docs):
        (root / "docs" / f"{i:07d}.txt").write_text(words(rng, int(rng.integers(50, 400))), encoding="utf-8")


def _stage(texts: list[str], spec: dict, root: str, seq_len: int | None):
    """The stage on one chunk of documents (Samples built before the clock starts)."""
    samples = [Sample(f"d{i:07d}", {"txt": t}) for i, t in enumerate(texts)]
    spec = dict(spec, seq_len=seq_len, shape=[seq_len + 1]) if seq_len else spec

    def run():
        stats: dict = {}
        out = list(tokenize(samples, spec=spec, root=root, tail="pad", shard_id=0, stats=stats))
        assert out and stats["documents"] == len(texts)

    return run


def interleaved(tok, texts: list[str], spec: dict, root: str, seq_len: int, chunk: int) -> dict[str, float]:
    """Seconds per method over the corpus, methods interleaved chunk by chunk (rotating their order)
    so that load from other processes falls on all of them alike."""
    seconds = {"encode_batch": 0.0, "encode_batch_fast": 0.0, "stage unpacked": 0.0, "stage packed": 0.0}
    for j, lo in enumerate(range(0, len(texts), chunk)):
        part = texts[lo:lo + chunk]
        runs = {"encode_batch": lambda: tok.encode_batch(part),  # ids not even read: the raw ceiling
                "encode_batch_fast": lambda: tok.encode_batch_fast(part, add_special_tokens=False),
                "stage unpacked": _stage(part, spec, root, None),
                "stage packed": _stage(part, spec, root, seq_len)}
        names = list(runs)
        for name in names[j % 4:] + names[:j % 4]:
            start = time.perf_counter()
            runs[name]()
            seconds[name] += time.perf_counter() - start
    return seconds


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--docs", type=int, default=40000, help="~9M tokens: ~70 loader batches per epoch")
    ap.add_argument("--vocab", type=int, default=8000)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--chunk", type=int, default=BATCH_DOCS, help="documents per interleaved measurement")
    ap.add_argument("--workers", type=int, default=2, help="Dask workers of the build")
    ap.add_argument("--workdir", default="bench/out/tokenize")
    args = ap.parse_args()
    work = Path(args.workdir)
    raw = work / f"corpus-{args.docs}"
    generated(raw, lambda root: make_corpus(Path(root), args.docs), f"{args.docs} documents")
    out = work / "packed"
    shutil.rmtree(out, ignore_errors=True)
    t0 = time.perf_counter()
    result = build(BuildConfig(src=str(raw), out=str(out), format="both", tokenizer=f"bpe:{args.vocab}",
                               seq_len=args.seq_len, labels=False, workers=args.workers, progress=False,
                               max_samples_per_shard=5000))
    build_s = time.perf_counter() - t0
    m = result.manifest
    spec = m.fields["tokens"]
    tok = load_tokenizer(str(out / "tokenizer.json"), spec["tokenizer_sha256"])
    texts = [p.read_text(encoding="utf-8") for p in sorted((raw / "docs").glob("*.txt"))]
    print(f"corpus: {len(texts)} documents, {m.extra['tokenizer']['stats']['tokens']:,} tokens; "
          f"bpe:{args.vocab} trained + packed build (Dask, {args.workers} workers, both formats) {build_s:.1f} s; "
          f"TOKENIZERS_PARALLELISM={os.environ.get('TOKENIZERS_PARALLELISM', '(unset: threads on)')}, "
          f"{os.cpu_count()} cores")
    ratios: dict[str, list[float]] = {"unpacked": [], "packed": [], "same_call": []}
    n_tokens = m.extra["tokenizer"]["stats"]["tokens"]
    for rep in range(args.reps):
        sec = interleaved(tok, texts, spec, str(out), args.seq_len, args.chunk)
        ratios["unpacked"].append(sec["encode_batch"] / sec["stage unpacked"])
        ratios["packed"].append(sec["encode_batch"] / sec["stage packed"])
        ratios["same_call"].append(sec["encode_batch_fast"] / sec["stage packed"])
        print(f"rep {rep}: " + ", ".join(f"{k} {len(texts) / v:,.0f} docs/s" for k, v in sec.items())
              + f" | stage packed {n_tokens / sec['stage packed'] / 1e6:.2f}M tokens/s")
    labels = {"unpacked": "stage unpacked / raw encode_batch", "packed": "stage packed / raw encode_batch",
              "same_call": "stage packed / raw encode_batch_fast (the call it makes: its own overhead)"}
    for name, vals in ratios.items():
        print(f"{labels[name]}: median {statistics.median(vals):.2f}  (target >= 0.90)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
