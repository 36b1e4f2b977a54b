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
import math
import os
import sys
import time
from dataclasses import dataclass, field, replace

from shardkit.cluster import background_client
from shardkit.config import WORKER_POOLS
from shardkit.contract import ShardInfo
from shardkit.errors import ConfigError, Rejection, RejectionLog
from shardkit.fs import atomic_write, folder_lock, tmp_name
from shardkit.shard_writer import BadSample, WriterConfig, finish, infer_fields, retire_manifest, to_sample
from shardkit.sources.plan import unit_samples
from shardkit.tasks import Then, progress_bar, run_tasks
from shardkit.writers import get_table_writer

STATE = os.path.join(".shardkit", "map")
MAX_PARTS = 100_000  # shards one group may be cut into (its part number is below this)
REPR_CHARS = 300  # of an input's repr in errors.jsonl


@dataclass(frozen=True)
class MapContext:
    """What every task shares (sent to each worker once)."""

    fn: object
    out: str
    fields: dict
    writer: WriterConfig
    on_error: str
    in_memory: bool  # every task runs in this process: units hand their tables over as they are


@dataclass(frozen=True)
class Group:
    """One shard group: inputs [start, stop), its rerun fingerprint."""

    index: int
    start: int
    stop: int
    fingerprint: str


@dataclass(frozen=True)
class Unit:
    group: int
    index: int
    start: int
    inputs: tuple


@dataclass
class UnitOutput:
    rows: int
    rejections: list
    table: object = None
    path: str | None = None


@dataclass
class GroupResult:
    """One group's shards and rejections (what its marker records)."""

    index: int
    shards: list[ShardInfo]
    rejections: list[Rejection]
    reused: bool = False

    def to_json(self) -> dict:
        return {"index": self.index, "shards": [s.to_dict() for s in self.shards],
                "rejections": [[r.path, r.stage, r.reason] for r in self.rejections]}


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
    if not hasattr(fn, "__code__"):
        h.update(_plain(vars(fn) if hasattr(fn, "__dict__") else None).encode())
    module = sys.modules.get(getattr(fn, "__module__", None) or "")
    path = getattr(module, "__file__", None)
    if path and os.path.isfile(path):
        with open(path, "rb") as f:
            h.update(f.read())
    return h.hexdigest()


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


# ---------------------------------------------------------------------------------------- tasks

def _samples_of(out) -> list:
    """fn's result as a list of sample dicts: one dict, an iterable of them, or None (skip)."""
    if out is None:
        return []
    if isinstance(out, dict):
        return [out]
    try:
        return list(out)
    except TypeError:
        raise BadSample(f"fn returned a {type(out).__name__}; it returns a sample dict, an iterable of "
                        "sample dicts, or None to skip the input") from None


def _last_line(e: BaseException) -> str:
    """`Type: message`, with the message's last line only (what a traceback's last line shows)."""
    lines = str(e).strip().splitlines()
    return f"{type(e).__name__}: {lines[-1]}" if lines else type(e).__name__


def run_unit(unit: Unit, ctx: MapContext) -> UnitOutput:
    """fn over one unit's inputs; an input whose fn raises (or gives a sample that does not fit) is
    rejected whole, with its repr and the exception's last line."""
    from shardkit.writers.parquet import samples_table

    log, samples = RejectionLog(ctx.on_error), []
    for offset, item in enumerate(unit.inputs):
        try:
            made = [to_sample(s, ctx.fields, ctx.writer) for s in _samples_of(ctx.fn(item))]
        except Exception as e:  # noqa: BLE001 — the user's function: any failure is this input's
            log.reject(repr(item)[:REPR_CHARS], "map", _last_line(e))
            continue
        samples += made
    table = samples_table(samples, ctx.fields)
    result = UnitOutput(table.num_rows, log.items)
    if ctx.in_memory:
        result.table = table
    else:
        result.path = _save(table, os.path.join(ctx.out, STATE, "units", f"{unit.group:05d}-{unit.index:04d}.arrow"))
    return result


def _save(table, path: str) -> str:
    """A unit's table as an Arrow file (temp name, then rename; no fsync: it lives for seconds)."""
    import pyarrow as pa

    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = tmp_name(path)
    with pa.OSFile(tmp, "wb") as f, pa.ipc.new_file(f, table.schema) as w:
        w.write_table(table)
    os.replace(tmp, path)
    return path


def _marker(out: str, g: int) -> str:
    return os.path.join(out, STATE, "done", f"group-{g:05d}.json")


