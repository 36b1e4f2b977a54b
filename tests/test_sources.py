"""Raw-folder scanning: stems group files, labels from the first folder, keys safe and unique."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from shardkit.config import BuildConfig
from shardkit.sources import read_record, scan


def _touch(root, rel, data=b"x"):
    path = os.path.join(root, rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


def test_files_sharing_a_stem_are_one_sample_with_a_label(tmp_path):
    _touch(tmp_path, "cats/001.jpg")
    _touch(tmp_path, "cats/001.json", json.dumps({"caption": "a cat"}))
    _touch(tmp_path, "dogs/sub/002.png")
    _touch(tmp_path, "dogs/002.txt", "a caption")
    result = scan(BuildConfig(src=str(tmp_path), out="o"))
    assert result.classes == ["cats", "dogs"]
    by_key = {r.key: r for r in result.records}
    assert set(by_key) == {"cats/001", "dogs/sub/002", "dogs/002"}
    assert by_key["cats/001"].files == ("cats/001.jpg", "cats/001.json")
    assert by_key["cats/001"].label == 0 and by_key["dogs/sub/002"].label == 1
    sample = read_record(str(tmp_path), by_key["cats/001"])
    assert sample.fields == {"image": b"x", "json": {"caption": "a cat"}, "cls": 0}


def test_no_labels_and_top_level_files(tmp_path):
    _touch(tmp_path, "a/1.txt", "one")
    _touch(tmp_path, "top.txt", "two")
    labelled = scan(BuildConfig(src=str(tmp_path), out="o", labels=True))
    assert {r.key: r.label for r in labelled.records} == {"a/1": 0, "top": None}
    plain = scan(BuildConfig(src=str(tmp_path), out="o", labels=False))
    assert plain.classes is None and all(r.label is None for r in plain.records)


def test_labels_by_default_only_where_the_folder_has_class_subfolders(tmp_path):
    _touch(tmp_path / "corpus", "docs/1.txt", "one")  # a text corpus in one folder: no labels
    _touch(tmp_path / "corpus", "docs/2.txt", "two")
    corpus = scan(BuildConfig(src=str(tmp_path / "corpus"), out="o"))
    assert corpus.classes is None and all(r.label is None for r in corpus.records)
    _touch(tmp_path / "corpus", "more/3.txt", "three")  # two subfolders: classes
    assert scan(BuildConfig(src=str(tmp_path / "corpus"), out="o")).classes == ["docs", "more"]
    _touch(tmp_path / "one", "cats/1.jpg")  # an image folder of one class keeps its label
    _touch(tmp_path / "one", "readme.txt", "about")
    images = scan(BuildConfig(src=str(tmp_path / "one"), out="o"))
    assert images.classes == ["cats"] and {r.key: r.label for r in images.records} == {"cats/1": 0, "readme": None}
    _touch(tmp_path / "one", "stray.jpg")  # ... but not when images also sit at the top
    assert scan(BuildConfig(src=str(tmp_path / "one"), out="o")).classes is None
    assert scan(BuildConfig(src=str(tmp_path / "one"), out="o", labels=True)).classes == ["cats"]


def test_keys_are_sanitised_unique_and_dot_free(tmp_path):
    for rel in ["x/café au lait.jpg", "x/a.b.jpg", "x/a_b.jpg", "x/ü.txt", "x/u.txt"]:
        _touch(tmp_path, rel)
    keys = [r.key for r in scan(BuildConfig(src=str(tmp_path), out="o")).records]
    assert len(keys) == len(set(keys)) == 5
    assert all("." not in k and " " not in k and k.isascii() for k in keys)
    assert keys == sorted(keys)
    # stable across runs
    assert keys == [r.key for r in scan(BuildConfig(src=str(tmp_path), out="o")).records]


def test_passed_over_inputs_are_recorded_never_dropped(tmp_path):
    _touch(tmp_path, ".hidden")
    _touch(tmp_path, ".git/config")
    _touch(tmp_path, "c/file.xyz")
    _touch(tmp_path, "c/two.jpg")
    _touch(tmp_path, "c/two.png")
    os.symlink("/etc/hostname", tmp_path / "c" / "escape.txt")
    result = scan(BuildConfig(src=str(tmp_path), out="o"))
    reasons = {r.path: r.reason for r in result.rejections}
    assert reasons[".hidden"].startswith("hidden file")
    assert reasons[".git/"].startswith("hidden folder")
    assert reasons["c/file.xyz"].startswith("unsupported extension")
    assert reasons["c/two.jpg"].startswith("ambiguous sample")
    assert reasons["c/two.png"].startswith("ambiguous sample")
    assert reasons["c/escape.txt"].startswith("symlink leaves the source folder")
    assert result.records == []


def test_jsonl_lines_are_samples_and_bad_lines_rejected(tmp_path):
    lines = [json.dumps({"text": "hello", "id": 1}), "", "{broken", json.dumps({"body": "x"})]
    _touch(tmp_path, "corpus.jsonl", "\n".join(lines) + "\n")
    result = scan(BuildConfig(src=str(tmp_path), out="o"))
    assert [r.key for r in result.records] == ["corpus/000001", "corpus/000003", "corpus/000004"]
    good = read_record(str(tmp_path), result.records[0])
    assert good.fields == {"txt": "hello", "json": {"id": 1}}
    import pytest

    from shardkit.errors import RejectedInput

    with pytest.raises(RejectedInput, match="invalid JSON line"):
        read_record(str(tmp_path), result.records[1])
    with pytest.raises(RejectedInput, match="missing text field"):
        read_record(str(tmp_path), result.records[2])


def test_colliding_keys_are_disambiguated(tmp_path):
    _touch(tmp_path, "docs.jsonl", json.dumps({"text": "a"}) + "\n")
    _touch(tmp_path, "docs/000001.txt", "b")
    keys = [r.key for r in scan(BuildConfig(src=str(tmp_path), out="o", labels=False)).records]
    assert len(keys) == len(set(keys)) == 2


def test_invalid_utf8_is_replaced_and_counted(tmp_path):
    _touch(tmp_path, "t.txt", "naïve".encode("latin-1"))
    rec = scan(BuildConfig(src=str(tmp_path), out="o")).records[0]
    sample = read_record(str(tmp_path), rec)
    assert sample.fields["txt"] == "na\ufffdve" and sample.meta["utf8_replaced"] == 1


def test_lone_surrogate_escapes_in_jsonl_are_replaced_and_counted(tmp_path):
    # "\\ud800" is valid JSON but no UTF-8 text: kept as is, it stopped the build and the dedup.
    _touch(tmp_path, "d.jsonl", '{"text": "!! \\udfff\\ud800 ??"}\n{"text": "ok \\ud83d\\ude00 pair"}\n')
    lone, pair = (read_record(str(tmp_path), r) for r in scan(BuildConfig(src=str(tmp_path), out="o")).records)
    assert lone.fields["txt"] == "!! \ufffd\ufffd ??" and lone.meta["utf8_replaced"] == 2
    assert pair.fields["txt"] == "ok \U0001f600 pair" and pair.meta["utf8_replaced"] == 0


def test_generated_folder_appears_only_when_complete(tmp_path):
    from shardkit.demo.datagen import generated

    root = tmp_path / "raw"

    def interrupted(folder):
        os.makedirs(folder)
        (Path(folder) / "a.txt").write_text("one")
        raise KeyboardInterrupt  # a benchmark stopped while generating its input

    with pytest.raises(KeyboardInterrupt):
        generated(root, interrupted, "test data")
    assert not root.exists()  # no short folder a later run would take for complete
    calls = []

    def make(folder):
        calls.append(folder)
        os.makedirs(folder)
        (Path(folder) / "a.txt").write_text("one")

    generated(root, make, "test data")
    generated(root, make, "test data")  # reused, not regenerated
    assert len(calls) == 1 and (root / "a.txt").read_text() == "one"
    assert not (tmp_path / "raw.partial").exists()


def test_reading_records_in_runs_gives_what_reading_each_gives(tmp_path):
    from shardkit.errors import RejectedInput
    from shardkit.sources import read_records

    _touch(tmp_path, "a.jsonl", '{"text": "one"}\n\n{not json\n{"text": "three", "id": 3}\n{"body": 1}\n')
    _touch(tmp_path, "a/b.txt", "a text file between the lines")
    _touch(tmp_path, "cls1/c.jsonl", '{"text": "labelled"}\n')
    records = scan(BuildConfig(src=str(tmp_path), out="o")).records
    one_by_one = []
    for rec in records:
        try:
            one_by_one.append(read_record(str(tmp_path), rec))
        except RejectedInput as e:
            one_by_one.append(e.reason)
    in_runs = [got.reason if isinstance(got, RejectedInput) else got
               for _, got in read_records(str(tmp_path), records)]
    assert in_runs == one_by_one and len(in_runs) == 6
    assert in_runs[-1].fields["cls"] == 1 and in_runs[-1].meta["source_row"] == 1
    assert [s.meta.get("source_path") for s in in_runs if not isinstance(s, str)][:2] == ["a.jsonl", "a.jsonl"]
