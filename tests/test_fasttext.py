"""--filter fasttext and the fasttext scorer: a model trained here with the binding itself (nothing
downloaded) scores and filters the same at 0 and 2 workers, its score is an attribute `where=` can
use, and a missing, wrong or label-less model is a one-line error (exit 2) before any worker starts."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys

import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from conftest import tree_bytes
from shardkit.cli import main
from shardkit.config import BuildConfig
from shardkit.jobs.build import build
from shardkit.reader.dataset import StreamingDataset

fasttext = pytest.importorskip("fasttext")  # the extra shardkit[fasttext] (in dev)

GOOD = "the river runs past the old mill and turns toward the quiet valley where farmers grow wheat".split()
BAD = "buy cheap casino now free bonus win click deal offer limited prize".split()


def _text(rng, words, n) -> str:
    return "\n".join(" ".join(rng.choice(words) for _ in range(n // 3)) for _ in range(3))


TRAIN = """
import sys, fasttext
folder = sys.argv[1]
kw = dict(input=folder + "/train.txt", minCount=1, thread=1, verbose=0)
for fn, path, opts in ((fasttext.train_unsupervised, "vectors.bin", dict(epoch=1, dim=8, bucket=1000)),
                       (fasttext.train_supervised, "quality.bin", dict(epoch=5, dim=16, bucket=10000, wordNgrams=2))):
    for _ in range(50):
        try:
            fn(**kw, **opts).save_model(folder + "/" + path)
            break
        except RuntimeError as e:
            if "NaN" not in str(e):
                raise
    else:
        sys.exit("fastText training raised NaN 50 times")
"""


def _train(folder) -> None:
    """The two models, trained by the binding in a fresh interpreter. On a corpus this small its
    training can end before its first loss report and raise "Encountered NaN" (its progress check
    divides by 0 examples), so it is tried again; in a process that has imported torch's data
    loader (as the other tests do) that happens on every try, hence the fresh interpreter. The
    skipgram model is trained first: after the supervised one, in the same interpreter, its first
    6 to 23 tries raised NaN on a quiet machine, and all 50 under `stress --cpu 2`; first, it
    passes at once, quiet or under stress."""
    subprocess.run([sys.executable, "-c", TRAIN, str(folder)], check=True)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A supervised model (__label__hq / __label__lq), an unsupervised one, and a file of another kind."""
    folder = tmp_path_factory.mktemp("ft")
    rng = random.Random(0)
    with open(folder / "train.txt", "w") as f:
        for _ in range(300):
            f.write(f"__label__hq {_text(rng, GOOD, 30).replace(chr(10), ' ')}\n")
            f.write(f"__label__lq {_text(rng, BAD, 30).replace(chr(10), ' ')}\n")
    _train(folder)
    (folder / "notes.bin").write_bytes(b"not a model\n" * 10)
    return folder


@pytest.fixture
def raw(tmp_path):
    """A .jsonl corpus whose documents mix the two vocabularies in every proportion."""
    rng = random.Random(1)
    os.makedirs(tmp_path / "raw")
    with open(tmp_path / "raw" / "docs.jsonl", "w") as f:
        for i in range(120):
            mix = GOOD * (i % 7) + BAD * (6 - i % 7) + GOOD
            f.write(json.dumps({"text": _text(rng, mix, 30)}) + "\n")
    return tmp_path / "raw"


def _options(model_dir, **kw) -> tuple:
    opts = {"model": str(model_dir / "quality.bin"), "label": "__label__hq", "threshold": 0.5, **kw}
    return (",".join(f"fasttext.{k}={v}" for k, v in opts.items()),)


def _build(raw, out, model_dir, workers, **kw):
    return build(BuildConfig(str(raw), str(out), filter="fasttext", filter_option=_options(model_dir),
                             max_samples_per_shard=25, format="parquet", workers=workers, progress=False, **kw))


def _keys(out) -> list[str]:
    return sorted(k for f in sorted((out / "shards").glob("*.parquet"))
                  for k in pq.read_table(f, columns=["__key__"]).column(0).to_pylist())


def test_same_scores_and_kept_set_at_0_and_2_workers_as_the_bindings_predict(tmp_path, raw, model_dir):
    a = _build(raw, tmp_path / "a", model_dir, 0)
    b = _build(raw, tmp_path / "b", model_dir, 2)
    assert tree_bytes(tmp_path / "a") == tree_bytes(tmp_path / "b")
    m = fasttext.load_model(str(model_dir / "quality.bin"))
    texts = [json.loads(line)["text"] for line in open(raw / "docs.jsonl")]
    kept = sorted(f"docs/{i:06d}" for i, t in enumerate(texts, 1)
                  if dict(zip(*m.predict(t.replace("\n", " "), k=-1))).get("__label__hq", 0.0) >= 0.5)
    assert 0 < len(kept) < len(texts) and _keys(tmp_path / "a") == kept == _keys(tmp_path / "b")
    assert a.stats["curation.fasttext.low_score"] == len(texts) - len(kept) == b.stats["curation.fasttext.low_score"]

    # --annotate: every sample kept, the score an attribute column where= chooses by
    ann = [_build(raw, tmp_path / f"ann{w}", model_dir, w, annotate=True) for w in (0, 2)]
    assert ann[0].samples == len(texts) and tree_bytes(tmp_path / "ann0") == tree_bytes(tmp_path / "ann2")
    scores = pq.read_table(sorted((tmp_path / "ann0" / "attributes").glob("*.parquet"))).to_pylist()
    want = {f"docs/{i:06d}": dict(zip(*m.predict(t.replace("\n", " "), k=-1))).get("__label__hq", 0.0)
            for i, t in enumerate(texts, 1)}
    assert all(abs(r["fasttext_score"] - want[r["__key__"]]) < 1e-6 for r in scores) and len(scores) == len(texts)
    ds = StreamingDataset(str(tmp_path / "ann0"), where="fasttext_score >= 0.5", shuffle=False)
    assert sorted(s["__key__"] for s in ds) == kept


