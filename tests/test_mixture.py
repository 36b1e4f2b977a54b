"""Mixture: exact per-source counts, smooth interleaving, exactly-once over ranks x workers, passes
that continue across epochs, resume (workers, world size, schedule change points), errors that name
the source."""

import json
import os
from collections import Counter

import numpy as np
import pytest
from factory import write_dataset
from resume import check_save_load_state

from shardkit import Mixture, make_loader
from shardkit.errors import ConfigError, ManifestError
from shardkit.manifest import Manifest, write_manifest
from shardkit.sample import Sample


def int_dataset(root, name: str, n: int, shards: int) -> str:
    """n samples `name/kNNNNNN` holding only `cls` (cheap to write and read)."""
    samples = [Sample(f"{name}/k{i:06d}", {"cls": i % 3}) for i in range(n)]
    write_dataset(root / name, samples, shards=shards)
    return str(root / name)


@pytest.fixture(scope="module")
def sizes3(tmp_path_factory):
    """Three sources of very different sizes: 100, 10k, 50k samples."""
    root = tmp_path_factory.mktemp("mix3")
    return {n: int_dataset(root, n, size, shards) for n, size, shards in (("a", 100, 2), ("b", 10_000, 4),
                                                                          ("c", 50_000, 8))}


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    root = tmp_path_factory.mktemp("mixsmall")
    return {n: int_dataset(root, n, size, shards) for n, size, shards in (("a", 30, 2), ("b", 70, 3), ("c", 200, 5))}


def source_of(key: str) -> str:
    return key.split("/")[0]


def epoch_keys(mix, bs=16, workers=0) -> list[str]:
    return [k for b in make_loader(mix, batch_size=bs, num_workers=workers, prefetch_factor=2) for k in b["__key__"]]


def test_counts_exact_and_every_window_of_1000_near_the_weights(sizes3):
    mix = Mixture({"a": (sizes3["a"], 0.2), "b": (sizes3["b"], 0.5), "c": (sizes3["c"], 0.3)}, seed=3)
    planned = mix.counts(0)
    assert planned == {"a": 12_020, "b": 30_050, "c": 18_030}  # 60,100 samples by largest remainder
    loader = make_loader(mix, batch_size=500, num_workers=0)
    keys, tags = [], []
    for batch in loader:
        keys += batch["__key__"]
        tags.append(batch["__dataset__"].numpy())
    tags = np.concatenate(tags)
    assert [source_of(k) for k in keys] == [mix.names[t] for t in tags]  # __dataset__ names each sample's source
    assert dict(Counter(source_of(k) for k in keys)) == planned
    for i, weight in enumerate((0.2, 0.5, 0.3)):
        share = np.convolve(tags == i, np.ones(1000), "valid") / 1000
        assert abs(share - weight).max() <= 0.05, (mix.names[i], share.min(), share.max())
    # Up-sampled "a": 120 whole passes + 20 samples of the next; down-sampled "c": 18,030 distinct samples.
    assert sorted(Counter(Counter(k for k in keys if k[0] == "a").values()).items()) == [(120, 80), (121, 20)]
    assert len({k for k in keys if k[0] == "c"}) == 18_030
    report = loader.proportions()
    assert report["b"]["samples"] == 30_050 and report["b"]["observed"] == report["b"]["target"] == 0.5


def test_a_down_sampled_source_continues_where_the_last_epoch_stopped(small):
    mix = Mixture({"b": (small["b"], None), "c": {"path": small["c"], "choose": 80}}, seed=5)
    assert mix.counts(0) == {"b": 70, "c": 80}
    seen = []
    for epoch in range(3):
        mix.set_epoch(epoch)
        keys = epoch_keys(mix)
        assert Counter(source_of(k) for k in keys) == {"b": 70, "c": 80}
        seen.append([k for k in keys if k[0] == "c"])
    # c's samples come in its stream's order: epochs 0 and 1 and the first 40 of epoch 2 are one full
    # pass over its 200 samples (nothing repeats before all were seen); then the next pass begins.
    assert len(set(seen[0] + seen[1] + seen[2][:40])) == 200
    assert len(set(seen[2][40:])) == 40
    where = {k: v for k, v in mix.state_extra()["mixture"][1].items() if k != "checksums"}
    assert where == {"name": "c", "samples": 200, "epoch_samples": 80, "pass": 0, "offset": 160}