def run_group(group: Group, parts: list[UnitOutput], ctx: MapContext) -> GroupResult:
    """A group's step: its units' tables in input order, duplicate keys rejected (the first kept),
    sorted by key, cut by size and count, written; then its marker."""
    import pyarrow as pa

    tables = [p.table if p.table is not None else pa.ipc.open_file(pa.memory_map(p.path)).read_all() for p in parts]
    rejections = [r for p in parts for r in p.rejections]
    table, dups = _sorted_unique(pa.concat_tables(tables))
    for key in dups:
        rejections.append(Rejection(key, "map", f"duplicate key: {key!r} was given by an earlier input, kept"))
    shards = _write_parts(table, group.index, ctx)
    result = GroupResult(group.index, shards, rejections)
    atomic_write(_marker(ctx.out, group.index), json.dumps({"fingerprint": group.fingerprint,
                                                            "result": result.to_json()}, sort_keys=True))
    for p in parts:
        if p.path:
            with contextlib.suppress(FileNotFoundError):
                os.remove(p.path)
    return result


def _sorted_unique(table):
    """The table sorted by key (stable: among equal keys the first input's row first), repeated keys
    dropped; returns (table, the repeated keys)."""
    import numpy as np
    import pyarrow.compute as pc

    order = pc.sort_indices(table, [("__key__", "ascending")]).to_numpy()  # a stable sort
    keys = table.column("__key__").take(order).to_pylist()
    repeat = np.array([False] + [a == b for a, b in zip(keys, keys[1:])], bool)
    return table.take(order[~repeat]), [k for k, r in zip(keys, repeat) if r]


def _row_bytes(table):
    """Each row's stored size in a tar shard (values plus a member's overhead per field present)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    from shardkit.contract import CHECKSUM_SUFFIX
    from shardkit.shard_writer import TAR_MEMBER_OVERHEAD

    total = np.zeros(table.num_rows, np.int64)
    for name in table.column_names:
        if name.startswith("__") or name.endswith(CHECKSUM_SUFFIX):
            continue
        col = table.column(name)
        present = col.is_valid().to_numpy(zero_copy_only=False)
        t = col.type
        if pa.types.is_binary(t) or pa.types.is_string(t) or pa.types.is_fixed_size_binary(t):
            sizes = pc.binary_length(col).fill_null(0).to_numpy(zero_copy_only=False)
        else:  # an int: its decimal text in a tar member
            sizes = np.full(table.num_rows, 20)
        total += np.where(present, sizes + TAR_MEMBER_OVERHEAD, 0)
    return total


def _cuts(sizes, cfg: WriterConfig) -> list[tuple[int, int]]:
    """[start, stop) rows of each shard: greedy by size and count, at least one row each."""
    cuts, start, acc = [], 0, 0
    for i, size in enumerate(sizes.tolist()):
        full = cfg.max_samples_per_shard is not None and i - start >= cfg.max_samples_per_shard
        if i > start and (full or acc + size > cfg.shard_size):
            cuts.append((start, i))
            start, acc = i, 0
        acc += size
    if start < len(sizes):
        cuts.append((start, len(sizes)))
    return cuts


def _write_parts(table, g: int, ctx: MapContext) -> list[ShardInfo]:
    """Shards `data-GGGGG-PPP` of one group (written under a numeric id, then renamed)."""
    cuts = _cuts(_row_bytes(table), ctx.writer)
    if len(cuts) >= MAX_PARTS:
        raise ConfigError(f"group {g} makes {len(cuts)} shards; raise shard_size or lower inputs_per_shard")
    infos = []
    for p, (a, b) in enumerate(cuts):
        for fmt in ctx.writer.formats:
            info = get_table_writer(fmt)(table.slice(a, b - a), ctx.out, g * MAX_PARTS + p, ctx.fields)
            infos.append(_rename(info, f"shards/data-{g:05d}-{p:03d}", ctx.out))
    return infos


def _rename(info: ShardInfo, stem: str, out: str) -> ShardInfo:
    path = stem + os.path.splitext(info.path)[1]
    os.replace(os.path.join(out, info.path), os.path.join(out, path))
    index = None
    if info.index:
        index = dict(info.index, path=path + ".idx.parquet")
        os.replace(os.path.join(out, info.index["path"]), os.path.join(out, index["path"]))
    return replace(info, path=path, index=index)


def reusable(out: str, group: Group) -> GroupResult | None:
    """A previous run's result for this group, if its fingerprint matches and its files are there."""
    try:
        with open(_marker(out, group.index), encoding="utf-8") as f:
            marker = json.load(f)
        if marker["fingerprint"] != group.fingerprint:
            return None
        d = marker["result"]
        result = GroupResult(group.index, [ShardInfo.from_dict(s) for s in d["shards"]],
                             [Rejection(*r) for r in d["rejections"]], reused=True)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    for info in result.shards:
        files = [(info.path, info.bytes)] + ([(info.index["path"], info.index["bytes"])] if info.index else [])
        if not all(os.path.isfile(os.path.join(out, rel)) and os.path.getsize(os.path.join(out, rel)) == size
                   for rel, size in files):
            return None
    return result


