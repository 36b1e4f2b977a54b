"""`shardkit plan`: a probe and a prediction on a raw folder, built datasets (tar and Parquet, raw
and JPEG) and an http:// dataset; bad arguments are one line and exit 2."""

from __future__ import annotations

import json
import pathlib

import pytest
from click.testing import CliRunner

from shardkit.cli import main


def plan(*args):
    return CliRunner().invoke(main, ["plan", *args], catch_exceptions=False)


def _check(result, out, feeds=None):
    assert result.exit_code == 0, result.output
    with open(out / "plan.json", encoding="utf-8") as f:
        doc = json.load(f)
    assert (out / "plan.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert doc["probe"]["probe_s"] < 30 and doc["probe"]["worker_s"] > 0
    curve = doc["curves"]["as stored"]
    assert [w for w, _ in curve] == list(range(0, doc["probe"]["cores"] + 1)) and all(r > 0 for _, r in curve)
    assert "predicted samples/s by workers" in result.output and len(result.output.splitlines()) <= 25
    if feeds is not None:
        assert doc["feeds"] is feeds
    return doc


@pytest.mark.parametrize("fmt, fields", [("tar", ("raw", "cls")), ("parquet", ("raw", "cls")),
                                          ("tar", ("jpg", "cls")), ("parquet", ("jpg", "cls"))])
def test_plan_on_built_datasets(tmp_path, fmt, fields):
    from factory import make_dataset

    root, _ = make_dataset(tmp_path / "ds", 96, shards=2, fmt=fmt, fields=fields, size=(32, 32))
    doc = _check(plan(root, "--rate", "1", "--batch", "8", "--out", str(tmp_path / "p")), tmp_path / "p", feeds=True)
    image = fields[0]
    assert doc["probe"]["fields"][image]["encoding"] == ("raw" if image == "raw" else "jpeg")
    if image == "jpg":  # the factory stores quality 90: found from the stored tables, priced against 75
        q = doc["probe"]["fields"][image]["requality"]
        assert q["quality"] == 75 and q["from"] == 90 and 0 < q["decode"] <= 1 and q["bytes"] > 0, q
    # An unreachable target: not fed, and the changes say what each would give and cost
    doc = _check(plan(root, "--rate", "1e9", "--batch", "8", "--out", str(tmp_path / "q")), tmp_path / "q", feeds=False)
    names = [c["change"] for c in doc["changes"]]
    if image == "jpg":
        assert any("raw uint8" in n for n in names) and "raw uint8" in doc["curves"]
        assert all(c["rate"] > 0 and c["cost"] for c in doc["changes"])


def test_a_planted_slow_decode_makes_raw_the_change_that_feeds(tmp_path, monkeypatch):
    import time

    from factory import make_dataset

    from shardkit.reader import decode

    plain = decode.column

    def slow(spec, values, *args, **kwargs):  # 2 ms more per image decoded: the decode is what holds
        if spec.get("kind") == "image":
            time.sleep(0.002 * len(values))
        return plain(spec, values, *args, **kwargs)

    monkeypatch.setattr(decode, "column", slow)
    root, _ = make_dataset(tmp_path / "ds", 96, shards=2, fields=("jpg", "cls"), size=(32, 32))
    result = plan(root, "--rate", "900", "--batch", "8", "--workers", "1", "--out", str(tmp_path / "p"))
    doc = _check(result, tmp_path / "p", feeds=False)
    assert doc["probe"]["fields"]["jpg"]["decode_s"] > 0.0015
    # Raw uint8 takes the decode away: at one worker it predicts several times the stored rate, and it
    # feeds. Whether a second worker alone would feed 900/s depends on this machine's speed (2 ms of
    # sleep per image caps a worker near 450/s); where it does, that cheaper change comes first.
    one = {name: dict(curve)[1] for name, curve in doc["curves"].items()}
    assert one["raw uint8"] > 2 * one["as stored"], one
    raw = [c for c in doc["changes"] if "raw uint8" in c["change"]]
    assert raw and raw[0]["feeds"], doc["changes"]
    first = doc["changes"][0]
    assert first["feeds"] and (first is raw[0] or first["change"].startswith("num_workers=")), doc["changes"]


def test_plan_on_a_raw_folder(tmp_path):
    from shardkit.demo.datagen import raw_folder

    raw_folder(str(tmp_path / "raw"), images_per_class=4, documents=1, bad=False, seed=0)
    doc = _check(plan(str(tmp_path / "raw"), "--step-ms", "1", "--batch", "1000", "--image-size", "32",
                      "--out", str(tmp_path / "p")), tmp_path / "p", feeds=False)
    assert doc["probe"]["kind"] == "folder" and any("build raw uint8 shards" in c["change"] for c in doc["changes"])


def test_plan_on_an_http_dataset(tmp_path):
    from factory import make_dataset
    from throttled import CHUNK, Store

    root, _ = make_dataset(tmp_path / "ds", 64, shards=1, fields=("jpg", "cls"), size=(32, 32))
    rate = 3e5  # the pacing (~0.4 s for the shard) outweighs the round trips' noise (~0.1 s under load)
    store = Store(root, latency=0.3, rate=rate)  # a far store: the network bounds the rate
    try:
        doc = _check(plan(store.url, "--rate", "1e9", "--batch", "8", "--out", str(tmp_path / "p")), tmp_path / "p")
    finally:
        store.close()
    p = doc["probe"]
    # the store sleeps 0.3 s before a body and paces it at `rate` before each chunk but the first: the
    # whole shard cannot come sooner than its paced chunks allow, so the probe sees at most `ceiling`
    # (the factor 2 is for the two round trips' noise; the bounds the other way are wide: a loaded
    # machine measures a slower store)
    size = (pathlib.Path(root) / "shards" / "data-00000.tar").stat().st_size
    paced = (size - 1) // CHUNK * CHUNK
    assert paced >= 2 * CHUNK  # a body of a few paced chunks, not one sent at once
    ceiling = size / (paced / rate)
    assert p["remote"] and 0.25 < p["rtt_s"] < 10.0 and 0.02e6 < p["conn_bytes_per_s"] < 2 * ceiling
    assert any("local cache" in c["change"] for c in doc["changes"])


def test_plan_on_an_http_server_that_ignores_range(tmp_path):
    """The standard library's server sends whole files to Range requests: the probe times the store
    with whole reads (the reader reads whole shards there too)."""
    import functools
    import http.server
    import threading

    from factory import make_dataset

    root, _ = make_dataset(tmp_path / "ds", 16, shards=1, fields=("jpg", "cls"), size=(32, 32))
    handler = functools.partial(type("Quiet", (http.server.SimpleHTTPRequestHandler,),
                                     {"log_message": lambda *a: None}), directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        doc = _check(plan(f"http://127.0.0.1:{server.server_address[1]}", "--rate", "1e9", "--batch", "8",
                          "--out", str(tmp_path / "p")), tmp_path / "p")
    finally:
        server.shutdown()
        server.server_close()
    assert doc["probe"]["remote"] and doc["probe"]["rtt_s"] > 0 and doc["probe"]["conn_bytes_per_s"] > 0


@pytest.mark.parametrize("args, message", [
    (["{ds}"], "no target"),
    (["{ds}", "--rate", "100", "--fields", "nope"], "unknown field 'nope'"),
    (["{tmp}/missing", "--rate", "100"], "no such dataset"),
    (["{ds}", "--rate", "-1"], "--rate"),
])
def test_bad_arguments_are_one_line_and_exit_2(tmp_path, args, message):
    from factory import make_dataset

    root, _ = make_dataset(tmp_path / "ds", 8, shards=1, fields=("raw", "cls"))
    result = CliRunner().invoke(main, ["plan", *[a.format(ds=root, tmp=tmp_path) for a in args]])
    assert result.exit_code == 2 and message in result.output
    assert len(result.output.strip().splitlines()) == 1 and "Traceback" not in result.output


def test_the_meter_holds_the_run_to_its_plan(tmp_path, monkeypatch):
    import time

    from factory import make_dataset

    from shardkit.loader import make_loader
    from shardkit.meter import StarvationMeter
    from shardkit.plan import PlanConfig, make_plan
    from shardkit.reader import decode, spans
    from shardkit.reader.dataset import StreamingDataset

    root, _ = make_dataset(tmp_path / "ds", 96, shards=2, fields=("jpg", "cls"), size=(32, 32))
    make_plan(PlanConfig(root, rate=100, batch=8, workers=0, out=str(tmp_path / "p")))
    plain = decode.column

    def slow(spec, values, *args, **kwargs):  # the run decodes 3 ms a sample slower than the probe saw
        if spec.get("kind") == "image":
            time.sleep(0.003 * len(values))
        return plain(spec, values, *args, **kwargs)

    monkeypatch.setattr(decode, "column", slow)
    try:
        meter = StarvationMeter(warmup=1, log_every=0, plan=str(tmp_path / "p" / "plan.json"), gpu_hour_price=2.5)
        for _ in meter.wrap(make_loader(StreamingDataset(root, fields=["jpg", "cls"]), batch_size=8, num_workers=0)):
            time.sleep(0.001)
        s = meter.summary()
    finally:
        spans.disable()
    assert s["plan"]["stages"]["decode"]["ratio"] > 2 and "trace" not in s  # no file without trace=
    assert "decode is" in s["plan"]["line"] and "slower than planned" in s["plan"]["line"]
    assert "$" in s["plan"]["line"] and s["plan"]["line"] in meter.report()


def test_a_missing_or_foreign_plan_says_how_to_make_one(tmp_path):
    from shardkit.errors import ConfigError
    from shardkit.meter import StarvationMeter

    with pytest.raises(ConfigError, match="shardkit plan"):
        StarvationMeter(plan=str(tmp_path / "nope.json"))
    (tmp_path / "x.json").write_text("{}")
    with pytest.raises(ConfigError, match="not a plan"):
        StarvationMeter(plan=str(tmp_path / "x.json"))


def _probe(**kw):
    from shardkit.plan.probe import Probe

    base = dict(src="http://x/ds", kind="dataset", samples=6000, cores=2, free_cores=2.0, worker_s=1 / 3000,
                bytes_per_sample=11_000, shard_bytes=5.5e6, remote=True, rtt_s=0.05, conn_bytes_per_s=25e6,
                connections=8, block_samples=16384)
    base.update(kw)
    return Probe(**base)


def test_a_cold_remote_epoch_waits_for_its_first_shuffle_blocks_shards():
    from shardkit.plan.model import rate

    small = _probe()  # one block: the whole dataset's 66 MB over 8 connections of 25 MB/s before it streams
    fill = 0.05 + 6000 * 11_000 / (8 * 25e6)
    assert rate(small, 1) == pytest.approx(6000 / (6000 / 3000 + fill))
    assert rate(small, 1) < 3000 * 0.9
    big = _probe(samples=100_000_000)  # many blocks: the fill is lost in the epoch
    assert rate(big, 1) == pytest.approx(3000, rel=1e-3)
    assert rate(small, 1, net=False) == pytest.approx(3000)  # a local cache: no fill
    assert rate(_probe(remote=False), 1) == pytest.approx(3000)
    # network-bound and one block: the block's fetch is the fill, not paid again at the network's rate
    slow = _probe(samples=16384, bytes_per_sample=110_000)
    fill = 0.05 + 16384 * 110_000 / (8 * 25e6)
    assert rate(slow, 1) == pytest.approx(16384 / (fill + 16384 / 3000))
    # unshuffled (or not known): one shard's samples are the first fetch
    assert rate(_probe(block_samples=0), 1) == pytest.approx(6000 / (0.05 + 5.5e6 / (8 * 25e6) + 500 / 3000
                                                                     + 5500 / 3000), rel=1e-3)


def test_free_cores_count_niced_work_as_free_and_busy_work_as_taken(monkeypatch):
    from shardkit.plan import probe

    monkeypatch.setattr(probe.time, "sleep", lambda s: None)

    def times(*deltas):  # per CPU of this process's set: user nice system idle iowait irq softirq steal
        it = iter([{i: [0] * 8 for i in range(len(deltas))}, dict(enumerate(deltas))])
        return lambda: next(it)
    monkeypatch.setattr(probe, "_cpu_times", times([0, 95, 0, 5, 0, 0, 0, 0], [0, 95, 0, 5, 0, 0, 0, 0]))
    assert probe.free_cores(2) == 2.0  # a niced suite on both cores
    monkeypatch.setattr(probe, "_cpu_times", times([100, 0, 0, 0, 0, 0, 0, 0], [0, 0, 0, 100, 0, 0, 0, 0]))
    assert probe.free_cores(2) == pytest.approx(1.0)  # one core busy
    monkeypatch.setattr(probe, "_cpu_times", times([25, 0, 25, 50, 0, 0, 0, 0], [0, 0, 0, 100, 0, 0, 0, 0]))
    assert probe.free_cores(2) == pytest.approx(1.5)  # half a core
    monkeypatch.setattr(probe, "_cpu_times", lambda: None)  # no /proc/stat: the load average
    monkeypatch.setattr(probe.os, "getloadavg", lambda: (1.5, 0, 0))
    assert probe.free_cores(2) == pytest.approx(1.5)


def test_free_cores_read_only_the_cpus_this_process_may_run_on(monkeypatch, tmp_path):
    """A 2-CPU set on a 4-CPU machine whose other 2 CPUs are busy: both of ours are free."""
    from shardkit.plan import probe

    stats = iter(["cpu  0 0 0 0 0 0 0 0\ncpu0 0 0 0 0 0 0 0 0\ncpu1 0 0 0 0 0 0 0 0\ncpu2 0 0 0 0 0 0 0 0\n"
                  "cpu3 0 0 0 0 0 0 0 0\nintr 1\n",
                  "cpu  200 0 0 200 0 0 0 0\ncpu0 0 0 0 100 0 0 0 0\ncpu1 0 0 0 100 0 0 0 0\n"
                  "cpu2 100 0 0 0 0 0 0 0\ncpu3 100 0 0 0 0 0 0 0\nintr 1\n"])
    real_open = open

    def fake_open(path, *a, **k):
        if path == "/proc/stat":
            f = tmp_path / "stat"
            f.write_text(next(stats))
            return real_open(f, *a, **k)
        return real_open(path, *a, **k)
    monkeypatch.setattr("builtins.open", fake_open)
    monkeypatch.setattr(probe.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    monkeypatch.setattr(probe.time, "sleep", lambda s: None)
    assert probe.free_cores(2) == 2.0


def test_a_lower_jpeg_quality_is_offered_at_the_decode_time_the_probe_measured():
    from shardkit.plan.model import changes, rate

    fields = {"jpg": {"kind": "image", "encoding": "jpeg", "read_s": 0.1e-3, "decode_s": 0.9e-3,
                      "requality": {"quality": 75, "from": 95, "decode": 0.6, "bytes": 0.4}}}
    probe = _probe(remote=False, worker_s=1e-3, fields=fields)
    offered = {c["change"]: c for c in changes(probe, 1e6, 1)}
    [name] = [n for n in offered if "quality 75" in n]
    assert "--quality 75" in name and "0.40x the image bytes" in offered[name]["cost"]
    # the decode (0.9 of the worker's time) at 0.6 of its cost: u = 1 - 0.9 * 0.4 = 0.64 ms
    assert offered[name]["rate"] == pytest.approx(rate(probe, 1, 0.64e-3))
    fields["jpg"]["requality"]["decode"] = 0.99  # no faster to decode: not offered
    assert not any("quality" in c["change"] for c in changes(probe, 1e6, 1))


def test_a_stored_quality_not_tried_is_named_by_the_nearest_in_size(monkeypatch):
    """JPEGs stored at quality 92 carry tables none of the tried qualities do: the change still names
    a stored quality (the re-encode closest in size), never None."""
    import io

    import numpy as np
    from PIL import Image

    from shardkit.plan import probe

    rng = np.random.default_rng(0)
    images = [Image.fromarray(rng.integers(0, 255, (64, 64, 3), np.uint8)) for _ in range(4)]
    blobs = []
    for im in images:
        buf = io.BytesIO()
        im.save(buf, "JPEG", quality=92)
        blobs.append(buf.getvalue())
    monkeypatch.setattr(probe, "_probe_images", lambda ds, name: (blobs, images))
    q = probe._requality(None, "jpg", 0.0)
    assert q is not None and q["from"] in (90, 95) and q["quality"] == 75 and 0 < q["decode"] <= 1, q
