"""Memory of curation at scale: peak RSS of every process of `shardkit build` over N jsonl documents
with the four heuristic filters, `--dedup-exact` and `--lang en`, for two N; prints the growth in
bytes per document of the largest process and of the driver (the `shardkit build` process itself).

The corpus is generated (deterministic) under --workdir (default /tmp, never the repo): English-like
pages of 3-12 lines built from common English words and a generated vocabulary, with sentence
punctuation, so that some pass every filter and the language is English; 3% are exact copies of an
earlier page (what --dedup-exact removes). Each build is a fresh process; a sampler walks its process
tree (psutil) every 0.1 s and keeps each process's peak resident set.

Usage:
    python bench/curation_scale_bench.py --docs 100000,1000000 [--workers 2] [--workdir /tmp/shardkit-curation-scale]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import time

import psutil

FILTERS = "gopher-repetition,gopher-quality,c4,fineweb"
COMMON = ("the be to of and a in that have it for not on with he as you do at this but his by from they we say "
          "her she or an will my one all would there their what so up out if about who get which go me when make "
          "can like time no just him know take people into year your good some could them see other than then now "
          "look only come its over think also back after use two how our work first well way even new want because "
          "any these give day most us").split()


def make_corpus(root: str, docs: int, files: int = 20) -> None:
    """`docs` jsonl lines in `files` files (written once; a finished folder has a ROOT.done marker)."""
    if os.path.exists(root + ".done"):
        return
    shutil.rmtree(root, ignore_errors=True)
    os.makedirs(root)
    rng = random.Random(0)
    letters = "abcdefghijklmnopqrstuvwxyz"
    rare = ["".join(rng.choice(letters) for _ in range(rng.randint(3, 9))) for _ in range(20_000)]
    earlier: list[str] = []
    per = docs // files
    for f in range(files):
        with open(os.path.join(root, f"part-{f:03d}.jsonl"), "w") as out:
            for i in range(per if f < files - 1 else docs - per * (files - 1)):
                if earlier and rng.random() < 0.03:
                    text = rng.choice(earlier)
                else:
                    lines = []
                    for _ in range(rng.randint(3, 12)):
                        sentence = " ".join(rng.choice(COMMON) if rng.random() < 0.8 else rng.choice(rare)
                                            for _ in range(rng.randint(6, 20)))
                        lines.append(sentence[0].upper() + sentence[1:] + rng.choice(".,.!?.;"))
                    text = "\n".join(lines)
                    if len(earlier) < 1000:
                        earlier.append(text)
                out.write(json.dumps({"text": text, "id": f"{f}-{i}"}) + "\n")
    open(root + ".done", "w").close()


def build(src: str, out: str, workers: int) -> dict:
    """One `shardkit build` in a fresh process; each process's peak RSS (the driver's apart)."""
    shutil.rmtree(out, ignore_errors=True)
    cmd = [sys.executable, "-c", "import sys; from shardkit.cli import main; sys.exit(main())", "build", src, out,
           "--filter", FILTERS, "--dedup-exact", "--lang", "en", "--workers", str(workers)]
    t0 = time.time()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    root = psutil.Process(proc.pid)
    peaks: dict[int, tuple[int, str]] = {}
    while proc.poll() is None:
        try:
            tree = [root] + root.children(recursive=True)
        except psutil.Error:
            break
        for p in tree:
            try:
                rss = p.memory_info().rss
                name = " ".join(p.cmdline()[1:3])[:60]
            except psutil.Error:
                continue
            if rss > peaks.get(p.pid, (0, ""))[0]:
                peaks[p.pid] = (rss, name)
        time.sleep(0.1)
    err = proc.stderr.read()
    if proc.returncode:
        sys.exit(f"build failed ({proc.returncode}):\n{err[-3000:]}")
    largest = max(peaks.items(), key=lambda kv: kv[1][0])
    return {"seconds": time.time() - t0, "driver": peaks.get(proc.pid, (0, ""))[0], "largest": largest[1][0],
            "largest_is_driver": largest[0] == proc.pid, "processes": len(peaks)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--docs", default="100000,1000000", help="two corpus sizes")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--workdir", default="/tmp/shardkit-curation-scale")
    args = ap.parse_args()
    sizes = [int(x) for x in args.docs.split(",")]
    print(f"machine: {os.cpu_count()} cores; load average {os.getloadavg()[0]:.1f}", flush=True)
    got = {}
    for n in sizes:
        src = os.path.join(args.workdir, f"jsonl-{n}")
        make_corpus(src, n)
        got[n] = run = build(src, os.path.join(args.workdir, f"out-{n}"), args.workers)
        print(f"{n:>9,} documents: {run['seconds']:.0f} s ({n / run['seconds']:.0f} docs/s), {run['processes']} "
              f"processes; peak RSS: driver {run['driver'] / 1e6:.0f} MB, largest {run['largest'] / 1e6:.0f} MB"
              f"{' (the driver)' if run['largest_is_driver'] else ''}", flush=True)
    lo, hi = min(sizes), max(sizes)
    for key in ("largest", "driver"):
        per = (got[hi][key] - got[lo][key]) / (hi - lo)
        print(f"{key} process: {got[lo][key] / 1e6:.0f} → {got[hi][key] / 1e6:.0f} MB from {lo:,} to {hi:,} "
              f"documents: {per:+.1f} B per document   (target ≤ 150)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
