"""Attributes, not only decisions: `build --annotate` then `where=` reads exactly what `build --filter`
keeps, over ranks x workers, after a resume at another world size, and by index and key."""

import json
from collections import Counter

import pytest
from factory import keys_of

from shardkit.config import BuildConfig
from shardkit.errors import ConfigError, SampleNotFound
from shardkit.jobs.build import build
from shardkit.loader import make_loader
from shardkit.manifest import load_manifest
from shardkit.reader.dataset import StreamingDataset
from shardkit.stages.filters import TextLength

DOCS = 500


def write_corpus(folder, docs: int = DOCS, seed: int = 0) -> dict[str, str]:
    """A .jsonl corpus of texts from 0 to ~300 characters; returns {key: text} as the build keys them."""
    import random

    r = random.Random(seed)
    folder.mkdir(parents=True, exist_ok=True)
    texts = {}
    with open(folder / "docs.jsonl", "w") as f:
        for i in range(1, docs + 1):
            text = " ".join(f"w{r.randint(0, 99)}" for _ in range(r.randint(0, 75))) + " " * r.randint(0, 2)
            f.write(json.dumps({"text": text}) + "\n")
            texts[f"docs/{i:06d}"] = text
    return texts


def built(tmp, name, **options):
    out = tmp / name
    build(BuildConfig(str(tmp / "raw"), str(out), max_samples_per_shard=37, workers=0, progress=False, **options))
    return str(out)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("attributes")
    texts = write_corpus(tmp / "raw")
    kept = {k for k, t in texts.items() if TextLength().keep({"text_chars": len(t.strip())})[0]}  # the rule, by hand
    assert 0.3 < len(kept) / DOCS < 0.9
    return {"filtered": built(tmp, "filtered", filter="text-length"),
            "annotated": built(tmp, "annotated", filter="text-length", annotate=True, format="both"),
            "kept": kept, "texts": texts}


def loader(root, monkeypatch, rank, world, workers, **options):
    monkeypatch.setenv("RANK", str(rank))
    monkeypatch.setenv("WORLD_SIZE", str(world))
    ds = StreamingDataset(root, fields=["txt"], seed=5, shuffle_buffer=64, **options)
    return make_loader(ds, batch_size=8, num_workers=workers, prefetch_factor=2)


def per_rank(root, monkeypatch, world, workers, **options):
    return [keys_of(loader(root, monkeypatch, r, world, workers, **options)) for r in range(world)]


@pytest.mark.filterwarnings("ignore:This DataLoader will create")
@pytest.mark.parametrize("fmt", ["tar", "parquet"])
def test_annotate_then_where_yields_what_filter_keeps_over_2_ranks_x_2_workers(corpus, monkeypatch, fmt):
    filtered = per_rank(corpus["filtered"], monkeypatch, 2, 2)
    annotated = per_rank(corpus["annotated"], monkeypatch, 2, 2, where="text_length", format=fmt)
    assert annotated == filtered  # key for key, in the same order on every rank
    seen = Counter(k for keys in annotated for k in keys)
    assert set(seen) == corpus["kept"]
    assert sum(seen.values()) - len(corpus["kept"]) == len(corpus["kept"]) % 2  # one pad at most
    everything = per_rank(corpus["annotated"], monkeypatch, 2, 2, format=fmt)
    assert {k for keys in everything for k in keys} == set(corpus["texts"])  # --annotate kept every sample


@pytest.mark.filterwarnings("ignore:This DataLoader will create")
@pytest.mark.parametrize("workers", [0, 2])
def test_resume_at_another_world_size_counts_kept_samples_only(corpus, monkeypatch, workers):
    def run(root, **options):
        loaders = [loader(root, monkeypatch, rank, 2, workers, **options) for rank in range(2)]
        before = []
        for one in loaders:  # every rank yields 3 batches, then the run stops
            it = iter(one)
            before.append(keys_of(next(it) for _ in range(3)))
            del it
        saved = loaders[0].state_dict()
        assert saved == loaders[1].state_dict() and saved["consumed"] == 24
        after = []
        for rank in range(3):
            resumed = loader(root, monkeypatch, rank, 3, workers, **options)
            resumed.load_state_dict(saved)
            after.append(keys_of(resumed))
        return before, after, resumed.source.padding

    f_before, f_after, f_pad = run(corpus["filtered"])
    w_before, w_after, w_pad = run(corpus["annotated"], where="text_length")
    assert (w_before, w_after) == (f_before, f_after)
    seen = Counter(k for keys in w_before + w_after for k in keys)
    assert set(seen) == corpus["kept"] and sum(seen.values()) - len(corpus["kept"]) == w_pad == f_pad


