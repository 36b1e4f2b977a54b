"""Training helpers: precision choice, accumulation, checkpoints, early stop, smoke test, autotune."""

import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch
from torch import nn

from shardkit.errors import ConfigError
from shardkit.meter import StarvationMeter
from shardkit.train import (
    AccumulationStep,
    CheckpointError,
    EarlyStopping,
    autocast,
    autotune_batch_size,
    choose_precision,
    classification_loss,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    make_scaler,
    save_checkpoint,
    search_largest,
    smoke_test,
)
from shardkit.train.autotune import step_bytes


def mlp(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(10, 16), nn.Tanh(), nn.Linear(16, 3))


# -- precision -------------------------------------------------------------------------------
def test_precision_choice_per_device():
    assert choose_precision("cpu").name == "bf16"
    assert choose_precision("cuda:0", capability=(8, 0)).name == "bf16"  # Ampere+
    old = choose_precision("cuda", capability=(7, 5))  # Turing: no fast bf16
    assert old.name == "fp16" and old.needs_scaler and old.device_type == "cuda"
    assert choose_precision("cuda", "fp32", capability=(9, 0)).name == "fp32"
    assert choose_precision("cpu", "fp16").needs_scaler
    with pytest.raises(ConfigError, match="'fp8'.*--precision"):
        choose_precision("cpu", "fp8")


def test_autocast_and_scaler():
    a, b = torch.randn(4, 4), torch.randn(4, 4)
    with autocast(choose_precision("cpu")):
        assert (a @ b).dtype == torch.bfloat16
    with autocast(choose_precision("cpu", "fp32")):
        assert (a @ b).dtype == torch.float32
    assert make_scaler(choose_precision("cpu")) is None
    assert make_scaler(choose_precision("cuda", "fp32")) is None
    assert isinstance(make_scaler(choose_precision("cpu", "fp16")), torch.amp.GradScaler)


# -- accumulation ----------------------------------------------------------------------------
def test_accumulation_4x8_equals_one_batch_of_32():
    torch.manual_seed(1)
    x, y = torch.randn(32, 10), torch.randint(0, 3, (32,))
    big, small = mlp(), mlp()
    opt_big = torch.optim.SGD(big.parameters(), lr=0.5, momentum=0.9)
    opt_small = torch.optim.SGD(small.parameters(), lr=0.5, momentum=0.9)
    one, accum = AccumulationStep(opt_big), AccumulationStep(opt_small, accum_steps=4)
    for _ in range(3):  # three optimizer steps, so momentum is exercised too
        assert one(nn.functional.cross_entropy(big(x), y)) is True
        stepped = [accum(nn.functional.cross_entropy(small(x[i:i + 8]), y[i:i + 8])) for i in range(0, 32, 8)]
        assert stepped == [False, False, False, True]
    assert accum.optimizer_steps == 3 and accum.micro == 0
    for p, q in zip(big.parameters(), small.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
    assert all(p.grad is None for p in small.parameters())  # zero_grad after the step


def test_accumulation_gradients_before_the_step_match():
    torch.manual_seed(2)
    x, y = torch.randn(32, 10), torch.randint(0, 3, (32,))
    big, small = mlp(), mlp()
    nn.functional.cross_entropy(big(x), y).backward()
    accum = AccumulationStep(torch.optim.SGD(small.parameters(), lr=0.1), accum_steps=4)
    for i in range(0, 24, 8):  # three of four micro-batches: no step yet, gradients still summed
        accum(nn.functional.cross_entropy(small(x[i:i + 8]), y[i:i + 8]))
    nn.functional.cross_entropy(small(x[24:]), y[24:]).div(4).backward()
    for p, q in zip(big.parameters(), small.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-6)


def test_scaler_skips_a_step_with_inf_gradients_then_steps():
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)  # the fp16 logic, run on CPU
    step = AccumulationStep(opt, accum_steps=2, scaler=scaler, clip_grad_norm=1.0)
    before = [p.detach().clone() for p in model.parameters()]
    x = torch.randn(4, 10)
    step(model(x).sum())
    assert step(model(x).sum() * float("inf")) is True
    assert step.skipped_steps == 1 and scaler.get_scale() == 2.0**9
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    step(model(x).sum())
    step(model(x).sum())
    assert step.skipped_steps == 1 and step.optimizer_steps == 2
    moved = sum(float((a - b.detach()).norm() ** 2) for a, b in zip(before, model.parameters())) ** 0.5
    assert 0 < moved <= 0.1 * 1.0 + 1e-6  # lr x clipped gradient norm bounds the update


