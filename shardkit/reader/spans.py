"""Stage spans of the input pipeline, per process: what a loader worker spent each batch on.

Off unless a StarvationMeter(trace=...) turns it on (`enable`, which also sets SHARDKIT_TRACE=1
so spawned workers start with it on). Off, every hook is one module-global test: `within()`
returns a shared no-op context and `traced()` hands the batches back untouched.

A batch is cut into contiguous stage segments: `within(stage)` switches the current stage and
switches back on exit, so the segments of a batch sum to its wall time by construction and the
time between two hooks goes to the stage the code was in (the default, 'read', covers locating
rows and reading them out of a shard). Times are time.perf_counter_ns(): CLOCK_MONOTONIC on
Linux, one clock for every process of the machine, so worker and main-process spans line up.
"""

from __future__ import annotations

import contextlib
import os
import time

ENV = "SHARDKIT_TRACE"
KEY = "__trace__"  # a traced worker's spans travel in its batch under this key
STAGES = ("fetch", "network wait", "read", "decode", "transforms", "collate", "hand-off")

ON = os.environ.get(ENV) == "1"
_NULL = contextlib.nullcontext()
_now = time.perf_counter_ns
_batch = None  # the batch being built in this process: [stage, since, [(stage, start, end)], args]
_sink = None  # main process: where batches built here (num_workers=0) leave their spans


def enable(sink=None) -> None:
    """Turn the spans on in this process and in workers started after this; `sink` (the meter's
    trace) takes the spans of batches built or received here (`sink.batch(spans)`) and the
    main process's own (`sink.span(name, start, end)`)."""
    global ON, _sink
    ON, _sink = True, sink
    os.environ[ENV] = "1"


def disable() -> None:
    global ON, _sink, _batch
    ON, _sink, _batch = False, None, None
    os.environ.pop(ENV, None)


def _switch(stage: str) -> str | None:
    b = _batch
    if b is None or b[0] == stage:
        return None if b is None else stage
    now = _now()
    if now > b[1]:
        b[2].append((b[0], b[1], now))
    previous, b[0], b[1] = b[0], stage, now
    return previous


class _Within:
    __slots__ = ("stage", "previous")

    def __init__(self, stage: str):
        self.stage, self.previous = stage, None

    def __enter__(self):
        self.previous = _switch(self.stage)

    def __exit__(self, *exc):
        if self.previous is not None:
            _switch(self.previous)


def within(stage: str):
    """`with within("decode"): ...`: the time inside goes to `stage` (a no-op when off)."""
    return _Within(stage) if ON and _batch is not None else _NULL


def note(name: str, value) -> None:
    """An argument of the batch being built (its shard ids, say), shown with its span."""
    if ON and _batch is not None:
        _batch[3][name] = value


def traced(batches, pack, ship: bool, worker: int | None):
    """The batches of `batches` with their spans recorded; `pack` is the hand-off (the transport's
    pack, or None). `ship`: the spans ride in the batch (a dict) to the main process under KEY;
    else they go to this process's sink."""
    if not ON:
        return batches if pack is None else map(pack, batches)
    return _traced(iter(batches), pack, ship, worker)


def _traced(it, pack, ship: bool, worker: int | None):
    global _batch
    pid = os.getpid()
    while True:
        start = _now()
        _batch = ["read", start, [], {}]
        try:
            batch = next(it)
        except StopIteration:
            _batch = None
            return
        if pack is not None:
            _switch("hand-off")
            batch = pack(batch)
        b, _batch = _batch, None
        end = _now()
        if end > b[1]:
            b[2].append((b[0], b[1], end))
        b[3]["samples"] = _samples(batch)
        spans = {"pid": pid, "worker": worker, "start": start, "end": end, "args": b[3], "stages": b[2]}
        if ship and isinstance(batch, dict):
            batch[KEY] = spans
        elif _sink is not None:
            _sink.batch(spans)
        yield batch


def _samples(batch) -> int | None:
    keys = batch.get("__key__") if isinstance(batch, dict) else None
    return len(keys) if isinstance(keys, list) else None


def received(item):
    """Main process: a worker item's spans (taken out of it) go to the sink; the item comes back."""
    if isinstance(item, dict):
        shipped = item.pop(KEY, None)
        if shipped is not None and _sink is not None:
            _sink.batch(shipped)
    return item


class _Main:
    __slots__ = ("name", "start")

    def __init__(self, name: str):
        self.name = name

    def __enter__(self):
        self.start = _now()

    def __exit__(self, *exc):
        if _sink is not None:
            _sink.span(self.name, self.start, _now())


def main(name: str):
    """`with main("copy"): ...`: a span of the main process (page-lock, host-to-device copy), a
    no-op when off. Public as shardkit.meter.trace.span for the training loop's own stages."""
    return _Main(name) if ON and _sink is not None else _NULL
