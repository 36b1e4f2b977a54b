"""What users act on: kept bytes untouched, no false 'identical', sources that lead back to files, an honest summary."""

import ast
import io
import json
import os
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner
from PIL import Image

from shardkit.cli import main
from shardkit.config import DedupConfig
from shardkit.jobs.dedup_tasks import find_duplicates
from shardkit.manifest import load_manifest
from shardkit.sample import Sample
from shardkit.jobs.cluster import CLUSTER_START_SECONDS, plan_execution

LETTERS = list("abcdefghijklmnopqrstuvwxyz")


def _photo(seed: int, size=(96, 72)) -> Image.Image:
    rng = np.random.default_rng(seed)
    coarse = rng.uniform(0, 255, (6, 8, 3)).astype(np.uint8)
    return Image.fromarray(coarse).resize(size, Image.Resampling.BICUBIC)


def _encode(im: Image.Image, fmt: str, **kw) -> bytes:
    buf = io.BytesIO()
    im.save(buf, fmt, **kw)
    return buf.getvalue()


def _dedup(src, out, *args):
    res = CliRunner().invoke(main, ["dedup", str(src), str(out), "--workers", "0", "--no-progress", *args])
    assert res.exit_code == 0, res.output
    return load_manifest(str(out)), json.loads((Path(out) / "dedup" / "summary.json").read_text())


def _tar_members(out: Path, m) -> dict[str, bytes]:
    import tarfile

    members = {}
    for shard in m.shards_of("tar"):
        with tarfile.open(out / shard.path) as tf:
            members.update({t.name: tf.extractfile(t).read() for t in tf if t.isfile()})
    return members


