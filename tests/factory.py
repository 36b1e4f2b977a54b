"""Small shardkit datasets for tests, written with the real writers + manifest into tmp_path."""

from __future__ import annotations

import io

import numpy as np

from shardkit.manifest import Manifest, write_manifest
from shardkit.sample import Sample
from shardkit.writers import get_writer

SPECS = {
    "jpg": {"kind": "image", "encoding": "jpeg"},
    "cls": {"kind": "int", "dtype": "int64"},
    "txt": {"kind": "text"},
    "json": {"kind": "json"},
}


def raw_spec(h: int, w: int) -> dict:
    return {"kind": "image", "encoding": "raw", "dtype": "uint8", "shape": [h, w, 3]}


def jpeg_bytes(arr: np.ndarray, quality: int = 90) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format="JPEG", quality=quality)
    return buf.getvalue()


def make_samples(n: int, *, fields=("jpg", "raw", "cls", "txt"), size=(12, 16), classes: int = 3,
                 text_only_every: int = 0, seed: int = 0) -> list[Sample]:
    """n samples sorted by key; every `text_only_every`-th one holds only txt (a mixed folder)."""
    rng = np.random.default_rng(seed)
    h, w = size
    samples = []
    for i in range(n):
        c = i % classes
        sample = Sample(f"class{c}/s{i:05d}")
        text_only = text_only_every and i % text_only_every == 0
        arr = (rng.integers(0, 256, (1, 1, 3)) + np.zeros((h, w, 3))).astype(np.uint8)
        arr[: h // 2] = 255 - arr[: h // 2]  # two flat halves: JPEG keeps them close to exact
        if "jpg" in fields and not text_only:
            sample.fields["jpg"] = jpeg_bytes(arr)
        if "raw" in fields and not text_only:
            sample.fields["raw"] = arr.tobytes()
        if "cls" in fields and not text_only:
            sample.fields["cls"] = c
        if "txt" in fields:
            sample.fields["txt"] = f"sample {i} ünïcode"
        if "json" in fields:
            sample.fields["json"] = {"i": i, "tags": ["a", str(c)]}
        samples.append(sample)
    return sorted(samples, key=lambda s: s.key)


def split(n: int, shards: int) -> list[int]:
    """Sizes of `shards` contiguous shards over n samples, deliberately uneven."""
    cuts = np.linspace(0, n, shards + 1).round().astype(int)
    if shards > 2:
        cuts[1] = max(1, cuts[1] - 1)  # one short shard, so counts are not all equal
    return np.diff(cuts).tolist()


def write_dataset(root, samples: list[Sample], *, shards: int = 4, fmt: str = "tar",
                  size=(12, 16), classes: int = 3) -> Manifest:
    """Write `samples` into `shards` shards of format tar, parquet or both, then the manifest."""
    root = str(root)
    names = sorted({f for s in samples for f in s.fields})
    fields = {f: (raw_spec(*size) if f == "raw" else SPECS[f]) for f in names}
    formats = ["tar", "parquet"] if fmt == "both" else [fmt]
    infos, start = [], 0
    for shard_id, count in enumerate(split(len(samples), shards)):
        chunk = samples[start:start + count]
        start += count
        for f in formats:
            infos.append(get_writer(f)(chunk, root, shard_id, fields))
    manifest = Manifest(samples=len(samples), fields=fields, shards=infos,
                        classes=[f"class{c}" for c in range(classes)] if "cls" in fields else None)
    write_manifest(root, manifest)
    return manifest


def make_dataset(root, n: int = 40, *, shards: int = 4, fmt: str = "tar", fields=("jpg", "raw", "cls", "txt"),
                 size=(12, 16), text_only_every: int = 0) -> tuple[str, dict[str, Sample]]:
    """Write a dataset; returns (root, {key: Sample}) with the values that were written."""
    samples = make_samples(n, fields=fields, size=size, text_only_every=text_only_every)
    write_dataset(root, samples, shards=shards, fmt=fmt, size=size)
    return str(root), {s.key: s for s in samples}


def keys_of(batches) -> list[str]:
    return [k for b in batches for k in b["__key__"]]


def read_epoch(src, cache_dir, *, workers=0, shuffle_buffer=16, **options):
    """(StreamingDataset, its batches of 5 for one epoch) of a local or remote dataset, seed 7: the
    read the remote tests compare (each module binds its defaults with functools.partial)."""
    from shardkit.loader import make_loader
    from shardkit.reader.dataset import StreamingDataset

    ds = StreamingDataset(src, cache_dir=str(cache_dir), seed=7, shuffle_buffer=shuffle_buffer, **options)
    return ds, list(make_loader(ds, batch_size=5, num_workers=workers))


def same_batches(a, b) -> None:
    """Two reads gave the same batches: keys, raw, cls and txt."""
    import torch

    assert keys_of(a) == keys_of(b)
    for x, y in zip(a, b):
        assert torch.equal(x["raw"], y["raw"]) and torch.equal(x["cls"], y["cls"]) and x["txt"] == y["txt"]


def loader_for(root, monkeypatch, *, rank=0, world=1, workers=0, bs=4, drop_last=False, **options):
    """(StreamingDataset, make_loader) over raw+cls as rank `rank` of `world`; shuffle blocks of 16."""
    from shardkit.loader import make_loader
    from shardkit.reader.dataset import StreamingDataset

    monkeypatch.setenv("RANK", str(rank))
    monkeypatch.setenv("WORLD_SIZE", str(world))
    options.setdefault("shuffle_buffer", 16)
    context = options.pop("multiprocessing_context", None)
    ds = StreamingDataset(root, fields=["raw", "cls"], **options)
    return ds, make_loader(ds, batch_size=bs, num_workers=workers, prefetch_factor=2, drop_last=drop_last,
                           multiprocessing_context=context)


class FixedCpu:
    """A meter's WorkerCpu stand-in: `measured` workers kept `cores` cores busy."""

    def __init__(self, cores, measured=2):
        self.cores, self.measured = cores, measured

    def watch(self, pids):
        pass

    def sample(self):
        pass

    def figures(self):
        return {"worker_cpu_cores": self.cores, "workers_measured": self.measured}
