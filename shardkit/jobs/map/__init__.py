"""build_map: a user function over any inputs, on Dask, into a shardkit dataset (LitData's `optimize`).

Inputs are cut into shard groups of `inputs_per_shard` consecutive inputs, decided from the inputs
alone, so the output never depends on the workers: each group is split into work units (sized from
the worker count, as the build sizes its units), each unit runs `fn` over its inputs and turns the
samples into a samples table (writers.parquet.samples_table); the group's step concatenates its
units' tables in input order and writes its shard(s) with the build's writers, then a completion
marker. The task loop is the build's (tasks.run_tasks: head start, ordered feeding, retries).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import sys
import time
from dataclasses import dataclass, field, replace

import shardkit.store as store
from shardkit.jobs import durable
from shardkit.jobs.cluster import background_client
from shardkit.jobs.main_guard import check_main_guard
from shardkit.contract import ShardInfo
from shardkit.errors import ConfigError, Rejection
from shardkit.jobs.map.tasks import (STATE, Group, GroupResult, MapContext, Unit, has_marker,
                                     make_durable, markers, run_group, run_unit, samples_of)
from shardkit.jobs.shard_writer import finish
from shardkit.store.lease import out_lock
from shardkit.writers.user_samples import BadSample, infer_fields
from shardkit.config.common import QUALITY, SHARD_SIZE, USER_ENCODE
from shardkit.config import remote_policy
from shardkit.config.writer import MapConfig, WriterConfig
from shardkit.sources.plan import unit_samples, unit_sizes
from shardkit.jobs.tasks import Then, progress_bar, run_tasks

@dataclass
class MapResult:
    """What build_map did: the dataset at `out`, its shards, the rejected inputs."""

    out: str
    inputs: int
    samples: int
    shards: list[ShardInfo]
    rejections: list[Rejection]
    reused_shards: int
    seconds: float
    manifest: object = field(default=None, repr=False)
    stats: dict = field(default_factory=dict)  # curation counters: curation.<filter>.<rule>, curation.pii.<kind>


# ---------------------------------------------------------------------------------------- fingerprints

def _code_digest(code, h) -> None:
    h.update(code.co_code)
    h.update(repr(code.co_names).encode())
    for const in code.co_consts:
        if hasattr(const, "co_code"):
            _code_digest(const, h)
        else:
            h.update(repr(const).encode())


def _plain(value) -> str:
    """A value's repr when it is plain data (stable across runs), else only its type's name."""
    if isinstance(value, (int, float, str, bytes, bool, type(None))):
        return repr(value)
    if isinstance(value, (tuple, list)):
        return "[" + ",".join(_plain(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{_plain(k)}:{_plain(v)}" for k, v in sorted(value.items(), key=repr)) + "}"
    return type(value).__qualname__


def function_fingerprint(fn) -> str:
    """A digest of what `fn` computes, as far as its code tells: its name, bytecode and constants,
    partial() arguments, plain default and closure values, and the source of its module (a change to
    a helper it calls in that module counts too)."""
    h = hashlib.sha256()
    while isinstance(fn, functools.partial):
        h.update(_plain((fn.args, fn.keywords)).encode())
        fn = fn.func
    call = fn if hasattr(fn, "__code__") else getattr(type(fn), "__call__", None)
    h.update(f"{getattr(fn, '__module__', '')}:{getattr(fn, '__qualname__', type(fn).__qualname__)}".encode())
    if hasattr(call, "__code__"):
        _code_digest(call.__code__, h)
        h.update(_plain(call.__defaults__).encode())
        h.update(_plain([c.cell_contents for c in call.__closure__ or ()]).encode())
    if not hasattr(fn, "__code__"):  # a callable object: its state (or what it says its state is)
        state = getattr(fn, "shardkit_fingerprint", None)
        h.update((state if isinstance(state, str) else _plain(vars(fn) if hasattr(fn, "__dict__") else None)).encode())
    module = sys.modules.get(getattr(fn, "__module__", None) or "")
    path = getattr(module, "__file__", None)
    if path and os.path.isfile(path):
        with open(path, "rb") as f:
            h.update(f.read())
    return h.hexdigest()


def function_name(fn) -> str:
    """`module:qualname` of fn (of the function inside partial()s; a callable object may name itself
    with a `shardkit_name` attribute), as the manifest records it: never an address."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    named = getattr(fn, "shardkit_name", None)
    if isinstance(named, str):
        return named
    qualname = getattr(fn, "__qualname__", None) or type(fn).__qualname__
    return f"{getattr(fn, '__module__', None) or type(fn).__module__}:{qualname}"


