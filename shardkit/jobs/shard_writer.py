"""ShardWriter: samples written from Python straight into a shardkit dataset, manifest last.

`with ShardWriter(out) as w: w.write({"__key__": "a/1", "jpg": data, "cls": 3})` gives the same
dataset folder `shardkit build` writes (tar and/or Parquet shards, index sidecars, per-value
xxh3, key bounds, manifest.json), through the build's own writers (writers/tar.py,
writers/parquet.py). A field's kind comes from its value's type (see `infer_spec`); the fields are
declared (`fields=`) or taken from the first sample, and a later sample that does not fit them is
refused with an error naming its key and the field, before anything of it is buffered.
"""

from __future__ import annotations

import contextlib

import shardkit.store as store
from shardkit.contract import key_hash
from shardkit.jobs import durable
from shardkit.manifest import Manifest
from shardkit.sample import Sample
from shardkit.store.lease import out_lock
from shardkit.writers.user_samples import BadSample, infer_fields, to_sample
from shardkit.config.common import QUALITY, SHARD_SIZE, USER_ENCODE
from shardkit.config.writer import WriterConfig
from shardkit.writers import get_table_writer

TAR_MEMBER_OVERHEAD = 512 + 256  # a member's header plus its average padding, for shard sizing

def stored_bytes(sample: Sample) -> int:
    """A sample's size in a tar shard (Parquet's is smaller), for cutting shards by size."""
    return sum(len(v) if isinstance(v, (bytes, str)) else getattr(v, "nbytes", 32) for v in sample.fields.values()) \
        + TAR_MEMBER_OVERHEAD * len(sample.fields)


