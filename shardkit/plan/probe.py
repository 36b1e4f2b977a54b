"""`shardkit plan`'s probe: what a sample costs on this machine, field by field, and what the store gives.

Per field, a few batches are read in this process with the pipeline's stage spans on
(reader/spans.py): read (with fetch) and decode seconds per sample. Then one worker reads the
whole sample set through make_loader, which prices what the stages leave out (the hand-off, the
DataLoader's queue) and the main process's share; its rate is the unit of the model. A remote
dataset is read twice: the first pass fills a local cache (and times the store), the probes read
the cache, so the CPU costs exclude the network, which the model adds from the store's round
trip and per-connection rate.
"""

from __future__ import annotations

import io
import logging
import os
import time
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

PROBE_S = 20.0  # the probe's budget; each part stops early when it runs out
FIELD_SAMPLES = 256  # samples read per field at most
WORKER_BATCHES = 32  # batches the one-worker probe times at most
PREFETCH = 2  # the one-worker probe's prefetch_factor: batches built ahead, left out of its timing
WORKER_MIN_S = 1.5  # seconds the one-worker probe times at least (within the budget)
EPOCHS_MAX = 20  # epochs it reads at most for that, on a small dataset
REQUALITY = 75  # the JPEG quality the plan prices a re-encode at (ImageNet-style sets store 75-95)


@dataclass
class Probe:
    """What was measured (seconds per sample, bytes, the store's figures)."""

    src: str
    kind: str  # "dataset" (built shards) or "folder" (a raw folder of images)
    samples: int
    cores: int
    fields: dict = field(default_factory=dict)  # field -> {read_s, decode_s, bytes, encoding, shape}
    worker_s: float = 0.0  # per sample, one worker through make_loader (all fields read)
    main_s: float = 0.0  # per sample, the training process's CPU in that read
    bytes_per_sample: float = 0.0
    shard_bytes: float = 0.0
    remote: bool = False
    rtt_s: float = 0.0
    conn_bytes_per_s: float | None = None  # one connection's rate (remote), None local
    connections: int = 8
    copy_bytes_per_s: float = 0.0  # memcpy rate here: prices stored-decoded images
    probe_s: float = 0.0
    gpu_decode: bool = False
    free_cores: float = 0.0  # cores the loader can have now: the cores less what other processes keep busy
    block_samples: int = 0  # samples an epoch reads from shards fetched together: a shuffle block (or a shard)

    def __post_init__(self):
        if not self.free_cores:
            self.free_cores = free_cores(self.cores)

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def free_cores(cores: int, window_s: float = 0.5) -> float:
    """The cores not taken by other processes now (at least 1): the cores less those of this
    process's CPU set busy over `window_s`, from /proc/stat's per-CPU lines. Niced work is counted
    free (it yields to the loader), and so is the past: the 1-minute load average, used where
    /proc/stat is missing, still counts a loader that ended seconds ago, or a test suite run at nice
    19, and a probe after either saw 1 core of 2. A CPU quota of a container (cgroup cpu.max) is not
    read: `cores` is what the process may run on."""
    first = _cpu_times()
    if first is None:
        try:
            load = os.getloadavg()[0]
        except (AttributeError, OSError):  # no load average (Windows): assume the cores are free
            return float(cores)
        return float(max(1.0, min(cores, cores - (load - 1.0))))
    time.sleep(window_s)
    second = _cpu_times()
    busy = 0.0
    for cpu, now in (second or {}).items():  # each CPU's busy share: user system irq softirq steal
        d = [b - a for a, b in zip(first.get(cpu, now), now)]
        total = sum(d[:8])  # user nice system idle iowait irq softirq steal
        busy += (d[0] + d[2] + d[5] + d[6] + d[7]) / total if total > 0 else 0.0
    return float(max(1.0, min(cores, cores - busy)))


def _cpu_times() -> dict | None:
    """{cpu number: its times (user, nice, system, idle, iowait, irq, softirq, steal)} of the CPUs
    this process may run on, from /proc/stat; None without it."""
    try:
        with open("/proc/stat") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    mine = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    out = {}
    for line in lines:
        fields = line.split()
        if len(fields) >= 9 and fields[0].startswith("cpu") and fields[0][3:].isdigit():
            n = int(fields[0][3:])
            if mine is None or n in mine:
                out[n] = [int(x) for x in fields[1:9]]
    return out or None


