"""StarvationMeter: starved% against injected delays, workers, warm-up, reports, CUDA-event gaps."""

import json
import logging
import time

import pytest

from shardkit.errors import ConfigError
from shardkit.meter import (DataProfile, StarvationMeter, advice, band, batch_size_of, cost_line, percentile,
                            profile_of)
from factory import FixedCpu


class FakeClock:
    """A manual clock: the fake loader and fake step advance it, so figures are exact."""

    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def fake_loader(clock, waits_s, batch=8):
    for w in waits_s:
        clock.t += w
        yield {"__key__": [f"k{i}" for i in range(batch)]}


def sleeping_loader(n, wait_s, batch=4):
    for _ in range(n):
        time.sleep(wait_s)
        yield [0] * batch


@pytest.mark.parametrize("wait_ms,step_ms", [(10, 20), (20, 5)])
def test_starved_pct_matches_injected_sleep(wait_ms, step_ms):
    meter = StarvationMeter(warmup=2, log_every=0)
    for _ in meter.wrap(sleeping_loader(27, wait_ms / 1e3)):
        time.sleep(step_ms / 1e3)
    s = meter.summary()
    assert s["steps"] == 25 and s["warmup_steps"] == 2 and s["samples"] == 100
    # A sleep never returns early, so the real clock's figures are at least what was injected; how
    # close they come (starved% within 3 points) is a timing: bench/meter_bench.py (accuracy) measures it.
    assert s["wait_p50_ms"] >= wait_ms - 0.5 and s["step_p50_ms"] >= step_ms - 0.5
    assert s["wait_s"] + s["step_s"] > 0 and 0 < s["starved_pct"] < 100


def test_exact_figures_with_fake_clock_and_warmup_excluded():
    clock = FakeClock()
    meter = StarvationMeter(warmup=3, log_every=0, window=4, clock=clock)
    waits = [1.0, 1.0, 1.0] + [0.010] * 6 + [0.050] * 2  # slow start-up, then steady
    for _ in meter.wrap(fake_loader(clock, waits, batch=8)):
        clock.t += 0.030
    s = meter.summary()
    assert s["steps"] == 8 and s["warmup_steps"] == 3 and s["samples"] == 64
    assert s["wait_s"] == pytest.approx(0.16) and s["step_s"] == pytest.approx(0.24)
    assert s["starved_pct"] == pytest.approx(40.0)
    assert s["samples_per_s"] == pytest.approx(64 / 0.4) and s["steps_per_s"] == pytest.approx(8 / 0.4)
    assert s["wait_p50_ms"] == pytest.approx(10) and s["wait_p95_ms"] == pytest.approx(50)
    assert s["band"] == "input-bound"
    # Two closed windows of 4 steps: steady 10 ms waits, then two of 10 ms and two of 50 ms.
    assert [w["first_step"] for w in s["windows"]] == [0, 4]
    assert s["windows"][0]["starved_pct"] == pytest.approx(25.0)
    assert s["windows"][1]["starved_pct"] == pytest.approx(100 * 0.12 / 0.24)


def test_break_out_of_loop_still_counts_the_last_step():
    clock = FakeClock()
    meter = StarvationMeter(warmup=0, log_every=0, clock=clock)
    for i, _ in enumerate(meter.wrap(fake_loader(clock, [0.01] * 10))):
        clock.t += 0.02
        if i == 3:
            break
    s = meter.summary()
    assert s["steps"] == 4 and s["step_s"] == pytest.approx(0.08)


class SlowDataset:
    """Map-style dataset whose items take `delay` seconds each (I/O-like: sleeps, no CPU)."""

    def __init__(self, n, delay):
        self.n, self.delay = n, delay

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        import torch

        time.sleep(self.delay)
        return torch.tensor([i])


