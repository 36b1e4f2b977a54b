"""Text dedup benchmark: shardkit vs a plain datasketch loop (`MinHash(num_perm=128).update_batch` per
document + `MinHashLSH` query/insert), same corpus, same run, interleaved.

1. Quality and per-core speed: 4,000 documents x 400 words with planted pairs at known exact
   Jaccard; the dedup engine in one process vs the loop in one process; recall at J >= 0.85 and
   precision at J >= 0.8 against exact Jaccard.
2. End to end, equal cores: 200,000 documents (.jsonl files, 2,000 planted pairs) through
   `shardkit dedup RAW OUT` (default settings: it picks in-process or a cluster) vs the loop run as
   one process per core over an equal share of the files. Recall and precision of that run too.

    .venv/bin/python bench/dedup_bench.py [--docs 4000] [--words 400] [--reps 3] [--e2e-docs 200000]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

from shardkit.config import DedupConfig
from shardkit.jobs.dedup_tasks import find_duplicates
from shardkit.sample import Sample
from shardkit.duplicates.lsh import detection_probability, optimal_params
from shardkit.duplicates.text import normalise, shingles

THRESHOLD, NUM_PERM, NGRAM = 0.8, 128, 5
E2E_WORDS, E2E_PAIRS, DOCS_PER_FILE = 120, 2000, 10_000
LOOP = r'''
import json, sys
from datasketch import MinHash, MinHashLSH
from shardkit.duplicates.text import normalise, shingles
lsh, n = MinHashLSH(threshold=0.8, num_perm=128), 0
for path in sys.argv[1:]:
    with open(path) as f:
        for line in f:
            m = MinHash(num_perm=128)
            m.update_batch([s.encode("utf-8") for s in shingles(normalise(json.loads(line)["text"]), 5)])
            lsh.query(m)
            lsh.insert(n, m)
            n += 1
print(n)
'''


def _vocab(rng):
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    return np.array(["".join(w) for w in letters[rng.integers(0, 26, (50000, 7))]])


def _partner(rng, vocab, a: list, level: float) -> list:
    """A document sharing a prefix with `a` so that their shingle sets have Jaccard ~level."""
    size = len(a) - NGRAM + 1
    shared = int(np.ceil(2 * size * level / (1 + level)))
    return a[:shared + NGRAM - 1] + list(rng.choice(vocab, len(a) - shared - NGRAM + 1))


def _jaccard(x: str, y: str) -> float:
    sa, sb = set(shingles(x, NGRAM)), set(shingles(y, NGRAM))
    return len(sa & sb) / len(sa | sb)


def make_corpus(n_docs: int, n_words: int, seed: int = 0):
    """Unrelated documents plus planted pairs at exact Jaccard 0.5 … 1.0 (shingle sets)."""
    rng = np.random.default_rng(seed)
    vocab = _vocab(rng)
    docs, pairs = [], []
    levels = np.round(np.arange(0.5, 1.0001, 0.05), 2)
    for i in range(n_docs // 2):
        a = list(rng.choice(vocab, n_words))
        docs.append(" ".join(a))
        if i % 4 == 0:  # a quarter of the documents get a near-duplicate partner
            docs.append(" ".join(_partner(rng, vocab, a, levels[(i // 4) % len(levels)])))
            pairs.append((len(docs) - 2, len(docs) - 1, _jaccard(docs[-2], docs[-1])))
    while len(docs) < n_docs:
        docs.append(" ".join(rng.choice(vocab, n_words)))
    return docs, pairs


def run_datasketch(docs):
    """The plain loop a user would write first; returns the set of candidate pairs."""
    from datasketch import MinHash, MinHashLSH

    lsh = MinHashLSH(threshold=THRESHOLD, num_perm=NUM_PERM)
    sketches = []
    for i, doc in enumerate(docs):
        m = MinHash(num_perm=NUM_PERM)
        m.update_batch([s.encode("utf-8") for s in shingles(normalise(doc), NGRAM)])
        lsh.insert(i, m)
        sketches.append(m)
    found = set()
    for i, m in enumerate(sketches):
        found.update((min(i, j), max(i, j)) for j in lsh.query(m) if j != i)
    return found


def run_shardkit(docs):
    """The dedup engine in this process (partition files, bucket tasks, clusters), as `shardkit dedup` runs it."""
    work = tempfile.mkdtemp(prefix="shardkit-dedup-bench-")
    try:
        result = find_duplicates([Sample(f"{i:08d}", {"txt": d}) for i, d in enumerate(docs)],
                                 DedupConfig(threshold=THRESHOLD, progress=False), None, work)
    finally:
        shutil.rmtree(work)
    rows = result.rows
    return {(int(r["duplicate_of"]), int(r["key"])) for r in rows if not r["kept"]}


def score(found, pairs):
    jac = {(a, b): j for a, b, j in pairs}
    hits = [(a, b) in found for a, b, j in pairs if j >= THRESHOLD + 0.05]
    true = sum(jac.get(p, 0.0) >= THRESHOLD for p in found)
    return sum(hits) / max(1, len(hits)), true / max(1, len(found))


def quality_and_speed(args) -> float:
    docs, pairs = make_corpus(args.docs, args.words)
    n_shingles = len(docs) * (args.words - NGRAM + 1)
    times = {"datasketch": [], "shardkit": []}
    cpu = {"datasketch": [], "shardkit": []}
    results = {}
    run_datasketch(docs[:200]), run_shardkit(docs[:200])  # imports and first calls: not what is compared
    for _ in range(args.reps):  # interleaved: machine noise hits both alike
        for name, fn in (("datasketch", run_datasketch), ("shardkit", run_shardkit)):
            start, start_cpu = time.perf_counter(), time.process_time()
            results[name] = fn(docs)
            times[name].append(time.perf_counter() - start)
            cpu[name].append(time.process_time() - start_cpu)
    bands, rows = optimal_params(THRESHOLD, NUM_PERM)
    print(f"1. corpus: {len(docs)} docs x {args.words} words ({n_shingles} shingles), {len(pairs)} planted pairs; "
          f"threshold {THRESHOLD}, {NUM_PERM} perms, {args.reps} interleaved reps, one process each")
    for name in ("datasketch", "shardkit"):
        t = statistics.median(times[name])
        recall, precision = score(results[name], pairs)
        print(f"  {name:<10} {len(docs) / t:>9,.0f} docs/s {n_shingles / t:>12,.0f} shingles/s   "
              f"recall(J>={THRESHOLD + 0.05:.2f}) {recall:.3f}  precision(J>={THRESHOLD}) {precision:.3f}")
    ratio = statistics.median(times["datasketch"]) / statistics.median(times["shardkit"])
    cpu_ratio = statistics.median(cpu["datasketch"]) / statistics.median(cpu["shardkit"])
    print(f"  speed-up shardkit / datasketch, one process each: {ratio:.1f}x wall, {cpu_ratio:.1f}x CPU time "
          f"(target >= 5x at equal or better recall)")
    print(f"  LSH: shardkit {bands} bands x {rows} rows, P(found | J=0.80) = "
          f"{detection_probability(0.8, bands, rows):.2f}, J=0.85: {detection_probability(0.85, bands, rows):.3f}; "
          f"datasketch 9 x 13: {detection_probability(0.8, 9, 13):.2f}, {detection_probability(0.85, 9, 13):.3f}")
    return ratio


def make_e2e_folder(folder: str, n_docs: int, seed: int = 1) -> None:
    """n_docs documents in .jsonl files of 10,000 lines; E2E_PAIRS planted pairs (J 0.5 … 1.0)
    spread over the files; their keys and exact Jaccard in FOLDER.truth.json."""
    from shardkit.demo.datagen import generated

    def make(path):
        rng = np.random.default_rng(seed)
        vocab = _vocab(rng)
        idx = rng.integers(0, len(vocab), (n_docs, E2E_WORDS))
        texts = [" ".join(vocab[row]) for row in idx]
        levels = np.round(np.arange(0.5, 1.0001, 0.05), 2)
        slots = rng.permutation(n_docs)[: 2 * E2E_PAIRS].reshape(E2E_PAIRS, 2)
        truth = []
        for k, (a, b) in enumerate(slots.tolist()):
            texts[b] = " ".join(_partner(rng, vocab, texts[a].split(), levels[k % len(levels)]))
            truth.append((a, b, _jaccard(texts[a], texts[b])))
        os.makedirs(path)
        for f in range(0, n_docs, DOCS_PER_FILE):
            with open(os.path.join(path, f"part-{f // DOCS_PER_FILE:04d}.jsonl"), "w") as fh:
                fh.writelines(json.dumps({"text": t}) + "\n" for t in texts[f:f + DOCS_PER_FILE])
        with open(folder + ".truth.json", "w") as fh:
            json.dump(truth, fh)
    generated(folder, make, f"{n_docs} documents with {E2E_PAIRS} planted pairs")


def _key(i: int) -> str:
    return f"part-{i // DOCS_PER_FILE:04d}/{i % DOCS_PER_FILE + 1:06d}"


def run_loops(folder: str, procs: int) -> float:
    files = sorted(os.path.join(folder, n) for n in os.listdir(folder))
    start = time.perf_counter()
    running = [subprocess.Popen([sys.executable, "-c", LOOP, *files[k::procs]], stdout=subprocess.DEVNULL)
               for k in range(procs)]
    if any(p.wait() for p in running):
        raise RuntimeError("a datasketch loop process failed")
    return time.perf_counter() - start


def run_cli(folder: str) -> tuple[float, list[dict], dict]:
    import pyarrow.parquet as pq

    out = tempfile.mkdtemp(prefix="shardkit-dedup-bench-")
    start = time.perf_counter()
    subprocess.run([os.path.join(os.path.dirname(sys.executable), "shardkit"), "dedup", folder, out,
                    "--no-progress"], check=True, stdout=subprocess.DEVNULL)
    seconds = time.perf_counter() - start
    rows = pq.read_table(os.path.join(out, "dedup", "clusters.parquet")).to_pylist()
    with open(os.path.join(out, "dedup", "summary.json")) as f:
        summary = json.load(f)
    shutil.rmtree(out)
    return seconds, rows, summary


def end_to_end(args) -> float:
    folder = os.path.join(tempfile.gettempdir(), f"shardkit-bench-text-{args.e2e_docs}")
    make_e2e_folder(folder, args.e2e_docs)
    with open(folder + ".truth.json") as f:
        truth = [(_key(a), _key(b), j) for a, b, j in json.load(f)]
    procs = os.cpu_count() or 1
    times = {"loop": [], "shardkit": []}
    for _ in range(args.e2e_reps):
        times["loop"].append(run_loops(folder, procs))
        t, rows, summary = run_cli(folder)
        times["shardkit"].append(t)
    cluster_of = {r["key"]: r["cluster"] for r in rows}
    linked = [(a, b, j) for a, b, j in truth if a in cluster_of and cluster_of[a] == cluster_of.get(b)]
    recall = sum(j >= THRESHOLD + 0.05 for *_, j in linked) / max(1, sum(j >= THRESHOLD + 0.05 for *_, j in truth))
    jac = {tuple(sorted((a, b))): j for a, b, j in truth}
    removed = [r for r in rows if not r["kept"]]
    precision = sum(jac.get(tuple(sorted((r["key"], r["duplicate_of"]))), 0.0) >= THRESHOLD
                    for r in removed) / max(1, len(removed))
    loop, sk = statistics.median(times["loop"]), statistics.median(times["shardkit"])
    ex = summary["execution"]
    print(f"2. end to end: {args.e2e_docs} documents x {E2E_WORDS} words in .jsonl files, {E2E_PAIRS} planted pairs; "
          f"{procs} cores; {args.e2e_reps} interleaved reps")
    print(f"  datasketch loop, {procs} processes over equal shares: {loop:6.1f} s  {args.e2e_docs / loop:>8,.0f} docs/s")
    print(f"  shardkit dedup RAW OUT (default):              {sk:6.1f} s  {args.e2e_docs / sk:>8,.0f} docs/s  "
          f"[{ex['mode']}, {ex['workers']} workers; stages {ex.get('seconds', {})}]")
    print(f"  recall(J>={THRESHOLD + 0.05:.2f}) {recall:.3f}  precision(J>={THRESHOLD}) {precision:.3f} "
          f"(target >= 0.95 each); {len(removed)} removed")
    ratio = loop / sk
    print(f"  speed-up shardkit / datasketch, same cores: {ratio:.2f}x (target >= 2x)")
    return ratio if recall >= 0.95 and precision >= 0.95 else 0.0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--docs", type=int, default=4000)
    ap.add_argument("--words", type=int, default=400)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--e2e-docs", type=int, default=200_000)
    ap.add_argument("--e2e-reps", type=int, default=2)
    args = ap.parse_args()
    per_core = quality_and_speed(args)
    e2e = end_to_end(args) if args.e2e_docs else 2.0
    return 0 if per_core >= 5 and e2e >= 2 else 1


if __name__ == "__main__":
    sys.exit(main())