def test_raw_image_folder_keeps_every_inputs_bytes_and_extension(tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    files = {"a.png": _encode(_photo(1), "PNG"), "b.webp": _encode(_photo(2), "WEBP", quality=80),
             "c.jpg": _encode(_photo(3), "JPEG", quality=75), "d.jpeg": _encode(_photo(4), "JPEG"),
             "e.png": _encode(_photo(1), "PNG")}  # e duplicates a
    for name, data in files.items():
        (raw / name).write_bytes(data)
    m, summary = _dedup(raw, tmp_path / "out", "--format", "both")
    assert set(m.fields) == {"png", "webp", "jpg", "jpeg"} and m.samples == 4
    members = _tar_members(tmp_path / "out", m)
    assert members == {name.replace(".", ".", 1): data for name, data in files.items() if name != "e.png"}
    rows = pq.read_table(tmp_path / "out" / m.shards_of("parquet")[0].path).to_pylist()
    for row in rows:
        ext = next(f for f in m.fields if row[f] is not None)
        assert row[ext] == files[f"{row['__key__']}.{ext}"] and row["__source__"] == f"{row['__key__']}.{ext}"
    assert summary["output"]["images"] == "original bytes kept" and summary["removed"] == 1


def test_build_dedup_says_when_it_re_encodes(tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    (raw / "a.png").write_bytes(_encode(_photo(1), "PNG"))
    res = CliRunner().invoke(main, ["build", str(raw), str(tmp_path / "out"), "--workers", "0", "--no-progress",
                                    "--dedup", "--image-size", "32"])
    assert res.exit_code == 0, res.output
    summary = json.loads((tmp_path / "out" / "dedup" / "summary.json").read_text())
    assert summary["output"]["images"] == "re-encoded: jpeg q90, shorter 32"
    with pytest.raises(ValueError, match="--encode keep"):
        from shardkit.config import BuildConfig

        BuildConfig("a", "b", encode="keep", image_size=32)


ART_A = """
  o o o o o o
   \\__|__/
   ( o o )
"""
ART_B = """
 o o o o o o o
   /^^^^^\\
  <  o o  >
"""


def test_symbol_documents_and_few_shingles_are_never_called_identical_unless_equal(tmp_path):
    docs = {
        "p1": "...!?!...", "p2": "*** --- ***", "p3": "~~~~~~ ~~~~", "p4": "~~~~~~ ~~~~",
        "art1": ART_A, "art2": ART_B, "art3": ART_A,
        "ha1": "ha ha ha ha ha ha", "ha2": "ha ha ha ha ha ha ha ha ha",
        "x1": "Hello, world!", "x2": "hello world",
    }
    samples = [Sample(k, {"txt": v}) for k, v in sorted(docs.items())]
    result = find_duplicates(samples, DedupConfig(progress=False), None, str(tmp_path))
    removed = {r["key"]: (r["duplicate_of"], r["reason"], r["similarity"]) for r in result.rows if not r["kept"]}
    assert removed == {"p4": ("p3", "exact", 1.0), "art3": ("art1", "exact", 1.0), "x2": ("x1", "exact", 1.0)}
    t = result.summary["text"]
    assert t["symbolic"] == 6 and t["too_few_shingles"] >= 6 and t["min_shingles"] == 4


def test_clusters_lead_back_to_existing_files_and_lines(tmp_path):
    raw = tmp_path / "raw"
    (raw / "sub").mkdir(parents=True)
    rng = np.random.default_rng(0)
    vocab = ["".join(rng.choice(LETTERS, 6)) for _ in range(3000)]
    texts = [" ".join(rng.choice(vocab, 60)) for _ in range(6)]
    (raw / "sub" / "ünï côde.txt").write_text(texts[0])
    (raw / "copy.txt").write_text(texts[0].upper())
    lines = [json.dumps({"text": t}) for t in texts[1:]] + [json.dumps({"text": texts[2] + " and more"})]
    (raw / "lines.jsonl").write_text("\n".join(lines[:2]) + "\n\n" + "\n".join(lines[2:]) + "\n")
    (raw / "a.png").write_bytes(_encode(_photo(7), "PNG"))
    (raw / "z.jpg").write_bytes(_encode(_photo(7), "JPEG", quality=70))
    m, _ = _dedup(raw, tmp_path / "out", "--format", "parquet")
    rows = pq.read_table(tmp_path / "out" / "dedup" / "clusters.parquet").to_pylist()
    removed = [r for r in rows if not r["kept"]]
    assert len(removed) == 3
    for r in removed:
        for side in ("source", "duplicate_of_source"):
            assert (raw / r[side]).is_file(), r
    near = next(r for r in removed if r["source"] == "lines.jsonl")
    assert near["source_row"] == 7 and near["duplicate_of_source_row"] == 2  # 1-based lines, the blank one counted
    file_lines = (raw / "lines.jsonl").read_text().split("\n")
    assert json.loads(file_lines[near["duplicate_of_source_row"] - 1])["text"] == texts[2]
    assert {r["source"] for r in removed} == {"sub/ünï côde.txt", "lines.jsonl", "z.jpg"}  # "copy" < "sub/…"
    table = pq.read_table(tmp_path / "out" / m.shards_of("parquet")[0].path)
    sources = dict(zip(table.column("__key__").to_pylist(), zip(table.column("__source__").to_pylist(),
                                                                 table.column("__source_row__").to_pylist())))
    assert sources[next(k for k, (p, _) in sources.items() if p == "lines.jsonl")][1] == 1
    assert all((raw / p).is_file() for p, _ in sources.values())


def test_summary_fields_are_present_and_agree(tmp_path):
    rng = np.random.default_rng(1)
    vocab = ["".join(rng.choice(LETTERS, 6)) for _ in range(3000)]
    base = [" ".join(rng.choice(vocab, 80)) for _ in range(30)]
    samples = [Sample(f"t{i:03d}", {"txt": t}) for i, t in enumerate(base)]
    samples += [Sample("t900", {"txt": base[0]}), Sample("t901", {"txt": base[1] + " x"}), Sample("t902", {"txt": " "}),
                Sample("t903", {"txt": "... ..."}), Sample("u000", {"cls": 1}),
                Sample("v000", {"png": _encode(_photo(1), "PNG")}), Sample("v001", {"png": _encode(_photo(1), "PNG")}),
                Sample("v002", {"png": b"not an image"})]
    result = find_duplicates(samples, DedupConfig(progress=False), None, str(tmp_path))
    s = result.summary

    def nulls(d, where=""):
        for k, v in d.items():
            if v is None:
                yield where + k
            elif isinstance(v, dict):
                yield from nulls(v, where + k + ".")
    assert not list(nulls(s))
    p, t, im = s["parameters"], s["text"], s["image"]
    assert (p["bands"], p["rows"]) == (14, 9) and t["permutations_used"] == 126 and p["num_perm"] == 128
    assert s["inputs"] == len(samples) == s["kept"] + s["removed"] + s["rejected"]
    no_field = s["no_content"] - t["empty"]  # u000: neither text nor image
    assert s["inputs"] == s["rejected"] + no_field + t["documents"] + im["images"]
    assert s["no_content"] == t["empty"] + 1 == 2 and s["rejected"] == 1
    assert t["documents"] == t["compared"] + t["too_few_shingles"] + t["empty"]
    assert s["removed"] == s["exact_duplicates"] + s["near_duplicates"] == 3
    rows = result.rows
    assert s["clusters"] == sum(r["kept"] for r in rows) == 3
    for r in rows:
        if r["kept"]:
            assert r["similarity"] is None and r["reason"] == "kept: smallest key" and r["duplicate_of"] is None
        else:
            assert r["reason"] in ("exact", "near") and 0 < r["similarity"] <= 1 and r["duplicate_of"] < r["key"]


def test_small_jobs_run_in_process_and_large_ones_on_a_cluster():
    small = plan_execution(None, None, 0.5)
    assert small.mode == "in-process" and small.workers == 0 and "less than" in small.reason
    big = plan_execution(None, None, 1000.0)
    assert big.mode == "embedded cluster" and big.workers is None
    assert plan_execution(None, 2, 0.1).mode == "embedded cluster"  # an explicit count is obeyed
    assert plan_execution("tcp://x:8786", None, 0.1).mode == "cluster"
    assert plan_execution(None, 0, 1e6).mode == "in-process"
    n = os.cpu_count() or 1
    if n > 1:
        edge = CLUSTER_START_SECONDS / (1 - 1 / n)
        assert plan_execution(None, None, edge * 0.99).mode == "in-process"
        assert plan_execution(None, None, edge * 1.01).mode == "embedded cluster"


def _imports(module: str) -> set[str]:
    path = Path(__file__).resolve().parents[1] / "shardkit" / f"{module}.py"
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
    return found


def test_build_and_dedup_import_one_way():
    assert not {"shardkit.jobs.dedup", "shardkit.jobs.build"} & _imports("jobs/dedup_tasks")
    for part in ("jobs/build/__init__", "jobs/build/dedup", "jobs/build/probe", "jobs/build/fields"):  # the build's modules
        assert "shardkit.jobs.dedup" not in _imports(part), part
    assert "shardkit.jobs.build" in _imports("jobs/dedup")


def test_dedup_of_a_raw_folder_builds_once_and_writes_its_report_once(tmp_path, monkeypatch):
    import shardkit.jobs.build as executor
    import shardkit.jobs.build.dedup as steps
    import shardkit.jobs.dedup as job

    calls = {"build": 0, "report": 0, "find": 0}
    for module, name, key in ((executor, "build", "build"), (steps, "write_report", "report"),
                              (steps, "dedup_inventory", "find")):
        original = getattr(module, name)

        def counted(*a, _original=original, _key=key, **kw):
            calls[_key] += 1
            return _original(*a, **kw)
        monkeypatch.setattr(module, name, counted)
    raw = tmp_path / "raw"
    raw.mkdir()
    (raw / "a.txt").write_text("one two three four five six seven eight")
    (raw / "b.txt").write_text("one two three four five six seven eight")
    result = job.dedup(DedupConfig(str(raw), str(tmp_path / "out"), workers=0, progress=False))
    assert calls == {"build": 1, "report": 1, "find": 1} and result.removed_keys == {"b"}


def test_a_dataset_of_original_bytes_streams_with_one_field_per_extension(tmp_path):
    from shardkit import StreamingDataset

    raw = tmp_path / "raw"
    raw.mkdir()
    (raw / "a.png").write_bytes(_encode(_photo(1), "PNG"))
    (raw / "b.jpg").write_bytes(_encode(_photo(2), "JPEG"))
    (raw / "c.txt").write_text("a caption with a few words in it")
    _dedup(raw, tmp_path / "out")
    got = {s["__key__"]: s for s in StreamingDataset(str(tmp_path / "out"), shuffle=False)}
    assert tuple(got["a"]["png"].shape) == (3, 72, 96) and "jpg" not in got["a"]
    assert tuple(got["b"]["jpg"].shape) == (3, 72, 96) and got["c"]["txt"].startswith("a caption")
