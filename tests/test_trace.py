"""The pipeline trace: valid trace-event JSON, nested spans that cover their wall time, a bounded
size, the planted slow stage named, and nothing recorded when it is off."""

from __future__ import annotations

import json
import time

import pytest

from shardkit.meter import StarvationMeter
from shardkit.meter import trace as trace_mod
from shardkit.reader import decode, spans


@pytest.fixture(autouse=True)
def spans_off():
    yield
    spans.disable()  # a meter that traced leaves the spans on for workers started later


def _run(root, path, *, workers=0, epochs=1, steps=300, step_s=0.0, transform=None):
    from shardkit.loader import make_loader
    from shardkit.reader.dataset import StreamingDataset

    meter = StarvationMeter(warmup=1, log_every=0, trace=str(path), trace_steps=steps)
    ds = StreamingDataset(str(root), fields=["jpg", "cls"], transform=transform)
    loader = make_loader(ds, batch_size=4, num_workers=workers, multiprocessing_context="fork" if workers else None)
    try:
        for _ in range(epochs):
            for batch in meter.wrap(loader):
                assert spans.KEY not in batch  # the spans never reach the training loop
                with trace_mod.span("copy"):
                    time.sleep(step_s)
    finally:
        if workers:
            loader.close()
    return meter


def _load(path) -> list:
    with open(path, encoding="utf-8") as f:
        doc = json.load(f)
    assert set(doc) >= {"traceEvents", "displayTimeUnit"}
    for e in doc["traceEvents"]:
        assert e["ph"] in ("X", "M") and isinstance(e["pid"], int) and isinstance(e["tid"], int)
        if e["ph"] == "X":
            assert e["dur"] >= 0 and e["ts"] >= 0 and isinstance(e["name"], str)
    return doc["traceEvents"]


def _by_pid(events) -> dict:
    out: dict = {}
    for e in events:
        if e["ph"] == "X":
            out.setdefault(e["pid"], []).append(e)
    return out


def _inside(inner, outer, slack_us=1.0) -> bool:
    return outer["ts"] - slack_us <= inner["ts"] and inner["ts"] + inner["dur"] <= outer["ts"] + outer["dur"] + slack_us


@pytest.fixture
def dataset(tmp_path):
    from factory import make_dataset

    root, _ = make_dataset(tmp_path / "ds", 64, shards=4, fields=("jpg", "cls"), size=(32, 32))
    return root


@pytest.mark.parametrize("workers", [0, 2])
def test_trace_is_valid_nested_and_covers_its_wall_time(dataset, tmp_path, workers):
    meter = _run(dataset, tmp_path / "run.trace.json", workers=workers, epochs=2, step_s=0.002)
    s = meter.summary()
    events = _load(s["trace"])
    names = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert "main (rank 0)" in names.values()
    if workers:
        assert {"loader worker 0", "loader worker 1"} <= set(names.values())
    per = _by_pid(events)
    assert set(per) == set(names)
    for pid, evs in per.items():
        batches = [e for e in evs if e["name"] == "batch"]
        stages = [e for e in evs if e.get("cat") == "stage"]
        builds = workers == 0 or "main" not in names[pid]  # with workers, the main process builds no batch
        assert bool(batches) == builds and all(e["args"]["samples"] > 0 and e["args"]["shards"] for e in batches)
        for st in stages:  # every stage span lies inside one batch span of its process
            assert any(_inside(st, b) for b in batches)
        # The stages of the batches sum to the batches' wall time (within 5%)
        assert sum(e["dur"] for e in stages) == pytest.approx(sum(b["dur"] for b in batches), rel=0.05)
        if "main" in names[pid]:
            waits = [e for e in evs if e["name"] == "wait"]
            steps = [e for e in evs if e["name"] == "step"]
            top = waits + steps + [e for e in evs if e["name"] in ("epoch start", "epoch end", "trace write")]
            covered = max(e["ts"] + e["dur"] for e in steps) - min(e["ts"] for e in top)
            assert sum(e["dur"] for e in top) == pytest.approx(covered, rel=0.05)
            for e in evs:
                if e["name"] in ("unpack", "batch"):
                    assert any(_inside(e, w) for w in waits)
                if e["name"] == "copy":
                    assert any(_inside(e, st) for st in steps)
    assert set(s["stages"]["loader"]) >= {"read", "decode"}
    assert sum(s["stages"]["loader"].values()) == pytest.approx(100.0, abs=0.5)
    assert "of the workers' time" in meter.report()


