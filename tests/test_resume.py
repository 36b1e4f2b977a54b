"""The shared resume contract (tests/resume.py) for the meter, gradient accumulation and early stopping.

The loader passes the same contract in test_loader.py."""

import pytest
import torch
from resume import check_save_load_state
from torch import nn

from shardkit.meter import StarvationMeter
from shardkit.train import AccumulationStep, EarlyStopping


class Clocked(StarvationMeter):
    """A meter on a manual clock that its own fake loader and fake step advance."""

    def __init__(self):
        self.t = 0.0
        super().__init__(warmup=0, log_every=0, window=3, clock=lambda: self.t)


def meter_outputs(meter, start):
    def loader():
        i = start
        while True:
            meter.t += 0.001 * (1 + i % 4)  # the wait of step i
            yield {"__key__": ["k"] * (1 + i % 3)}
            i += 1

    for i, _ in enumerate(meter.wrap(loader()), start):
        meter.t += 0.002 * (1 + i % 5)  # the step itself
        s = meter.summary()
        yield (s["steps"], s["samples"], round(s["wait_s"], 9), round(s["step_s"], 9), len(meter.windows))


def test_meter_resumes_its_figures():
    check_save_load_state(Clocked, meter_outputs, total=14, stop=6)


class Training:
    """Model, optimizer and AccumulationStep checkpointed together, as a training loop does."""

    def __init__(self):
        torch.manual_seed(0)
        self.model = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 2))
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=1e-2)
        self.step = AccumulationStep(self.optimizer, accum_steps=3, clip_grad_norm=1.0)

    def state_dict(self):
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                "step": self.step.state_dict()}

    def load_state_dict(self, state):
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.step.load_state_dict(state["step"])


def training_outputs(t, start):
    i = start
    while True:
        x = torch.Generator().manual_seed(i)  # micro-batch i's data
        loss = t.model(torch.randn(4, 6, generator=x)).pow(2).mean()
        stepped = t.step(loss)
        weights = float(sum(p.detach().double().sum() for p in t.model.parameters()))
        yield stepped, t.step.micro, t.step.optimizer_steps, round(weights, 12)
        i += 1


@pytest.mark.parametrize("stop", [3, 9])  # at optimizer-step boundaries: partial gradients are not saved
def test_accumulation_resumes_its_steps(stop):
    check_save_load_state(Training, training_outputs, total=15, stop=stop)


def early_outputs(early, start):
    values = [1.0, 0.9, 0.95, 0.89, 0.92, float("nan"), 0.8, 0.85, 0.86, 0.9]
    for i in range(start, len(values)):
        yield early(values[i], step=i), early.best, early.best_step, early.bad


@pytest.mark.parametrize("stop", [2, 5, 8])
def test_early_stopping_resumes_its_patience(stop):
    check_save_load_state(lambda: EarlyStopping(patience=3, min_delta=0.005), early_outputs, total=10, stop=stop)


def test_the_contract_catches_a_lost_state():
    class Forgetful(EarlyStopping):
        def load_state_dict(self, state):
            pass  # a resume that keeps nothing

    with pytest.raises(AssertionError, match="after a restore"):
        check_save_load_state(lambda: Forgetful(patience=3), early_outputs, total=10, stop=5)
