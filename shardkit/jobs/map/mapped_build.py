"""`shardkit build SRC OUT --map module:function`: the built-in stages, then a user function per sample.

The build writes SRC's samples (read, resized, encoded, tokenized: every built-in stage) into a
staging dataset, OUT/.shardkit/map/stage (Parquet; reused shard by shard on a rerun, as any build),
then build_map runs the function over its samples into OUT, with build_map's guarantees: the same
bytes for any workers, errors per sample in errors.jsonl (with the build's own rejections), reruns
reusing unchanged groups. The function gets each sample as ShardWriter takes it (`__key__`, encoded
image bytes under their field name, ints, str, dicts, numpy arrays) and returns the same, an
iterable of them, or None to drop the sample.
"""

from __future__ import annotations

import contextlib
import importlib
import os
from dataclasses import dataclass, replace

import shardkit.store as store
from shardkit.jobs.map import STATE, MapResult, first_fields, function_fingerprint, run_build_map
from shardkit.errors import ConfigError, Rejection
from shardkit.config.writer import WriterConfig

STAGE = f"{STATE}/stage"


def load_function(spec: str):
    """`module:function` (a dotted attribute path after the colon) → the function."""
    module, _, name = spec.partition(":")
    if not module or not name:
        raise ConfigError(f"--map {spec!r}: expected MODULE:FUNCTION, e.g. --map my_pipeline:add_caption_length "
                          "(MODULE importable: on PYTHONPATH or in the current folder)")
    import sys

    if os.getcwd() not in sys.path:  # `shardkit build` (a console script) does not put it there itself
        sys.path.append(os.getcwd())
    try:
        obj = importlib.import_module(module)
    except ImportError as e:
        raise ConfigError(f"--map {spec!r}: cannot import {module!r} ({e}); put its folder on PYTHONPATH") from None
    for part in name.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            raise ConfigError(f"--map {spec!r}: {module!r} has no {name!r}")
    if not callable(obj):
        raise ConfigError(f"--map {spec!r}: {name!r} is not a function")
    return obj


@dataclass(frozen=True)
class StagedRow:
    """One staged sample: row `row` of staged shard `path`. `stamp` (the shard's sha256 and the row)
    is what a rerun compares (build_map reads it); repr names the sample's source, as errors.jsonl shows it."""

    path: str
    row: int
    source: str
    shardkit_stamp: str

    def __repr__(self) -> str:
        return self.source


_CACHE: dict = {}  # per process: staged files' row-group starts and the last row groups read (as Samples)
_FUNCTIONS: dict = {}  # per process: module:function -> the function


class StagedFn:
    """The user's function applied to a staged sample; sent to workers by name (module:function).
    `policy`: the build's RemotePolicy, for a staging folder on a store."""

    def __init__(self, spec: str, stage: str, fields: dict, policy=None):
        self.spec, self.stage, self.fields, self.policy = spec, stage, fields, policy
        self.code = function_fingerprint(load_function(spec))  # a change to the function reruns its groups

    @property
    def shardkit_name(self) -> str:
        return self.spec

    @property
    def shardkit_fingerprint(self) -> str:
        """What build_map's fingerprint takes of this object: not the staging folder's path (it lies in
        OUT), so a dataset built in another folder gets the same manifest."""
        import json

        return json.dumps([self.spec, self.code, self.fields], sort_keys=True)

    def __call__(self, item: StagedRow):
        fn = _FUNCTIONS.get(self.spec)
        if fn is None:
            fn = _FUNCTIONS[self.spec] = load_function(self.spec)
        return fn(self._sample(item))

    def _sample(self, item: StagedRow) -> dict:
        import numpy as np
        import pyarrow.parquet as pq

        from shardkit.writers.parquet import table_samples

        # A staged shard on a store is read from a local copy, one per machine (named by its sha256).
        path = store.local_copy(store.join(self.stage, item.path), item.shardkit_stamp.split(":", 1)[0], self.policy)
        meta = _CACHE.get(("meta", path))
        if meta is None:
            meta = _CACHE[("meta", path)] = _row_groups(path)
        g = int(np.searchsorted(meta, item.row, side="right")) - 1
        rows = _CACHE.get(("rows", path, g))  # one lookup: worker threads share the cache
        if rows is None:
            rows = table_samples(pq.ParquetFile(path).read_row_group(g), self.fields)
            if len(_CACHE) > 64:  # a few row groups per worker thread are all a unit of consecutive rows needs
                _CACHE.clear()
            _CACHE[("rows", path, g)] = rows
        sample = rows[item.row - int(meta[g])]
        out = {"__key__": sample.key}
        for name, value in sample.fields.items():
            spec = self.fields[name]
            if spec["kind"] == "array" and spec.get("shape") is not None:
                value = np.frombuffer(value, np.dtype(spec["dtype"])).reshape(spec["shape"])
            elif spec["kind"] == "image" and spec.get("encoding") == "raw":
                from PIL import Image

                value = Image.fromarray(np.frombuffer(value, np.uint8).reshape(spec["shape"]))
            out[name] = value
        return out