@pytest.mark.filterwarnings("ignore:This DataLoader will create")  # 4 sleeping workers on 2 cores is fine
def test_meter_counts_steps_samples_and_workers_of_a_real_dataloader():
    """The meter over torch's DataLoader at 0, 2 and 4 workers: what it counts. How the wait falls as
    workers rise is a timing, measured by bench/meter_bench.py (workers section), not asserted here."""
    from torch.utils.data import DataLoader

    for workers in (0, 2, 4):
        loader = DataLoader(SlowDataset(64, 0.002), batch_size=4, num_workers=workers,
                            prefetch_factor=2 if workers else None)
        meter = StarvationMeter(warmup=3, log_every=0)
        seen = [int(b[0]) for batch in meter.wrap(loader) for b in batch]
        s = meter.summary()
        assert sorted(seen) == list(range(64))
        assert s["num_workers"] == workers and s["steps"] == 13 and s["samples"] == 4 * 13
        assert s["wait_s"] > 0 and 0 <= s["starved_pct"] <= 100


def test_summary_and_json_contents(tmp_path):
    clock = FakeClock()
    meter = StarvationMeter(warmup=1, log_every=0, clock=clock)
    for _ in meter.wrap(fake_loader(clock, [0.5] + [0.001] * 10, batch=16)):
        clock.t += 0.099
    s = meter.to_json(tmp_path / "meter.json")
    on_disk = json.loads((tmp_path / "meter.json").read_text())
    assert on_disk == json.loads(json.dumps(s))
    for key in ("steps", "samples", "samples_per_s", "steps_per_s", "starved_pct", "wait_p50_ms",
                "wait_p95_ms", "band", "advice", "cost", "rank", "world_size", "warmup_steps", "windows"):
        assert key in on_disk, key
    assert on_disk["starved_pct"] == pytest.approx(1.0)
    assert on_disk["band"] == "fine"
    assert on_disk["cost"] == "of every 100 GPU-hours, 1.0 were spent waiting for data"
    assert on_disk["samples_per_s"] == pytest.approx(160.0)
    assert "gpu_idle_pct" not in on_disk
    assert "1.0% of step time" in meter.report() and "GPU-hours" in meter.report()


def test_periodic_log_line(caplog):
    clock = FakeClock()
    meter = StarvationMeter(warmup=0, log_every=5, clock=clock)
    with caplog.at_level(logging.INFO, logger="shardkit.meter"):
        for _ in meter.wrap(fake_loader(clock, [0.01] * 12, batch=2)):
            clock.t += 0.09
    lines = [r.getMessage() for r in caplog.records if r.name == "shardkit.meter"]
    assert len(lines) == 2
    assert lines[0].startswith("[rank 0] step 5:") and "starved 10.0% last 5 steps" in lines[0]
    assert "moderately input-bound" in lines[1] and "20.0 samples/s" in lines[1]


def figures(pct, p50_ms, p95_ms, step_ms=10.0, steps=100, epoch_start=0.0) -> dict:
    return {"starved_pct": pct, "wait_p50_ms": p50_ms, "wait_p95_ms": p95_ms, "step_p50_ms": step_ms,
            "steps": steps, "epoch_start_wait_pct": epoch_start}


def test_bands_advice_and_cost():
    assert band(0.0) == "fine" and band(4.99) == "fine"
    assert band(5.0) == band(19.99) == "moderately input-bound"
    assert band(20.0) == band(90) == "input-bound"
    assert "no change" in advice(figures(2, 1, 1))
    assert "num_workers" in advice(figures(30, 10, 10), num_workers=0, cpus=8)
    assert "raise num_workers (now 2, 8 cores)" in advice(figures(30, 10, 10), num_workers=2, cpus=8)
    assert "prefetch_factor" in advice(figures(30, 0.5, 50), num_workers=8, cpus=8)
    # a median wait of 30% of the step: the workers are too slow on average, prefetch cannot help
    assert "prefetch" not in advice(figures(30, 3, 50), num_workers=8, cpus=8)
    saturated = advice(figures(30, 10, 12), num_workers=8, cpus=8, data=DataProfile("encoded"))
    assert "--encode raw" in saturated and "--image-size" in saturated
    assert cost_line(12.345) == "of every 100 GPU-hours, 12.3 were spent waiting for data"


