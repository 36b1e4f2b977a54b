"""Building from a WebDataset set vs from the same samples as a folder (target: tar rate >= 0.8 x folder).

    .venv/bin/python bench/wds_source_bench.py [--samples 6000] [--per-tar 1000] [--reps 3]
                                               [--encode jpeg,keep] [--worker-pool auto]

The samples: photo-like JPEGs of about 450 x 340 (shardkit.demo.datagen), a caption and a JSON record each,
as img2dataset lays them out. The same samples twice: a WebDataset set written by webdataset's own
ShardWriter (`--per-tar` samples per tar), and the folder those tars extract to (`tar xf` of each
tar into a folder named by its stem), so that both builds give the same keys and, checked here, the
same shards byte for byte. Each build runs `shardkit build` with the default workers, the
`--worker-pool` given (default auto: each build probes its own images, so on a loaded machine a
noisy probe may pick differently for the two), `--no-labels`, and the `--encode` given (`jpeg`:
resized to 224 and re-encoded, a re-shard for training; `keep`: the original bytes, where the
source's own overhead weighs most), in a fresh process timed around `build()` (cluster start and
close included, imports excluded). Folder and tar builds alternate (the first one flips every
repetition); rates are samples / seconds, the ratio is the tar's median rate over the folder's.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
from pathlib import Path

CHILD = r"""
import json, logging, sys, time
from shardkit.config import BuildConfig
from shardkit.jobs.build import build
from shardkit.manifest import load_manifest
lines = []
class Keep(logging.Handler):
    def emit(self, record):
        lines.append(record.getMessage())
logging.getLogger("shardkit").addHandler(Keep())
logging.getLogger("shardkit").setLevel(logging.INFO)
cfg = BuildConfig(**json.loads(sys.argv[1]))
start = time.perf_counter()
result = build(cfg)
seconds = time.perf_counter() - start
print(json.dumps({"seconds": seconds, "samples": result.samples, "rejected": len(result.rejections),
                  "pool": next((l for l in lines if l.startswith("worker pool")), ""),
                  "sha256": [s.sha256 for s in load_manifest(cfg.out).shards]}))
"""


def make_set(root: str, n: int, per_tar: int) -> None:
    """n samples (JPEG, caption, JSON) as webdataset's ShardWriter writes them."""
    import numpy as np
    import webdataset as wds

    from shardkit.demo.datagen import _jpeg, photo_like, words

    rng = np.random.default_rng(0)
    os.makedirs(root)
    with wds.ShardWriter(os.path.join(root, "%05d.tar"), maxcount=per_tar, verbose=0) as sink:
        for i in range(n):
            w, h = int(450 * rng.uniform(0.9, 1.1)), int(340 * rng.uniform(0.9, 1.1))
            sink.write({"__key__": f"{i // per_tar:05d}{i % per_tar:04d}", "jpg": _jpeg(photo_like(rng, w, h)),
                        "txt": words(rng, 12), "json": {"width": w, "height": h, "status": "success"}})


def extract(tars: str, root: str) -> None:
    """The folder the tars extract to: each tar into a folder named by its stem."""
    os.makedirs(root)
    for name in sorted(os.listdir(tars)):
        with tarfile.open(os.path.join(tars, name)) as tf:
            tf.extractall(os.path.join(root, name[:-len(".tar")]), filter="data")


def child(cfg: dict) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, json.dumps(cfg)], capture_output=True, text=True)
    if out.returncode:
        raise RuntimeError(out.stderr[-3000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def measure(work: Path, samples: int = 6000, per_tar: int = 1000, reps: int = 3,
            encodes: tuple[str, ...] = ("jpeg", "keep"), pool: str = "auto") -> dict:
    """Run the comparison (printing each repetition); {encode: tar rate / folder rate}. Other benches
    (bench/object_store_bench.py) call this for the WebDataset figure."""
    from shardkit.demo.datagen import generated

    work.mkdir(parents=True, exist_ok=True)
    tars, folder = work / f"wds-{samples}-{per_tar}", work / f"folder-{samples}-{per_tar}"
    generated(tars, lambda root: make_set(root, samples, per_tar), f"a WebDataset set of {samples:,}")
    generated(folder, lambda root: extract(str(tars), root), "the folder it extracts to")
    size = sum(p.stat().st_size for p in tars.iterdir())
    print(f"machine: {os.cpu_count()} cores, shared; load average {os.getloadavg()[0]:.1f} at start")
    print(f"{samples:,} samples in {len(list(tars.iterdir()))} tars ({size / 1e6:,.0f} MB) and as a folder")
    ratios = {}
    for encode in encodes:
        opts = {"encode": encode, "labels": False, "progress": False, "worker_pool": pool}
        if encode != "keep":
            opts.update(image_size=224, resize_mode="center-crop")
        seconds = {"folder": [], "tar": []}
        for rep in range(reps):
            got = {}
            for kind in ("folder", "tar") if rep % 2 == 0 else ("tar", "folder"):
                out = work / f"out-{kind}"
                shutil.rmtree(out, ignore_errors=True)
                got[kind] = child(dict(opts, src=str(folder if kind == "folder" else tars), out=str(out)))
                assert got[kind]["samples"] == samples and not got[kind]["rejected"], got[kind]
                seconds[kind].append(got[kind]["seconds"])
            assert got["folder"]["sha256"] == got["tar"]["sha256"], "the two builds differ"
            print(f"  --encode {encode}, rep {rep}: folder {got['folder']['seconds']:6.2f} s "
                  f"({samples / got['folder']['seconds']:4.0f}/s), tar {got['tar']['seconds']:6.2f} s "
                  f"({samples / got['tar']['seconds']:4.0f}/s): ratio "
                  f"{got['folder']['seconds'] / got['tar']['seconds']:.2f}; load {os.getloadavg()[0]:.1f}", flush=True)
        med = {k: statistics.median(v) for k, v in seconds.items()}
        ratios[encode] = med["folder"] / med["tar"]
        paired = statistics.median(f / t for f, t in zip(seconds["folder"], seconds["tar"]))
        print(f"--encode {encode}: median folder {samples / med['folder']:,.0f} samples/s, tar "
              f"{samples / med['tar']:,.0f} samples/s: tar / folder = {ratios[encode]:.2f} (median of the "
              f"repetitions' ratios {paired:.2f}; target >= 0.8); same shards, byte for byte")
        print(f"  folder {got['folder']['pool']}\n  tar    {got['tar']['pool']}")
    return ratios


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=6000)
    ap.add_argument("--per-tar", type=int, default=1000)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--encode", default="jpeg,keep")
    ap.add_argument("--worker-pool", default="auto", help="both builds' --worker-pool (auto: each probes its own)")
    ap.add_argument("--workdir", default="bench/out/wds-source")
    args = ap.parse_args()
    measure(Path(args.workdir), args.samples, args.per_tar, args.reps, tuple(args.encode.split(",")), args.worker_pool)
    return 0


if __name__ == "__main__":
    sys.exit(main())
