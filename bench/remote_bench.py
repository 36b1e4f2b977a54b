"""Remote streaming benchmark: shardkit over a throttled object store on 127.0.0.1 against its local
rate and WebDataset over the same store, in one run, interleaved.

    .venv/bin/python bench/remote_bench.py                     # 2,000 raw + 12,000 JPEG, 2 rounds
    .venv/bin/python bench/remote_bench.py --rounds 1 --sizes 16MB
    .venv/bin/python bench/remote_bench.py --profile           # where the remote path's CPU goes
    .venv/bin/python bench/remote_bench.py --first-batch 4 --code . --code ../main   # fresh processes
    .venv/bin/python bench/remote_bench.py --baseline 28987ad --rounds 5 --sizes 16MB --n-jpeg 6000  # A/B, raw+JPEG http

The store (tests/throttled.py) serves the datasets with 50 ms before each answer, 25 MB/s per
connection, Range requests, no cap on connections. Data: photo-like 224^2 images (shardkit.demo.datagen's
generator, as bench/loader_bench.py uses), as raw uint8 (--n-raw, 2,000) and JPEG q90 (--n-jpeg, 12,000), in tar
shards cut as `shardkit build` cuts them: the default --shard-size (256 MB, at most 10,000 samples)
and 16 MB. Each run is one shuffled epoch from a fresh cache, make_loader(batch_size=64,
num_workers=2) (WebDataset: its own loader with 2 workers, shuffle(1000)), a fresh loader each
time. Per run: samples/s, seconds to the first batch, and the CPU seconds per 1,000 samples of
the DataLoader workers (the store runs in this process, so it is not counted). Prints the median
of the rounds, the ratios the targets name, and the bytes 4 ranks sharing one cache fetched.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.join(HERE, "..", "tests")]  # loader_bench's images, the throttled store

BATCH, WORKERS = 64, 2
LINK = 8 * 25e6  # the raw target's link: 8 connections x 25 MB/s
SIZES = {"default": (256_000_000, 10_000), "16MB": (16_000_000, 10_000)}


def children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def epoch(loader) -> tuple[float, float, int, float]:
    """(samples/s, seconds to the first batch, samples, workers' CPU seconds) of one epoch."""
    cpu, t0 = children_cpu(), time.perf_counter()
    n, first = 0, None
    for batch in loader:
        n += len(batch["__key__"]) if isinstance(batch, dict) else len(batch[0])
        if first is None:
            first = time.perf_counter() - t0
    rate = n / (time.perf_counter() - t0)
    del loader  # its workers exit and are waited for: their CPU is counted
    return rate, first, n, children_cpu() - cpu


def shardkit_loader(src: str, cache: str | None, workers: int = WORKERS, **options):
    from shardkit.loader import make_loader
    from shardkit.reader.dataset import StreamingDataset

    if cache is not None:
        shutil.rmtree(cache, ignore_errors=True)  # a fresh cache every run
        options["cache_dir"] = cache
    ds = StreamingDataset(src, format="tar", seed=0, **options)
    return ds, make_loader(ds, batch_size=BATCH, num_workers=workers)


def wds_loader(url: str, root: str, field: str):
    """WebDataset 1.0.2 over http (curl per shard), shuffled shards + shuffle(1000), batched."""
    import torch
    import webdataset as wds
    from loader_bench import _wds_jpeg, _wds_raw

    shards = sorted(f for f in os.listdir(os.path.join(root, "shards")) if f.endswith(".tar"))
    urls = [f"{url}/shards/{f}" for f in shards]
    fn = _wds_raw if field == "raw" else _wds_jpeg
    ds = (wds.WebDataset(urls, shardshuffle=len(urls), empty_check=False, nodesplitter=None,
                         workersplitter=wds.split_by_worker)
          .shuffle(1000).map(fn).batched(BATCH))
    return torch.utils.data.DataLoader(ds, batch_size=None, num_workers=min(WORKERS, len(urls)))


def _image(args) -> tuple[bytes, bytes | None]:
    """Image i at 224^2 from loader_bench's photo-like generator: (JPEG q90, raw uint8 or None)."""
    import numpy as np

    from shardkit.demo.datagen import _jpeg, photo_like

    i, raw = args
    im = photo_like(np.random.default_rng([0, i]), 224, 224)
    return _jpeg(im, 90), np.asarray(im).tobytes() if raw else None


def prepare(work: str, n_raw: int, n_jpeg: int, sizes) -> dict:
    """{(kind, size): dataset root}: photo-like 224^2 images (made once, kept in `work`), cut into
    tar shards by bytes and count as `shardkit build` cuts them (--shard-size, 10,000 samples)."""
    from multiprocessing import Pool

    from shardkit.manifest import Manifest, write_manifest
    from shardkit.sample import Sample
    from shardkit.writers import get_writer

    roots = {(kind, size): os.path.join(work, f"{kind}-{n}-{size}") for kind, n in (("raw", n_raw), ("jpeg", n_jpeg))
             for size in sizes if n > 0}
    if all(os.path.exists(os.path.join(r, "manifest.json")) for r in roots.values()):
        return roots
    with Pool(2) as pool:
        images = pool.map(_image, [(i, i < n_raw) for i in range(max(n_raw, n_jpeg))], chunksize=64)
    keys = [f"class_{i % 10:02d}/{i:06d}" for i in range(len(images))]
    for (kind, size), root in roots.items():
        name, col, count = ("jpg", 0, n_jpeg) if kind == "jpeg" else ("raw", 1, n_raw)
        spec = {"kind": "image", "encoding": "jpeg"} if kind == "jpeg" else \
            {"kind": "image", "encoding": "raw", "dtype": "uint8", "shape": [224, 224, 3]}
        fields = {name: spec, "cls": {"kind": "int", "dtype": "int64"}}
        limit, most = SIZES[size]
        order = sorted(range(count), key=lambda i: keys[i])
        infos, shard, held = [], [], 0
        for i in order:
            value = images[i][col]
            if shard and (held + len(value) > limit or len(shard) >= most):
                infos.append(get_writer("tar")(shard, root, len(infos), fields))
                shard, held = [], 0
            shard.append(Sample(keys[i], {name: value, "cls": i % 10}))
            held += len(value)
        infos.append(get_writer("tar")(shard, root, len(infos), fields))
        write_manifest(root, Manifest(samples=count, fields=fields, shards=infos,
                                      classes=[f"class_{c:02d}" for c in range(10)]))
    return roots


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


def run_rounds(roots: dict, store, cache: str, rounds: int) -> dict:
    """name -> [(samples/s, first batch s, CPU ms per sample of the workers), ...] over the rounds."""
    runs: dict[str, list] = {}
    for r in range(rounds):
        for (kind, size), root in roots.items():
            url = f"{store.url}/{os.path.basename(root)}"
            field = "jpg" if kind == "jpeg" else "raw"
            variants = {"local": lambda: shardkit_loader(root, None)[1],
                        "http": lambda: shardkit_loader(url, cache)[1],
                        "webdataset": lambda: wds_loader(url, root, field)}
            order = list(variants) if r % 2 == 0 else list(reversed(variants))  # rotate: no variant always first
            for variant in order:
                rate, first, n, cpu = epoch(variants[variant]())
                name = f"{kind} {size} {variant}"
                runs.setdefault(name, []).append((rate, first, 1000 * cpu / n))
                print(f"round {r}: {name:28s} {rate:7.0f} samples/s  first batch {first:5.2f} s  "
                      f"workers' CPU {1000 * cpu / n:5.2f} ms/sample  ({n} samples)", flush=True)
    return runs


def report(runs: dict, roots: dict, rounds: int) -> None:
    from shardkit.manifest import load_manifest

    med = {name: tuple(statistics.median(x[i] for x in v) for i in range(3)) for name, v in runs.items()}
    print(f"\nmedian of {rounds} round(s); store: 50 ms to the first byte, 25 MB/s per connection")
    for name, (rate, first, cpu) in med.items():
        print(f"  {name:28s} {rate:7.0f} samples/s  first batch {first:5.2f} s  workers' CPU {cpu:5.2f} ms/sample")
    for kind, size in roots:
        pre = f"{kind} {size}"
        local, http, wds = med[f"{pre} local"], med[f"{pre} http"], med[f"{pre} webdataset"]
        print(f"  {pre:12s} first batch: http - local = {http[1] - local[1]:+.2f} s (target <= +0.15), "
              f"http / webdataset = {http[1] / wds[1]:.2f} (target <= 1)")
        print(f"  {pre:12s} CPU per sample: http / local = {http[2] / local[2]:.2f}")
        if kind == "jpeg":
            print(f"  {pre:12s} rate: http / local = {http[0] / local[0]:.2f} (target >= 0.9), "
                  f"http / webdataset = {http[0] / wds[0]:.2f} (target >= 2)")
        else:
            root = roots[(kind, size)]
            m = load_manifest(root)
            per = sum(s.bytes for s in m.shards) / m.samples
            goal = 0.8 * min(local[0], LINK / per)
            print(f"  {pre:12s} rate: http / 0.8 x min(local, 8 x 25 MB/s) = {http[0]:.0f} / {goal:.0f} = "
                  f"{http[0] / goal:.2f} (target >= 1), http / webdataset = {http[0] / wds[0]:.2f} (target >= 3)")


def profile(roots: dict, store: str, cache: str) -> None:
    """Where the remote path's CPU goes: per dataset, one epoch read locally and one over http in
    this process (num_workers=0, the store in a subprocess): the CPU per sample of each thread of
    the process by role (its own clock, sampled every 20 ms, so threads that end are counted too),
    io_stats(), and the reading thread's cProfile over http."""
    import cProfile
    import pstats
    import threading

    for (kind, size), root in roots.items():
        for where, src, c in (("local", root, None), ("http", f"{store}/{os.path.basename(root)}", cache)):
            ds, loader = shardkit_loader(src, c, workers=0)
            clocks, stop = _thread_clocks(), threading.Event()
            watch = threading.Thread(target=lambda: [clocks.update(_thread_clocks()) for _ in iter(lambda: stop.wait(0.02), True)])
            before, prof = _thread_clocks(), cProfile.Profile()
            watch.start()
            prof.enable()
            n = sum(len(b["__key__"]) for b in loader)
            prof.disable()
            stop.set()
            watch.join()
            roles: dict[str, float] = {}
            for (name, ident), cpu in clocks.items():
                role = name.split("_")[0].rstrip("0123456789-")
                if not role.startswith("Thread"):  # the watcher
                    roles[role] = roles.get(role, 0.0) + cpu - before.get((name, ident), 0.0)
            print(f"{kind} {size} {where}: {1000 * sum(roles.values()) / n:.3f} ms of CPU per sample; by thread: "
                  + ", ".join(f"{k} {1000 * v / n:.3f}" for k, v in sorted(roles.items(), key=lambda x: -x[1])
                              if v > 0.00001 * n) + (f"; {ds.io_stats()}" if c else ""))
        pstats.Stats(prof).sort_stats("tottime").print_stats(12)


def _thread_clocks() -> dict:
    """{(thread name, ident): CPU seconds} of this process's live threads (one clock per thread)."""
    import threading

    out = {}
    for t in threading.enumerate():
        try:
            out[(t.name, t.ident)] = time.clock_gettime(time.pthread_getcpuclockid(t.ident))
        except (OSError, AttributeError, TypeError):  # ended meanwhile
            pass
    return out


FIRST = """
import json, os, sys, time
sys.path[:0] = [%r, %r]
import remote_bench
kind, root, url, cache = sys.argv[1:5]
field = "jpg" if kind == "jpeg" else "raw"
out = {}
for name, make in (("local", lambda: remote_bench.shardkit_loader(root, None)[1]),
                   ("http", lambda: remote_bench.shardkit_loader(url, cache)[1]),
                   ("webdataset", lambda: remote_bench.wds_loader(url, root, field))):
    loader = make()
    t0 = time.perf_counter()
    it = iter(loader)
    next(it)
    out[name] = time.perf_counter() - t0
    del it, loader
print(json.dumps(out))
""" % (HERE, os.path.join(HERE, "..", "tests"))


def first_batches(roots: dict, store, cache: str, rounds: int, codes: list[str]) -> None:
    """Seconds to the first batch, each run in a fresh process (imports, worker start and first
    connections included, as a new training run pays them), local, http and WebDataset in turn,
    for each shardkit checkout in `codes` (PYTHONPATH), interleaved; medians of http - local."""
    results: dict = {}
    for r in range(rounds):
        for (kind, size), root in roots.items():
            for code in (codes if r % 2 == 0 else codes[::-1]):
                url = f"{store.url}/{os.path.basename(root)}"
                env = dict(os.environ, PYTHONPATH=code)  # cwd: sys.path's '' is not another checkout
                got = subprocess.run([sys.executable, "-c", FIRST, kind, root, url, cache], env=env, cwd=code,
                                     check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1]
                results.setdefault((kind, size, code), []).append(json.loads(got))
    for (kind, size, code), runs in results.items():
        med = {k: statistics.median(x[k] for x in runs) for k in runs[0]}
        gaps = [x["http"] - x["local"] for x in runs]
        print(f"{kind} {size} ({code}): first batch local {med['local']:.2f} s, http {med['http']:.2f} s, "
              f"webdataset {med['webdataset']:.2f} s; http - local median {statistics.median(gaps):+.2f} s "
              f"({', '.join(f'{g:+.2f}' for g in gaps)})")


EPOCH = """
import json, sys, time
sys.path[:0] = [%r, %r]
import remote_bench
src, cache = sys.argv[1:3]
ds, loader = remote_bench.shardkit_loader(src, cache if cache != "-" else None)
rate, first, n, cpu = remote_bench.epoch(loader)
print(json.dumps([rate, first, n, cpu, ds.io_stats().get("network_wait_s", 0.0)]))
""" % (HERE, os.path.join(HERE, "..", "tests"))


def trusted_bundle(cert: str, work: str) -> str:
    """A CA bundle of the system's roots and the store's certificate (what SSL_CERT_FILE names for
    the clients): a client loads as many roots as it would against a real store."""
    import ssl

    path = os.path.join(work, "tls", "trusted.pem")
    with open(ssl.get_default_verify_paths().cafile or os.devnull, "rb") as system, open(cert, "rb") as own:
        data = system.read() + b"\n" + own.read()
    with open(path, "wb") as f:
        f.write(data)
    return path


def checkout(rev: str, work: str) -> str:
    """The shardkit package of this repository at `rev`, exported once under `work` (git archive: no
    worktree registered): the folder to put on PYTHONPATH."""
    repo = os.path.join(HERE, "..")
    sha = subprocess.run(["git", "-C", repo, "rev-parse", "--verify", f"{rev}^{{commit}}"], check=True,
                         capture_output=True, text=True).stdout.strip()
    path = os.path.join(work, f"code-{sha[:12]}")
    if not os.path.isdir(path):
        tmp = path + ".tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
        tar = subprocess.run(["git", "-C", repo, "archive", sha, "shardkit"], check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", tmp], input=tar, check=True)
        os.rename(tmp, path)  # whole or not at all
    return path


def in_flight(spans) -> float:
    """Mean GETs of whole-shard parts (1 MiB or more) in flight while any was: what the store saw of
    how the fetches overlap (2 workers x 8 connections: up to 16)."""
    parts = [(s, e) for s, e, _, n in spans if n >= 1 << 20]
    if not parts:
        return 0.0
    events, busy, held, last = sorted([(s, 1) for s, _ in parts] + [(e, -1) for _, e in parts]), 0.0, 0, 0.0
    for t, step in events:
        busy += (t - last) if held else 0.0
        held, last = held + step, t
    return sum(e - s for s, e in parts) / busy


def baseline_rounds(roots: dict, store, cache: str, rounds: int, codes: dict) -> None:
    """Raw and JPEG datasets: one epoch per run in a fresh process (imports done before the clock
    starts), local with this checkout and http with each of `codes` ({name: checkout}), interleaved
    and rotated each round; medians and the ratios of each code's http rate to the first's, and the
    parts in flight the store saw (less noisy than rates on a loaded machine). Per epoch also the CPU
    per sample of the reader (the epoch's process and its workers) and of the store (this process's
    threads, which do nothing else meanwhile): on a machine of its own the store's would not be taken
    from the reader's cores, so local's reader CPU over http's is the rate this reader could reach.
    And the rate after the first batch (`steady`): a 6,000-sample epoch lasts ~1.5 s, of which the
    first batch's wait is a large share; a run of 1e8 samples goes at the steady rate."""
    def reader_cpu() -> float:
        used = resource.getrusage(resource.RUSAGE_CHILDREN)
        return used.ru_utime + used.ru_stime

    runs: dict = {}
    for r in range(rounds):
        for (kind, size), root in roots.items():
            url = f"{store.url}/{os.path.basename(root)}"
            https = [(f"http {name}", code, url, cache) for name, code in codes.items()]
            https = https[r % len(https):] + https[:r % len(https)]  # each code first among them in turn
            variants = [("local", codes[next(iter(codes))], root, "-")] + https
            k = r % len(variants)
            for name, code, src, c in variants[k:] + variants[:k]:  # rotate: no variant always first
                seen, cpu0, store0 = len(store.spans), reader_cpu(), time.process_time()
                got = subprocess.run([sys.executable, "-c", EPOCH, src, c], env=dict(os.environ, PYTHONPATH=code),
                                     cwd=code, check=True, capture_output=True, text=True).stdout.split("\n")[-2]
                rate, first, n, cpu, wait = json.loads(got)
                waited = wait / (WORKERS * n / rate)  # of the workers' time in the epoch
                reader, served = 1000 * (reader_cpu() - cpu0) / n, 1000 * (time.process_time() - store0) / n
                steady = (n - BATCH) / (n / rate - first)
                parts = in_flight(store.spans[seen:])
                runs.setdefault((kind, size, name), []).append((rate, first, parts, reader, served, steady, waited))
                print(f"round {r}: {kind:4s} {size:7s} {name:24s} {rate:7.0f} samples/s  first batch {first:5.2f} s  "
                      f"steady {steady:7.0f}/s  parts in flight {parts:4.1f}  CPU ms/sample reader {reader:.3f} "
                      f"store {served:.3f}  workers waiting {100 * waited:.0f}%  ({n} samples)", flush=True)
    from shardkit.manifest import load_manifest

    print(f"\nmedian of {rounds} round(s); store: 50 ms to the first byte, 25 MB/s per connection")
    for (kind, size), root in roots.items():
        m = load_manifest(root)
        per = sum(s.bytes for s in m.shards) / m.samples
        med = {name: tuple(statistics.median(x[i] for x in v) for i in range(7))
               for (k, z, name), v in runs.items() if (k, z) == (kind, size)}
        # raw: the link is the bound; JPEG: the link carries far more than the reader, so local is
        goal = 0.8 * min(med["local"][0], LINK / per) if kind == "raw" else 0.9 * med["local"][0]
        base = med[f"http {next(iter(codes))}"]
        for name, (rate, first, parts, reader, served, steady, waited) in med.items():
            print(f"  {kind:4s} {size:7s} {name:24s} {rate:7.0f} samples/s  first batch {first:5.2f} s  "
                  f"parts in flight {parts:4.1f}  / goal {rate / goal:.2f}  / {next(iter(codes))} {rate / base[0]:.2f}  "
                  f"steady {steady:.0f}/s (/ local's {steady / med['local'][5]:.2f})  "
                  f"CPU ms/sample reader {reader:.3f} (local's / this {med['local'][3] / reader:.2f}) store {served:.3f}  "
                  f"workers waiting for the store {100 * waited:.0f}% of their time")
        print(f"  {kind:4s} {size:7s} goal: " + ("0.8 x min(local, 8 x 25 MB/s)" if kind == "raw" else "0.9 x local")
              + f" = {goal:.0f} samples/s, first batch <= 1.5 s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n-raw", type=int, default=2000)
    ap.add_argument("--n-jpeg", type=int, default=12000)
    ap.add_argument("--sizes", default="default,16MB", help="shard sizes to build: default and/or 16MB")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--four-ranks", action="store_true", help="also 4 ranks x 2 workers sharing one cache (raw)")
    ap.add_argument("--profile", action="store_true", help="where the remote path's CPU goes, instead of the runs")
    ap.add_argument("--first-batch", type=int, default=0, metavar="ROUNDS",
                    help="instead of the runs: seconds to the first batch in fresh processes, ROUNDS rounds")
    ap.add_argument("--code", action="append", default=None,
                    help="with --first-batch: a shardkit checkout to measure (repeat to compare; default: this one)")
    ap.add_argument("--baseline", action="append", default=None, metavar="REV",
                    help="instead of the runs: raw http epochs of this checkout and of REV (its shardkit package "
                         "exported under --work), each in a fresh process, interleaved (repeatable)")
    ap.add_argument("--tls", action="store_true",
                    help="the store over https (a certificate of its own, trusted beside the system's roots)")
    ap.add_argument("--work", default=os.path.join(tempfile.gettempdir(), "shardkit-remote-bench2"))
    args = ap.parse_args()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from throttled import Store

    roots = prepare(args.work, args.n_raw, args.n_jpeg, args.sizes.split(","))
    cache = os.path.join(args.work, "cache")
    if args.profile:
        server = subprocess.Popen([sys.executable, "-c", SERVE, args.work], stdout=subprocess.PIPE, text=True)
        try:
            profile(roots, server.stdout.readline().strip(), cache)
        finally:
            server.kill()
            server.wait()
        return
    store = Store(args.work, latency=0.05, rate=25e6, tls=os.path.join(args.work, "tls") if args.tls else None)
    if args.tls:  # trusted as a user's client trusts a store: the system's roots, and this one
        os.environ["SSL_CERT_FILE"] = os.environ["CURL_CA_BUNDLE"] = trusted_bundle(store.cert, args.work)  # curl: WebDataset's
    if args.baseline:
        codes = {"current": os.path.abspath(os.path.join(HERE, ".."))}
        codes.update({rev: checkout(rev, args.work) for rev in args.baseline})
        try:
            baseline_rounds(roots, store, cache, args.rounds, codes)
        finally:
            store.close()
        return
    if args.first_batch:
        try:
            first_batches(roots, store, cache, args.first_batch, args.code or [os.path.join(HERE, "..")])
        finally:
            store.close()
        return
    try:
        runs = run_rounds(roots, store, cache, args.rounds)
        ranks = four_ranks(f"{store.url}/{os.path.basename(roots[('raw', args.sizes.split(',')[-1])])}", cache) \
            if args.four_ranks else None
    finally:
        store.close()
    report(runs, roots, args.rounds)
    if ranks is not None:
        from shardkit.manifest import load_manifest

        seconds, samples, fetched = ranks
        m = load_manifest(roots[("raw", args.sizes.split(",")[-1])])
        size = sum(s.bytes + s.index["bytes"] for s in m.shards)
        print(f"  4 ranks x 2 workers, one cache: {samples} samples in {seconds:.1f} s, fetched "
              f"{fetched / size:.3f} x the dataset ({fetched} of {size} bytes)  target <= 1.05")


SERVE = """
import sys, time
sys.path.insert(0, %r)
from throttled import Store
s = Store(sys.argv[1], latency=0.05, rate=25e6)
print(s.url, flush=True)
time.sleep(3600)
""" % os.path.join(HERE, "..", "tests")


if __name__ == "__main__":
    main()