def test_advice_never_asks_for_what_the_data_already_is():
    saturated = figures(30, 10, 12)
    raw = advice(saturated, num_workers=8, cpus=8, data=DataProfile("raw", (64, 64)))
    assert "--encode raw" not in raw and "decode" not in raw.replace("stored decoded", "")
    assert "stored decoded (64x64)" in raw
    assert "--image-size" not in raw and "fields" in raw  # 64x64 is small already: smaller would not help
    large = advice(saturated, num_workers=8, cpus=8, data=DataProfile("raw", (224, 224)))
    assert "--image-size" in large and "fields" in large
    files = advice(saturated, num_workers=8, cpus=8, data=DataProfile("files"))
    assert "build shards once" in files and "--encode raw" in files
    assert "overlaps the step" in advice(saturated, num_workers=0, cpus=8, data=DataProfile("raw"))
    assert "reading overlaps" in advice(saturated, num_workers=0, cpus=8, data=DataProfile("raw"))
    assert "decoding overlaps" in advice(saturated, num_workers=0, cpus=8, data=DataProfile("encoded"))
    # with the workers' CPU measured (ranked levers) too: a raw dataset is never told to cache decoded
    for busy in (8.0, 1.0):
        ranked = advice(dict(saturated, worker_cpu_cores=busy, workers_measured=8), num_workers=8, cpus=8,
                        data=DataProfile("raw", (64, 64)))
        assert "--encode raw" not in ranked and "decoded every epoch" not in ranked
        assert "stored decoded (64x64)" in ranked and "fields" in ranked


def test_advice_follows_what_was_measured():
    assert "only 6 steps measured" in advice(figures(40, 10, 12, steps=6), num_workers=8, cpus=8)
    assert "keeps up" in advice(figures(1, 1, 1, steps=6)) and "only 6 steps" in advice(figures(1, 1, 1, steps=6))
    no_step = advice(figures(99, 10, 12, step_ms=0.01), num_workers=0, cpus=8)
    assert "loader alone" in no_step and "num_workers" not in no_step
    on_gpu = dict(figures(30, 10, 12, step_ms=0.01), gpu_idle_pct=30.0)  # async CUDA: host step time is small
    assert "loader alone" not in advice(on_gpu, num_workers=0, cpus=8)
    epochs = advice(dict(figures(30, 1, 80, epoch_start=70), steady_starved_pct=3.0), num_workers=2, cpus=2)
    assert "70% of the waiting is for the first batch of an epoch" in epochs and "prefetch" not in epochs
    assert "keeps up (3.0% starved)" in epochs
    both = advice(dict(figures(30, 5, 8, epoch_start=40), steady_starved_pct=20.0), num_workers=2, cpus=2,
                  data=DataProfile("raw"))
    assert "stored decoded" in both and both.endswith("40% of the waiting is at epoch starts, which fades as "
                                                      "epochs get longer")
    # Bursts only at epoch starts are not bursts of steady loading: the lever is the data, not prefetch.
    steady = dict(figures(30, 0.5, 80, epoch_start=40), steady_wait_p95_ms=1.5)
    assert "prefetch" not in advice(steady, num_workers=2, cpus=2, data=DataProfile("raw"))
    assert "prefetch" in advice(dict(steady, steady_wait_p95_ms=80.0), num_workers=2, cpus=2)


def test_the_meter_measures_epoch_start_waits():
    clock = FakeClock()
    meter = StarvationMeter(warmup=1, log_every=0, clock=clock)
    for _ in range(3):  # three short epochs: a 100 ms first batch, then 1 ms waits
        for _ in meter.wrap(fake_loader(clock, [0.1] + [0.001] * 9)):
            clock.t += 0.002
    s = meter.summary()
    assert s["steps"] == 29 and s["wait_s"] == pytest.approx(0.2 + 0.027)
    assert s["epoch_start_wait_pct"] == pytest.approx(100 * 0.2 / 0.227)  # the first epoch's start was warm-up
    assert s["wait_p95_ms"] == pytest.approx(100) and s["steady_wait_p95_ms"] == pytest.approx(1)
    assert s["steady_starved_pct"] == pytest.approx(100 * 0.027 / (0.027 + 29 * 0.002))
    # 10 batches an epoch: too few to judge steady loading; the restarts are named
    assert "too small to judge" in s["advice"] and "at the starts of its 3 epochs" in s["advice"]
    restored = StarvationMeter(warmup=1, log_every=0)
    restored.load_state_dict(meter.state_dict())
    again = restored.summary()
    assert again["epoch_start_wait_pct"] == pytest.approx(s["epoch_start_wait_pct"])
    assert again["steady_wait_p95_ms"] == pytest.approx(1)