@pytest.mark.filterwarnings("ignore:This DataLoader will create")
@pytest.mark.parametrize("workers", [0, 2])
def test_exactly_once_over_ranks_and_workers(small, monkeypatch, workers):
    spec = {"a": (small["a"], 1.0), "b": (small["b"], 1.0), "c": (small["c"], 1.0)}  # 40 each: 30 up, 70 and 200 down
    reference = None
    for world in (1, 2, 3):
        per_rank = []
        for rank in range(world):
            monkeypatch.setenv("RANK", str(rank))
            monkeypatch.setenv("WORLD_SIZE", str(world))
            per_rank.append(epoch_keys(Mixture(spec, seed=1, samples=120, shuffle_buffer=8), bs=7, workers=workers))
        assert len({len(keys) for keys in per_rank}) == 1  # equal per-rank counts
        everything = Counter(k for keys in per_rank for k in keys)
        reference = reference or everything
        assert everything == reference  # the same samples however the epoch is split
        by_source = {s: Counter({k: n for k, n in everything.items() if source_of(k) == s}) for s in "abc"}
        assert {s: sum(c.values()) for s, c in by_source.items()} == {"a": 40, "b": 40, "c": 40}
        assert sorted(Counter(by_source["a"].values()).items()) == [(1, 20), (2, 10)]  # a pass, then 10 of the next
        assert set(by_source["b"].values()) == set(by_source["c"].values()) == {1}
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    mix = Mixture(spec, seed=1, samples=120, shuffle_buffer=8)
    first = epoch_keys(mix)
    assert epoch_keys(Mixture(spec, seed=1, samples=120, shuffle_buffer=8)) == first  # deterministic
    mix.set_epoch(1)
    assert epoch_keys(mix) != first  # another epoch, another order


def test_uneven_split_keeps_per_rank_counts_equal(small, monkeypatch):
    lengths = []
    for rank in range(3):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "3")
        mix = Mixture({"a": small["a"], "b": small["b"]}, seed=2)  # 100 samples over 3 ranks: one pad
        lengths.append(len(epoch_keys(mix, bs=5)))
        assert mix.padding == 2
    assert lengths == [34, 34, 34]


def _batches(mix_args, workers, bs=6):
    def make():
        return make_loader(Mixture(*mix_args[:1], **mix_args[1]), batch_size=bs, num_workers=workers, prefetch_factor=2)
    return make


@pytest.mark.filterwarnings("ignore:This DataLoader will create")
@pytest.mark.parametrize("before, after", [(0, 0), (0, 2), (2, 1)])
def test_resume_mid_epoch_equals_the_uninterrupted_run(small, before, after):
    args = ({"a": (small["a"], 0.5), "c": (small["c"], 0.5)}, {"seed": 4, "samples": 96, "shuffle_buffer": 8})
    check_save_load_state(_batches(args, before), lambda loader, start: (tuple(b["__key__"]) for b in loader),
                          total=16, stop=7, make_restored=_batches(args, after))


def test_resume_at_another_world_size(small, monkeypatch):
    spec = {"a": (small["a"], 0.3), "c": (small["c"], 0.7)}

    def ranks(world, state=None):
        loaders = []
        for rank in range(world):
            monkeypatch.setenv("RANK", str(rank))
            monkeypatch.setenv("WORLD_SIZE", str(world))
            loader = make_loader(Mixture(spec, seed=6, samples=100, shuffle_buffer=8), batch_size=4, num_workers=0)
            if state is not None:
                loader.load_state_dict(state)
            loaders.append(loader)
        return loaders

    whole = Counter(k for loader in ranks(1) for b in loader for k in b["__key__"])
    before, states = [], []
    for loader in ranks(2):
        it = iter(loader)
        before += [k for _ in range(3) for k in next(it)["__key__"]]
        states.append(loader.state_dict())
    assert states[0] == states[1] and states[0]["mixture"][0]["epoch_samples"] == 30
    resumed = ranks(3, states[0])
    after = [[k for b in loader for k in b["__key__"]] for loader in resumed]
    assert len({len(a) for a in after}) == 1
    got = Counter(before + [k for a in after for k in a])
    assert sum(got.values()) - sum(whole.values()) == resumed[0].source.padding
    assert set(got) == set(whole) and all(got[k] >= whole[k] for k in whole)


