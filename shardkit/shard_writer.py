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
import os
from dataclasses import dataclass

from shardkit.contract import key_hash
from shardkit.errors import ShardkitError
from shardkit.fs import atomic_write, folder_lock
from shardkit.manifest import MANIFEST_NAME, TABLE_NAME, Manifest, remove_unlisted_shards, write_manifest
from shardkit.sample import Sample, check_key
from shardkit.writers import get_table_writer

# Bytes under one of these names are an encoded image, kept as it is (spec encoding "keep", as
# `shardkit build --encode keep` stores them); bytes under any other name are plain bytes.
IMAGE_EXTENSIONS = ("jpg", "jpeg", "png", "webp", "bmp", "gif", "tif", "tiff")
ENCODINGS = ("jpeg", "png", "webp", "raw")  # how a PIL image is stored (stages.image.encode)
FORMATS = ("tar", "parquet", "both")
TAR_MEMBER_OVERHEAD = 512 + 256  # a member's header plus its average padding, for shard sizing


class BadSample(ShardkitError, ValueError):
    """A sample that does not fit the writer's fields (or has a bad or repeated key)."""


@dataclass(frozen=True)
class WriterConfig:
    """How samples are stored and cut into shards (ShardWriter's and build_map's options)."""

    format: str = "tar"
    shard_size: int = 256 * 2**20  # stored bytes per shard, at most (one sample larger than this is a shard)
    max_samples_per_shard: int | None = None
    encode: str = "png"  # PIL images: jpeg, png, webp or raw (HWC uint8)
    quality: int = 90  # jpeg / webp

    def __post_init__(self):
        if self.format not in FORMATS:
            raise ValueError(f"format={self.format!r}; expected one of {', '.join(FORMATS)}")
        if self.encode not in ENCODINGS:
            raise ValueError(f"encode={self.encode!r}; expected one of {', '.join(ENCODINGS)} "
                             "(how PIL images are stored)")
        if not isinstance(self.shard_size, int) or self.shard_size <= 0:
            raise ValueError(f"shard_size={self.shard_size!r}; expected a positive number of bytes, e.g. 256 * 2**20")
        if self.max_samples_per_shard is not None and self.max_samples_per_shard <= 0:
            raise ValueError(f"max_samples_per_shard={self.max_samples_per_shard!r}; expected a positive count or None")
        if not 1 <= self.quality <= 100:
            raise ValueError(f"quality={self.quality!r}; expected 1..100")

    @property
    def formats(self) -> list[str]:
        return ["tar", "parquet"] if self.format == "both" else [self.format]


def _kind(value) -> str:
    """The kind a value's type gives it (bool is refused: it would silently become an int)."""
    import numpy as np

    if isinstance(value, bool):
        return "bool"
    if isinstance(value, (int, np.integer)):
        return "int"
    if isinstance(value, str):
        return "text"
    if isinstance(value, (bytes, bytearray, memoryview)):
        return "bytes"
    if isinstance(value, dict):
        return "json"
    if isinstance(value, np.ndarray):
        return "array"
    if _is_pil(value):
        return "pil"
    return type(value).__name__


def _is_pil(value) -> bool:
    import sys

    image = sys.modules.get("PIL.Image")  # a PIL image means PIL is imported already
    return image is not None and isinstance(value, image.Image)


KIND_HELP = ("bytes (under an extension such as 'jpg', 'wav'), a PIL image, a numpy array, an int, a str "
             "or a dict (json)")


def infer_spec(name: str, value, cfg: WriterConfig) -> dict:
    """The field spec a first value gives field `name` (the manifest's `fields[name]`)."""
    kind = _kind(value)
    if kind == "bytes":
        return {"kind": "image", "encoding": "keep"} if name.lower() in IMAGE_EXTENSIONS else {"kind": "bytes"}
    if kind == "pil":
        spec = {"kind": "image", "encoding": cfg.encode}
        if cfg.encode == "raw":
            spec.update(dtype="uint8", shape=[value.height, value.width, 3])
        return spec
    if kind == "array":
        return {"kind": "array", "dtype": value.dtype.newbyteorder("<").name, "shape": list(value.shape)}
    if kind == "int":
        return {"kind": "int", "dtype": "int64"}
    if kind in ("text", "json"):
        return {"kind": kind}
    raise BadSample(f"field {name!r} holds a {kind}; a field value is {KIND_HELP}")