def test_interface_columns_match_scores(model_dir):
    from shardkit.stages.filters import Curation, parse_options

    f = Curation.from_options("fasttext", _options(model_dir)).steps[0]
    scores = f.score("the river runs\npast the mill")
    assert set(f.columns) - set(scores) == {"fasttext"} and 0.5 < scores["fasttext_score"] <= 1.0
    assert f.check("buy cheap casino now") == (False, "low_score") and f.score("x") == f.score("x")
    assert parse_options(["fasttext.threshold=none"]) == {"fasttext": {"threshold": None}}
    assert len(f.digest) == 16 and f.digest in repr(f)  # the model's bytes are in the fingerprint


def test_fasttext_is_a_declared_filter_and_its_thresholds_read_none(model_dir):
    from shardkit.stages.filters import Curation, parse_options
    from shardkit.stages.filters.base import Filter

    f = Curation.from_options("fasttext", _options(model_dir, threshold="none", max_chars="none")).steps[0]
    assert isinstance(f, Filter) and f.decides and f.columns[f.verdict] is not None
    assert (f.threshold, f.max_chars) == (None, None)
    assert all(f.check(doc) == (True, None) for doc in ("buy cheap casino now", "the river runs", ""))
    assert Curation.from_options("fasttext", _options(model_dir, max_chars=0)).steps[0].max_chars is None  # old off
    with pytest.raises(Exception, match="fasttext.threshold"):
        parse_options(["fasttext.threshold=nan"])


def test_cli_filter_option_in_one_flag(tmp_path, raw, model_dir):
    res = CliRunner().invoke(main, ["build", str(raw), str(tmp_path / "out"), "--workers", "0", "--no-progress",
                                    "--filter", "fasttext", "--filter-option", _options(model_dir)[0]])
    assert res.exit_code == 0, res.output
    assert "fasttext: low_score" in res.output


@pytest.mark.parametrize("change,message", [
    ({"model": "missing.bin"}, "no such file"),
    ({"label": "__label__edu"}, "has no such label; its labels: __label__"),
    ({"model": "vectors.bin"}, "a skipgram (word vector) model has no labels"),
    ({"model": "notes.bin"}, "not a fastText model"),
])
def test_a_bad_model_is_one_line_exit_2_before_any_worker(tmp_path, raw, model_dir, monkeypatch, change, message):
    import distributed

    def no_cluster(*a, **k):
        raise AssertionError("a cluster was started")

    monkeypatch.setattr(distributed, "LocalCluster", no_cluster)
    if "model" in change:
        change = {"model": str(model_dir / change["model"])}
    res = CliRunner().invoke(main, ["build", str(raw), str(tmp_path / "out"), "--workers", "2", "--no-progress",
                                    "--filter", "fasttext", "--filter-option", _options(model_dir, **change)[0]])
    assert res.exit_code == 2, res.output
    assert message in res.output and len(res.output.strip().splitlines()) == 1
    assert not (tmp_path / "out" / "shards").exists()


def test_shardkit_annotate_takes_scorer_options(tmp_path, raw, model_dir):
    build(BuildConfig(str(raw), str(tmp_path / "out"), max_samples_per_shard=25, workers=0, progress=False))
    runs = []
    for workers in ("0", "2"):
        res = CliRunner().invoke(main, ["annotate", str(tmp_path / "out"), "--scorers", "gopher-quality,fasttext",
                                        "--scorer-option", _options(model_dir)[0], "--scorer-option",
                                        "gopher-quality.min_doc_words=none", "--workers", workers, "--no-progress"])
        assert res.exit_code == 0, res.output
        assert "fasttext_score" in res.output and "gopher_quality" in res.output
        runs.append(tree_bytes(tmp_path / "out" / "attributes"))
        (tmp_path / "out" / "attributes").rename(tmp_path / f"attributes{workers}")
        os.remove(tmp_path / "out" / "manifest.json")
        build(BuildConfig(str(raw), str(tmp_path / "out"), max_samples_per_shard=25, workers=0, progress=False))
    assert runs[0] == runs[1]
    bad = CliRunner().invoke(main, ["annotate", str(tmp_path / "out"), "--scorers", "fasttext", "--workers", "0",
                                    "--scorer-option", "c4.min_num_sentences=2"])
    assert bad.exit_code == 1 and "--scorer-option for c4, which is not run" in bad.output
    bad = CliRunner().invoke(main, ["annotate", str(tmp_path / "out"), "--scorers", "fasttext", "--workers", "0",
                                    "--scorer-option", f"fasttext.model={model_dir / 'vectors.bin'}"])
    assert bad.exit_code == 2 and "word vector" in bad.output