def test_schedule_follows_the_weights_and_resumes_across_a_change_point(small):
    # Weights move from 90/10 to 10/90 over steps 2..8 (a step is 10 samples); phases of 10 samples.
    args = ({"a": small["a"], "c": small["c"]},
            {"seed": 8, "samples": 120, "shuffle_buffer": 8, "phase": 10, "step_samples": 10,
             "schedule": [(2, {"a": 0.9, "c": 0.1}), (8, [0.1, 0.9])]})
    mix = Mixture(args[0], **args[1])
    tags = np.concatenate([b["__dataset__"].numpy() for b in make_loader(mix, batch_size=10, num_workers=0)])
    first, last = tags[:20], tags[90:]
    assert (first == 0).sum() == 18 and (last == 1).sum() == 27  # 90% a at the start, 90% c after step 8
    assert mix.counts(1) == {"a": 12, "c": 108}  # every later epoch at the last weights, exactly
    # Stop at sample 40 (inside the ramp), resume, and go past the last change point.
    check_save_load_state(_batches(args, 0, bs=10), lambda loader, start: (tuple(b["__key__"]) for b in loader),
                          total=12, stop=4)
    with pytest.raises(ConfigError, match="strictly increasing"):
        Mixture(args[0], schedule=[(5, [1, 1]), (5, [1, 2])])
    with pytest.raises(ConfigError, match=r"drop weight/repeat/choose from \['.*/a'\].*first point, at step 0"):
        Mixture({"a": (small["a"], 0.9), "c": small["c"]}, schedule=[(5, [1, 1])])  # 0.9 would be ignored


@pytest.mark.filterwarnings("ignore:This DataLoader will create")
def test_batch_level_mixing_takes_one_source_per_batch(small, monkeypatch):
    spec = {"a": (small["a"], 0.25), "b": (small["b"], 0.25), "c": (small["c"], 0.5)}
    mix = Mixture(spec, seed=9, mixing="batch", batch_size=8, samples=160)
    assert mix.counts() == {"a": 40, "b": 40, "c": 80}
    batches = list(make_loader(mix, batch_size=8, num_workers=2, prefetch_factor=2))
    assert all(len({source_of(k) for k in b["__key__"]}) == 1 and len(b["__key__"]) == 8 for b in batches)
    assert Counter(source_of(k) for b in batches for k in b["__key__"]) == {"a": 40, "b": 40, "c": 80}
    args = (spec, {"seed": 9, "mixing": "batch", "batch_size": 8, "samples": 160})
    check_save_load_state(_batches(args, 0, bs=8), lambda loader, start: (tuple(b["__key__"]) for b in loader),
                          total=20, stop=9, make_restored=_batches(args, 2, bs=8))
    with pytest.raises(ConfigError, match="one source per batch of 8"):
        make_loader(Mixture(spec, mixing="batch", batch_size=8), batch_size=16)


def test_unreachable_or_empty_source_is_named_at_construction(small, tmp_path):
    with pytest.raises(ManifestError, match=r"mixture source 'gone' \(.*nowhere\).*no manifest"):
        Mixture({"a": small["a"], "gone": str(tmp_path / "nowhere")})
    with pytest.raises(ManifestError, match=r"mixture source 'remote' \(http://127\.0\.0\.1:9/ds\): cannot fetch"):
        Mixture({"a": small["a"], "remote": "http://127.0.0.1:9/ds"}, retries=0, timeout=2)
    write_manifest(str(tmp_path), Manifest(samples=0, fields={"cls": {"kind": "int", "dtype": "int64"}}, shards=[]))
    with pytest.raises(ManifestError, match="mixture source 'empty' .* holds no samples"):
        Mixture({"a": small["a"], "empty": str(tmp_path)})


def test_sources_must_share_the_fields_read(small, tmp_path):
    write_dataset(tmp_path / "img", [Sample(f"i{i}", {"cls": 1, "raw": bytes(8 * 8 * 3)}) for i in range(5)],
                  shards=1, size=(8, 8))
    with pytest.raises(ConfigError, match=r"mixture source 'img' .*no field|field 'raw'"):
        Mixture({"img": str(tmp_path / "img"), "a": small["a"]})
    assert Mixture({"img": str(tmp_path / "img"), "a": small["a"]}, fields=["cls"]).counts() == {"img": 5, "a": 30}


