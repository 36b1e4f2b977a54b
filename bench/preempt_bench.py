"""How long a stop takes: seconds from the signal to the exit of `shardkit build` (worker processes
for jsonl text, worker threads for images), SIGTERM against SIGINT at the same moments (one clean-up
path: the ratio should be ~1), and what the rerun after a SIGTERM costs against a clean build.

    python bench/preempt_bench.py [--rounds 3]

Prints per variant the median stop latency and the ratios, measured interleaved in one run.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BIN = Path(sys.executable).parent / "shardkit"


def corpus(root: Path) -> None:
    rng = random.Random(0)
    vocab = "alpha beta gamma delta epsilon zeta eta theta iota kappa".split()
    root.mkdir()
    for f in range(6):
        with open(root / f"docs{f}.jsonl", "w") as fh:
            for _ in range(3000):
                fh.write(json.dumps({"text": " ".join(rng.choice(vocab) for _ in range(60))}) + "\n")


def images(root: Path) -> None:
    from shardkit.demo.datagen import image_folder

    image_folder(str(root), n=300, classes=3, size=(400, 300), seed=2)


def stop_once(args: list[str], after: float, signum: int) -> tuple[float, int, float]:
    """(seconds from the signal to the exit, exit status, seconds the rerun took)."""
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    time.sleep(after)
    sent = time.monotonic()
    proc.send_signal(signum)
    proc.communicate()
    took = time.monotonic() - sent
    start = time.monotonic()
    subprocess.run(args, check=True, capture_output=True)
    return took, proc.returncode, time.monotonic() - start


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    rounds = ap.parse_args().rounds
    work = Path(tempfile.mkdtemp(prefix="preempt-bench-"))
    try:
        corpus(work / "text")
        images(work / "images")
        variants = {
            "text, 2 worker processes": (work / "text", ["--workers", "2", "--max-samples-per-shard", "500",
                                                        "--unit-samples", "100"]),
            "images, 2 worker threads": (work / "images", ["--workers", "2", "--image-size", "128",
                                                          "--max-samples-per-shard", "20"]),
        }
        for name, (src, opts) in variants.items():
            out = work / "out"
            args = [str(BIN), "build", str(src), str(out), *opts, "--no-progress"]
            shutil.rmtree(out, ignore_errors=True)
            start = time.monotonic()
            subprocess.run(args, check=True, capture_output=True)
            clean = time.monotonic() - start
            lat = {signal.SIGTERM: [], signal.SIGINT: []}
            rerun, statuses = [], set()
            for r in range(rounds):
                for signum in (signal.SIGTERM, signal.SIGINT):  # interleaved, same moments
                    shutil.rmtree(out, ignore_errors=True)
                    took, status, again = stop_once(args, clean * (0.3 + 0.4 * r / max(1, rounds - 1)), signum)
                    lat[signum].append(took)
                    statuses.add(status)
                    if signum == signal.SIGTERM:
                        rerun.append(again)
            term, intr = statistics.median(lat[signal.SIGTERM]), statistics.median(lat[signal.SIGINT])
            print(f"{name}: clean build {clean:.1f} s; stop after SIGTERM {term:.2f} s (range "
                  f"{min(lat[signal.SIGTERM]):.2f}-{max(lat[signal.SIGTERM]):.2f}), SIGINT {intr:.2f} s, "
                  f"ratio {term / intr:.2f}; rerun after SIGTERM {statistics.median(rerun):.1f} s = "
                  f"{statistics.median(rerun) / clean:.2f} of a clean build; exit statuses {sorted(statuses)}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
