"""Peak memory of curating a folder of pathological text: one 50 MB single-line document among
others (a 20 MB one-word-repeated page, 1 MB pages of random words without punctuation, long
lines of symbols), ~101 MB in all, through `shardkit build --filter
gopher-repetition,gopher-quality,c4,fineweb --workers 0`.

Each run is a fresh process; its peak resident set (ru_maxrss of the child) is printed, for the
build with the default document bound (`--filter-max-bytes`, 10 MB) and with it off (`none`),
interleaved, so the ratio comes from one machine at one time.

Usage:
    python bench/curation_memory_bench.py [--folder /tmp/curation-mem] [--repeats 1]
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import subprocess
import sys
import tempfile

FILTERS = "gopher-repetition,gopher-quality,c4,fineweb"  # repetition first: it computes every signal of a text


def make_folder(folder: str) -> int:
    """The pathological folder (deterministic); its size in bytes."""
    os.makedirs(folder, exist_ok=True)
    rng = random.Random(0)
    vocab = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 9))) for _ in range(5000)]
    vocab += ["naïve", "日本語", "🙂"]  # one character beyond Latin-1 makes Python hold the text at 4 bytes a character
    with open(os.path.join(folder, "huge-one-line.txt"), "w", encoding="utf-8") as f:  # ~50 MB, one line
        for _ in range(50):
            f.write(" ".join(rng.choices(vocab, k=170_000))[:1_000_000])
    with open(os.path.join(folder, "repeated.txt"), "w") as f:  # 20 MB: one word again and again
        f.write("spam " * 4_000_000)
    for i in range(25):  # 25 × 1 MB of words without punctuation, many short lines
        with open(os.path.join(folder, f"page-{i:03d}.txt"), "w") as f:
            f.write("\n".join(" ".join(rng.choices(vocab, k=rng.randint(1, 12))) for _ in range(25_000))[:1_000_000])
    with open(os.path.join(folder, "symbols.txt"), "w") as f:  # 6 MB of symbol lines
        f.write(("#{}[]<>|~^ " * 100 + "\n") * 6000)
    return sum(e.stat().st_size for e in os.scandir(folder))


def peak_of(src: str, out: str, bound: str) -> tuple[int, str]:
    """(peak RSS in bytes, the build's last summary lines) of one build in a fresh process."""
    shutil.rmtree(out, ignore_errors=True)
    code = ("import resource, subprocess, sys; r = subprocess.run(sys.argv[1:], capture_output=True, text=True); "
            "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); print(r.returncode); "
            "print(r.stdout[-600:] + r.stderr[-600:])")
    cmd = [sys.executable, "-c", code, sys.executable, "-m", "shardkit.cli", "build", src, out, "--workers", "0",
           "--no-progress", "--no-labels", "--allow-empty", "--filter", FILTERS, "--filter-max-bytes", bound]
    run = subprocess.run(cmd, capture_output=True, text=True, check=True)
    kib, rc, tail = run.stdout.split("\n", 2)
    if rc.strip() != "0":
        raise SystemExit(f"the build failed ({rc.strip()}): {tail}")
    return int(kib) * 1024, tail


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--folder", default=None, help="where to generate the folder (default: a temp dir)")
    ap.add_argument("--repeats", type=int, default=1)
    args = ap.parse_args()
    work = args.folder or tempfile.mkdtemp(prefix="curation-mem-")
    src = os.path.join(work, "src")
    size = make_folder(src)
    print(f"folder: {size / 1e6:.1f} MB, {len(os.listdir(src))} documents; max resident set per build:")
    peaks: dict = {"10MB": [], "none": []}
    for _ in range(args.repeats):
        for bound in ("none", "10MB"):
            peak, tail = peak_of(src, os.path.join(work, f"out-{bound}"), bound)
            peaks[bound].append(peak)
            print(f"  --filter-max-bytes {bound:>5}: {peak / 1e9:.2f} GB")
    off, on = min(peaks["none"]), min(peaks["10MB"])
    print(f"bound on / off: {on / off:.2f} ({on / 1e9:.2f} GB vs {off / 1e9:.2f} GB)")
    print(tail.strip())
    if not args.folder:
        shutil.rmtree(work)


if __name__ == "__main__":
    main()