def test_a_state_from_another_mixture_is_refused(small):
    loader = make_loader(Mixture({"a": (small["a"], 0.5), "b": (small["b"], 0.5)}, samples=60), batch_size=4)
    next(iter(loader))
    state = loader.state_dict()
    other = make_loader(Mixture({"a": (small["a"], 0.2), "b": (small["b"], 0.8)}, samples=60), batch_size=4)
    with pytest.raises(ConfigError, match="source 'a' of the saved state differs: epoch_samples=30 then, 12 now"):
        other.load_state_dict(state)
    from shardkit import StreamingDataset

    with pytest.raises(ConfigError, match="saved from a Mixture"):
        make_loader(StreamingDataset(small["a"]), batch_size=4).load_state_dict(state)


def test_config_from_a_dict_or_a_json_file(small, tmp_path):
    spec = {"sources": {"a": {"path": small["a"], "repeat": 2}, "b": {"path": small["b"], "choose": 10}},
            "seed": 3, "shuffle_buffer": 8}
    path = tmp_path / "mix.json"
    path.write_text(json.dumps(spec))
    a, b = Mixture.from_config(spec), Mixture.from_config(str(path))
    assert a.counts() == b.counts() == {"a": 60, "b": 10}
    assert epoch_keys(a) == epoch_keys(b)
    with pytest.raises(ConfigError, match="give one of weight, repeat or choose"):
        Mixture({"a": {"path": small["a"], "weight": 1, "choose": 3}})
    with pytest.raises(ConfigError, match="unknown options"):
        Mixture({"a": small["a"]}, weights=[1])


def test_meter_reports_observed_and_target_shares(small):
    from shardkit import StarvationMeter

    loader = make_loader(Mixture({"a": (small["a"], 0.25), "c": (small["c"], 0.75)}, samples=80), batch_size=8,
                         num_workers=0)
    meter = StarvationMeter(warmup=0)
    for _ in meter.wrap(loader):
        pass
    summary = meter.summary()
    assert summary["mixture"]["a"]["samples"] == 20 and summary["mixture"]["c"]["observed"] == 0.75
    assert "mixture (observed / target): a 25.0% / 25.0%, c 75.0% / 75.0%" in meter.report()


def test_packed_token_datasets_mix(tmp_path):
    from shardkit.config import BuildConfig
    from shardkit.demo.datagen import words
    from shardkit.jobs.build import build

    rng = np.random.default_rng(1)
    raw = tmp_path / "raw"
    raw.mkdir()
    for i in range(12):
        (raw / f"d{i:02d}.txt").write_text(words(rng, 30), encoding="utf-8")
    build(BuildConfig(src=str(raw), out=str(tmp_path / "tok"), tokenizer="bpe:300", seq_len=16, workers=0,
                      progress=False, max_samples_per_shard=5))
    src = str(tmp_path / "tok")
    from shardkit import StreamingDataset

    alone = {b["__key__"][i]: b["input_ids"][i].tolist()
             for b in make_loader(StreamingDataset(src, keys=True), batch_size=4, num_workers=0)
             for i in range(len(b["__key__"]))}
    mix = Mixture({"x": (src, 0.5), "y": (src, 0.5)}, keys=True, seed=2)
    batches = list(make_loader(mix, batch_size=4, num_workers=0))
    rows = [(b["__key__"][i], b["input_ids"][i].tolist()) for b in batches for i in range(len(b["__key__"]))]
    assert len(rows) == 2 * len(alone) and all(alone[k] == ids for k, ids in rows)
    assert Counter(int(t) for b in batches for t in b["__dataset__"]) == {0: len(alone), 1: len(alone)}


def test_remote_and_local_sources_mix(small, tmp_path):
    import functools
    import threading
    from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

    class Quiet(SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=os.path.dirname(small["c"])))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/c"
        local = Mixture({"a": small["a"], "c": (small["c"], None)}, seed=1)
        remote = Mixture({"a": small["a"], "c": (url, None)}, seed=1, cache_dir=str(tmp_path / "cache"))
        assert epoch_keys(remote, workers=0) == epoch_keys(local)
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_proportions_count_whole_batches_and_runs_across_epochs(small):
    mix = Mixture({"a": (small["a"], 0.25), "c": (small["c"], 0.75)}, mixing="batch", batch_size=8, samples=160, seed=1)
    loader = make_loader(mix, batch_size=8, num_workers=0)
    it = iter(loader)
    for _ in range(4):
        next(it)
    part = loader.proportions()  # mid-epoch: what the first 4 batches held, one source each
    assert sum(v["samples"] for v in part.values()) == 32
    assert all(v["observed"] == v["target"] for v in part.values())
    for _ in it:
        pass
    for _ in loader:  # a second epoch
        pass
    report = loader.proportions()
    assert {k: v["samples"] for k, v in report.items()} == {"a": 80, "c": 240}
    assert report["a"]["observed"] == report["a"]["target"] == 0.25