def test_len_index_and_key_count_kept_samples_only(corpus):
    filtered = StreamingDataset(corpus["filtered"], fields=["txt"])
    ds = StreamingDataset(corpus["annotated"], fields=["txt"], where="text_length")
    assert len(ds) == len(filtered) == len(corpus["kept"])
    assert [ds[i]["__key__"] for i in range(len(ds))] == [filtered[i]["__key__"] for i in range(len(ds))]
    assert ds[-1] == filtered[-1]
    dropped = sorted(set(corpus["texts"]) - corpus["kept"])
    key = sorted(corpus["kept"])[7]
    assert ds.get(key) == filtered.get(key) and ds.lookup.index_of(key) == filtered.lookup.index_of(key)
    with pytest.raises(SampleNotFound, match="among the .* samples where='text_length' keeps"):
        ds.get(dropped[0])
    assert ds.get(dropped[0], None) is None
    everything = StreamingDataset(corpus["annotated"], fields=["txt"])
    assert everything.get(dropped[0])["txt"] == corpus["texts"][dropped[0]]


def test_where_errors_name_the_available_columns(corpus):
    for bad, says in (("lang == 'en'", "no attribute column 'lang'"), ("text_length and", "is not an expression")):
        with pytest.raises(ConfigError) as e:
            StreamingDataset(corpus["annotated"], where=bad)
        assert says in str(e.value) and "available columns: text_chars (int64), text_length (bool)" in str(e.value)
        assert "\n" not in str(e.value)
    with pytest.raises(ConfigError, match=r"available columns: none \(add some with `shardkit annotate"):
        StreamingDataset(corpus["filtered"], where="text_length")
    with pytest.raises(ConfigError, match="expected an expression string"):
        StreamingDataset(corpus["annotated"], where=1)


def test_a_state_saved_with_another_where_is_refused(corpus, monkeypatch):
    saved = loader(corpus["annotated"], monkeypatch, 0, 1, 0, where="text_length").state_dict()
    other = loader(corpus["annotated"], monkeypatch, 0, 1, 0, where="text_chars >= 100 and text_length")
    with pytest.raises(ConfigError, match="where='text_length' then"):
        other.load_state_dict(saved)  # the same samples, hence the same counts: the expression tells them apart
    everything = loader(corpus["annotated"], monkeypatch, 0, 1, 0)
    with pytest.raises(ConfigError, match="samples="):
        everything.load_state_dict(saved)


def test_manifest_without_attributes_and_readers_that_ignore_them(corpus):
    plain = load_manifest(corpus["filtered"])
    assert "attributes" not in plain.extra
    annotated = json.loads(open(f"{corpus['annotated']}/manifest.json").read())
    assert annotated["version"] == 1 and annotated["attributes"]["version"] == 1  # an addition, not a new format
    assert set(annotated) - {"attributes"} == set(json.loads(open(f"{corpus['filtered']}/manifest.json").read()))
    assert len(StreamingDataset(corpus["annotated"])) == DOCS  # no where=: every sample


@pytest.mark.filterwarnings("ignore:This DataLoader will create")
def test_mixture_where_per_source_counts_kept_samples_exactly_once(corpus, monkeypatch):
    from shardkit.reader.mixture import Mixture

    long_ = {k for k, t in corpus["texts"].items() if len(t.strip()) > 200}
    sources = {"kept": {"path": corpus["annotated"], "where": "text_length"},
               "long": {"path": corpus["annotated"], "where": "text_chars > 200", "repeat": 2},
               "all": corpus["filtered"]}
    seen = {0: Counter(), 1: Counter(), 2: Counter()}
    for rank in range(2):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "2")
        mix = Mixture(sources, seed=2, fields=["txt"], shuffle_buffer=64)
        assert mix.sizes == [len(corpus["kept"]), len(long_), len(corpus["kept"])]
        for batch in make_loader(mix, batch_size=8, num_workers=2, prefetch_factor=2):
            for key, source in zip(batch["__key__"], batch["__dataset__"].tolist()):
                seen[source][key] += 1
    assert set(seen[0]) == corpus["kept"] and set(seen[1]) == long_ and set(seen[2]) == corpus["kept"]
    assert set(seen[1].values()) == {2}  # two passes, each sample once a pass
    assert sum(seen[0].values()) + sum(seen[2].values()) - 2 * len(corpus["kept"]) <= 1  # at most one pad
    with pytest.raises(ConfigError, match=r"mixture source 'kept' .*no attribute column 'lang'.*text_chars"):
        Mixture({"kept": {"path": corpus["annotated"], "where": "lang == 'en'"}, "all": corpus["filtered"]})
    everywhere = Mixture({"a": corpus["annotated"], "b": corpus["annotated"]}, where="text_length")
    assert everywhere.sizes == [len(corpus["kept"])] * 2