def test_accumulation_skips_ddp_all_reduce_until_the_last_micro_batch():
    import contextlib

    model = mlp()
    synced = []

    class FakeDDP:  # records which backward passes ran inside no_sync()
        inside = False

        @contextlib.contextmanager
        def no_sync(self):
            FakeDDP.inside = True
            yield
            FakeDDP.inside = False

    model[0].weight.register_hook(lambda g: synced.append(not FakeDDP.inside))
    step = AccumulationStep(torch.optim.SGD(model.parameters(), lr=0.1), accum_steps=3, ddp_model=FakeDDP())
    for _ in range(6):
        step(model(torch.randn(2, 10)).sum())
    assert synced == [False, False, True] * 2


def test_accumulation_rejects_bad_values():
    opt = torch.optim.SGD(mlp().parameters(), lr=0.1)
    with pytest.raises(ConfigError, match="accum_steps=0"):
        AccumulationStep(opt, accum_steps=0)
    with pytest.raises(ConfigError, match="clip_grad_norm=-1"):
        AccumulationStep(opt, clip_grad_norm=-1)


# -- checkpoints -----------------------------------------------------------------------------
class FakeLoader:
    """Anything with state_dict/load_state_dict is checkpointed, like shardkit's loader."""

    def __init__(self):
        self.consumed = 0

    def state_dict(self):
        return {"consumed": self.consumed}

    def load_state_dict(self, state):
        self.consumed = state["consumed"]


def stateful(seed=0):
    model = mlp(seed)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    return {"model": model, "optimizer": opt, "loader": FakeLoader(), "stepper": AccumulationStep(opt),
            "early": EarlyStopping(patience=2), "meter": StarvationMeter(warmup=0, log_every=0)}


def test_checkpoint_round_trip_keeps_last_n(tmp_path):
    a = stateful(0)
    x = torch.randn(8, 10)
    for step in range(1, 6):
        a["stepper"](a["model"](x).pow(2).mean())
        a["loader"].consumed = step * 8
        a["early"](1.0 / step)
        a["meter"].record(0.01, 0.03, 8)
        save_checkpoint(tmp_path, a, step=step, epoch=0, extra={"note": "ok"}, keep=2)
    assert [s for s, _ in list_checkpoints(tmp_path)] == [4, 5]
    expected_rand = torch.rand(3)  # RNG state right after the last save...
    b = stateful(1)
    ck = load_checkpoint(tmp_path, b)
    assert (ck.step, ck.epoch, ck.extra) == (5, 0, {"note": "ok"}) and ck.path.endswith("step-000000005.pt")
    assert torch.equal(torch.rand(3), expected_rand)  # ...is restored, so dropout/shuffles continue alike
    for p, q in zip(a["model"].parameters(), b["model"].parameters()):
        assert torch.equal(p, q)
    assert b["optimizer"].state_dict()["state"][0]["step"] == 5
    assert b["loader"].consumed == 40 and b["stepper"].optimizer_steps == 5
    assert b["early"].best == pytest.approx(0.2) and b["meter"].summary()["steps"] == 5
    # Training continues identically from the restored state.
    for obj in (a, b):
        obj["stepper"](obj["model"](x).pow(2).mean())
    for p, q in zip(a["model"].parameters(), b["model"].parameters()):
        assert torch.equal(p, q)


