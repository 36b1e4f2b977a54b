"""The input pipeline's trace: a ring of the last N steps' spans, written as Chrome trace-event JSON.

StarvationMeter(trace="run.trace.json") makes one. The loader's workers record their stage spans
(reader/spans.py) and ship them inside the batches; the main process records wait-for-batch,
unpack (page-lock) and step, plus any `span("copy")` the training loop adds. Perfetto UI and
chrome://tracing open the file: one track per process, named, with sample counts and shard ids
as arguments. Only the last `steps` steps are kept, so the file's size does not grow with the run.
"""

from __future__ import annotations

import json
import os
import re
import threading
from collections import deque

from shardkit.errors import ConfigError
from shardkit.store.local import atomic_write
from shardkit.meter.stages import wait_holders
from shardkit.reader import spans as _spans

__all__ = ["Trace", "span", "rank_path", "merge", "DEFAULT_STEPS", "PENDING_MAX"]

WRITE_EVERY_S = 30.0  # at an epoch's end the file is rewritten at most this often (a write takes ~10 ms)
DEFAULT_STEPS = 300  # ~50 KB of JSON per worker at 10 stages a batch: a few minutes of a fast run
PENDING_MAX = 4096  # spans held between two steps (a loop that never steps must not grow them)


def span(name: str):
    """`with span("copy"): batch = batch.to("cuda")`: a span of the training loop in the trace
    (host-to-device copy, a forward pass...); a no-op when no meter traces."""
    return _spans.main(name)


def rank_path(path: str, rank: int, world_size: int) -> str:
    """run.trace.json -> run.rank3.trace.json when there are several ranks (one file per rank)."""
    path = os.fspath(path)
    if world_size <= 1:
        return path
    head, tail = (path[:-len(".trace.json")], ".trace.json") if path.endswith(".trace.json") else os.path.splitext(path)
    return f"{head}.rank{rank}{tail}"


class Trace:
    """The sink of the spans (reader.spans.enable) and their ring of steps."""

    def __init__(self, path: str, steps: int = DEFAULT_STEPS, rank: int = 0, world_size: int = 1):
        if not isinstance(steps, int) or isinstance(steps, bool) or steps <= 0:
            raise ConfigError(f"trace_steps={steps!r}: expected a positive number of steps (StarvationMeter(trace_steps=...))")
        # path None: spans for the summary only (StarvationMeter(plan=...) without trace=), no file
        self.path = None if path is None else rank_path(path, rank, world_size)
        self.rank, self.world_size = rank, world_size
        self.main_pid, self.main_tid = os.getpid(), threading.get_ident()
        self._ring: deque = deque(maxlen=steps)  # (step, wait start, batch arrived, step end, samples, pending)
        self._pending: list = []
        self._wait = self._arrived = None
        self._steps = 0
        self._written = None  # when write_now_and_then() last wrote

    # -- the sink (reader.spans) ---------------------------------------------------------------
    def batch(self, shipped: dict) -> None:
        if len(self._pending) < PENDING_MAX:
            self._pending.append(shipped)

    def span(self, name: str, start: int, end: int) -> None:
        if len(self._pending) < PENDING_MAX:
            self._pending.append((name, start, end))

    # -- the meter's steps ---------------------------------------------------------------------
    now = staticmethod(_spans._now)

    def waiting(self) -> None:
        self._wait = _spans._now()

    def ended(self) -> None:
        """The wait that found the epoch over (shown with the next step: the end of an epoch is the
        time its last next() took to say so)."""
        if self._wait is not None:
            self.span("epoch end", self._wait, _spans._now())
        self._wait = None

    def arrived(self) -> None:
        self._arrived = _spans._now()

    def stepped(self, samples: int) -> None:
        if self._wait is None or self._arrived is None:
            return
        self._ring.append((self._steps, self._wait, self._arrived, _spans._now(), samples, self._pending))
        self._steps += 1
        self._pending, self._wait, self._arrived = [], None, None

    # -- reading it ----------------------------------------------------------------------------
    def batches(self):
        """Every batch's shipped spans in the ring."""
        for *_, pending in self._ring:
            yield from (p for p in pending if isinstance(p, dict))

    def shares(self) -> dict:
        """Per-stage share (%) of the loader's batch-building time over the ring, worst first, and
        the main process's wait / unpack / step shares of its wall time."""
        stage: dict = {}
        busy = 0
        for b in self.batches():
            busy += b["end"] - b["start"]
            for name, start, end in b["stages"]:
                stage[name] = stage.get(name, 0) + end - start
        main: dict = {}
        for _, t0, t1, t2, _, pending in self._ring:
            main["wait"] = main.get("wait", 0) + t1 - t0
            main["step"] = main.get("step", 0) + t2 - t1
            for p in pending:
                if isinstance(p, tuple):
                    main[p[0]] = main.get(p[0], 0) + p[2] - p[1]
        wall = main.get("wait", 0) + main.get("step", 0)
        loader = {k: 100.0 * v / busy for k, v in sorted(stage.items(), key=lambda kv: -kv[1])} if busy else {}
        wait = wait_holders(self._ring)
        return {"steps": len(self._ring), "batches": sum(1 for _ in self.batches()), "loader_busy_s": busy / 1e9,
                "loader": loader, "main": {k: 100.0 * v / wall for k, v in main.items()} if wall else {},
                "slowest_stage": next(iter(loader), None), "wait": wait, "held_by": next(iter(wait), None)}

    def events(self) -> list:
        """The ring as trace events (ts and dur in microseconds from the ring's first event)."""
        if not self._ring:
            return []
        origin = min(min(self._ring[0][1], p[1] if isinstance(p, tuple) else p["start"])
                     for *_, pending in self._ring for p in pending or [(None, self._ring[0][1])])
        us = lambda t: (t - origin) / 1e3  # noqa: E731
        out, names = [], {self.main_pid: f"main (rank {self.rank})"}
        main = {"pid": self.main_pid, "tid": self.main_pid}
        for step, t0, t1, t2, samples, pending in self._ring:
            out.append(dict(main, ph="X", name="wait", cat="main", ts=us(t0), dur=us(t1) - us(t0), args={"step": step}))
            out.append(dict(main, ph="X", name="step", cat="main", ts=us(t1), dur=us(t2) - us(t1),
                            args={"step": step, "samples": samples}))
            for p in pending:
                if isinstance(p, tuple):
                    out.append(dict(main, ph="X", name=p[0], cat="main", ts=us(p[1]), dur=us(p[2]) - us(p[1])))
                    continue
                pid = p["pid"]
                if pid not in names:
                    names[pid] = "loader (main process)" if p["worker"] is None else f"loader worker {p['worker']}"
                where = {"pid": pid, "tid": pid}
                out.append(dict(where, ph="X", name="batch", cat="loader", ts=us(p["start"]),
                                dur=us(p["end"]) - us(p["start"]), args=dict(p["args"], worker=p["worker"])))
                out += [dict(where, ph="X", name=n, cat="stage", ts=us(s), dur=us(e) - us(s)) for n, s, e in p["stages"]]
        meta = []
        for i, (pid, name) in enumerate(sorted(names.items(), key=lambda kv: kv[0] != self.main_pid)):
            meta += [{"ph": "M", "name": "process_name", "pid": pid, "tid": pid, "args": {"name": name}},
                     {"ph": "M", "name": "process_sort_index", "pid": pid, "tid": pid, "args": {"sort_index": i}},
                     {"ph": "M", "name": "thread_name", "pid": pid, "tid": pid,
                      "args": {"name": "training loop" if pid == self.main_pid else "batches"}}]
        return meta + out

    def write_now_and_then(self) -> None:
        """Write at the first epoch's end, then at most every WRITE_EVERY_S; the write shows as a span."""
        start = _spans._now()
        if self.path is None or self._written is not None and start - self._written < WRITE_EVERY_S * 1e9:
            return
        self.write()
        self._written = _spans._now()
        self.span("trace write", start, self._written)

    def write(self) -> str | None:
        """Write the ring as trace-event JSON (atomically); returns the path (None: no file asked for)."""
        if self.path is None:
            return None
        doc = {"traceEvents": self.events(), "displayTimeUnit": "ms",
               "otherData": {"rank": self.rank, "world_size": self.world_size, "steps": len(self._ring),
                             "shares": self.shares()}}
        atomic_write(self.path, json.dumps(doc, separators=(",", ":")) + "\n")
        return self.path