# ---------------------------------------------------------------------------------------- the client

def build_map(fn, inputs, out: str, *, workers: int | None = None, scheduler: str | None = None,
              worker_pool: str = "auto", format: str = "tar", shard_size: int = 256 * 2**20,
              max_samples_per_shard: int | None = None, encode: str = "png", quality: int = 90,
              fields: dict | None = None, inputs_per_shard: int = 1000, on_error: str = "skip",
              progress: bool = True) -> MapResult:
    """Run `fn(input)` over `inputs` (any sequence: paths, URLs, rows, ids) and write what it returns
    (a sample dict as ShardWriter takes, an iterable of them, or None to skip) as a shardkit dataset.

    Runs on an embedded Dask cluster (`workers`, default one per core; `worker_pool` "processes",
    "threads" of this process, or "auto": processes), on `scheduler` (an address), or here with
    workers=0; the bytes written are the same every way. Shard k holds the samples of inputs
    [k * inputs_per_shard, (k + 1) * inputs_per_shard), in key order, cut further by `shard_size`
    and `max_samples_per_shard`. An input whose fn raises is recorded in errors.jsonl (its repr,
    the exception's last line) and counted; `on_error="fail"` stops at the first. A rerun reuses
    the shards of groups whose inputs, fn (its code and its module's source) and options did not change.

    >>> build_map(load_and_resize, sorted(glob.glob("photos/*.jpg")), "out", encode="jpeg")
    """
    options = {"workers": workers, "scheduler": scheduler, "worker_pool": worker_pool, "format": format,
               "shard_size": shard_size, "max_samples_per_shard": max_samples_per_shard, "encode": encode,
               "quality": quality, "fields": fields, "inputs_per_shard": inputs_per_shard, "on_error": on_error,
               "progress": progress}
    return run_build_map(fn, inputs, out, options)


def run_build_map(fn, inputs, out: str, options: dict, prior: list | tuple = ()) -> MapResult:
    """build_map with its keyword options as a dict; `prior`: rejections made before fn ran (the
    built-in stages of `shardkit build --map`), listed first in errors.jsonl."""
    o = dict(workers=None, scheduler=None, worker_pool="auto", format="tar", shard_size=256 * 2**20,
             max_samples_per_shard=None, encode="png", quality=90, fields=None, inputs_per_shard=1000,
             on_error="skip", progress=True)
    unknown = sorted(set(options) - set(o))
    if unknown:
        raise ConfigError(f"build_map: unknown option(s) {unknown}; valid: {', '.join(o)}")
    o.update(options)
    cfg = WriterConfig(o["format"], o["shard_size"], o["max_samples_per_shard"], o["encode"], o["quality"])
    if o["worker_pool"] not in WORKER_POOLS:
        raise ConfigError(f"worker_pool={o['worker_pool']!r}; expected one of {', '.join(WORKER_POOLS)}")
    if not isinstance(o["inputs_per_shard"], int) or o["inputs_per_shard"] <= 0:
        raise ConfigError(f"inputs_per_shard={o['inputs_per_shard']!r}; expected a positive int")
    RejectionLog(o["on_error"])  # checks the policy's name
    if not callable(fn):
        raise ConfigError(f"fn={fn!r} is not callable; pass the function to run on each input")
    from collections.abc import Sequence

    inputs = inputs if isinstance(inputs, Sequence) and not isinstance(inputs, (str, bytes)) else list(inputs)
    out = os.path.abspath(out)
    os.makedirs(os.path.join(out, "shards"), exist_ok=True)
    run = _Run(o["workers"], o["scheduler"], o["worker_pool"], o["fields"], o["inputs_per_shard"], o["on_error"],
               o["progress"], tuple(prior))
    with folder_lock(out, "build_map"):
        return _build_map(fn, inputs, out, cfg, run)


@dataclass(frozen=True)
class _Run:
    workers: int | None
    scheduler: str | None
    worker_pool: str
    fields: dict | None
    inputs_per_shard: int
    on_error: str
    progress: bool
    prior: tuple = ()