def test_checkpoint_fresh_start_mismatch_and_bad_objects(tmp_path):
    assert load_checkpoint(tmp_path / "none-yet", stateful()) is None
    save_checkpoint(tmp_path, {"model": mlp()}, step=1)
    with pytest.raises(CheckpointError, match=r"holds \['model'\] but \['loader', 'model'\]"):
        load_checkpoint(tmp_path, {"model": mlp(), "loader": FakeLoader()})
    assert load_checkpoint(tmp_path, {"model": mlp(), "loader": FakeLoader()}, strict=False).step == 1
    with pytest.raises(ConfigError, match="'lr' \\(float\\) has no state_dict"):
        save_checkpoint(tmp_path, {"model": mlp(), "lr": 0.1}, step=2)
    with pytest.raises(ConfigError, match="keep=0"):
        save_checkpoint(tmp_path, {"model": mlp()}, step=2, keep=0)


def test_temp_and_corrupt_files(tmp_path):
    save_checkpoint(tmp_path, {"model": mlp()}, step=1)
    stale = tmp_path / "step-000000009.pt.tmp-0123456789ab"
    stale.write_bytes(b"half a checkpoint")
    assert latest_checkpoint(tmp_path).endswith("step-000000001.pt")  # a temp file is never a checkpoint
    save_checkpoint(tmp_path, {"model": mlp()}, step=2)
    assert not stale.exists()  # leftovers of a killed writer are cleaned by the next save
    (tmp_path / "step-000000003.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match="step-000000003.pt.*delete it"):
        load_checkpoint(tmp_path, {"model": mlp()})


KILLED_WRITER = textwrap.dedent("""
    import sys, torch
    from shardkit.train import save_checkpoint
    model = torch.nn.Linear(512, 1024)  # ~2 MB per file, so a kill often lands mid-write
    for step in range(1, 10**6):
        with torch.no_grad():
            model.weight.fill_(step)
        save_checkpoint(sys.argv[1], {"model": model}, step=step, keep=2)
""")


def test_sigkill_during_saves_leaves_a_loadable_checkpoint(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", KILLED_WRITER, str(tmp_path)])
    try:
        deadline = time.monotonic() + 30
        while len(list_checkpoints(tmp_path)) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.137)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert list_checkpoints(tmp_path), "the writer never saved a checkpoint"
    model = torch.nn.Linear(512, 1024)
    ck = load_checkpoint(tmp_path, {"model": model})
    assert torch.all(model.weight == ck.step)


# -- early stopping --------------------------------------------------------------------------
def test_early_stopping_min_and_max():
    early = EarlyStopping(patience=2, min_delta=0.01)
    decisions = [early(v, step=i) for i, v in enumerate([1.0, 0.9, 0.895, 0.95, 0.85, float("nan"), 0.849])]
    assert decisions == [False, False, False, True, False, False, True]
    assert early.best == 0.85 and early.best_step == 4
    acc = EarlyStopping(patience=1, mode="max")
    assert [acc(v) for v in (0.5, 0.6, 0.6)] == [False, False, True]
    restored = EarlyStopping(patience=1, mode="max")
    restored.load_state_dict(acc.state_dict())
    assert restored.should_stop and restored.best == 0.6
    with pytest.raises(ConfigError, match="mode='avg'"):
        EarlyStopping(mode="avg")
    with pytest.raises(ConfigError, match="patience=0"):
        EarlyStopping(patience=0)


# -- smoke test ------------------------------------------------------------------------------
def image_batches(n=3, size=8, classes=4):
    g = torch.Generator().manual_seed(0)
    return [{"raw": torch.randint(0, 256, (4, 3, size, size), dtype=torch.uint8, generator=g),
             "cls": torch.randint(0, classes, (4,), generator=g), "__key__": [f"k{i}" for i in range(4)]}
            for _ in range(n)]


def tiny_cnn(size=8, classes=4):
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(4 * size * size, classes))