def infer_fields(sample: dict, cfg: WriterConfig) -> dict:
    """Field specs from a first sample (every field but `__key__`; None values are left out)."""
    _check_dict(sample)
    return {name: infer_spec(name, value, cfg) for name, value in sorted(sample.items())
            if name != "__key__" and value is not None}


def _check_dict(sample) -> str:
    if not isinstance(sample, dict):
        raise BadSample(f"a sample is a dict with '__key__' and fields, not a {type(sample).__name__}")
    if "__key__" not in sample:
        raise BadSample(f"sample with fields {sorted(sample)} has no '__key__': give each sample a unique key, "
                        "e.g. {'__key__': f'{i:08d}', ...}")
    key = sample["__key__"]
    if not isinstance(key, str):
        raise BadSample(f"'__key__' is {key!r} ({type(key).__name__}); a key is a str, e.g. f'{{i:08d}}'")
    try:
        return check_key(key)
    except ValueError as e:
        raise BadSample(str(e)) from None


def store(key: str, name: str, spec: dict, value, cfg: WriterConfig, copy: bool = True):
    """The stored form of one value (bytes, int, str or dict), or BadSample naming key and field.
    copy=False leaves an array as a C-contiguous ndarray, possibly the caller's own, to be copied
    before the caller gets control back (ShardCutter copies it into its shard buffer)."""
    kind, want = _kind(value), spec["kind"]

    def bad(detail: str) -> BadSample:
        return BadSample(f"sample {key!r}, field {name!r}: {detail} (the fields are declared with fields=, or "
                         "taken from the first sample: every sample's value of a field has one kind)")

    if want == "image":
        if spec["encoding"] == "keep":
            if kind != "bytes":
                raise bad(f"expected encoded image bytes, got a {kind}")
            return bytes(value)
        if kind != "pil":
            raise bad(f"expected a PIL image (stored as {spec['encoding']}), got a {kind}")
        return _encode_image(value, spec, cfg, bad)
    if want == "bytes":
        if kind != "bytes":
            raise bad(f"expected bytes, got a {kind}")
        return bytes(value)
    if want == "array":
        return _array_value(value, spec, bad, kind, copy)
    if want == "int":
        if kind != "int":
            raise bad(f"expected an int, got a {kind}")
        value = int(value)
        if not -2**63 <= value < 2**63:
            raise bad(f"{value} does not fit in int64")
        return value
    if want == "text":
        if kind != "text":
            raise bad(f"expected a str, got a {kind}")
        return value
    if want == "json":
        if kind != "json":
            raise bad(f"expected a dict (json), got a {kind}")
        return _json_checked(value, bad)
    raise bad(f"kind {want!r} cannot be written by ShardWriter")


def _encode_image(im, spec: dict, cfg: WriterConfig, bad):
    from shardkit.stages.image import encode

    if im.mode != "RGB":  # readers decode every image to RGB: store what they will give back
        im = im.convert("RGB")
    if spec.get("shape") is not None and [im.height, im.width, 3] != spec["shape"]:
        raise bad(f"image of {im.width}x{im.height}; raw images have one size, the first's "
                  f"{spec['shape'][1]}x{spec['shape'][0]} (resize first, or encode='png'/'jpeg' for mixed sizes)")
    return encode(im, spec["encoding"], cfg.quality)


def _array_value(value, spec: dict, bad, kind: str, copy: bool):
    import numpy as np

    if kind != "array":
        raise bad(f"expected a numpy array, got a {kind}")
    if list(value.shape) != spec["shape"]:
        raise bad(f"array of shape {list(value.shape)}; the field's arrays have shape {spec['shape']} "
                  "(pad or crop to one shape)")
    if value.dtype.newbyteorder("<") != np.dtype(spec["dtype"]):
        raise bad(f"array of dtype {value.dtype}; the field's arrays are {spec['dtype']} (cast with .astype)")
    arr = np.ascontiguousarray(value, dtype=np.dtype(spec["dtype"]))
    return arr.tobytes() if copy else arr