def merge(paths, out: str) -> str:
    """One trace of several ranks' files: each rank's processes keep their names, prefixed 'rank r'.
    Pids may repeat across machines, so each becomes rank * 10**7 + pid (Linux pids stay below 2**22)."""
    events = []
    for path in paths:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
        rank = int(doc.get("otherData", {}).get("rank", 0))
        for e in doc["traceEvents"]:
            e = dict(e, pid=rank * 10**7 + e["pid"], tid=rank * 10**7 + e["tid"])
            if e.get("name") == "process_name" and e["ph"] == "M":
                e["args"] = {"name": re.sub(r"^(?!main)", f"rank {rank} ", e["args"]["name"])}
            events.append(e)
    atomic_write(out, json.dumps({"traceEvents": events, "displayTimeUnit": "ms"}, separators=(",", ":")) + "\n")
    return out


def shares_line(shares: dict) -> str:
    """'loader stages (last 300 steps, 150 batches): decode 61% of the workers' time, read 20%, ...'"""
    loader = shares.get("loader") or {}
    if not loader:
        return f"loader stages: no batch spans in the last {shares.get('steps', 0)} steps"
    parts = [f"{name} {pct:.0f}%" for name, pct in loader.items() if pct >= 0.5]
    parts[0] += " of the workers' time"
    line = f"loader stages (last {shares['steps']} steps, {shares['batches']} batches): " + ", ".join(parts)
    wait = [f"{name} {pct:.0f}%" for name, pct in (shares.get("wait") or {}).items() if pct >= 0.5]
    return line + ("; the loop's wait was held by " + ", ".join(wait) if wait else "")


def start_trace(path, steps: int, rank: int, world_size: int) -> Trace:
    """A Trace to `path` (per rank), with the spans turned on here and in workers started from now:
    a loader whose workers already run traces its main process only."""
    trace = Trace(path, steps, rank, world_size)
    _spans.enable(trace)
    return trace


def stop_trace() -> None:
    """Spans off again (workers started from now record none)."""
    _spans.disable()