def test_profile_of_reads_the_manifest(tmp_path):
    from factory import make_dataset

    from shardkit.loader import make_loader
    from shardkit.reader.dataset import StreamingDataset

    root, _ = make_dataset(tmp_path, 8, shards=1, fields=("jpg", "raw", "cls"))
    assert profile_of(StreamingDataset(root, fields=["raw", "cls"])) == DataProfile("raw", (12, 16))
    assert profile_of(make_loader(StreamingDataset(root, fields=["jpg", "cls"]), batch_size=4,
                                  num_workers=0)) == DataProfile("encoded")
    assert profile_of(StreamingDataset(root, fields=["cls"])) == DataProfile()
    assert profile_of([1, 2, 3]) == DataProfile()
    meter = StarvationMeter(warmup=0, log_every=0)
    for _ in meter.wrap(make_loader(StreamingDataset(root, fields=["raw", "cls"]), batch_size=4, num_workers=0)):
        pass
    assert meter.data == DataProfile("raw", (12, 16))
    with pytest.raises(ConfigError, match="images='jpeg'"):
        DataProfile("jpeg")


def test_batch_size_of_common_batch_shapes():
    import torch

    assert batch_size_of({"__key__": ["a", "b", "c"], "cls": torch.zeros(3)}) == 3
    assert batch_size_of({"raw": torch.zeros(5, 3, 8, 8)}) == 5
    assert batch_size_of((torch.zeros(7, 2), torch.zeros(7))) == 7
    assert batch_size_of(torch.zeros(6, 1)) == 6
    assert batch_size_of([1, 2]) == 2
    assert batch_size_of(object()) == 1


def test_percentile_nearest_rank():
    assert percentile([], 50) == 0.0
    assert percentile([3, 1, 2], 50) == 2
    assert percentile(list(range(1, 101)), 95) == 95
    assert percentile([5], 95) == 5


def test_rank_from_environment(monkeypatch):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "4")
    s = StarvationMeter(log_every=0).summary()
    assert (s["rank"], s["world_size"]) == (1, 4)


def test_state_dict_round_trip_and_warmup_after_restart():
    clock = FakeClock()
    a = StarvationMeter(warmup=1, log_every=0, clock=clock)
    for _ in a.wrap(fake_loader(clock, [0.01] * 5)):
        clock.t += 0.01
    b = StarvationMeter(warmup=1, log_every=0, clock=clock)
    b.load_state_dict(a.state_dict())
    for _ in b.wrap(fake_loader(clock, [1.0] + [0.03] * 2)):  # the restart's slow step is left out
        clock.t += 0.01
    s = b.summary()
    assert s["steps"] == 6 and s["warmup_steps"] == 2
    assert s["wait_s"] == pytest.approx(0.04 + 0.06)


def test_all_ranks_gathers_under_torch_distributed(tmp_path):
    import torch.distributed as dist

    clock = FakeClock()
    meter = StarvationMeter(warmup=0, log_every=0, clock=clock)
    for _ in meter.wrap(fake_loader(clock, [0.03] * 4)):
        clock.t += 0.07
    alone = meter.all_ranks()
    assert alone["slowest_rank"] == 0 and alone["max_starved_pct"] == pytest.approx(30.0)
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        gathered = StarvationMeter(log_every=0).all_ranks()  # picks its rank from torch.distributed
        assert len(gathered["ranks"]) == 1 and gathered["ranks"][0]["world_size"] == 1
        assert gathered["band"] == "fine"
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("kwargs", [{"warmup": -1}, {"window": 0}, {"device": "tpu"}, {"log_every": 1.5}])
def test_bad_config_names_the_value(kwargs):
    with pytest.raises(ConfigError, match=repr(next(iter(kwargs.values())))):
        StarvationMeter(**kwargs)


