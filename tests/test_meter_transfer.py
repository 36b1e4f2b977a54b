"""The meter splits the host side of a step into waiting, page-lock + copy, and the step, and
names the copy's lever (meter/transfer.py), checked against an injected slow transfer."""

import torch

from shardkit.meter import StarvationMeter
from shardkit.meter.transfer import largest, transfer_advice
from factory import FixedCpu


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def run(meter, clock, steps, *, wait_s, step_s, to="cpu"):
    def batches():
        for _ in range(steps):
            clock.t += wait_s  # the loader: waiting for the batch
            yield {"x": torch.zeros(4, 3), "__key__": ["a"] * 4}
    for batch in meter.wrap(batches(), to=to):
        assert batch["x"].shape == (4, 3)
        clock.t += step_s  # the step itself


def slow_copy(clock, seconds):
    def copy(batch, device, pin):
        clock.t += seconds
        return batch
    return copy


def test_split_matches_an_injected_slow_transfer_within_3_points():
    clock = Clock()
    # wait 10 ms, copy 70 ms, step 20 ms: 10% / 70% / 20% of the host side of a step
    meter = StarvationMeter(warmup=2, log_every=0, clock=clock, copy=slow_copy(clock, 0.070))
    run(meter, clock, 42, wait_s=0.010, step_s=0.020)
    split = meter.summary()["transfer"]
    assert abs(split["wait_pct"] - 10) <= 3 and abs(split["copy_pct"] - 70) <= 3
    assert abs(split["step_pct"] - 20) <= 3 and split["page_lock_pct"] == 0
    assert split["copies"] == 40  # the warm-up is left out, as for the other figures


def test_advice_names_the_copy_and_pin_memory_when_the_batch_is_pageable():
    clock = Clock()
    meter = StarvationMeter(warmup=0, log_every=0, clock=clock, copy=slow_copy(clock, 0.070))
    run(meter, clock, 30, wait_s=0.010, step_s=0.020)
    s = meter.summary()
    assert s["advice"].startswith("the host→device copy takes 70% of each step: pass pin_memory=True")
    assert "the copy blocks: the batch is not page-locked" in s["advice"]
    assert "host→device copy 70%" in meter.report()


def test_page_lock_is_timed_apart_and_named_when_largest():
    clock = Clock()

    class Pinned:  # what pin_memory() gives; this machine may have no CUDA to pin with
        device = torch.device("cpu")
        shape = (4, 3)

        def is_pinned(self):
            return True

    def lock(batch):
        clock.t += 0.050
        return {**batch, "x": Pinned()}
    meter = StarvationMeter(warmup=0, log_every=0, clock=clock, pin=True, lock=lock,
                            copy=slow_copy(clock, 0.010))
    run(meter, clock, 30, wait_s=0.020, step_s=0.020)
    split = meter.summary()["transfer"]
    assert abs(split["page_lock_pct"] - 50) <= 3 and abs(split["copy_pct"] - 10) <= 3
    assert largest(split) == "transfer"
    assert transfer_advice(split).startswith("page-locking takes 50% of each step")


def test_a_fast_copy_leaves_the_advice_alone_and_state_round_trips():
    clock = Clock()
    meter = StarvationMeter(warmup=0, log_every=0, clock=clock, copy=slow_copy(clock, 0.001))
    run(meter, clock, 30, wait_s=0.030, step_s=0.070)
    s = meter.summary()
    assert s["transfer"]["copy_pct"] < 2 and "host→device" not in s["advice"]
    again = StarvationMeter(warmup=0, log_every=0, clock=clock)
    again.load_state_dict(meter.state_dict())
    assert again.summary()["transfer"]["copies"] == 30


def test_no_transfer_figures_without_a_copy_through_the_meter():
    clock = Clock()
    meter = StarvationMeter(warmup=0, log_every=0, clock=clock)
    run(meter, clock, 5, wait_s=0.01, step_s=0.01, to=None)
    assert "transfer" not in meter.summary()


def test_the_default_copy_moves_every_tensor_of_a_batch():
    meter = StarvationMeter(warmup=0, log_every=0)
    moved = meter.to_device({"x": torch.ones(2), "__key__": ["a", "b"]}, "cpu")
    assert moved["x"].tolist() == [1.0, 1.0] and moved["__key__"] == ["a", "b"]


def _crowded_run(monkeypatch, cores):
    monkeypatch.setattr("os.cpu_count", lambda: 4)
    clock = Clock()
    meter = StarvationMeter(warmup=0, log_every=0, clock=clock, worker_cpu=FixedCpu(cores, measured=4),
                            copy=slow_copy(clock, 0.001))
    meter.num_workers = 4
    run(meter, clock, 30, wait_s=0.010, step_s=0.060)  # 14% starved, the step the largest part
    return meter.summary()["advice"]


def test_workers_crowding_out_the_loop_are_named(monkeypatch):
    line = _crowded_run(monkeypatch, 3.9)
    assert line.startswith("the workers keep 3.9 of 4 cores busy, leaving the training loop less than a core")
    assert "lower num_workers (now 4) to 3 or fewer" in line


def test_workers_leaving_a_core_free_are_not_blamed(monkeypatch):
    assert "leaving the training loop" not in _crowded_run(monkeypatch, 2.5)


class StreamEvents:
    """torch.cuda.Event stand-ins on a fake stream: record() stamps the time the stream reaches it."""

    def __init__(self, clock):
        self.clock, self.queued_until = clock, 0.0

    def enqueue(self, seconds):  # an asynchronous copy: the host returns at once
        self.queued_until = max(self.queued_until, self.clock()) + seconds

    def __call__(self):
        stream = self

        class Event:
            def record(self):
                self.t = max(stream.clock(), stream.queued_until)

            def query(self):
                return True

            def synchronize(self):
                pass

            def elapsed_time(self, end):  # milliseconds, like torch.cuda.Event
                return (end.t - self.t) * 1e3
        return Event()


def test_on_cuda_the_copy_is_timed_by_events_on_its_stream():
    """A page-locked copy returns at once on the host; the events around it on the stream see its
    40 ms, and the split names it (the host alone would have seen nothing)."""
    clock = Clock()
    stream = StreamEvents(clock)

    def async_copy(batch, device, pin):
        stream.enqueue(0.040)
        return batch
    meter = StarvationMeter(warmup=0, log_every=0, device="cuda", event_factory=stream, clock=clock,
                            copy=async_copy)
    run(meter, clock, 30, wait_s=0.010, step_s=0.050)
    split = meter.summary()["transfer"]
    assert split["copy_blocked_s"] == 0.0 and abs(split["copy_s"] - 30 * 0.040) < 1e-9
    assert abs(split["copy_pct"] - 40) <= 3  # 40 of wait 10 + copy 40 + step 50 ms
