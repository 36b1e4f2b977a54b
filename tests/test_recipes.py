"""Recipes end to end: cached build, training, and SIGKILL + restart resuming exactly."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
IMAGE = ROOT / "pipelines" / "image_classification.py"
LM = ROOT / "pipelines" / "causal_lm.py"
# fp32 so that a resumed run can match an uninterrupted one; build in-process (no Dask cluster).
COMMON = ["--precision", "fp32", "--build-workers", "0", "--trace", "--eval-every", "4", "--ckpt-every", "4",
          "--patience", "100"]
IMAGE_ARGS = COMMON + ["--image-size", "16", "--batch-size", "16", "--accum-steps", "2", "--num-workers", "1",
                       "--max-steps", "20"]
# One intra-op thread: on a shared 2-core machine more threads only spin against each other.
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


@pytest.fixture(scope="module")
def raw_images(tmp_path_factory):
    from shardkit.demo import datagen

    root = tmp_path_factory.mktemp("raw") / "images"
    datagen.image_folder(str(root), n=240, classes=3, size=(24, 20), seed=1)
    return root


def run(script, *args, timeout=120):
    proc = subprocess.run([sys.executable, str(script), *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, env=ENV)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout, proc.stderr


def trace(run_dir):
    """The trace split by process start: [(resumed_from, [(step, micro, keys), ...]), ...]."""
    starts = []
    for line in (Path(run_dir) / "trace.jsonl").read_text().splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue  # the half line a SIGKILL can leave
        if rec.get("event") == "start":
            starts.append((rec["resumed_from"], []))
        elif rec.get("event") is None:
            starts[-1][1].append((rec["step"], rec["micro"], rec["keys"]))
    return starts


def final_weights(run_dir):
    return torch.load(Path(run_dir) / "final.pt", map_location="cpu")


def test_image_recipe_killed_and_restarted_matches_uninterrupted(raw_images, tmp_path):
    data = tmp_path / "data"
    _, first = run(IMAGE, raw_images, data, tmp_path / "a", *IMAGE_ARGS)
    assert "build skipped" not in first and (data / "train" / "manifest.json").exists()

    # A second run over the same data: killed with SIGKILL soon after its first checkpoint.
    b = tmp_path / "b"
    proc = subprocess.Popen([sys.executable, str(IMAGE), raw_images, data, b, *IMAGE_ARGS, "--step-delay-ms", "60"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT, env=ENV)
    try:
        deadline = time.monotonic() + 90
        while not list((b / "checkpoints").glob("step-*.pt")) and time.monotonic() < deadline:
            assert proc.poll() is None, "the run ended before its first checkpoint"
            time.sleep(0.02)
        time.sleep(0.1)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert not (b / "final.pt").exists(), "the run finished before the kill: raise --max-steps"

    report, resumed = run(IMAGE, raw_images, data, b, *IMAGE_ARGS)
    assert "build skipped" in resumed and "were spent waiting for data" in report  # the dataset is cached between runs

    (_, full), = trace(tmp_path / "a")
    (start0, killed), (resumed_from, after) = trace(b)
    assert start0 == 0 and resumed_from >= 4 and resumed_from % 4 == 0
    assert len(full) == 20 * 2  # 20 optimizer steps of 2 micro-batches
    # Before the kill the data order was the uninterrupted run's; after the restart it goes on
    # from the checkpoint with exactly the batches the uninterrupted run saw next.
    assert killed == full[: len(killed)]
    assert after == [r for r in full if r[0] > resumed_from]
    a_w, b_w = final_weights(tmp_path / "a"), final_weights(b)
    for name in a_w:
        torch.testing.assert_close(b_w[name], a_w[name], rtol=1e-5, atol=1e-6)
    meter = json.loads((b / "meter.json").read_text())
    assert meter["steps"] > 0 and "GPU-hours" in meter["cost"]


@pytest.fixture(scope="module")
def raw_texts(tmp_path_factory):
    import numpy as np

    from shardkit.demo import datagen

    root = tmp_path_factory.mktemp("raw") / "texts"
    root.mkdir()
    rng = np.random.default_rng(2)
    for i in range(120):
        (root / f"doc_{i:04d}.txt").write_text(datagen.words(rng, int(rng.integers(10, 40))))
    return root


def test_causal_lm_trains_and_resumes(raw_texts, tmp_path):
    args = COMMON + ["--block", "24", "--d-model", "32", "--heads", "2", "--layers", "1", "--batch-size", "8",
                     "--num-workers", "0", "--lr", "0.01"]
    run(LM, raw_texts, tmp_path / "data", tmp_path / "run", *args, "--max-steps", "6")
    out, err = run(LM, raw_texts, tmp_path / "data", tmp_path / "run", *args, "--max-steps", "12")
    assert "build skipped" in err
    (_, first), (resumed_from, second) = trace(tmp_path / "run")
    assert [r[0] for r in first] == list(range(1, 7))
    assert resumed_from == 6 and [r[0] for r in second] == list(range(7, 13))
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["step"] == 12 and summary["resumed_from"] == 6
    assert summary["best_val"] < 4.0  # well below uniform over bytes (ln 257 = 5.55): it learned


def test_causal_lm_on_a_tokenized_build(raw_texts, tmp_path):
    args = COMMON + ["--tokenizer", "bpe:300", "--block", "24", "--d-model", "32", "--heads", "2", "--layers", "1",
                     "--batch-size", "8", "--num-workers", "0", "--lr", "0.01", "--max-steps", "8"]
    out, _ = run(LM, raw_texts, tmp_path / "data", tmp_path / "run", *args)
    train, val = (json.loads((tmp_path / "data" / part / "manifest.json").read_text()) for part in ("train", "val"))
    assert train["fields"]["tokens"]["shape"] == [25]
    # The held-out split is encoded with the training split's tokenizer, not one of its own.
    assert val["tokenizer"]["sha256"] == train["tokenizer"]["sha256"] and val["tokenizer"]["source"] != "bpe:300"
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["step"] == 8 and summary["best_val"] < 5.0  # below uniform over 300 ids (ln 300 = 5.7)


def test_bad_flags_say_what_to_fix(raw_images, tmp_path):
    proc = subprocess.run([sys.executable, str(IMAGE), raw_images, tmp_path / "d", tmp_path / "r",
                           "--batch-size", "10", "--accum-steps", "4"],
                          capture_output=True, text=True, cwd=ROOT, env=ENV)
    assert proc.returncode != 0 and "not a multiple of --accum-steps 4" in proc.stderr


def test_image_recipe_on_a_mixed_folder(raw_folder, tmp_path):
    """The demo folder also holds text documents and bad files: only labelled images are trained on."""
    report, log = run(IMAGE, raw_folder, tmp_path / "data", tmp_path / "run", *COMMON, "--batch-size", "4",
                      "--max-steps", "6", "--num-workers", "0", "--val-pct", "20")
    keys = [k for _, records in trace(tmp_path / "run") for _, _, batch in records for k in batch]
    assert keys and all(k.split("/")[0] in ("bird", "cat", "dog") for k in keys)
    assert json.loads(report.strip().splitlines()[-1])["step"] == 6
    manifest = json.loads((tmp_path / "data" / "train" / "manifest.json").read_text())
    assert "txt" in manifest["fields"] and manifest["errors"]["count"] > 0  # documents and bad files were there


@pytest.mark.parametrize("script", [IMAGE, LM], ids=lambda p: p.stem)
def test_each_recipe_imports_only_installed_packages(script):
    """Copyable alone: no sys.path edits, no import of a sibling file of pipelines/."""
    import ast

    siblings = {p.stem for p in script.parent.glob("*.py")}
    tree = ast.parse(script.read_text(encoding="utf-8"))
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {(n.module or "").split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert not imported & siblings, f"{script.name} imports {imported & siblings} from pipelines/"
    assert "sys.path" not in script.read_text(encoding="utf-8")


def test_a_recipe_copied_alone_trains(raw_texts, tmp_path):
    alone = tmp_path / "mine"
    alone.mkdir()
    (alone / "lm.py").write_bytes(LM.read_bytes())
    args = COMMON + ["--block", "16", "--d-model", "16", "--heads", "2", "--layers", "1", "--batch-size", "8",
                     "--num-workers", "0", "--max-steps", "2"]
    out, _ = run(alone / "lm.py", raw_texts, tmp_path / "data", tmp_path / "run", *args)
    assert json.loads(out.strip().splitlines()[-1])["step"] == 2


STOP_ARGS = [*IMAGE_ARGS, "--ckpt-every", "100"]  # no periodic checkpoint: the stop writes the only one


@pytest.fixture(scope="module")
def uninterrupted(raw_images, tmp_path_factory):
    """The dataset, built once, and a run over it that nothing stops."""
    root = tmp_path_factory.mktemp("uninterrupted")
    run(IMAGE, raw_images, root / "data", root / "a", *STOP_ARGS)
    return root / "data", root / "a"


@pytest.mark.parametrize("signum,group", [(signal.SIGTERM, False), (signal.SIGUSR1, True), (signal.SIGTERM, True)],
                         ids=["sigterm", "sigusr1-to-the-group", "sigterm-to-the-group"])
def test_a_stop_signal_mid_epoch_saves_and_resumes_exactly(raw_images, uninterrupted, tmp_path, signum, group):
    """A preempted run (SIGTERM; SLURM's pre-timeout SIGUSR1, sent to every process of the job) finishes
    its step, checkpoints with the loader's position and exits 128 + signal within seconds; the rerun
    continues from that step: the samples before and after are the uninterrupted run's, exactly once."""
    data, a = uninterrupted
    args = STOP_ARGS
    b = tmp_path / "b"
    proc = subprocess.Popen([sys.executable, str(IMAGE), raw_images, data, b, *args, "--step-delay-ms", "60"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=ENV,
                            start_new_session=group)
    try:
        deadline = time.monotonic() + 90
        while len(trace_lines(b)) < 8 and time.monotonic() < deadline:  # a few steps into the epoch
            assert proc.poll() is None, proc.stderr.read()[-3000:]
            time.sleep(0.02)
        before = len(trace_lines(b))
        os.killpg(proc.pid, signum) if group else proc.send_signal(signum)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    name = signal.Signals(signum).name
    assert proc.returncode == 128 + signum, err[-3000:]
    # Promptly, counted in steps rather than seconds: after the signal the run finishes the step in
    # progress (or, had one just begun between the count and the signal, that one), and no other.
    after = {json.loads(line)["step"] for line in trace_lines(b)[before:] if '"event"' not in line}
    assert len(after) <= 2, sorted(after)
    assert f"stopped by {name}: step" in err and "rerun the same command to continue" in err
    assert not (b / "final.pt").exists(), "the run finished before the signal: raise --max-steps"

    run(IMAGE, raw_images, data, b, *args)
    (_, full), = trace(a)
    (_, stopped), (resumed_from, after) = trace(b)
    saved = [int(p.stem.split("-")[1]) for p in (b / "checkpoints").glob("step-*.pt")]
    assert 0 < resumed_from < 20 and resumed_from in saved
    assert stopped == full[: len(stopped)] and stopped[-1][0] == resumed_from  # stopped after a whole step
    assert stopped + after == full  # every micro-batch once, in the uninterrupted order
    a_w, b_w = final_weights(a), final_weights(b)
    for key in a_w:
        torch.testing.assert_close(b_w[key], a_w[key], rtol=1e-5, atol=1e-6)


def trace_lines(run_dir) -> list[str]:
    path = Path(run_dir) / "trace.jsonl"
    return path.read_text().splitlines() if path.exists() else []


def test_the_recipe_output_holds_no_dask_line_unless_debug(raw_texts, tmp_path):
    """A build on the embedded Dask cluster: its scheduler and nannies run in the recipe's process and
    logged ~65 INFO lines through the recipe's log handler; they show only with --debug."""
    args = ["--precision", "fp32", "--build-workers", "2", "--block", "16", "--d-model", "16", "--heads", "2",
            "--layers", "1", "--batch-size", "8", "--num-workers", "0", "--max-steps", "2", "--eval-every", "2"]
    out, err = run(LM, raw_texts, tmp_path / "data", tmp_path / "run", *args)
    lines = (out + err).splitlines()
    assert not [line for line in lines if " distributed." in line or line.startswith("distributed.")], err
    assert any("shardkit.recipes built" in line for line in lines)  # the recipe's own lines stay
    _, debug = run(LM, raw_texts, tmp_path / "data2", tmp_path / "run2", *args, "--debug")
    assert sum(" distributed." in line for line in debug.splitlines()) > 5  # the same run does make them