class FakeGpu:
    """Simulates a CUDA stream: work launched runs after what is queued; events complete in order."""

    def __init__(self, clock):
        self.clock, self.busy_until = clock, 0.0

    def launch(self, seconds):
        self.busy_until = max(self.busy_until, self.clock()) + seconds

    def event_factory(self):
        gpu = self

        class FakeEvent:
            def record(self):
                self.t = max(gpu.clock(), gpu.busy_until)

            def query(self):
                return gpu.clock() >= self.t

            def synchronize(self):
                gpu.clock.t = max(gpu.clock.t, self.t)

            def elapsed_time(self, end):  # milliseconds, like torch.cuda.Event
                return (end.t - self.t) * 1e3

        return FakeEvent()


@pytest.mark.parametrize("kernel_s,expected_idle_pct", [(0.030, 0.0), (0.005, 100 * 0.007 / 0.012)])
def test_cuda_event_gap_with_fake_events(kernel_s, expected_idle_pct):
    """Host wait is 10 ms of every 12; the GPU is idle only when its queue drains first."""
    clock = FakeClock()
    gpu = FakeGpu(clock)
    meter = StarvationMeter(warmup=2, log_every=0, device="cuda", event_factory=gpu.event_factory, clock=clock)
    for _ in meter.wrap(fake_loader(clock, [0.010] * 200)):
        gpu.launch(kernel_s)  # the step enqueues kernel_s of GPU work...
        clock.t += 0.002  # ...and returns to the host after 2 ms
    s = meter.summary()
    assert s["starved_pct"] == pytest.approx(100 * 10 / 12)
    assert s["gpu_idle_pct"] == pytest.approx(expected_idle_pct, abs=0.5)
    # The band and cost follow the GPU figure, the truer one when kernels queue up.
    assert s["band"] == band(s["gpu_idle_pct"])
    assert f"{s['gpu_idle_pct']:.1f} were spent" in s["cost"]
    assert "GPU idle between steps" in meter.report()
    meter.record(0.01, 0.002, 8)  # a step timed by the caller has no CUDA events: host figures only
    assert meter.summary()["steps"] == s["steps"] + 1


def test_cuda_without_device_says_how_to_fix(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigError, match="device='cpu'"):
        StarvationMeter(device="cuda")


# -- levers ranked by what each can give, from the workers' measured CPU (fake figures here)

def measured(pct, cores_busy, network_pct=None, p50_ms=10.0, p95_ms=12.0):
    out = dict(figures(pct, p50_ms, p95_ms), worker_cpu_cores=cores_busy, workers_measured=1)
    if network_pct is not None:
        out["network_wait_pct"] = network_pct
    return out


def test_saturated_workers_reading_files_are_told_to_build_shards_not_to_add_workers():
    """The ImageFolder run of issue 25: 15 workers on 16 cores, all busy, GPU idle 78%."""
    line = advice(dict(measured(0.0, 15.0), gpu_idle_pct=77.7), num_workers=15, cpus=16, data=DataProfile("files"))
    assert line.startswith("needs 4.48x today's loader speed (78% starved): build shards once (shardkit build")
    assert "more workers give at most 1.07x (15 workers keep 15.0 of 16 cores busy)" in line
    assert "raise num_workers" not in line
    encoded = advice(measured(60.0, 8.0), num_workers=8, cpus=8, data=DataProfile("encoded"))
    assert "shardkit build --encode raw" in encoded and "more workers give at most 1.00x" in encoded
    unknown = advice(measured(60.0, 8.0), num_workers=8, cpus=8)  # nothing known to cut: say so
    assert "cut per-sample work" in unknown


def test_idle_workers_with_free_cores_are_told_to_raise_num_workers():
    line = advice(measured(50.0, 1.2), num_workers=4, cpus=16, data=DataProfile("files"))
    assert line.startswith("needs 2.00x today's loader speed (50% starved): raise num_workers (now 4, keeping 1.2 "
                           "of 16 cores busy)") and "(up to 13.3x)" in line