def test_smoke_test_passes_a_working_model():
    model = tiny_cnn().eval()
    result = smoke_test(model, image_batches(), steps=2)
    assert result.ok and bool(result) and result.steps == 2 and result.problem is None
    assert len(result.losses) == 2 and all(0 < v < 10 for v in result.losses)
    assert result.peak_memory_bytes > 0 and result.memory_source == "process peak RSS"
    assert "raw (4, 3, 8, 8) torch.uint8" in result.batch
    assert not model.training and all(p.grad is None for p in model.parameters())


def test_smoke_test_reports_shape_errors_nans_and_data_errors():
    wrong = smoke_test(tiny_cnn(size=16), image_batches(size=8))
    assert not wrong and wrong.problem == "shape" and "raw (4, 3, 8, 8)" in wrong.message
    model = tiny_cnn()
    with torch.no_grad():
        model[0].weight[0, 0, 0, 0] = float("nan")
    nan = smoke_test(model, image_batches())
    assert nan.problem == "nan" and "step 0" in nan.message

    def broken():
        yield image_batches(1)[0]
        raise OSError("shard data-00003.tar truncated")

    data = smoke_test(tiny_cnn(), broken(), steps=3)
    assert data.problem == "data" and "truncated" in data.message and data.steps == 1
    empty = smoke_test(tiny_cnn(), [])
    assert empty.problem == "data" and "no batch" in empty.message


# -- autotune --------------------------------------------------------------------------------
def test_search_largest_doubles_then_bisects():
    calls = []

    def fits(n):
        calls.append(n)
        return n <= 37

    assert search_largest(fits, 4096) == 37
    assert calls[:7] == [1, 2, 4, 8, 16, 32, 64] and len(calls) <= 7 + 5
    assert search_largest(lambda n: True, 100) == 100
    assert search_largest(lambda n: False, 100) == 0


def test_autotune_cuda_path_on_fake_oom():
    model = tiny_cnn()

    def make_batch(n):
        if n > 50:  # what the CUDA allocator raises when a batch does not fit
            raise torch.OutOfMemoryError(f"CUDA out of memory (fake) for batch {n}")
        return image_batches(1)[0]

    result = autotune_batch_size(model, make_batch, device="cuda", margin=0.9)
    assert (result.largest_fit, result.batch_size, result.method) == (50, 45, "cuda-oom-search")
    assert result.tried[64] is False and result.tried[50] is True


def test_autotune_cpu_memory_budget():
    model = tiny_cnn(size=16)

    def make_batch(n):
        return {"raw": torch.zeros(n, 3, 16, 16, dtype=torch.uint8), "cls": torch.zeros(n, dtype=torch.long)}

    budget = 64 * step_bytes(model, make_batch(8), classification_loss)
    small = autotune_batch_size(model, make_batch, memory_budget=budget, margin=1.0)
    large = autotune_batch_size(model, make_batch, memory_budget=4 * budget, margin=1.0)
    assert small.method == "cpu-memory-budget" and sorted(small.tried) == [8, 16]
    assert large.largest_fit > 3.5 * small.largest_fit
    # The chosen batch fits the budget (parameters + gradients included) and one more would not.
    params = 2 * sum(p.numel() * 4 for p in model.parameters())
    n = small.largest_fit
    assert step_bytes(model, make_batch(n), classification_loss) + params <= budget
    assert step_bytes(model, make_batch(n + 1), classification_loss) + params > budget
    assert autotune_batch_size(model, make_batch, memory_budget=budget, margin=0.5).batch_size == n // 2
    with pytest.raises(ConfigError, match="not even a batch of 1"):
        autotune_batch_size(model, make_batch, memory_budget=1000)