class _Sink:
    """Collects the spans of batches built in this process (reader.spans' sink)."""

    def __init__(self):
        self.stages: dict = {}
        self.samples = 0

    def batch(self, shipped: dict) -> None:
        self.samples += shipped["args"].get("samples") or 0
        for name, start, end in shipped["stages"]:
            self.stages[name] = self.stages.get(name, 0) + (end - start) / 1e9

    def span(self, name, start, end) -> None:
        pass


def probe_dataset(src: str, fields: list[str] | None, batch: int, cache_dir: str, budget_s: float = PROBE_S) -> Probe:
    """Measure a built dataset (local or remote)."""
    import numpy as np

    from shardkit.store.local import is_url
    from shardkit.identity import usable_cores
    from shardkit.reader.dataset import StreamingDataset

    t0 = time.perf_counter()
    ds = StreamingDataset(src, fields=fields, seed=0, cache_dir=cache_dir)
    specs = {f: ds.manifest.fields[f] for f in ds.fields} if ds.fields else dict(ds.manifest.fields)
    table = ds.shards
    p = Probe(src=src, kind="dataset", samples=len(ds), cores=usable_cores(), remote=is_url(src),
              connections=ds.config.connections, copy_bytes_per_s=_copy_rate(),
              block_samples=ds.config.shuffle_buffer if ds.config.shuffle else -(-len(ds) // max(1, len(table))))
    nbytes = np.asarray(table.nbytes, dtype=np.float64)
    p.shard_bytes = float(nbytes.mean()) if len(nbytes) else 0.0
    p.bytes_per_sample = float(nbytes.sum()) / max(1, len(ds))
    n = min(len(ds), FIELD_SAMPLES)
    if p.remote:  # fill the cache with the shards the probes read, and time the store
        p.rtt_s, p.conn_bytes_per_s = store_rate(src, table)
        _read(StreamingDataset(src, fields=list(specs), seed=0, cache_dir=cache_dir), batch, n)
    for name, spec in specs.items():
        left = budget_s * 0.5 / len(specs)  # half the budget for the fields, the rest for the worker
        sink = _stage_costs(StreamingDataset(src, fields=[name], seed=0, cache_dir=cache_dir), batch, n, left)
        per = max(1, sink.samples)
        p.fields[name] = {"read_s": (sink.stages.get("read", 0) + sink.stages.get("fetch", 0)) / per,
                          "decode_s": sink.stages.get("decode", 0) / per, "kind": spec.get("kind"),
                          "encoding": spec.get("encoding"), "shape": spec.get("shape")}
        if spec.get("kind") == "image" and spec.get("encoding") == "jpeg":
            p.fields[name]["requality"] = _requality(StreamingDataset(src, fields=[name], seed=0, cache_dir=cache_dir),
                                                     name, p.bytes_per_sample)
    p.worker_s, p.main_s = _one_worker(StreamingDataset(src, fields=list(specs), seed=0, cache_dir=cache_dir), batch,
                                       max(0.5, budget_s - (time.perf_counter() - t0)))
    p.gpu_decode = _gpu_decode_available()
    p.probe_s = time.perf_counter() - t0
    return p


def _requality(ds, name: str, stored_bytes: float, budget_s: float = 3.0) -> dict | None:
    """What re-encoding a JPEG field at quality REQUALITY would change: {"from": the stored quality,
    "decode": decode time at REQUALITY / as stored, "bytes": size ratio}, on up to 16 of the dataset's
    images. The stored blobs are read from a local shard where they can be (their quality is the
    one whose re-encode carries the same quantization tables, else the one closest in size); else
    they are re-encoded at the quality whose size comes closest to `stored_bytes`, the dataset's
    bytes per sample. None where the stored quality is not above REQUALITY, or the images cannot be
    had within `budget_s`."""
    from PIL import Image

    end = time.perf_counter() + budget_s
    try:
        stored, images = _probe_images(ds, name)
        by_q = {}
        for q in (98, 95, 90, 85, 80, REQUALITY):
            if time.perf_counter() > end:
                return None
            by_q[q] = _encoded(images, q)
        tables = Image.open(io.BytesIO(stored[0])).quantization if stored else None
        quality = next((q for q in by_q if Image.open(io.BytesIO(by_q[q][0])).quantization == tables), None)
        if quality is None:  # no local shard, or stored at a quality not tried: the nearest in size
            per_image = sum(map(len, stored)) / len(stored) if stored else stored_bytes
            quality = min(by_q, key=lambda q: abs(sum(map(len, by_q[q])) / len(images) - per_image))
        stored = stored or by_q[quality]
        if quality <= REQUALITY:
            return None
        _decode_s(stored)  # warm
        ratio = _decode_s(by_q[REQUALITY]) / max(1e-9, _decode_s(stored))
        return {"quality": REQUALITY, "from": quality, "decode": min(1.0, ratio),
                "bytes": sum(map(len, by_q[REQUALITY])) / sum(map(len, stored))}
    except Exception:  # noqa: BLE001 — a change the plan cannot price is left out, never the plan
        log.debug("pricing a JPEG quality of %s for %s failed", REQUALITY, name, exc_info=True)
        return None


def _probe_images(ds, name: str) -> tuple[list[bytes] | None, list]:
    """(the stored blobs or None, PIL images of them): from a local shard, else a decoded batch."""
    import numpy as np
    from PIL import Image

    from shardkit.loader import make_loader

    stored = _stored_blobs(ds, name)
    if stored:
        return stored, [Image.open(io.BytesIO(b)).convert("RGB") for b in stored]
    arrays = np.asarray(next(iter(make_loader(ds, batch_size=16, num_workers=0)))[name])[:16]
    if arrays.ndim == 4 and arrays.shape[1] in (1, 3) and arrays.shape[-1] not in (1, 3):
        arrays = arrays.transpose(0, 2, 3, 1)  # the loader's CHW
    return None, [Image.fromarray(np.ascontiguousarray(a.squeeze(-1) if a.shape[-1] == 1 else a)) for a in arrays]


def _stored_blobs(ds, name: str, n: int = 16) -> list[bytes] | None:
    """Up to n stored values of field `name` from the dataset's first shard when it is a local file."""
    from shardkit.store.local import is_url, join, local_path

    root = str(ds.src)
    if not len(ds.shards) or is_url(root):
        return None
    shard = ds.shards[0]
    path = join(local_path(root), shard.path)
    if shard.format == "parquet":
        import pyarrow.parquet as pq

        return [bytes(v) for v in pq.read_table(path, columns=[name]).column(0).to_pylist()[:n] if v]
    import tarfile

    out = []
    with tarfile.open(path) as tf:
        for member in tf:
            if member.isfile() and member.name.endswith("." + name):
                out.append(tf.extractfile(member).read())
                if len(out) >= n:
                    break
    return out


def _encoded(images, quality: int) -> list[bytes]:
    out = []
    for im in images:
        buf = io.BytesIO()
        im.save(buf, "JPEG", quality=quality)
        out.append(buf.getvalue())
    return out


def _decode_s(blobs) -> float:
    from shardkit.reader.decode import decode_image

    t0 = time.perf_counter()
    for _ in range(3):
        for b in blobs:
            decode_image(b)
    return time.perf_counter() - t0


def _read(ds, batch: int, n: int) -> None:
    from shardkit.loader import make_loader

    seen = 0
    for b in make_loader(ds, batch_size=batch, num_workers=0):
        seen += len(b["__key__"])
        if seen >= n:
            break


def _stage_costs(ds, batch: int, n: int, budget_s: float) -> _Sink:
    from shardkit.loader import make_loader
    from shardkit.reader import spans

    sink = _Sink()
    was_on = spans.ON
    spans.enable(sink)
    try:
        end = time.perf_counter() + budget_s
        loader = make_loader(ds, batch_size=batch, num_workers=0)
        for _ in loader:
            if sink.samples >= n or time.perf_counter() > end:
                break
    finally:
        spans.disable()
        if was_on:  # a meter traces this process: leave its spans on (without a sink for ours)
            spans.ON = True
    return sink


def _one_worker(ds, batch: int, budget_s: float) -> tuple[float, float]:
    """(seconds per sample with one worker, the main process's CPU seconds per sample), the
    worker's start and the batches it prefetched meanwhile left out. At least WORKER_BATCHES
    batches and WORKER_MIN_S seconds are timed, over more than one epoch where the dataset is small:
    32 batches of raw 224^2 images take ~0.1 s, and a probe that short read 8,000-19,000 samples/s
    in three runs on one dataset."""
    from shardkit.loader import make_loader

    loader = make_loader(ds, batch_size=batch, num_workers=1, prefetch_factor=PREFETCH)
    try:
        it = iter(loader)
        next(it, None)  # the worker's start
        # The next PREFETCH batches were built meanwhile: timed from after them, the rate is the
        # worker's steady one, not its queue's (a dataset too small for that is timed whole).
        marks = [(time.perf_counter(), time.process_time(), 0)]
        seen = got = 0
        end = marks[0][0] + budget_s
        for _ in range(EPOCHS_MAX):
            for b in it:
                seen, got = seen + len(b["__key__"]), got + 1
                if got == PREFETCH:
                    marks.append((time.perf_counter(), time.process_time(), seen))
                now = time.perf_counter()
                if (got >= PREFETCH + WORKER_BATCHES and now - marks[-1][0] >= WORKER_MIN_S) or now > end:
                    break
            else:  # the epoch ended first: another one, within the budget
                if time.perf_counter() > end:
                    break
                it = iter(loader)
                continue
            break
        t0, c0, skipped = marks[-1] if seen > marks[-1][2] else marks[0]
        wall, cpu, seen = time.perf_counter() - t0, time.process_time() - c0, seen - skipped
    finally:
        loader.close()
    return (wall / seen, cpu / seen) if seen else (0.0, 0.0)


def store_rate(src: str, table) -> tuple[float, float]:
    """(round trip s, one connection's bytes/s) of the store: a 1-byte range read, then a whole shard,
    each through the client the reader's own reads of that store take (store.remote: http(s) on
    shardkit's connections, s3://, az://, ... through fsspec's backend)."""
    from shardkit.store.local import join
    from shardkit.store.remote import RangeIgnored, read_bytes, read_range

    url = join(src, table[0].path)
    try:
        read_range(url, 0, 1)  # the connection made and the client built, outside the timing
        t0 = time.perf_counter()
        read_range(url, 1, 2)
    except RangeIgnored:  # a server that sends whole files (the reader reads whole shards there): the
        read_bytes(join(src, "manifest.json"))  # round trip of its smallest file, the dataset's manifest
        t0 = time.perf_counter()
        read_bytes(join(src, "manifest.json"))
    rtt = time.perf_counter() - t0
    t0 = time.perf_counter()
    got = len(read_bytes(url))
    took = time.perf_counter() - t0
    return rtt, got / max(1e-6, took - rtt)


def _copy_rate() -> float:
    import numpy as np

    a, b = np.ones(8 << 20, np.uint8), np.empty(8 << 20, np.uint8)
    t0 = time.perf_counter()
    for _ in range(8):
        np.copyto(b, a)
    return 8 * a.nbytes / (time.perf_counter() - t0)


def _gpu_decode_available() -> bool:
    import sys

    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available():
        return False
    try:
        import torchvision.io  # noqa: F401
    except ImportError:
        return False
    return True


IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".webp", ".bmp")


def probe_folder(src: str, image_size: int | None, budget_s: float = PROBE_S) -> Probe:
    """Measure a raw folder: open + decode (+ resize to image_size) per image, in this process."""
    from PIL import Image

    from shardkit.identity import usable_cores

    t0 = time.perf_counter()
    paths = sorted(os.path.join(d, f) for d, _, fs in os.walk(src) for f in fs if f.lower().endswith(IMAGE_SUFFIXES))
    p = Probe(src=src, kind="folder", samples=len(paths), cores=usable_cores(), copy_bytes_per_s=_copy_rate())
    if not paths:
        return p
    read = dec = 0.0
    done, size = 0, 0
    end = t0 + budget_s * 0.5
    for path in paths[:FIELD_SAMPLES]:
        a = time.perf_counter()
        with open(path, "rb") as f:
            data = f.read()
        b = time.perf_counter()
        im = Image.open(__import__("io").BytesIO(data)).convert("RGB")
        if image_size:
            im = im.resize((image_size, image_size))
        im.tobytes()
        c = time.perf_counter()
        read, dec, done, size = read + b - a, dec + c - b, done + 1, size + len(data)
        if c > end:
            break
    p.fields["image"] = {"read_s": read / done, "decode_s": dec / done, "kind": "image", "encoding": "files",
                         "shape": [image_size, image_size, 3] if image_size else None}
    p.bytes_per_sample = size / done
    p.worker_s = (read + dec) / done * 1.05  # a map-style Dataset's per-sample collate and queue, ~5%
    p.probe_s = time.perf_counter() - t0
    return p