def test_workers_waiting_on_the_network_are_told_to_fetch_ahead():
    line = advice(measured(60.0, 0.4, network_pct=80.0), num_workers=4, cpus=16, data=DataProfile("raw"))
    assert line.startswith("needs 2.50x today's loader speed (60% starved): raise fetch-ahead and connections")
    assert "wait on the network 80% of the time" in line and "(up to 5.0x)" in line
    little = advice(measured(60.0, 0.4, network_pct=5.0), num_workers=4, cpus=16, data=DataProfile("raw"))
    assert "raise num_workers" in little.split(";")[0]  # a small network wait cannot give 2.5x


def test_without_measured_worker_cpu_the_advice_says_it_guesses():
    line = advice(figures(30, 10, 10), num_workers=2, cpus=8)
    assert "raise num_workers (now 2, 8 cores)" in line and "not measured" in line


def test_worker_cpu_from_fake_readings():
    from shardkit.meter.workers import WorkerCpu

    clock = FakeClock()
    used = {10: 0.0, 11: 5.0}

    cpu = WorkerCpu(cpu=lambda pid: used.get(pid), clock=clock)
    assert cpu.figures() == {}
    cpu.watch([10, 11])
    clock.t, used[10], used[11] = 2.0, 2.0, 6.0  # worker 10 busy the whole time, worker 11 half of it
    assert cpu.figures() == {"worker_cpu_cores": pytest.approx(1.5), "workers_measured": 2}
    cpu.watch([20])  # a new iteration's workers (no persistent workers): the last set counts
    used[20] = 0.0
    assert cpu.figures() == {"worker_cpu_cores": pytest.approx(1.5), "workers_measured": 2}
    del used[10], used[11]  # the old workers are gone; the new ones are read from now on
    cpu.watch([20])
    clock.t, used[20] = 4.0, 0.5
    cpu.watch([21])  # 21 cannot be read (yet): 20 stays the measured set
    assert cpu.figures() == {"worker_cpu_cores": pytest.approx(0.25), "workers_measured": 1}


class Spin:
    """A map-style dataset whose items cost ~2 ms of CPU in the worker."""

    def __len__(self):
        return 256

    def __getitem__(self, i):
        end = time.process_time() + 0.002
        while time.process_time() < end:
            pass
        return i


def test_the_meter_reads_the_cpu_of_a_dataloaders_own_workers():
    from torch.utils.data import DataLoader

    meter = StarvationMeter(warmup=2, log_every=0)
    for _ in meter.wrap(DataLoader(Spin(), batch_size=8, num_workers=2)):
        pass
    s = meter.summary()
    assert s["workers_measured"] == 2 and 0.1 < s["worker_cpu_cores"] <= 2.2
    assert "workers kept" in meter.report()


def test_the_meter_finds_make_loaders_workers_and_falls_back_when_they_are_hidden(tmp_path, monkeypatch):
    from factory import loader_for, make_dataset

    from shardkit.meter import workers

    root, _ = make_dataset(tmp_path, 40, shards=4, fields=("raw", "cls"))
    _, loader = loader_for(root, monkeypatch, workers=2)
    meter = StarvationMeter(warmup=1, log_every=0)
    for _ in meter.wrap(loader):
        pass
    assert meter.summary()["workers_measured"] == 2
    assert workers.worker_pids(object()) == []  # torch renamed its private list: not measured, no guess
    _, other = loader_for(root, monkeypatch, workers=2)
    monkeypatch.setattr(workers, "worker_pids", lambda it: [])
    monkeypatch.setattr("shardkit.meter.worker_pids", lambda it: [])
    meter = StarvationMeter(warmup=1, log_every=0)
    for _ in meter.wrap(other):
        pass
    assert "worker_cpu_cores" not in meter.summary()


class _RemoteLoader:
    """Two workers over a dataset whose io_stats() are `stats`: 50 batches 30 ms apart."""

    num_workers = 2

    def __init__(self, clock, stats: dict):
        class Remote(list):
            def io_stats(self):
                return stats

        self.dataset, self.clock = Remote(), clock

    def __iter__(self):
        return fake_loader(self.clock, [0.03] * 50)