def _input_stamp(item) -> bytes:
    """An input's repr, plus size and mtime when it names a local file (its content may change)."""
    stamp = repr(item) + str(getattr(item, "shardkit_stamp", ""))  # e.g. a staged sample's shard digest
    if isinstance(item, (str, os.PathLike)):
        with contextlib.suppress(OSError, ValueError, TypeError):
            st = os.stat(item)
            stamp += f"|{st.st_size}|{st.st_mtime_ns}"
    return stamp.encode("utf-8", "surrogatepass")


def _groups(inputs, per_shard: int, base: str) -> list[Group]:
    groups = []
    for g, start in enumerate(range(0, len(inputs), per_shard)):
        stop = min(len(inputs), start + per_shard)
        h = hashlib.sha256(f"{base}|{start}|{stop}".encode())
        for i in range(start, stop):
            h.update(_input_stamp(inputs[i]))
            h.update(b"\0")
        groups.append(Group(g, start, stop, h.hexdigest()))
    return groups


# ---------------------------------------------------------------------------------------- the client

def build_map(fn, inputs, out: str, *, workers: int | None = None, scheduler: str | None = None,
              worker_pool: str = "auto", format: str = "tar", shard_size: int = SHARD_SIZE,
              max_samples_per_shard: int | None = None, encode: str = USER_ENCODE, quality: int = QUALITY,
              fields: dict | None = None, inputs_per_shard: int = 1000, on_error: str = "skip",
              progress: bool = True, curation=None, config: MapConfig | None = None) -> MapResult:
    """Run `fn(input)` over `inputs` (any sequence: paths, URLs, rows, ids) and write what it returns
    (a sample dict as ShardWriter takes, an iterable of them, or None to skip) as a shardkit dataset.

    Runs on an embedded Dask cluster (`workers`, default one per core; `worker_pool` "processes",
    "threads" of this process, or "auto": processes), on `scheduler` (an address), or here with
    workers=0; the bytes written are the same every way. Shard k holds the samples of inputs
    [k * inputs_per_shard, (k + 1) * inputs_per_shard), in key order, cut further by `shard_size`
    and `max_samples_per_shard`. An input whose fn raises is recorded in errors.jsonl (its repr,
    the exception's last line) and counted; `on_error="fail"` stops at the first. A rerun reuses
    the shards of groups whose inputs, fn (its code and its module's source) and options did not change.
    `curation` (a `shardkit.stages.filters.Curation`, e.g. `Curation.from_options("gopher-quality,c4",
    lang="en")`) runs on each sample's `txt` as the build's --filter does: removed samples are counted
    in `MapResult.stats` and listed in OUT/curation/filtered-GGGGG.parquet.

    `config`: all of these as one frozen shardkit.config.writer.MapConfig (the keywords are then ignored).

    >>> build_map(load_and_resize, sorted(glob.glob("photos/*.jpg")), "out", encode="jpeg")
    """
    if config is not None:
        return run_build_map(fn, inputs, out, config)
    options = {"workers": workers, "scheduler": scheduler, "worker_pool": worker_pool, "format": format,
               "shard_size": shard_size, "max_samples_per_shard": max_samples_per_shard, "encode": encode,
               "quality": quality, "fields": fields, "inputs_per_shard": inputs_per_shard, "on_error": on_error,
               "progress": progress, "curation": curation}
    return run_build_map(fn, inputs, out, options)