def _build_map(fn, inputs, out: str, cfg: WriterConfig, run: _Run) -> MapResult:
    start = time.perf_counter()
    retire_manifest(out)
    fields = run.fields if run.fields is not None else first_fields(fn, inputs, cfg)
    base = hashlib.sha256(json.dumps([function_fingerprint(fn), repr(cfg), fields, run.inputs_per_shard,
                                      run.on_error], sort_keys=True).encode()).hexdigest()
    groups = _groups(inputs, run.inputs_per_shard, base)
    reused = {g.index: r for g in groups if (r := reusable(out, g)) is not None}
    todo = [g for g in groups if g.index not in reused]
    done = _run_groups(fn, inputs, out, cfg, run, fields, todo, (len(groups), len(reused), base)) if todo else []
    results = sorted(list(reused.values()) + done, key=lambda r: r.index)
    _remove_stale(out, len(groups))
    infos = _numbered([i for r in results for i in r.shards])
    _check_keys_across(out, results)
    rejections = list(run.prior) + [x for r in results for x in r.rejections]
    build = {"map": {"function": f"{getattr(fn, '__module__', '?')}:{getattr(fn, '__qualname__', repr(fn))}",
                     "fingerprint": base[:16], "inputs": len(inputs), "inputs_per_shard": run.inputs_per_shard,
                     "format": cfg.format, "shard_size": cfg.shard_size,
                     "max_samples_per_shard": cfg.max_samples_per_shard, "encode": cfg.encode, "quality": cfg.quality}}
    manifest = finish(out, fields, infos, build, rejections)
    reused_shards = sum(len({s.path.split(".")[0] for s in r.shards}) for r in reused.values())
    return MapResult(out, len(inputs), manifest.samples, infos, rejections, reused_shards,
                     time.perf_counter() - start, manifest)


def first_fields(fn, inputs, cfg: WriterConfig) -> dict:
    """Fields from the first sample fn makes, trying inputs in order here (the same on every run)."""
    for item in inputs:
        try:
            samples = _samples_of(fn(item))
        except Exception:  # noqa: BLE001 — the task running this input records why
            continue
        if samples:
            return infer_fields(samples[0], cfg)
    return {}


def _run_groups(fn, inputs, out, cfg, run: _Run, fields, todo: list[Group], counts) -> list[GroupResult]:
    total, reused, base = counts
    with background_client(run.scheduler, run.workers, start=False) as pending:
        pending.use_threads(run.worker_pool == "threads")
        if not pending.in_process:
            _check_picklable(fn)
        threads = 1 if pending.local else (sum(pending.get().nthreads().values()) if run.scheduler else
                                           run.workers or max(1, os.cpu_count() or 1))
        size = unit_samples(sum(g.stop - g.start for g in todo), threads, "image")
        items, members = [], []
        for g in todo:
            n = math.ceil((g.stop - g.start) / size)
            bounds = [g.start + round(j * (g.stop - g.start) / n) for j in range(n + 1)]
            members.append(list(range(len(items), len(items) + n)))
            items += [Unit(g.index, j, a, tuple(inputs[a:b])) for j, (a, b) in enumerate(zip(bounds, bounds[1:]))]
        ctx = MapContext(fn, out, fields, cfg, run.on_error, in_memory=pending.in_process)
        with progress_bar(total, initial=reused, desc="build_map", unit="shard", enabled=run.progress) as bar:
            return run_tasks(run_unit, items, client=pending, bar=bar, name=f"map-{base[:12]}", shared=(ctx,),
                             then=Then(run_group, todo, members))


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


def _check_keys_across(out: str, results: list[GroupResult]) -> None:
    """Keys are unique within each group (its step drops repeats); across groups only when their key
    ranges overlap can two share a key: then their key columns are compared, and a shared key is an
    error (no manifest), since shards already written cannot drop it."""
    ranges = sorted((s.keys[0], s.keys[1], r.index, s.path) for r in results for s in r.shards
                    if s.keys and s.format == r.shards[0].format)
    overlapping = {p for a, b in zip(ranges, ranges[1:]) if b[0] <= a[1] for p in (a[3], b[3])}
    if not overlapping:
        return
    import pyarrow.parquet as pq

    seen = {}
    for path in sorted(overlapping):
        keys_file = path + ".idx.parquet" if path.endswith(".tar") else path
        for key in pq.read_table(os.path.join(out, keys_file), columns=["__key__"]).column(0).to_pylist():
            if key in seen and seen[key] != path:
                raise BadSample(f"key {key!r} is made by the inputs of two shards ({seen[key]}, {path}): keys are "
                                "unique within a dataset; build them from the input (e.g. its path or row number)")
            seen[key] = path


def _remove_stale(out: str, n_groups: int) -> None:
    """Markers of groups past the last (a previous run had more inputs) and leftover unit files."""
    import shutil

    folder = os.path.join(out, STATE, "done")
    for name in os.listdir(folder) if os.path.isdir(folder) else []:
        if name.startswith("group-") and int(name[6:11]) >= n_groups:
            os.remove(os.path.join(folder, name))
    shutil.rmtree(os.path.join(out, STATE, "units"), ignore_errors=True)