def test_network_wait_comes_from_the_datasets_io_stats():
    clock = FakeClock()
    meter = StarvationMeter(warmup=0, log_every=0, clock=clock, worker_cpu=FixedCpu(0.3))
    for _ in meter.wrap(_RemoteLoader(clock, {"network_wait_s": 3.0, "bytes": 10})):
        clock.t += 0.02
    s = meter.summary()  # 3 s of 2 workers x 2.5 s run
    assert s["network_wait_pct"] == pytest.approx(60.0) and "raise fetch-ahead" in s["advice"]


def test_a_local_dataset_says_nothing_about_the_network():
    from shardkit.meter.workers import network_wait_s

    class Local:
        def io_stats(self):  # what StreamingDataset reports for a local folder
            return {"bytes_fetched": 0, "files_fetched": 0, "network_wait_s": 0.0}

    class Remote:
        def io_stats(self):
            return {"bytes_fetched": 10, "files_fetched": 1, "network_wait_s": 0.0}

    assert network_wait_s(Local()) is None and network_wait_s(object()) is None
    assert network_wait_s(Remote()) == 0.0  # fetched without waiting: worth saying


def test_folders_and_lists_of_file_paths_read_as_files():
    from pathlib import Path

    from shardkit.meter.advice import reads_files

    class DatasetFolder:  # torchvision's, by name: no torchvision here
        pass

    class ImageFolder(DatasetFolder):
        pass

    class MyFolder(ImageFolder):
        pass

    class Paths:
        def __init__(self, files):
            self.files = files

    class Pairs:
        samples = [(Path("a/b.jpg"), 0)]

    assert reads_files(MyFolder()) and reads_files(Paths(["x.jpg"])) and reads_files(Pairs())
    assert not reads_files(Paths([])) and not reads_files(Paths([b"bytes"])) and not reads_files(object())

    class Loader:
        dataset = MyFolder()

    assert profile_of(Loader()) == DataProfile("files")


def test_with_cuda_events_the_log_line_and_report_headline_gpu_idle(caplog):
    clock = FakeClock()
    gpu = FakeGpu(clock)
    meter = StarvationMeter(warmup=2, log_every=50, device="cuda", event_factory=gpu.event_factory, clock=clock)
    with caplog.at_level(logging.INFO, logger="shardkit.meter"):
        for _ in meter.wrap(fake_loader(clock, [0.010] * 120)):
            gpu.launch(0.030)  # kernels queue: the GPU never waits although the host does
            clock.t += 0.002
    line = [r.getMessage() for r in caplog.records if r.name == "shardkit.meter"][-1]
    assert "step 102: " in line and ": 0.0 samples/s" not in line
    assert line.split("samples/s, ")[1].startswith("GPU idle 0.00% (CUDA events, fine); host starved 83.3%")
    report = meter.report().splitlines()
    assert report[1].startswith("GPU idle between steps 0.00%") and report[2].startswith("host wait 83.3%")


def test_workers_busy_fetching_are_told_the_fetch_holds_them():
    """Saturated workers that spend most of their CPU on the remote path: the fetch, not the decode."""
    line = advice(dict(measured(60.0, 2.0), fetch_cpu_pct=70.0), num_workers=2, cpus=2, data=DataProfile("raw"))
    assert line.startswith("needs 2.50x today's loader speed (60% starved): the workers spend 70% of their CPU "
                           "fetching remote shards, not decoding") and "(up to 3.3x)" in line
    little = advice(dict(measured(60.0, 2.0), fetch_cpu_pct=5.0), num_workers=2, cpus=2, data=DataProfile("raw"))
    assert "fetching" not in little


def test_fetch_cpu_comes_from_the_datasets_io_stats():
    clock = FakeClock()
    meter = StarvationMeter(warmup=0, log_every=0, clock=clock, worker_cpu=FixedCpu(1.0))
    for _ in meter.wrap(_RemoteLoader(clock, {"network_wait_s": 0.5, "bytes_fetched": 10, "fetch_cpu_s": 1.5})):
        clock.t += 0.02
    s = meter.summary()  # 1.5 s of 1 core busy over a 2.5 s run
    assert s["fetch_cpu_s"] == 1.5 and s["fetch_cpu_pct"] == pytest.approx(60.0)
    assert "spent 60% of their CPU fetching" in meter.report()