def test_trace_size_is_bounded_whatever_the_runs_length(dataset, tmp_path):
    short = _run(dataset, tmp_path / "a.trace.json", epochs=1, steps=8).summary()
    long = _run(dataset, tmp_path / "b.trace.json", epochs=4, steps=8).summary()
    assert short["stages"]["steps"] == long["stages"]["steps"] == 8
    a, b = (len(_load(s["trace"])) for s in (short, long))
    assert a == b


def test_a_planted_slow_decode_is_the_stage_the_trace_and_summary_name(dataset, tmp_path, monkeypatch):
    plain = decode.column

    def slow(*args, **kwargs):  # the test hook: every decode takes 20 ms longer (forked workers inherit it)
        time.sleep(0.02)
        return plain(*args, **kwargs)

    monkeypatch.setattr(decode, "column", slow)
    meter = _run(dataset, tmp_path / "slow.trace.json", workers=1)
    s = meter.summary()
    assert s["stages"]["slowest_stage"] == "decode" and s["stages"]["loader"]["decode"] > 50
    assert "decode" in meter.report().split("loader stages")[1].split(":")[1].split(",")[0]
    per_stage: dict = {}
    for e in _load(s["trace"]):
        if e.get("cat") == "stage":
            per_stage[e["name"]] = per_stage.get(e["name"], 0) + e["dur"]
    assert max(per_stage, key=per_stage.get) == "decode"


def test_a_transform_shows_as_its_own_stage(dataset, tmp_path):
    def transform(sample):
        time.sleep(0.005)
        return sample

    s = _run(dataset, tmp_path / "t.trace.json", transform=transform).summary()
    assert s["stages"]["slowest_stage"] == "transforms" and "collate" in s["stages"]["loader"]


def test_the_meters_own_copy_is_a_copy_span(dataset, tmp_path):
    """wrap(loader, to=device) moves each batch through the meter: the trace shows that as the main
    process's "copy" span, the same time the transfer split counts."""
    from shardkit.loader import make_loader
    from shardkit.reader.dataset import StreamingDataset

    path = tmp_path / "c.trace.json"
    meter = StarvationMeter(warmup=1, log_every=0, trace=str(path))
    for _ in meter.wrap(make_loader(StreamingDataset(str(dataset), fields=["jpg", "cls"]), batch_size=4), to="cpu"):
        pass
    meter.summary()
    steps = sum(1 for e in _load(path) if e["ph"] == "X" and e["name"] == "step")
    copies = [e for e in _load(path) if e["ph"] == "X" and e["name"] == "copy"]
    assert copies and len(copies) >= steps - 1


def test_off_records_nothing_and_hands_batches_back_untouched(dataset, tmp_path):
    from shardkit.loader import make_loader
    from shardkit.reader.dataset import StreamingDataset

    assert not spans.ON
    batches = iter([{"a": 1}])
    assert spans.traced(batches, None, True, 0) is batches  # the fast path: not even a wrapper
    assert isinstance(spans.within("decode"), type(spans.within("read")))
    meter = StarvationMeter(warmup=0, log_every=0)
    loader = make_loader(StreamingDataset(str(dataset), fields=["jpg", "cls"]), batch_size=4, num_workers=0)
    for batch in meter.wrap(loader):
        assert spans.KEY not in batch
    assert "stages" not in meter.summary() and not list(tmp_path.glob("*.trace.json"))


def test_rank_files_and_merge(tmp_path, monkeypatch):
    assert trace_mod.rank_path("run.trace.json", 3, 8) == "run.rank3.trace.json"
    assert trace_mod.rank_path("run.json", 1, 2) == "run.rank1.json"
    assert trace_mod.rank_path("run.trace.json", 0, 1) == "run.trace.json"
    paths = []
    for rank in (0, 1):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "2")
        meter = StarvationMeter(warmup=0, log_every=0, trace=str(tmp_path / "run.trace.json"))
        for _ in meter.wrap([[1, 2]] * 5):
            pass
        paths.append(meter.close_trace())
    assert [p.rsplit("/", 1)[1] for p in paths] == ["run.rank0.trace.json", "run.rank1.trace.json"]
    merged = _load(trace_mod.merge(paths, str(tmp_path / "all.trace.json")))
    assert len({e["pid"] for e in merged}) == 2  # the same pid in both files becomes two tracks


def test_bad_trace_steps_says_what_was_expected(tmp_path):
    from shardkit.errors import ConfigError

    with pytest.raises(ConfigError, match="trace_steps=0"):
        StarvationMeter(trace=str(tmp_path / "x.json"), trace_steps=0)