def run_build_map(fn, inputs, out: str, options: dict | MapConfig, prior: list | tuple = ()) -> MapResult:
    """build_map with its options as a MapConfig (or build_map's keywords as a dict); `prior`: rejections
    made before fn ran (the built-in stages of `shardkit build --map`), listed first in errors.jsonl."""
    run = options if isinstance(options, MapConfig) else MapConfig.from_options(options)
    cfg = run.writer
    if run.workers != 0 and not run.scheduler and run.worker_pool != "threads":
        check_main_guard("build_map")  # worker processes import the calling script again
    if not callable(fn):
        raise ConfigError(f"fn={fn!r} is not callable; pass the function to run on each input")
    from collections.abc import Sequence

    inputs = inputs if isinstance(inputs, Sequence) and not isinstance(inputs, (str, bytes)) else list(inputs)
    out = store.location(out, "build_map(out)", write=True)
    store.makedirs(store.join(out, "shards"))
    with out_lock(out, "build_map", policy=remote_policy(run)):
        return _build_map(fn, inputs, out, cfg, run, tuple(prior))


def _build_map(fn, inputs, out: str, cfg: WriterConfig, run: MapConfig, prior: tuple = ()) -> MapResult:
    start, policy = time.perf_counter(), remote_policy(run)
    durable.retire_manifest(out, policy)
    fields = run.fields if run.fields is not None else first_fields(fn, inputs, cfg)
    curation = run.curation.record() if run.curation else None
    base = hashlib.sha256(json.dumps([function_fingerprint(fn), repr(cfg), fields, run.inputs_per_shard,
                                      run.on_error, curation], sort_keys=True, default=str).encode()).hexdigest()
    groups = _groups(inputs, run.inputs_per_shard, base)
    reused = markers(out, groups, policy)
    todo = [g for g in groups if g.index not in reused]
    done = _run_groups(fn, inputs, out, cfg, run, fields, todo, (len(groups), len(reused), base)) if todo else []
    results = sorted(list(reused.values()) + done, key=lambda r: r.index)
    _remove_stale(out, len(groups), policy)
    infos = _numbered([i for r in results for i in r.shards])
    _check_keys_across(out, results, policy)
    rejections = list(prior) + [x for r in results for x in r.rejections]
    build = {"map": {"function": function_name(fn),
                     "fingerprint": base[:16], "inputs": len(inputs), "inputs_per_shard": run.inputs_per_shard,
                     "format": cfg.format, "shard_size": cfg.shard_size,
                     "max_samples_per_shard": cfg.max_samples_per_shard, "encode": cfg.encode, "quality": cfg.quality}}
    stats: dict = {}
    for r in results:
        for k, v in r.stats.items():
            stats[k] = stats.get(k, 0) + v
    if curation:
        build["curation"] = {"filters": curation, "counts": dict(sorted(stats.items())),
                             "filtered": "curation/filtered-*.parquet"}
    manifest = finish(out, fields, infos, build, rejections, policy)
    reused_shards = sum(len({s.path.split(".")[0] for s in r.shards}) for r in reused.values())
    return MapResult(out, len(inputs), manifest.samples, infos, rejections, reused_shards,
                     time.perf_counter() - start, manifest, dict(sorted(stats.items())))


def first_fields(fn, inputs, cfg: WriterConfig) -> dict:
    """Fields from the first sample fn makes, trying inputs in order here (the same on every run)."""
    for item in inputs:
        try:
            samples = samples_of(fn(item))
        except Exception:  # noqa: BLE001 — the task running this input records why
            continue
        if samples:
            return infer_fields(samples[0], cfg)
    return {}