class ShardCutter:
    """Cuts a stream of Samples into shards by stored size and count, each written (sorted by key,
    which readers' key lookups rely on) with the build's writers: callers get ShardInfos back.

    A full shard is written by a thread of its own while the caller makes the next one (Arrow,
    hashing and the disk release the GIL): at most one shard waits for it, so memory holds two
    shards at most. The fsyncs run on it too; `close()` waits for them, so every ShardInfo it
    returns names files on disk."""

    def __init__(self, root: str, fields: dict, cfg: WriterConfig):
        from concurrent.futures import ThreadPoolExecutor

        from shardkit.contract import fixed_nbytes

        self.root, self.fields, self.cfg = root, fields, cfg
        # Arrays are copied once, at add(), into one buffer per field and shard: that buffer becomes
        # the Arrow column as it is (no bytes object per value, no join), as samples_table would build it.
        self.fixed = {n: fixed_nbytes(spec) for n, spec in fields.items() if spec["kind"] == "array"}
        per_sample = sum(self.fixed.values()) + TAR_MEMBER_OVERHEAD * len(fields)
        self.capacity = min(cfg.max_samples_per_shard or 2**62, cfg.shard_size // max(1, per_sample) + 1)
        self.samples: list[Sample] = []
        self.nbytes, self.next_id, self.infos = 0, 0, []
        self.buffers = self._new_buffers()
        self._pool, self._pending = ThreadPoolExecutor(1, thread_name_prefix="shardkit-writer"), None

    def _new_buffers(self) -> dict:
        import numpy as np

        # np.empty commits pages only as they are written: a buffer for a whole shard costs what it holds
        return {n: np.empty(self.capacity * nb, np.uint8) for n, nb in self.fixed.items()}

    def add(self, sample: Sample) -> None:
        """Add a Sample from to_sample(copy=False); its arrays are copied here, before the caller goes on."""
        size = stored_bytes(sample)
        full = self.cfg.max_samples_per_shard is not None and len(self.samples) >= self.cfg.max_samples_per_shard
        if self.samples and (full or len(self.samples) >= self.capacity or self.nbytes + size > self.cfg.shard_size):
            self.flush()
        slot = len(self.samples)
        for name, nb in self.fixed.items():
            value = sample.fields.get(name)
            if value is not None:
                view = self.buffers[name][slot * nb:(slot + 1) * nb]
                view[:] = value.reshape(-1).view(self.buffers[name].dtype)
                sample.fields[name] = view
        self.samples.append(sample)
        self.nbytes += size

    def flush(self) -> None:
        """Hand the current shard to the writing thread (after the previous one is written)."""
        if not self.samples:
            return
        self._wait()
        self._pending = self._pool.submit(self._write, self.samples, self.buffers, self.next_id)
        self.samples, self.nbytes, self.next_id = [], 0, self.next_id + 1
        self.buffers = self._new_buffers()

    def _wait(self) -> None:
        if self._pending is not None:
            pending, self._pending = self._pending, None
            self.infos += pending.result()  # a failure to write is raised here, in the caller

    def _write(self, samples: list[Sample], buffers: dict, shard_id: int) -> list:
        table = self._table(samples, buffers)
        infos = [get_table_writer(fmt)(table, store.staged(self.root), shard_id, self.fields, durable=False)
                 for fmt in self.cfg.formats]
        for rel, _ in durable.files_of(infos):  # fsync'd, or uploaded to a store from the staging folder
            store.publish(self.root, rel)
        return infos

    def _table(self, samples: list[Sample], buffers: dict):
        """samples_table of the shard, sorted by key. Samples written in key order with every array
        present (the usual case) get their array columns straight from the shard buffers."""
        import pyarrow as pa

        from shardkit.contract import CHECKSUM_SUFFIX, checksum
        from shardkit.writers.parquet import samples_table

        ordered = all(a.key < b.key for a, b in zip(samples, samples[1:]))
        if not ordered or any(s.fields.get(n) is None for n in self.fixed for s in samples):
            for s in samples:  # the general path: values as bytes, sorted
                s.fields.update({n: bytes(v) for n, v in s.fields.items() if n in self.fixed})
            return samples_table(sorted(samples, key=lambda s: s.key), self.fields)
        rest = samples_table(samples, {n: spec for n, spec in self.fields.items() if n not in self.fixed})
        columns = {name: rest.column(name) for name in rest.column_names}
        for name, nb in self.fixed.items():
            data = buffers[name][:len(samples) * nb]
            columns[name] = pa.FixedSizeBinaryArray.from_buffers(pa.binary(nb), len(samples), [None, pa.py_buffer(data)])
            columns[name + CHECKSUM_SUFFIX] = pa.array([checksum(data[i * nb:(i + 1) * nb]) for i in range(len(samples))],
                                                       pa.uint64())
        order = samples_table([], self.fields).schema.names  # the same columns, in samples_table's order
        return pa.table({name: columns[name] for name in order})

    def close(self) -> list:
        """Write what is left and wait until every shard is on disk; returns their ShardInfos."""
        try:
            self.flush()
            self._wait()
        finally:
            self._pool.shutdown(wait=True)
        return self.infos


def finish(out: str, fields: dict, infos: list, build: dict, rejections: list, policy=None) -> Manifest:
    """errors.jsonl, stale shard files removed, then the manifest, last (every shard is durable: the
    writers fsync or upload each file). `policy`: the job's RemotePolicy (None: store.JOB_POLICY)."""
    infos = sorted(infos, key=lambda i: (i.id, i.format))
    durable.write_errors(out, rejections, policy=policy)
    first = "parquet" if infos and all(i.format == "parquet" for i in infos) else "tar"
    manifest = Manifest(samples=sum(i.samples for i in infos if i.format == first), fields=fields, shards=infos,
                        build=build, errors=durable.errors_record(rejections))
    return durable.finish(out, manifest, policy)


class ShardWriter:
    """Write samples (dicts) into a shardkit dataset at `out`; a context manager.

    `format`: "tar", "parquet" or "both". Shards roll over at `shard_size` stored bytes or
    `max_samples_per_shard` samples; within a shard samples are stored in key order. `encode`: how
    PIL images are stored (jpeg, png, webp, raw). `fields`: {name: spec} to declare the fields
    (default: inferred from the first sample). close() writes errors.jsonl and the manifest, last;
    leaving the `with` block through an exception writes no manifest.

    >>> with ShardWriter("out", format="both", max_samples_per_shard=1000) as w:
    ...     w.write({"__key__": "000001", "jpg": open("a.jpg", "rb").read(), "cls": 3, "txt": "a cat"})
    """

    def __init__(self, out: str, *, format: str = "tar", shard_size: int = SHARD_SIZE,
                 max_samples_per_shard: int | None = None, encode: str = USER_ENCODE, quality: int = QUALITY,
                 fields: dict | None = None):
        self.cfg = WriterConfig(format, shard_size, max_samples_per_shard, encode, quality)
        self.out = store.location(out, "ShardWriter(out)", write=True)
        if fields is not None:
            from shardkit.manifest import check_fields

            check_fields(fields, "ShardWriter(fields=...)")
        self.fields = dict(fields) if fields is not None else None
        self._keys: set[int] = set()  # 8-byte key hashes (~70 bytes each in a set): a repeated key is refused
        self._lock = contextlib.ExitStack()
        store.makedirs(store.join(self.out, "shards"))
        self._lock.enter_context(out_lock(self.out, "ShardWriter"))
        durable.retire_manifest(self.out)
        self._cutter: ShardCutter | None = None
        self.manifest: Manifest | None = None
        self.closed = False

    def write(self, sample: dict) -> None:
        """Add one sample: {"__key__": str, field: value, ...}; BadSample (nothing written) if it does
        not fit the fields, lacks a key, or repeats one."""
        if self.closed:
            raise BadSample(f"ShardWriter({self.out!r}) is closed; open a new one to write more")
        fields = self.fields if self.fields is not None else infer_fields(sample, self.cfg)
        stored = to_sample(sample, fields, self.cfg, copy=False)  # the cutter copies arrays at once
        h = key_hash(stored.key)
        if h in self._keys:
            raise BadSample(f"key {stored.key!r} was written before: keys are unique within a dataset")
        self.fields = fields  # a first sample that is refused fixes nothing
        if self._cutter is None:
            self._cutter = ShardCutter(self.out, self.fields, self.cfg)
        self._cutter.add(stored)
        self._keys.add(h)

    def close(self) -> Manifest:
        """Write the last shard, errors.jsonl and the manifest (last); returns the Manifest."""
        if self.closed:
            return self.manifest
        try:
            infos = self._cutter.close() if self._cutter is not None else []
            build = {"writer": {"format": self.cfg.format, "shard_size": self.cfg.shard_size,
                                "max_samples_per_shard": self.cfg.max_samples_per_shard,
                                "encode": self.cfg.encode, "quality": self.cfg.quality}}
            self.manifest = finish(self.out, self.fields or {}, infos, build, [])
        finally:
            self.closed = True
            self._lock.close()
        return self.manifest

    def abort(self) -> None:
        """Stop without a manifest: the shards written so far stay, named by nothing."""
        self.closed = True
        try:
            if self._cutter is not None:
                self._cutter._pool.shutdown(wait=True)
        finally:
            self._lock.close()

    def __enter__(self) -> "ShardWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()
