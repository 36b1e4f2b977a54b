"""`shardkit bench` end to end on a tiny generated folder, plus its parts: schedule, checks, model step, plot."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from shardkit.cli import main

VARIANTS = ["raw-folder", "webdataset-tar", "shardkit-tar", "shardkit-parquet", "shardkit-raw"]
TINY = ["--images", "24", "--classes", "3", "--image-size", "32", "--batch-size", "4", "--warmup", "1",
        "--min-batches", "5", "--build-workers", "0", "--no-progress"]
METRICS = ("samples_per_s", "mb_per_s", "starved_pct", "first_batch_s", "peak_rss_bytes", "wait_p50_ms",
           "wait_p95_ms")


def bench(*args):
    result = CliRunner().invoke(main, ["bench", *args], catch_exceptions=False)
    return result


@pytest.fixture(scope="module")
def ran(tmp_path_factory):
    """One full tiny run shared by the tests that read its outputs."""
    root = tmp_path_factory.mktemp("bench")
    out, cache = root / "out", root / "cache"
    result = bench(*TINY, "--repeat", "2", "--workers", "0,1", "--out", str(out), "--cache-dir", str(cache))
    assert result.exit_code == 0, result.output
    with open(out / "bench.json", encoding="utf-8") as f:
        return {"out": out, "cache": cache, "output": result.output, "report": json.load(f)}


def test_every_variant_ran_on_the_same_samples(ran):
    r = ran["report"]
    assert r["schema"] == "shardkit.loaderbench/1"
    assert {"created", "machine", "config", "step", "data", "variants", "checks", "cells", "ratios", "best",
            "runs"} <= set(r)
    assert r["data"]["samples"] == 24 and r["data"]["classes"] == 3
    assert [(c["variant"], c["workers"]) for c in r["cells"]] == [(v, w) for v in VARIANTS for w in (0, 1)]
    assert len(r["runs"]) == len(VARIANTS) * 2 * 2
    for run in r["runs"]:
        assert run["samples"] == 24, run
        assert run["label_checksum"] == r["checks"]["label_checksum"], run
        assert run["measured_steps"] == 6 - 1 and run["warmup_steps"] == 1  # 24 / 4 batches, 1 left out
    assert r["checks"]["same_samples"] and not r["checks"]["mismatches"]


def test_cells_hold_medians_within_min_max_and_ratios(ran):
    from shardkit.meter import band

    r = ran["report"]
    for c in r["cells"]:
        assert c["repetitions"] == 2
        for m in METRICS:
            assert c[m]["min"] <= c[m]["median"] <= c[m]["max"], (c["variant"], m)
        assert c["samples_per_s"]["min"] > 0 and c["peak_rss_bytes"]["min"] > 0 and c["first_batch_s"]["min"] > 0
        assert 0 <= c["starved_pct"]["median"] <= 100
        assert c["band"] == band(c["starved_pct"]["median"]) and c["advice"]
        base = next(x for x in r["cells"] if x["variant"] == "raw-folder" and x["workers"] == c["workers"])
        want = c["samples_per_s"]["median"] / base["samples_per_s"]["median"]
        assert r["ratios"]["vs_raw_folder"][c["variant"]][str(c["workers"])] == pytest.approx(want)
    best = max(r["cells"], key=lambda c: c["samples_per_s"]["median"])
    assert (r["best"]["variant"], r["best"]["workers"]) == (best["variant"], best["workers"])
    fastest_wds = max(c["samples_per_s"]["median"] for c in r["cells"] if c["variant"] == "webdataset-tar")
    assert r["best"]["vs_webdataset"] == pytest.approx(best["samples_per_s"]["median"] / fastest_wds)


def test_table_and_plot_are_written(ran):
    out = ran["out"]
    table = (out / "bench.md").read_text(encoding="utf-8")
    assert table in ran["output"]
    for v in VARIANTS:
        assert f"| {v} | 0 |" in table and f"| {v} | 1 |" in table
    assert "best here:" in table and "meter advice:" in table and "same samples in every run: 24 samples" in table
    png = (out / "bench.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000


def test_rerun_reuses_the_cache(ran, tmp_path):
    generated = next(p for p in ran["cache"].iterdir() if p.name.startswith("generated-"))
    stamp = os.stat(generated / "raw" / "class_00" / "000000.jpg").st_mtime_ns
    result = bench(*TINY, "--repeat", "1", "--workers", "0", "--variants", "raw-folder,shardkit-raw",
                   "--out", str(tmp_path), "--cache-dir", str(ran["cache"]), "--no-plot")
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "bench.json").read_text(encoding="utf-8"))
    data = ran["report"]["data"]
    shard_ids = len(list((Path(data["jpeg_root"]) / "shards").glob("*.tar")))
    shard_ids += len(list((Path(data["raw_root"]) / "shards").glob("*.tar")))
    assert data["reused_shards"] == 0 and shard_ids > 2
    assert report["data"]["reused_shards"] == shard_ids  # nothing rebuilt: every shard came from the cache
    assert os.stat(generated / "raw" / "class_00" / "000000.jpg").st_mtime_ns == stamp
    assert [c["variant"] for c in report["cells"]] == ["raw-folder", "shardkit-raw"]
    assert not (tmp_path / "bench.png").exists()


def test_checks_catch_a_variant_that_read_other_samples(ran):
    from shardkit.loaderbench.summary import checks
    from shardkit.loaderbench.summary import label_checksum

    r = ran["report"]
    runs = [dict(run) for run in r["runs"]]
    runs[3].update(samples=23, label_checksum=label_checksum([8, 7, 8, 0]))  # one sample of class 1 lost

    class Data:
        samples, classes = 24, ("class_00", "class_01", "class_02")
        items = [("x", i % 3) for i in range(24)]

    got = checks(runs, Data)
    assert not got["same_samples"] and len(got["mismatches"]) == 1
    assert runs[3]["variant"] in got["mismatches"][0] and "23 samples" in got["mismatches"][0]
    assert checks(r["runs"], Data)["same_samples"]


def test_the_plot_needs_no_matplotlib(ran, monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    (tmp_path / "bench.json").write_bytes((ran["out"] / "bench.json").read_bytes())
    result = CliRunner().invoke(main, ["bench", "--plot-only", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_plot_shows_the_figures(ran):
    """Each cell's bar is drawn in its worker count's colour, and taller bars mean more samples/s."""
    from PIL import Image, ImageColor

    from shardkit.loaderbench import plot

    report = ran["report"]
    img = Image.open(ran["out"] / "bench.png").convert("RGB")
    assert img.size == plot.SIZE
    axis = plot.log_axis(report["cells"], plot.PANELS[0][1], plot.PANELS[0][3])
    drawn = plot.bars(report["cells"], "samples_per_s", axis, plot.PANELS[0], whiskers=True)
    assert len(drawn) == len(report["cells"]) == 10
    for bar, cell in zip(drawn, report["cells"]):
        x0, top, x1, bottom = bar.box
        assert img.getpixel((x0 + 2, (top + bottom) // 2 + 1)) == ImageColor.getrgb(bar.color), bar
        assert bar.whisker[0] <= top <= bar.whisker[1]  # the median lies within min-max
    by_speed = sorted(zip(drawn, report["cells"]), key=lambda p: p[1]["samples_per_s"]["median"])
    tops = [bar.box[1] for bar, _ in by_speed]
    assert tops == sorted(tops, reverse=True)  # faster: higher bar (smaller pixel row)


def test_plot_only_redraws_from_bench_json(ran, tmp_path):
    (tmp_path / "bench.json").write_bytes((ran["out"] / "bench.json").read_bytes())
    result = bench("--plot-only", "--out", str(tmp_path))
    assert result.exit_code == 0, result.output
    assert (tmp_path / "bench.png").read_bytes()[:4] == b"\x89PNG"


def test_schedule_interleaves_and_rotates():
    from shardkit.loaderbench.settings import BenchConfig
    from shardkit.loaderbench.runner import schedule

    cfg = BenchConfig(workers=(0, 2), repeat=3, cache_dir="unused")
    order = schedule(cfg)
    assert len(order) == 3 * 2 * 5
    reps = [rep for rep, _, _ in order]
    assert reps == sorted(reps)  # a repetition of every cell ends before the next begins
    firsts = [order[i][2] for i in range(0, len(order), 5)]
    assert firsts == ["raw-folder", "raw-folder", "webdataset-tar", "webdataset-tar", "shardkit-tar", "shardkit-tar"]
    for rep in range(3):
        assert sorted((w, v) for r, w, v in order if r == rep) == sorted((w, v) for w in (0, 2) for v in VARIANTS)


@pytest.mark.parametrize("args, message", [
    (["--gpu", "--step-ms", "5"], "--gpu runs a real model step"),
    (["--variants", "raw-folder,nope"], "['nope']; choose from raw-folder"),
    (["--workers", "0,-1"], "expected DataLoader worker counts >= 0"),
    (["--workers", "0,x"], "expected comma-separated worker counts"),
    (["--repeat", "0"], "repeat=0: expected a positive integer (--repeat)"),
])
def test_bad_flags_say_what_to_do(tmp_path, args, message):
    result = CliRunner().invoke(main, ["bench", *args, "--cache-dir", str(tmp_path)])
    assert result.exit_code != 0
    assert message in result.output


@pytest.mark.parametrize("images, workers", [(20, "0,1"), (1, "0")])
def test_a_small_folder_is_read_for_enough_epochs(tmp_path, images, workers):
    """Default batch 64 and warm-up 5: a 20-image folder is one batch per epoch, so every run reads
    25 epochs to measure 20 batches after the warm-up, and says so; one image works the same way."""
    from shardkit.demo.datagen import image_folder

    raw = tmp_path / "photos"
    image_folder(str(raw), n=images, classes=2, size=(64, 48))
    result = bench(str(raw), "--image-size", "32", "--build-workers", "0", "--no-progress", "--repeat", "1",
                   "--workers", workers, "--out", str(tmp_path / "out"), "--cache-dir", str(tmp_path / "cache"),
                   "--no-plot")
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "out" / "bench.json").read_text(encoding="utf-8"))
    assert report["data"]["samples"] == images and report["data"]["epochs_per_run"] == 25
    assert report["checks"]["same_samples"]
    for run in report["runs"]:
        assert (run["epochs"], run["samples"], run["warmup_steps"]) == (25, images, 5), run
        assert run["measured_steps"] >= 20 and run["samples_per_s"] > 0, run  # WebDataset: a batch per worker
    assert (f"{images} images make 1 batch of 64 per epoch: each run read 25 epochs, so that at least 20 "
            "batches were measured after the 5 warm-up ones") in result.output


def test_epochs_per_run():
    from shardkit.loaderbench.settings import BenchConfig

    cfg = BenchConfig(cache_dir="unused")  # batch 64, warmup 5, min_batches 20
    assert [cfg.epochs_per_run(n) for n in (1, 64, 65, 137, 1600, 3000)] == [25, 25, 13, 9, 1, 1]


def test_every_epoch_of_a_run_must_read_the_same_samples():
    from shardkit.loaderbench.runner import _read

    class Variant:
        @staticmethod
        def split(batch):
            return batch

    import torch

    from shardkit.meter import StarvationMeter

    epochs = iter([[0, 1, 1], [0, 1, 1], [0, 0, 1]])  # the third epoch read a class-0 sample twice

    class Loader:
        def __iter__(self):
            labels = next(epochs)
            return iter([(torch.zeros(len(labels)), torch.tensor(labels))])

    samples, checksum, _ = _read(Loader(), Variant, StarvationMeter(warmup=0, log_every=0), 3, lambda x, y: None, 2)
    assert checksum.startswith("epochs differ") and samples == 9


def test_gpu_flag_without_cuda_says_so(ran, tmp_path, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    result = CliRunner().invoke(main, ["bench", *TINY, "--gpu", "--workers", "0", "--out", str(tmp_path),
                                       "--cache-dir", str(ran["cache"])])
    assert result.exit_code == 1
    assert "--gpu needs a CUDA device and none is visible" in result.output


def test_model_step_trains_on_cpu():
    import torch

    from shardkit.loaderbench.model import ModelStep

    torch.manual_seed(0)
    step = ModelStep(num_classes=3, device="cpu", width=8)
    assert step.precision.name == "bf16" and step.scaler is None
    images = torch.randint(0, 256, (6, 3, 24, 24), dtype=torch.uint8)
    labels = torch.tensor([0, 1, 2, 0, 1, 2])
    before = [p.detach().clone() for p in step.model.parameters()]
    losses = [float(step(images, labels)) for _ in range(6)]
    assert all(torch.isfinite(torch.tensor(losses)))
    assert losses[-1] < losses[0]  # it learns the fixed batch: forward, backward and step all ran
    assert any(not torch.equal(a, b) for a, b in zip(before, step.model.parameters()))


def test_a_user_folder_with_a_bad_image_is_read_without_it(tmp_path):
    from shardkit.demo.datagen import image_folder

    raw = tmp_path / "raw"
    image_folder(str(raw), n=12, classes=2, size=(64, 48))
    good = (raw / "class_00" / "000000.jpg").read_bytes()
    (raw / "class_01" / "broken.jpg").write_bytes(good[: len(good) // 3])  # the build rejects it
    result = bench(str(raw), *TINY, "--repeat", "1", "--workers", "0", "--variants", "raw-folder,shardkit-tar",
                   "--out", str(tmp_path / "out"), "--cache-dir", str(tmp_path / "cache"), "--no-plot")
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "out" / "bench.json").read_text(encoding="utf-8"))
    assert report["data"]["samples"] == 12 and report["checks"]["same_samples"]
    assert [run["samples"] for run in report["runs"]] == [12, 12]


def test_a_folder_with_text_samples_is_refused(tmp_path):
    from shardkit.demo.datagen import image_folder

    raw = tmp_path / "raw"
    image_folder(str(raw), n=4, classes=2, size=(32, 24))
    (raw / "class_00" / "notes.txt").write_text("not an image", encoding="utf-8")
    result = CliRunner().invoke(main, ["bench", str(raw), *TINY, "--cache-dir", str(tmp_path / "cache")])
    assert result.exit_code == 1
    assert "1 samples without an image (e.g. class_00/notes.txt)" in result.output


def test_variants_yield_the_same_batches(ran):
    """Same samples, same order (0 workers, no shuffle), same layout; the JPEG variants decode the same bytes."""
    import torch

    from shardkit.loaderbench.settings import BenchConfig
    from shardkit.loaderbench.data import prepare
    from shardkit.loaderbench.loaders import VARIANTS

    cfg = BenchConfig(images=24, classes=3, image_size=32, build_workers=0, progress=False,
                      cache_dir=str(ran["cache"]))
    data = prepare(cfg)
    got = {}
    for name, v in VARIANTS.items():
        batches = [v.split(b) for b in v.loader(data, 0, 8, False)]
        got[name] = (torch.cat([x for x, _ in batches]), torch.cat([y for _, y in batches]))
    for name, (x, y) in got.items():
        assert x.shape == (24, 3, 32, 32) and x.dtype == torch.uint8, name
        assert torch.equal(y, got["shardkit-tar"][1]), name
    for name in ("webdataset-tar", "shardkit-parquet"):
        assert torch.equal(got[name][0], got["shardkit-tar"][0]), name
    diff = (got["shardkit-raw"][0].float() - got["shardkit-tar"][0].float()).abs().mean()
    assert diff < 8  # raw pixels vs their q90 JPEG: the same crops, up to compression error


def test_a_mixture_variant_reports_observed_against_target_proportions(ran, tmp_path):
    result = bench(*TINY, "--repeat", "1", "--workers", "0,1", "--variants", "shardkit-tar,shardkit-mix",
                   "--out", str(tmp_path), "--cache-dir", str(ran["cache"]), "--no-plot")
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "bench.json").read_text(encoding="utf-8"))
    assert report["checks"]["same_samples"], report["checks"]
    mixed = [c for c in report["cells"] if c["variant"] == "shardkit-mix"]
    assert len(mixed) == 2
    for c in mixed:  # 24 samples, half from each source: exactly on target
        assert {k: v["samples"] for k, v in c["mixture"].items()} == {"tar": 12, "parquet": 12}
        assert all(v["observed"] == v["target"] == 0.5 for v in c["mixture"].values())
    assert "shardkit-mix workers=1: mixture (observed / target): tar 50.0% / 50.0%, parquet 50.0% / 50.0%" \
        in result.output
    assert not any("mixture" in c for c in report["cells"] if c["variant"] == "shardkit-tar")


def test_checks_flag_a_mixture_off_its_targets():
    from types import SimpleNamespace

    from shardkit.loaderbench.summary import checks

    data = SimpleNamespace(samples=4, items=[("a", 0)] * 4, classes=["a"])
    run = {"variant": "shardkit-mix", "workers": 0, "repetition": 0, "samples": 4, "label_checksum": "x",
           "mixture": {"tar": {"observed": 0.75, "target": 0.5, "samples": 3},
                       "parquet": {"observed": 0.25, "target": 0.5, "samples": 1}}}
    result = checks([run], data)
    assert not result["same_samples"] and "tar 75.0% / 50.0%" in result["mismatches"][0]
    run["mixture"] = {k: dict(v, observed=0.5) for k, v in run["mixture"].items()}
    assert checks([run], data)["same_samples"]  # the label checksum is not a mixture's to match


def test_trace_writes_one_trace_per_variant_and_worker_count(tmp_path):
    from shardkit.reader import spans

    trace = tmp_path / "run.trace.json"
    try:
        result = bench(*TINY, "--repeat", "1", "--workers", "1", "--variants", "shardkit-tar", "--out",
                       str(tmp_path / "out"), "--cache-dir", str(tmp_path / "cache"), "--trace", str(trace))
    finally:
        spans.disable()
    assert result.exit_code == 0, result.output
    path = tmp_path / "run.shardkit-tar.w1.trace.json"
    with open(path, encoding="utf-8") as f:
        names = {e["args"]["name"] for e in json.load(f)["traceEvents"] if e["name"] == "process_name"}
    assert names == {"main (rank 0)", "loader worker 0"}
    with open(tmp_path / "out" / "bench.json", encoding="utf-8") as f:
        runs = [r for r in json.load(f)["runs"] if r["variant"] == "shardkit-tar"]
    assert runs and all("decode" in r["stages"] and r["trace"] == str(path) for r in runs)