def rescore(root) -> None:
    """What `shardkit annotate` does when a scorer changes: every attribute table rewritten, here with
    text_length rotated by one row in each shard (as many kept per shard, other samples)."""
    import dataclasses
    import os

    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from shardkit.store.local import sha256_file
    from shardkit.manifest import write_manifest
    from shardkit.manifest.attributes import Attributes, attach, load_attributes

    manifest = load_manifest(root)
    attributes = load_attributes(manifest, root)
    infos = []
    for info in attributes.infos():
        path = f"{root}/{info.path}"
        table = pq.read_table(path)
        j = table.schema.get_field_index("text_length")
        column = table.column(j).to_numpy(zero_copy_only=False)
        pq.write_table(table.set_column(j, "text_length", pa.array(np.roll(column, 1), pa.bool_())), path)
        infos.append(dataclasses.replace(info, bytes=os.path.getsize(path), sha256=sha256_file(path)))
    kept = {w: attributes.kept(w) for w in attributes.selections}
    attach(root, manifest, Attributes.of(infos, attributes.columns, attributes.scorers, kept))
    write_manifest(root, manifest)


def test_a_resume_against_rescored_attribute_tables_is_refused_naming_them(corpus, monkeypatch, tmp_path):
    import shutil

    from shardkit.reader.mixture import Mixture

    root = str(tmp_path / "annotated")
    shutil.copytree(corpus["annotated"], root)
    one = loader(root, monkeypatch, 0, 1, 0, where="text_length")
    it = iter(one)
    [next(it) for _ in range(3)]
    saved = one.state_dict()
    del it
    mix = Mixture({"kept": {"path": root, "where": "text_length"}, "all": corpus["filtered"]}, seed=2, fields=["txt"])
    mixed = make_loader(mix, batch_size=8, num_workers=0).state_dict()
    counts = StreamingDataset(root, where="text_length").counts
    rescore(root)
    assert (StreamingDataset(root, where="text_length").counts == counts).all()  # the counts cannot tell
    again = loader(root, monkeypatch, 0, 1, 0, where="text_length")
    with pytest.raises(ConfigError, match=rf"where='text_length' selected from other attribute tables of '{root}' "
                                          r"than it does now \(\d+ of \d+: attributes/.*\(shard 0\)"):
        again.load_state_dict(saved)
    mix = Mixture({"kept": {"path": root, "where": "text_length"}, "all": corpus["filtered"]}, seed=2, fields=["txt"])
    with pytest.raises(ConfigError, match="other attribute tables of source 'kept'"):
        make_loader(mix, batch_size=8, num_workers=0).load_state_dict(mixed)
    unchanged = loader(corpus["annotated"], monkeypatch, 0, 1, 0, where="text_length")
    unchanged.load_state_dict(saved)  # the same tables elsewhere: the state resumes


def test_a_where_that_keeps_nothing_says_so_with_the_count_of_each_condition(corpus):
    from shardkit.reader.mixture import Mixture

    texts = corpus["texts"]
    long_ = sum(len(t.strip()) > 150 for t in texts.values())
    kept, short = len(corpus["kept"]), sum(len(t.strip()) < 3 for t in texts.values())
    assert long_ and short and kept
    with pytest.raises(ConfigError) as e:
        StreamingDataset(corpus["annotated"], where="text_chars > 150 and text_chars < 3 and text_length")
    said = str(e.value)
    assert "no samples; rebuild" not in said and "\n" not in said
    assert said.startswith(f"where='text_chars > 150 and text_chars < 3 and text_length' keeps none of the {DOCS} "
                           f"samples of {corpus['annotated']!r} (the selection is empty, not the dataset)")
    assert (f"text_chars > 150: {long_} of {DOCS}; text_chars < 3: {short} of {DOCS}; text_length: {kept} of {DOCS}"
            in said)
    with pytest.raises(ConfigError, match=rf"where='text_chars > 100000' keeps none of the {DOCS} samples of "
                                          rf"mixture source 'long' .*text_chars > 100000: 0 of {DOCS}"):
        Mixture({"all": corpus["filtered"], "long": {"path": corpus["annotated"], "where": "text_chars > 100000"}})
