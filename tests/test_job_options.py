"""One way to pass options: JobOptions declared and checked once for every job config, MapConfig for
build_map (the same bytes as its keywords), WriterConfig a ConfigError like its neighbours, and the
writers' defaults in one place."""

from __future__ import annotations

import dataclasses

import map_fns
import pytest

from shardkit.config import AnnotateConfig, BuildConfig, DedupConfig, JobOptions
from shardkit.config.common import QUALITY, SHARD_SIZE, USER_ENCODE
from shardkit.config.writer import MapConfig, WriterConfig
from shardkit.errors import ConfigError
from shardkit.jobs.map import build_map
from shardkit.jobs.shard_writer import ShardWriter

JOB = {f.name for f in dataclasses.fields(JobOptions)}


@pytest.mark.parametrize("make", [lambda **kw: BuildConfig("a", "b", **kw), lambda **kw: DedupConfig(**kw),
                                  lambda **kw: AnnotateConfig("o", scorers="text-length", **kw),
                                  lambda **kw: MapConfig(**kw)])
@pytest.mark.parametrize("bad", [{"on_error": "never"}, {"worker_pool": "fibers"}, {"workers": -1},
                                 {"timeout": 0}, {"retries": -1}])
def test_every_job_config_checks_the_job_options_the_same_way(make, bad):
    assert JOB <= {f.name for f in dataclasses.fields(make())}
    name = next(iter(bad))
    with pytest.raises(ConfigError, match=name):
        make(**bad)


def test_the_job_options_stay_out_of_what_a_config_records():
    for cfg in (BuildConfig("a", "b"), DedupConfig()):
        assert not set(JobOptions.RUNTIME_ONLY) & set(cfg.recorded())
    assert BuildConfig("a", "b", workers=0, timeout=3).output_hash() == BuildConfig("a", "c").output_hash()


def test_writer_config_raises_config_error():
    for bad in ({"format": "zip"}, {"encode": "gif"}, {"shard_size": 0}, {"quality": 0},
                {"max_samples_per_shard": 0}):
        with pytest.raises(ConfigError):
            WriterConfig(**bad)


def test_the_writers_defaults_are_written_once():
    writer, build = WriterConfig(), BuildConfig("a", "b")
    assert writer.shard_size == build.shard_size == SHARD_SIZE and writer.quality == build.quality == QUALITY
    assert writer.encode == USER_ENCODE != build.encode  # config/common.py says why they differ
    import inspect

    for fn in (ShardWriter.__init__, build_map):
        params = inspect.signature(fn).parameters
        assert (params["shard_size"].default, params["encode"].default, params["quality"].default) == \
            (SHARD_SIZE, USER_ENCODE, QUALITY)


def test_build_map_takes_a_map_config_or_its_keywords_alike(tmp_path):
    options = dict(workers=0, progress=False, inputs_per_shard=30, format="both")
    by_keywords = build_map(map_fns.make, range(60), str(tmp_path / "a"), **options)
    config = MapConfig.from_options(options)
    assert config.writer == WriterConfig(format="both") and config.inputs_per_shard == 30
    by_config = build_map(map_fns.make, range(60), str(tmp_path / "b"), config=config)
    assert [s.sha256 for s in by_keywords.manifest.shards] == [s.sha256 for s in by_config.manifest.shards]
    with pytest.raises(ConfigError, match=r"unknown option\(s\) \['shard_bytes'\]"):
        MapConfig.from_options({"shard_bytes": 1})
