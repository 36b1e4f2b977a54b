"""A Parquet file whose label column has another type than the other files' is rejected alone,
counted with its reason; the other files build (integers win a tie: the ClassLabel convention)."""

from __future__ import annotations

import json
import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from shardkit.config import BuildConfig
from shardkit.jobs.build import build
from shardkit.manifest import load_manifest


def _errors(out) -> list[dict]:
    with open(os.path.join(out, "errors.jsonl"), encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def test_the_odd_label_type_rejects_only_its_file(tmp_path):
    raw = tmp_path / "raw"
    os.makedirs(raw)
    pq.write_table(pa.table({"text": ["a0", "a1", "a2"], "label": [0, 1, 2]}), raw / "a.parquet")
    pq.write_table(pa.table({"text": ["b0", "b1"], "label": ["cat", "dog"]}), raw / "b.parquet")
    pq.write_table(pa.table({"text": ["c0", "c1"], "label": [2, 0]}), raw / "c.parquet")
    out = tmp_path / "out"
    result = build(BuildConfig(src=str(raw), out=str(out), label_field="label", format="parquet", workers=0,
                               progress=False))
    errors = _errors(out)
    assert [e["path"] for e in errors] == ["b.parquet"]  # one rejected input: the file, not its rows
    assert errors[0]["reason"].startswith("wrong type: label column 'label' (--label-field) holds strings in "
                                          "this file and integers in the other Parquet files")
    assert result.samples == 5 and result.inputs == 6 and result.rejected_by_reason == {"wrong type": 1}
    m = load_manifest(str(out))
    assert m.classes == ["0", "1", "2"] and m.errors["count"] == 1
    rows = [r for s in m.shards for r in pq.read_table(out / s.path).to_pylist()]
    assert [(r["txt"], r["cls"]) for r in rows] == [("a0", 0), ("a1", 1), ("a2", 2), ("c0", 2), ("c1", 0)]


@pytest.mark.parametrize("string_rows,rejected", [(4, "a.parquet"), (3, "b.parquet")])
def test_the_type_of_most_rows_wins_integers_on_a_tie(tmp_path, string_rows, rejected):
    raw = tmp_path / "raw"
    os.makedirs(raw)
    pq.write_table(pa.table({"text": ["a0", "a1", "a2"], "label": [0, 1, 1]}), raw / "a.parquet")
    pq.write_table(pa.table({"text": [f"b{i}" for i in range(string_rows)],
                             "label": ["cat", "dog"] * (string_rows // 2) + ["cat"] * (string_rows % 2)}),
                   raw / "b.parquet")
    out = tmp_path / "out"
    build(BuildConfig(src=str(raw), out=str(out), label_field="label", workers=0, progress=False))
    assert [e["path"] for e in _errors(out)] == [rejected]
