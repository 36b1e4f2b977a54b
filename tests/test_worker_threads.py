"""Library threads are capped in DataLoader workers (loader/threads.py), so workers leave cores to
the training loop; SHARDKIT_WORKER_THREADS changes or lifts the cap."""

from __future__ import annotations

import os

import pytest
import torch

from shardkit.errors import ConfigError
from shardkit.loader import make_loader
from shardkit.loader.threads import worker_threads
from shardkit.reader.dataset import StreamingDataset


class Probe(StreamingDataset):
    """Records, in each worker, the thread settings its batches were built under."""

    def batches(self, batch_size, drop_last, transport=None):
        import pyarrow

        seen = f"{torch.get_num_threads()},{os.environ.get('OMP_NUM_THREADS')},{pyarrow.cpu_count()}"
        for batch in super().batches(batch_size, drop_last, transport):
            batch["txt"] = [seen] * len(batch["__key__"])
            yield batch


@pytest.fixture(scope="module")
def texts(tmp_path_factory):
    from factory import make_dataset

    return make_dataset(tmp_path_factory.mktemp("texts"), 12, shards=2, fields=("txt", "cls"))


def _seen(root, monkeypatch, **env):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    loader = make_loader(Probe(root, fields=["txt", "cls"]), batch_size=4, num_workers=2)
    try:
        return {t for b in loader for t in b["txt"]}
    finally:
        loader.close()


def test_workers_run_libraries_on_one_thread(texts, monkeypatch):
    root, _ = texts
    assert _seen(root, monkeypatch) == {"1,1,1"}


def test_the_cap_can_be_raised(texts, monkeypatch):
    root, _ = texts
    assert _seen(root, monkeypatch, SHARDKIT_WORKER_THREADS="3") == {"3,3,3"}


def test_a_bad_cap_says_how_to_fix_it(monkeypatch):
    monkeypatch.setenv("SHARDKIT_WORKER_THREADS", "many")
    with pytest.raises(ConfigError, match="SHARDKIT_WORKER_THREADS='many'.*or 'none'"):
        worker_threads()
    monkeypatch.setenv("SHARDKIT_WORKER_THREADS", "none")
    assert worker_threads() is None
