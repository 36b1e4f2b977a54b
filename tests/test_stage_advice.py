"""The advice names the stage that holds the step (from the trace), knows a tiny dataset's epoch
restarts, and never asks for smaller images when they are already small."""

from __future__ import annotations

import pytest

from shardkit.meter import DataProfile, advice
from shardkit.meter.stages import wait_holders
from shardkit.reader import spans


@pytest.fixture(autouse=True)
def spans_off():
    yield
    spans.disable()


def figures(**extra) -> dict:
    base = {"starved_pct": 40.0, "steps": 100, "wait_p50_ms": 8.0, "wait_p95_ms": 12.0, "step_p50_ms": 30.0,
            "steady_wait_p95_ms": 12.0, "wait_s": 1.0, "step_s": 1.5, "worker_cpu_cores": 1.9}
    return dict(base, **extra)


def test_small_decoded_images_are_never_told_to_get_smaller():
    small = advice(figures(), num_workers=2, cpus=2, data=DataProfile("raw", (64, 64)))
    large = advice(figures(), num_workers=2, cpus=2, data=DataProfile("raw", (224, 224)))
    assert "--image-size" not in small and "fields=" in small
    assert "--image-size" in large


def test_a_tiny_datasets_epoch_restarts_are_recognised():
    line = advice(figures(steps=40, warmup_steps=8, epochs=8, epoch_start_wait_pct=49.0, steady_starved_pct=15.0),
                  num_workers=2, cpus=2, data=DataProfile("raw", (64, 64)))
    assert line.startswith("the dataset is too small to judge") and "8 epochs" in line
    assert "--image-size" not in line
    # Long epochs: the same share of epoch-start waiting is a note on a real lever, not a verdict.
    long = advice(figures(steps=400, epochs=2, epoch_start_wait_pct=49.0, steady_starved_pct=15.0),
                  num_workers=2, cpus=2, data=DataProfile("raw", (64, 64)))
    assert "too small" not in long


@pytest.mark.parametrize("stage, images, lever", [
    ("decode", "encoded", "--encode raw"),
    ("hand-off", "raw", "shared slots"),
    ("network wait", "encoded", "fetch_ahead"),
    ("transforms", "raw", "batch_transform"),
])
def test_a_traced_run_is_told_the_lever_of_the_stage_that_holds_its_wait(stage, images, lever):
    stages = {"wait": {stage: 70.0, "epoch start": 30.0}}
    line = advice(figures(stages=stages), num_workers=2, cpus=2, data=DataProfile(images, (64, 64)))
    assert f"held by {stage} (70%" in line and lever in line


def test_wait_holders_splits_each_wait_by_what_its_batch_was_doing():
    ms = 1_000_000
    batch = {"start": 0, "end": 10 * ms, "stages": [("read", 0, 2 * ms), ("decode", 2 * ms, 10 * ms)]}
    ring = [
        (0, 0, 5 * ms, 6 * ms, 4, [("epoch start", 0, 0)]),  # an epoch's first wait: all of it
        # asked at 4 ms, the batch ready at 10 ms (decoding since 2), arrived at 12 ms: 6 decode, 2 hand-off
        (1, 4 * ms, 12 * ms, 13 * ms, 4, [batch]),
    ]
    held = wait_holders(ring)
    assert held == pytest.approx({"decode": 6 / 13 * 100, "epoch start": 5 / 13 * 100, "hand-off": 2 / 13 * 100})


def test_the_demo_names_what_holds_its_step_not_a_smaller_image(tmp_path, capsys):
    from factory import make_dataset

    from shardkit import demo

    root, _ = make_dataset(tmp_path / "out", 167, shards=1, fields=("raw", "cls"), size=(64, 64))
    summary = demo.run(root)
    report = capsys.readouterr().out
    assert "--image-size" not in report
    assert "wait was held by" in report  # the stage that holds the step, whatever the band
    assert summary["stages"]["wait"] and (tmp_path / "demo.trace.json").exists()


def test_all_ranks_names_the_straggler_and_its_worst_stage(tmp_path):
    import json
    import os
    import subprocess
    import sys

    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.dirname(here), os.environ.get("PYTHONPATH", "")]))
    env.pop("RANK", None), env.pop("WORLD_SIZE", None)
    procs = [subprocess.Popen([sys.executable, os.path.join(here, "rank_meter.py"), str(r), str(tmp_path / "store"),
                               str(tmp_path), here], env=env) for r in (0, 1)]
    try:
        assert [p.wait(timeout=120) for p in procs] == [0, 0]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    with open(tmp_path / "all.json", encoding="utf-8") as f:
        result = json.load(f)
    assert result["straggler_rank"] == 1 and result["straggler_stage"] == "decode"
    assert result["straggler_wait_x_median"] > 1 and result["straggler"].startswith("rank 1 waits")
    assert (tmp_path / "run.rank0.trace.json").exists() and (tmp_path / "run.rank1.trace.json").exists()
