"""Remote streaming benchmark: shardkit over a throttled object store on 127.0.0.1, against its local
rate, its own fetch-as-needed mode and WebDataset over the same store, in one run.

    .venv/bin/python bench/remote_bench.py                 # 2,090 images, 2 rounds (~3 min on 2 cores)
    .venv/bin/python bench/remote_bench.py --rounds 1      # quick check

The store (tests/throttled.py) serves the datasets with 50 ms before each answer, 25 MB/s per
connection, Range requests, no cap on connections. Each remote run is one shuffled epoch from a
fresh cache: make_loader(batch_size=64, num_workers=2). Data: raw uint8 224^2 and JPEG 224^2 tar
shards of 110 photo-like images each (bench/loader_bench.py's generator), kept in --work.
Prints samples/s and the first batch's wait per run (median of the rounds), the ratios the
targets name, and the bytes 4 ranks sharing one cache fetched.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.join(HERE, "..", "tests")]  # loader_bench's data, the throttled store

BATCH, WORKERS = 64, 2
LINK = 8 * 25e6  # the target's link: 8 connections x 25 MB/s


def epoch(loader) -> tuple[float, float, int]:
    """(samples/s over the epoch, seconds to the first batch, samples), the loader made fresh."""
    t0 = time.perf_counter()
    n, first = 0, None
    for batch in loader:
        n += len(batch["__key__"]) if isinstance(batch, dict) else len(batch[0])
        if first is None:
            first = time.perf_counter() - t0
    return n / (time.perf_counter() - t0), first, n


def shardkit_loader(src: str, cache: str | None, **options):
    from shardkit.loader import make_loader
    from shardkit.reader.dataset import StreamingDataset

    if cache is not None:
        shutil.rmtree(cache, ignore_errors=True)  # a fresh cache every run
        options["cache_dir"] = cache
    ds = StreamingDataset(src, format="tar", seed=0, **options)
    return ds, make_loader(ds, batch_size=BATCH, num_workers=WORKERS)


def wds_loader(url: str, root: str, field: str):
    """WebDataset 1.0.2 over http (curl per shard), shuffled shards + shuffle(1000), batched."""
    import torch
    import webdataset as wds
    from loader_bench import _wds_jpeg, _wds_raw

    shards = sorted(f for f in os.listdir(os.path.join(root, "shards")) if f.endswith(".tar"))
    urls = [f"{url}/shards/{f}" for f in shards]
    fn = _wds_raw if field == "raw" else _wds_jpeg
    ds = (wds.WebDataset(urls, shardshuffle=len(urls), empty_check=False, nodesplitter=None)
          .shuffle(1000).map(fn).batched(BATCH))
    return torch.utils.data.DataLoader(ds, batch_size=None, num_workers=WORKERS)


RANK = """
import sys
from shardkit import StreamingDataset, make_loader
url, cache = sys.argv[1:3]
ds = StreamingDataset(url, cache_dir=cache, format="tar", seed=0)
n = sum(len(b["__key__"]) for b in make_loader(ds, batch_size=64, num_workers=2))
print(n, ds.io_stats()["bytes_fetched"])
"""


def four_ranks(url: str, cache: str) -> tuple[float, int, int]:
    """(seconds, samples, bytes fetched) of 4 rank processes x 2 workers sharing one fresh cache."""
    shutil.rmtree(cache, ignore_errors=True)
    env = dict(os.environ, WORLD_SIZE="4", TOKENIZERS_PARALLELISM="false")
    t0 = time.perf_counter()
    procs = [subprocess.Popen([sys.executable, "-c", RANK, url, cache], env=dict(env, RANK=str(r)),
                              stdout=subprocess.PIPE, text=True) for r in range(4)]
    outs = [p.communicate(timeout=600)[0].split() for p in procs]
    assert all(p.returncode == 0 for p in procs)
    return time.perf_counter() - t0, sum(int(o[0]) for o in outs), sum(int(o[1]) for o in outs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=2090, help="images (default 2,090: 19 shards of 110)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--work", default=os.path.join(tempfile.gettempdir(), "shardkit-remote-bench"))
    args = ap.parse_args()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from loader_bench import prepare
    from throttled import Store

    from shardkit.manifest import load_manifest

    work = f"{args.work}-{args.n}"
    if not os.path.exists(os.path.join(work, "raw", "manifest.json")):
        prepare(work, args.n, shard=110)
    roots = {"raw": os.path.join(work, "raw"), "jpeg": os.path.join(work, "jpeg")}
    sizes = {k: sum(s.bytes + s.index["bytes"] for s in load_manifest(r).shards_of("tar")) for k, r in roots.items()}
    store = Store(work, latency=0.05, rate=25e6)
    cache = os.path.join(work, "cache")
    runs: dict[str, list] = {}
    try:
        for r in range(args.rounds):
            for kind, field in (("raw", "raw"), ("jpeg", "jpg")):
                url = f"{store.url}/{kind}"
                variants = {
                    f"shardkit local {kind}": lambda: shardkit_loader(roots[kind], None),
                    f"shardkit http {kind}": lambda: shardkit_loader(url, cache),
                    f"shardkit http {kind}, fetch_ahead=0 connections=1": lambda: shardkit_loader(
                        url, cache, fetch_ahead=0, connections=1),
                    f"webdataset http {kind}": lambda: (None, wds_loader(url, roots[kind], field)),
                }
                for name, make in variants.items():
                    ds, loader = make()
                    rate, first, n = epoch(loader)
                    stats = ds.io_stats() if ds is not None else {}
                    runs.setdefault(name, []).append((rate, first, stats.get("network_wait_s", 0.0)))
                    print(f"round {r}: {name:55s} {rate:8.0f} samples/s  first batch {first:5.2f} s  "
                          f"({n} samples{', waited on the network %.1f s' % stats['network_wait_s'] if stats else ''})",
                          flush=True)
                    del loader, ds
        seconds, samples, fetched = four_ranks(f"{store.url}/raw", cache)
    finally:
        store.close()
    med = {name: (statistics.median(x[0] for x in v), statistics.median(x[1] for x in v)) for name, v in runs.items()}
    print(f"\nmedian of {args.rounds} round(s), 2-core VM shared with other jobs; store: 50 ms, 25 MB/s per connection")
    for name, (rate, first) in med.items():
        print(f"  {name:55s} {rate:8.0f} samples/s  first batch {first:5.2f} s")
    raw_bytes = os.path.getsize(os.path.join(roots["raw"], load_manifest(roots["raw"]).shards_of("tar")[0].path)) / 110
    local, http = med["shardkit local raw"][0], med["shardkit http raw"][0]
    goal = 0.8 * min(local, LINK / raw_bytes)
    print(f"  raw  http / 0.8 x min(local, 8 x 25 MB/s)  = {http:.0f} / {goal:.0f} = {http / goal:.2f}  target >= 1")
    jpeg = med["shardkit http jpeg"][0] / med["shardkit local jpeg"][0]
    print(f"  jpeg http / local                          = {jpeg:.2f}  target >= 0.8")
    print(f"  raw  http first batch                      = {med['shardkit http raw'][1]:.2f} s  target <= 1.5 s")
    for kind in ("raw", "jpeg"):
        print(f"  {kind:4s} http / webdataset http              = "
              f"{med[f'shardkit http {kind}'][0] / med[f'webdataset http {kind}'][0]:.2f}  target >= 3")
        print(f"  {kind:4s} http / fetch_ahead=0 connections=1  = "
              f"{med[f'shardkit http {kind}'][0] / med[f'shardkit http {kind}, fetch_ahead=0 connections=1'][0]:.2f}")
    print(f"  4 ranks x 2 workers, one cache: {samples} samples in {seconds:.1f} s, fetched "
          f"{fetched / sizes['raw']:.3f} x the dataset ({fetched} of {sizes['raw']} bytes)  target <= 1.05")


if __name__ == "__main__":
    main()