def test_a_schedule_ending_far_ahead_costs_only_the_epochs_reached(small, monkeypatch):
    # The last point lies ~1e8 epochs of 100 samples ahead: epoch 0 (and its saved state) needs
    # epoch 0's phases only, never the counts of the first epoch after the schedule.
    from shardkit.reader.mixing import MixPlan

    real = MixPlan._compute

    def compute(self, epoch):
        assert epoch <= 3, f"epoch {epoch}'s phases computed for epochs 0..3"
        return real(self, epoch)

    monkeypatch.setattr(MixPlan, "_compute", compute)
    mix = Mixture({"a": small["a"], "b": small["b"]}, seed=1, schedule=[(0, [0.5, 0.5]), (10**10, [0.1, 0.9])])
    loader = make_loader(mix, batch_size=10, num_workers=0)
    next(iter(loader))
    assert loader.state_dict()["mixture"][1]["pass"] == 0 and mix.counts() == {"a": 50, "b": 50}
    mix.set_epoch(3)
    assert mix.order(3).starts.tolist() == [150, 150]


def test_sources_and_schedules_as_scripts_write_them(small):
    # Paths as pathlib.Path inside (path, weight), numbers from numpy, a schedule as {step: weights}.
    from pathlib import Path

    mix = Mixture({"a": (Path(small["a"]), np.float32(0.25)), "b": {"path": Path(small["b"]), "choose": np.int64(10)},
                   "c": (small["c"], np.float64(0.75))}, samples=90)
    assert mix.counts() == {"a": 20, "b": 10, "c": 60}
    timed = Mixture({"a": small["a"], "c": small["c"]}, samples=100,
                    schedule={np.int64(0): np.array([1.0, 1.0]), 10: {"c": 1}})
    assert timed.counts(0) == Mixture({"a": small["a"], "c": small["c"]}, samples=100,
                                      schedule=[(0, [1.0, 1.0]), (10, {"c": 1})]).counts(0)
    with pytest.raises(ConfigError, match=r"schedule point \(0, \[1, 1\], 3\): expected \(step, weights\)"):
        Mixture({"a": small["a"], "c": small["c"]}, schedule=[(0, [1, 1], 3)])
    with pytest.raises(ConfigError, match="weight='x'; expected a number >= 0"):
        Mixture({"a": (small["a"], "x")})


def test_proportions_name_batches_whose_source_tags_a_batch_transform_dropped(small, caplog):
    mix = Mixture({"a": (small["a"], 0.5), "c": (small["c"], 0.5)}, samples=40, seed=1,
                  batch_transform=lambda b: {k: v for k, v in b.items() if k != "__dataset__"})
    loader = make_loader(mix, batch_size=8, num_workers=0)
    for _ in loader:
        pass
    with caplog.at_level("WARNING", logger="shardkit.reader.mixture"):
        report = loader.proportions()
    assert sum(v["samples"] for v in report.values()) == 0
    assert "40 yielded samples came in batches without '__dataset__'" in caplog.text


def test_a_state_is_refused_by_sources_of_the_same_size_swapped(tmp_path):
    x, y = int_dataset(tmp_path, "x", 40, 2), int_dataset(tmp_path, "y", 40, 2)
    loader = make_loader(Mixture({"web": (x, 0.75), "books": (y, 0.25)}, samples=40), batch_size=4)
    next(iter(loader))
    state = loader.state_dict()
    swapped = make_loader(Mixture({"web": (y, 0.75), "books": (x, 0.25)}, samples=40), batch_size=4)
    with pytest.raises(ConfigError, match="source 'web' of the saved state differs: checksums="):
        swapped.load_state_dict(state)
    copied = tmp_path / "copy"
    import shutil

    shutil.copytree(x, copied)  # the same shard files elsewhere: the same source
    again = make_loader(Mixture({"web": (str(copied), 0.75), "books": (y, 0.25)}, samples=40), batch_size=4)
    again.load_state_dict(state)
    old = dict(state, mixture=[{k: v for k, v in s.items() if k != "checksums"} for s in state["mixture"]])
    make_loader(Mixture({"web": (x, 0.75), "books": (y, 0.25)}, samples=40), batch_size=4).load_state_dict(old)