def _json_checked(value: dict, bad) -> dict:
    import json

    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise bad(f"the dict is not JSON ({e})") from None
    return value


def to_sample(sample: dict, fields: dict, cfg: WriterConfig, copy: bool = True) -> Sample:
    """A user's sample dict checked against `fields` and turned into a Sample of stored values
    (copy=False: arrays as ndarrays that may be the caller's, see `store`)."""
    key = _check_dict(sample)
    extra = sorted(set(sample) - set(fields) - {"__key__"})
    if extra:
        raise BadSample(f"sample {key!r} has field(s) {extra} that the dataset does not have (its fields: "
                        f"{sorted(fields)}); declare every field with fields= or give the first sample all of them")
    stored = {name: store(key, name, fields[name], sample[name], cfg, copy)
              for name in fields if sample.get(name) is not None}
    if not stored:
        raise BadSample(f"sample {key!r} has no field values: nothing to store")
    return Sample(key, stored, {})


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
        from shardkit.fs import fsync_path

        table = self._table(samples, buffers)
        infos = [get_table_writer(fmt)(table, self.root, shard_id, self.fields, durable=False)
                 for fmt in self.cfg.formats]
        for info in infos:
            for rel in [info.path] + ([info.index["path"]] if info.index else []):
                fsync_path(os.path.join(self.root, rel))
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


def retire_manifest(out: str) -> None:
    """Delete OUT's manifest before any shard is written: until the new one is written last, nothing
    may name shards that are about to be replaced (a writer that crashes leaves no manifest)."""
    for name in (MANIFEST_NAME, TABLE_NAME):
        with contextlib.suppress(FileNotFoundError):
            os.remove(os.path.join(out, name))


def finish(out: str, fields: dict, infos: list, build: dict, rejections: list) -> Manifest:
    """errors.jsonl, stale shard files removed, then the manifest, last (every shard is on disk:
    the writers fsync each file)."""
    from shardkit.errors import count_by_reason

    infos = sorted(infos, key=lambda i: (i.id, i.format))
    atomic_write(os.path.join(out, "errors.jsonl"), "".join(r.to_json() + "\n" for r in rejections))
    remove_unlisted_shards(out, infos)
    first = "parquet" if infos and all(i.format == "parquet" for i in infos) else "tar"
    manifest = Manifest(samples=sum(i.samples for i in infos if i.format == first), fields=fields, shards=infos,
                        build=build, errors={"count": len(rejections), "by_reason": count_by_reason(rejections)})
    write_manifest(out, manifest)
    return manifest


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

    def __init__(self, out: str, *, format: str = "tar", shard_size: int = 256 * 2**20,
                 max_samples_per_shard: int | None = None, encode: str = "png", quality: int = 90,
                 fields: dict | None = None):
        self.cfg = WriterConfig(format, shard_size, max_samples_per_shard, encode, quality)
        self.out = os.path.abspath(out)
        if fields is not None:
            from shardkit.manifest import check_fields

            check_fields(fields, "ShardWriter(fields=...)")
        self.fields = dict(fields) if fields is not None else None
        self._keys: set[int] = set()  # 8-byte key hashes (~70 bytes each in a set): a repeated key is refused
        self._lock = contextlib.ExitStack()
        os.makedirs(os.path.join(self.out, "shards"), exist_ok=True)
        self._lock.enter_context(folder_lock(self.out, "ShardWriter"))
        retire_manifest(self.out)
        self._cutter: ShardCutter | None = None
        self.manifest: Manifest | None = None
        self.closed = False

    def write(self, sample: dict) -> None:
        """Add one sample: {"__key__": str, field: value, ...}; BadSample (nothing written) if it does
        not fit the fields, lacks a key, or repeats one."""
        if self.closed:
            raise BadSample(f"ShardWriter({self.out!r}) is closed; open a new one to write more")
        if self.fields is None:
            self.fields = infer_fields(sample, self.cfg)
        stored = to_sample(sample, self.fields, self.cfg, copy=False)  # the cutter copies arrays at once
        h = key_hash(stored.key)
        if h in self._keys:
            raise BadSample(f"key {stored.key!r} was written before: keys are unique within a dataset")
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
