"""Dedup cut into partitions and bucket ranges on Dask gives the report of the one-process run, byte for byte."""

import io
import json

import numpy as np
import pytest
from PIL import Image

from shardkit.config import DedupConfig
from shardkit.jobs.dedup_tasks import find_duplicates
from shardkit.sample import Sample
from shardkit.duplicates.review import write_report
from shardkit.jobs.cluster import dask_client

LETTERS = list("abcdefghijklmnopqrstuvwxyz")


def planted(seed=3, length=120, per_level=6, unrelated=300) -> list[Sample]:
    """Pairs at exact Jaccard 0.5 … 1.0 plus unrelated documents."""
    rng = np.random.default_rng(seed)
    vocab = np.array(["".join(rng.choice(LETTERS, 7)) for _ in range(20000)])
    docs = {}
    size = length - 4
    for level in np.round(np.arange(0.5, 1.0001, 0.05), 2):
        for r in range(per_level):
            a = list(rng.choice(vocab, length))
            shared = int(np.ceil(2 * size * level / (1 + level)))
            docs[f"p{level:.2f}-{r}-a"] = " ".join(a)
            docs[f"p{level:.2f}-{r}-b"] = " ".join(a[:shared + 4] + list(rng.choice(vocab, length - shared - 4)))
    for i in range(unrelated):
        docs[f"u{i:04d}"] = " ".join(rng.choice(vocab, length))
    return [Sample(k, {"txt": docs[k]}) for k in sorted(docs)]


def hundred_copies(seed=4) -> list[Sample]:
    """One document 100 times (exact and near copies interleaved with others), plus a 30-image cluster."""
    rng = np.random.default_rng(seed)
    vocab = np.array(["".join(rng.choice(LETTERS, 7)) for _ in range(20000)])
    base = list(rng.choice(vocab, 150))
    samples = []
    for i in range(100):
        words = list(base)
        if i % 3:
            words[int(rng.integers(0, 150))] = "changed"  # near copies
        samples.append(Sample(f"c{i:03d}", {"txt": " ".join(words)}))
        samples.append(Sample(f"o{i:03d}", {"txt": " ".join(rng.choice(vocab, 150))}))
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (24, 32, 3), dtype=np.uint8)).resize((64, 48)).save(buf, "PNG")
    samples += [Sample(f"i{i:02d}", {"png": buf.getvalue()}) for i in range(30)]
    return sorted(samples, key=lambda s: s.key)


def _report(samples, tmp_path, name, client, **cut) -> dict:
    result = find_duplicates(samples, DedupConfig(progress=False), client, str(tmp_path / name), **cut)
    result.summary.pop("execution")
    write_report(str(tmp_path / name / "report"), result)
    return {f: (tmp_path / name / "report" / f).read_bytes() for f in ("clusters.parquet", "summary.json")}


@pytest.mark.parametrize("make", [planted, hundred_copies])
def test_partitioned_clustering_equals_the_single_process_path(tmp_path, make):
    samples = make()
    single = _report(samples, tmp_path, "single", None, per_partition=len(samples), bucket_tasks=1)
    many = _report(samples, tmp_path, "many", None, per_partition=37, bucket_tasks=11)
    with dask_client(None, 2) as client:
        dask = _report(samples, tmp_path, "dask", client, per_partition=64, bucket_tasks=5)
    assert single == many == dask
    summary = json.loads(single["summary.json"])
    assert summary["removed"] > 0
    if make is hundred_copies:
        assert summary["removed"] == 99 + 29 and summary["clusters"] == 2


def test_hash_order_equals_a_lexsort_by_hash_then_the_tie_breakers():
    from shardkit.duplicates.links import hash_order

    rng = np.random.default_rng(5)
    for n, values in [(1, 1), (2000, 3), (2000, 400), (50000, 2**64 - 1)]:
        h = rng.integers(0, values, n, dtype=np.uint64)
        row, x = rng.permutation(n).astype(np.uint32), rng.integers(0, 3, n, dtype=np.uint64)
        assert np.array_equal(hash_order(h, row), np.lexsort((row, h)))
        assert np.array_equal(hash_order(h, x, row, runs=True), np.lexsort((row, x, h)))
        runs = np.concatenate([np.sort(part) for part in np.array_split(h, 7)])
        assert np.array_equal(hash_order(runs, row, runs=True), np.lexsort((row, runs)))