def _row_groups(path: str):
    import numpy as np
    import pyarrow.parquet as pq

    md = pq.ParquetFile(path).metadata
    return np.cumsum([0] + [md.row_group(i).num_rows for i in range(md.num_row_groups)])[:-1]


def _staged_rows(stage: str, manifest, policy=None) -> list[StagedRow]:
    """Every staged sample in order: (shard, row), named by its source (or key)."""
    import pyarrow.parquet as pq

    from shardkit.contract import SOURCE_COLUMN, SOURCE_ROW_COLUMN

    rows = []
    for shard in manifest.shards_of("parquet") if manifest.samples else []:
        url = store.join(stage, shard.path)
        with (store.open_source(url, policy) if store.is_url(url) else contextlib.nullcontext(url)) as source:
            t = pq.read_table(source, columns=["__key__", SOURCE_COLUMN, SOURCE_ROW_COLUMN])
        for r, (key, src, line) in enumerate(zip(*(c.to_pylist() for c in t.columns))):
            where = key if src is None else (src if line is None else f"{src}:{line}")
            rows.append(StagedRow(shard.path, r, where, f"{shard.sha256}:{r}"))
    return rows


def build_with_map(cfg) -> MapResult:
    """`shardkit build --map` (cfg.map = MODULE:FUNCTION): build SRC into the staging dataset, then
    build_map over its samples."""
    from shardkit.config import remote_policy
    from shardkit.jobs.build import build

    spec, policy = cfg.map, remote_policy(cfg)
    out = store.location(cfg.out, "OUT", write=True)  # a bad OUT or spec fails before any work
    store.location(cfg.src, "SRC")
    load_function(spec)
    stage = store.join(out, STAGE)
    staged = build(replace(cfg, out=stage, format="parquet", allow_empty=True, map=None))
    rows = _staged_rows(stage, staged.manifest, policy)
    if "tokens" in staged.manifest.fields:
        raise ConfigError("--map runs on samples, and a tokenized build (--tokenizer) stores token rows: build "
                          "without --tokenizer, or tokenize inside your function")
    prior = [Rejection(r.path, r.stage, r.reason) for r in staged.rejections]
    options = {"workers": cfg.workers, "scheduler": cfg.scheduler, "worker_pool": cfg.worker_pool,
               "format": cfg.format, "shard_size": cfg.shard_size,
               "max_samples_per_shard": cfg.max_samples_per_shard,
               "encode": "png" if cfg.encode == "keep" else cfg.encode, "quality": cfg.quality,
               "inputs_per_shard": cfg.max_samples_per_shard or 10_000, "on_error": cfg.on_error,
               "progress": cfg.progress, "timeout": cfg.timeout, "retries": cfg.retries}
    fn = StagedFn(spec, stage, staged.manifest.fields, policy)
    writer = WriterConfig(cfg.format, cfg.shard_size, cfg.max_samples_per_shard, options["encode"], cfg.quality)
    # Fields the function passes through keep their specs (a sample may lack some: mixed folders), and
    # what its first sample holds (new fields, or ones it changed) is added over them.
    options["fields"] = {**passed_through(staged.manifest.fields), **first_fields(fn, rows, writer)}
    return run_build_map(fn, rows, out, options, prior)


def passed_through(fields: dict) -> dict:
    """The specs of staged fields as the function gets them back: encoded images as bytes kept as they
    are (raw images come as PIL images, re-stored raw), the rest as they were."""
    return {name: {"kind": "image", "encoding": "keep"} if spec["kind"] == "image" and spec.get("encoding") != "raw"
            else dict(spec) for name, spec in fields.items()}


def map_summary(r: MapResult) -> str:
    """The one-screen summary of a build with --map."""
    from collections import Counter

    reasons = Counter(x.kind for x in r.rejections)
    lines = [f"built {r.out} (with --map)", f"  inputs          {r.inputs} samples from the built-in stages",
             f"  samples written {r.samples}",
             f"  rejected        {len(r.rejections)}" + (" (see errors.jsonl)" if r.rejections else "")]
    lines += [f"    {n:>5}  {reason}" for reason, n in sorted(reasons.items())]
    shards = len({s.id for s in r.shards})
    lines += [f"  shards          {shards}" + (f" ({r.reused_shards} unchanged, reused)" if r.reused_shards else ""),
              f"  time            {r.seconds:.1f} s"]
    return "\n".join(lines)