def _run_groups(fn, inputs, out, cfg, run: MapConfig, fields, todo: list[Group], counts) -> list[GroupResult]:
    total, reused, base = counts
    with background_client(run.scheduler, run.workers, start=False) as pending:
        pending.use_threads(run.worker_pool == "threads")
        if not pending.in_process:
            _check_picklable(fn)
        threads = 1 if pending.local else (sum(pending.get().nthreads().values()) if run.scheduler else
                                           run.workers or max(1, os.cpu_count() or 1))
        # Units sized as the build sizes them (cut smaller at both ends: the head start stops soon after
        # the workers are up, and the workers finish together); they never change the output.
        counts = [g.stop - g.start for g in todo]
        sizes = unit_sizes(counts, unit_samples(sum(counts), threads, "image"), threads, "image")
        items, members = [], []
        for g, group_sizes in zip(todo, sizes):
            members.append(list(range(len(items), len(items) + len(group_sizes))))
            a = g.start
            for j, n in enumerate(group_sizes):
                items.append(Unit(g.index, j, a, tuple(inputs[a:a + n])))
                a += n
        ctx = MapContext(fn, out, fields, cfg, run.on_error, in_memory=pending.in_process, curation=run.curation,
                         policy=remote_policy(run))
        with progress_bar(total, initial=reused, desc="build_map", unit="shard", enabled=run.progress) as bar:
            done = run_tasks(run_unit, items, client=pending, bar=bar, name=f"map-{base[:12]}", shared=(ctx,),
                             then=Then(run_group, todo, members))
        # Every group's files on disk with its marker before the manifest names them: the fsync
        # threads of this process (head start) and of the workers, then any a lost worker left.
        if store.is_url(out):  # each group's step uploaded its files and wrote its marker before it returned
            return done
        durable.flush_durable()
        if not pending.local and pending.started:
            pending.get().run(durable.flush_durable)
        for g, result in zip(todo, done):
            if not has_marker(out, g.index, ctx.policy):
                make_durable(out, g, result, policy=ctx.policy)
        return done


def _check_picklable(fn) -> None:
    """Worker processes get fn pickled (cloudpickle, as Dask sends it): say how to fix one that is not."""
    import cloudpickle

    try:
        cloudpickle.dumps(fn)
    except Exception as e:  # noqa: BLE001 — any pickling failure means the same fix
        raise ConfigError(
            f"fn {getattr(fn, '__qualname__', fn)!r} cannot be sent to worker processes ({type(e).__name__}: {e}); "
            "define it at module level in an importable module and keep locks, open files and clients out of "
            "it (open them inside fn), or run it on worker threads (worker_pool='threads') or here (workers=0)"
        ) from None


def _numbered(infos: list[ShardInfo]) -> list[ShardInfo]:
    """Shard ids 0.. in group and part order (a tar and a Parquet copy of one part share theirs)."""
    ids, out = {}, []
    for info in infos:
        stem = info.path.rsplit(".", 1)[0] if not info.path.endswith(".idx.parquet") else info.path
        out.append(replace(info, id=ids.setdefault(stem, len(ids))))
    return out


def _check_keys_across(out: str, results: list[GroupResult], policy=None) -> None:
    """Keys are unique within each group (its step drops repeats); across groups only when their key
    ranges overlap can two share a key: then their key columns are compared, and a shared key is an
    error (no manifest), since shards already written cannot drop it."""
    ranges = sorted((s.keys[0], s.keys[1], r.index, s.path) for r in results for s in r.shards
                    if s.keys and s.format == r.shards[0].format)
    overlapping = {p for a, b in zip(ranges, ranges[1:]) if b[0] <= a[1] for p in (a[3], b[3])}
    if not overlapping:
        return
    import pyarrow as pa
    import pyarrow.parquet as pq

    seen = {}
    for path in sorted(overlapping):
        keys_file = store.join(out, path + ".idx.parquet" if path.endswith(".tar") else path)
        source = keys_file if not store.is_url(out) else pa.BufferReader(store.read(keys_file, policy))
        for key in pq.read_table(source, columns=["__key__"]).column(0).to_pylist():
            if key in seen and seen[key] != path:
                raise BadSample(f"key {key!r} is made by the inputs of two shards ({seen[key]}, {path}): keys are "
                                "unique within a dataset; build them from the input (e.g. its path or row number)")
            seen[key] = path


def _remove_stale(out: str, n_groups: int, policy=None) -> None:
    """Markers of groups past the last (a previous run had more inputs) and leftover unit files."""
    durable.remove_markers(out, f"{STATE}/done", "group-", n_groups, policy)
    store.remove_tree(store.join(out, STATE, "units"), policy)
    durable.remove_markers(out, "curation", "filtered-", n_groups, policy)  # lists of what --filter removed
