"""Build at scale: Parquet sources, compact scanning, work units, key order, reruns — same bytes always."""

from __future__ import annotations

import datetime
import io
import json
import os
import threading

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner
from PIL import Image

from shardkit.cli import main
from shardkit.config import BuildConfig
from shardkit.errors import ConfigError
from shardkit.jobs.build import build
from shardkit.manifest import load_manifest
from shardkit.sources.rows import jsonl_index

from conftest import tree_bytes

CLASSES = ["airplane", "bird", "cat"]


def _build(raw, out, **kw):
    kw.setdefault("workers", 0)
    kw.setdefault("progress", False)
    return build(BuildConfig(src=str(raw), out=str(out), **kw))


def _errors(out) -> dict[str, str]:
    with open(os.path.join(out, "errors.jsonl"), encoding="utf-8") as f:
        return {e["path"]: e["reason"] for e in map(json.loads, f)}


def _jpeg(seed: int, size=(40, 30)) -> bytes:
    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (size[1], size[0], 3), dtype=np.uint8)).save(buf, "JPEG", quality=80)
    return buf.getvalue()


def hf_image_parquet(path, n: int = 12, *, bad: bool = True, row_group_size: int = 5,
                     text_column: str = "caption") -> dict[int, str]:
    """A Parquet file as Hugging Face datasets writes an image dataset: image = struct {bytes, path},
    label = int64 with ClassLabel names in the schema metadata, plus a caption and metadata columns.
    Returns the bad rows planted, by row number, with the reason the build must give."""
    images = [{"bytes": _jpeg(i), "path": f"img_{i}.jpg"} for i in range(n)]
    captions = [f"a photo number {i}" for i in range(n)]
    labels = [i % len(CLASSES) for i in range(n)]
    planted = {}
    if bad:
        images[3] = None
        planted[3] = "null image"
        images[5] = {"bytes": b"definitely not a jpeg", "path": "broken.jpg"}
        planted[5] = "undecodable image"
        captions[7] = None
        planted[7] = "null text"
        labels[9] = None
        planted[9] = "null label"
    image_type = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    table = pa.table({
        "image": pa.array(images, image_type),
        text_column: pa.array(captions, pa.string()),
        "label": pa.array(labels, pa.int64()),
        "id": pa.array(range(n), pa.int64()),
        "score": pa.array([i / 4 for i in range(n)], pa.float64()),
        "taken": pa.array([datetime.datetime(2024, 1, 1 + i) for i in range(n)], pa.timestamp("s")),
        "thumb": pa.array([bytes([i]) * 3 for i in range(n)], pa.binary()),
    })
    features = {"image": {"_type": "Image"}, "caption": {"dtype": "string", "_type": "Value"},
                "label": {"names": CLASSES, "_type": "ClassLabel"}}
    table = table.replace_schema_metadata({"huggingface": json.dumps({"info": {"features": features}})})
    os.makedirs(os.path.dirname(path), exist_ok=True)
    pq.write_table(table, path, row_group_size=row_group_size)
    return planted


def test_parquet_in_hugging_face_image_layout_nothing_lost(tmp_path):
    raw = tmp_path / "raw"
    planted = hf_image_parquet(raw / "train-00000-of-00001.parquet")
    out = tmp_path / "out"
    result = _build(raw, out, text_field="caption", label_field="label", image_size=24,
                    resize_mode="center-crop", format="both", max_samples_per_shard=4)
    errors = _errors(out)
    assert result.inputs == 12 and result.samples + len(errors) == 12
    for row, reason in planted.items():
        assert errors[f"train-00000-of-00001.parquet:{row}"].startswith(reason), errors
    m = load_manifest(str(out))
    assert m.classes == CLASSES
    assert set(m.fields) == {"jpg", "txt", "cls", "json"}
    rows = [r for s in m.shards_of("parquet") for r in pq.read_table(out / s.path).to_pylist()]
    assert [r["__key__"] for r in rows] == [f"train-00000-of-00001/{i:06d}" for i in range(12) if i not in planted]
    first = rows[0]
    assert first["txt"] == "a photo number 0" and first["cls"] == 0
    assert Image.open(io.BytesIO(first["jpg"])).size == (24, 24)
    meta = json.loads(rows[1]["json"])
    assert meta == {"id": 1, "score": 0.25, "taken": "2024-01-02T00:00:00", "thumb": "AQEB"}


def test_parquet_wrong_types_are_rejected_per_row_and_labels_from_strings(tmp_path):
    raw = tmp_path / "raw"
    os.makedirs(raw)
    pq.write_table(pa.table({"text": ["one", "two"], "tag": ["dog", "cat"], "n": [1, 2]}), raw / "a.parquet")
    pq.write_table(pa.table({"text": [10, 20, 30], "tag": ["eel", "cat", None]}), raw / "b.parquet")
    out = tmp_path / "out"
    result = _build(raw, out, label_field="tag", format="parquet")
    errors = _errors(out)
    assert result.inputs == 5 and result.samples == 2 and len(errors) == 3
    assert errors["b.parquet:0"].startswith("wrong type: column 'text' holds int64, expected a string")
    assert "--text-field" in errors["b.parquet:0"]
    m = load_manifest(str(out))
    assert m.classes == ["cat", "dog", "eel"]  # every file's values, sorted
    rows = pq.read_table(out / m.shards[0].path).to_pylist()
    assert [(r["txt"], r["cls"], json.loads(r["json"])) for r in rows] == [("one", 1, {"n": 1}), ("two", 0, {"n": 2})]


def test_parquet_options_that_cannot_work_say_how_to_fix_them(tmp_path):
    raw = tmp_path / "raw"
    os.makedirs(raw)
    pq.write_table(pa.table({"body": ["x"], "kind": [1]}), raw / "a.parquet")
    with pytest.raises(ConfigError, match="--text-field"):
        _build(raw, tmp_path / "o1")
    with pytest.raises(ConfigError, match="no Parquet file in SRC has that column"):
        _build(raw, tmp_path / "o2", text_field="body", label_field="missing")
    res = CliRunner().invoke(main, ["build", str(raw), str(tmp_path / "o3"), "--workers", "0", "--no-progress",
                                    "--text-field", "body", "--label-field", "kind"])
    assert res.exit_code == 0, res.output
    assert load_manifest(str(tmp_path / "o3")).classes == ["0", "1"]  # integer labels without names


@pytest.fixture
def mixed_folder(raw_folder):
    """The demo folder (images, sidecars, text, jsonl, bad files) plus a Parquet file with bad rows."""
    hf_image_parquet(raw_folder / "bird" / "more.parquet", n=10, row_group_size=4, text_column="text")
    return raw_folder


def test_images_jsonl_and_parquet_give_the_same_bytes_on_0_1_2_workers(mixed_folder, tmp_path):
    opts = dict(image_size=32, resize_mode="center-crop", format="both", max_samples_per_shard=9)
    _build(mixed_folder, tmp_path / "w0", workers=0, **opts)
    _build(mixed_folder, tmp_path / "w1", workers=1, unit_samples=4, **opts)
    _build(mixed_folder, tmp_path / "w2", workers=2, **opts)
    a, b, c = (tree_bytes(tmp_path / w) for w in ("w0", "w1", "w2"))
    assert len(a) > 10 and a == b == c
    m = load_manifest(str(tmp_path / "w0"))
    keys = {k for s in m.shards_of("parquet") for k in pq.read_table(tmp_path / "w0" / s.path).column("__key__").to_pylist()}
    assert {"bird/more/000000", "corpus/000001", "cat/000000"} <= keys


_RAN_ON: list = []  # (thread name, in_memory) of the units that ran in this process
_ON_WORKER_THREAD = threading.Event()  # a unit ran on a worker thread of this process


def _recorded_unit(item, ctx):
    """unit_task, noting where it ran (Dask sends it by reference: workers in other processes note there).
    A head start beside worker threads holds its first unit until they run one: tiny units could all
    be done here before the cluster is up (it imports Dask first in a fresh process)."""
    from shardkit.jobs.build.tasks import unit_task

    name = threading.current_thread().name
    if "Dask-Default-Threads" in name:
        _ON_WORKER_THREAD.set()
    elif name == "shardkit-head-start" and ctx.in_memory:
        _ON_WORKER_THREAD.wait(60)
    _RAN_ON.append((name, ctx.in_memory))
    return unit_task(item, ctx)


@pytest.fixture
def image_only_folder(tmp_path):
    """Class folders of images with a few sidecars and a corrupt image: the work threads share."""
    from shardkit.demo.datagen import image_folder

    root = tmp_path / "images"
    image_folder(str(root), n=30, classes=3, size=(48, 36), seed=3)
    first = sorted(root.rglob("*.jpg"))[0]
    first.with_suffix(".txt").write_text("a caption", encoding="utf-8")
    (first.parent / "broken.jpg").write_bytes(b"\xff\xd8 not a jpeg")
    return root


def test_image_folders_run_on_worker_threads_with_the_same_bytes_as_processes(image_only_folder, tmp_path,
                                                                           monkeypatch):
    import shardkit.jobs.build as executor

    ran_on = _RAN_ON
    _ON_WORKER_THREAD.clear()
    monkeypatch.setattr(executor, "unit_task", _recorded_unit)
    opts = dict(image_size=24, resize_mode="center-crop", encode="raw", format="both", max_samples_per_shard=12,
                unit_samples=3)
    results, here = {}, {}
    for pool in ("threads", "processes"):
        results[pool] = _build(image_only_folder, tmp_path / pool, workers=2, worker_pool=pool, **opts)
        here[pool], ran_on[:] = list(ran_on), []
    _build(image_only_folder, tmp_path / "w0", **opts)
    # threads: units ran on the worker's threads here, and handed their tables over in memory
    assert len(here["threads"]) == 11 and all(in_memory for _, in_memory in here["threads"])
    assert any("Dask-Default-Threads" in name for name, _ in here["threads"]), here["threads"]
    # processes: only the head start's units ran here (if any), and they wrote unit files
    assert all(name == "shardkit-head-start" and not in_memory for name, in_memory in here["processes"])
    trees = [tree_bytes(tmp_path / name) for name in ("threads", "processes", "w0")]
    assert len(trees[0]) > 5 and trees[0] == trees[1] == trees[2]
    assert results["threads"].samples == 30
    assert [r.path for r in results["threads"].rejections] == ["class_00/broken.jpg"]


def test_threads_for_images_only(tmp_path):
    from shardkit.jobs.pool import choose_pool
    from shardkit.jobs.build.probe import image_work
    from shardkit.sources.walk import Listing, RowFile

    def row_file(kind):
        return RowFile(0, f"x.{kind}", kind, 1, 1, "x", None)

    images = Listing(files=None, row_files=[], images=3)
    rows = Listing(files=None, row_files=[row_file("jsonl")], images=3)
    cfg = BuildConfig(src=str(tmp_path), out=str(tmp_path / "o"))
    assert image_work(images, cfg) and not image_work(rows, cfg)
    # WebDataset tars may hold images (the probe looks inside them), unless rows to parse come too
    assert image_work(Listing(files=None, row_files=[row_file("tar")]), cfg)
    assert not image_work(Listing(files=None, row_files=[row_file("tar"), row_file("parquet")], images=3), cfg)
    assert not image_work(images, BuildConfig(src=str(tmp_path), out=str(tmp_path / "o"), tokenizer="bpe:1000"))
    assert not image_work(Listing(files=None, row_files=[]), cfg)
    light = lambda: (0.1, 0.005)  # noqa: E731 — a probe: 10% of 5 ms under the GIL
    assert choose_pool("auto", True, 2, light).threads and not choose_pool("auto", False, 2, light).threads
    assert choose_pool("threads", False, 2).threads and not choose_pool("processes", True, 2, light).threads
    with pytest.raises(ConfigError, match="--worker-pool"):
        BuildConfig(src=str(tmp_path), out=str(tmp_path / "o"), worker_pool="fibers")


def test_work_units_never_change_the_bytes(mixed_folder, tmp_path):
    opts = dict(image_size=24, resize_mode="shorter", format="both", max_samples_per_shard=11)
    trees = []
    for per_unit in (1, 3, 10_000):
        out = tmp_path / f"u{per_unit}"
        _build(mixed_folder, out, unit_samples=per_unit, **opts)
        trees.append(tree_bytes(out))
        assert not (out / ".shardkit" / "units").exists()  # unit files are gone once shards are written
    assert trees[0] == trees[1] == trees[2]


def test_jsonl_index_matches_reading_line_by_line(tmp_path, monkeypatch):
    import shardkit.sources.rows as rows

    lines = [b'{"text": "a"}\n', b"\n", b"   \t\n", b'{"text": "b"}\r\n', b"\x0c\n", b'{"text": "c"}', b"\n",
             b"x" * 50 + b"\n", b"  \n", b'{"t":1}']
    data = b"".join(lines) + b"  "  # a last line of spaces, no newline
    path = tmp_path / "f.jsonl"
    path.write_bytes(data)
    expect, offset = [], 0
    with open(path, "rb") as f:
        for number, line in enumerate(f, start=1):
            if line.strip():
                expect.append((number, offset, len(line)))
            offset += len(line)
            total = number
    for block in (3, 7, 1 << 20):  # lines cut by block edges at every position
        monkeypatch.setattr(rows, "BLOCK", block)
        index, n_lines = jsonl_index(str(path))
        assert list(zip(index["number"].tolist(), index["offset"].tolist(), index["length"].tolist())) == expect
        assert n_lines == total
        assert index["cum"].tolist() == np.cumsum([e[2] for e in expect]).tolist()


def test_keys_past_a_million_lines_widen_and_keep_numeric_order(tmp_path):
    raw = tmp_path / "raw"
    os.makedirs(raw)
    numbers = [1, 999_999, 1_000_000, 1_000_001]
    with open(raw / "big.jsonl", "w") as f:
        for n in range(1, numbers[-1] + 1):
            f.write(json.dumps({"text": f"line {n}"}) + "\n" if n in numbers else "\n")
    with open(raw / "small.jsonl", "w") as f:
        f.write(json.dumps({"text": "only line"}) + "\n")
    out = tmp_path / "out"
    _build(raw, out, format="parquet")
    keys = pq.read_table(out / load_manifest(str(out)).shards[0].path).column("__key__").to_pylist()
    assert keys == ["big/0000001", "big/0999999", "big/1000000", "big/1000001", "small/000001"]


def test_keys_that_fall_inside_a_jsonl_keep_the_global_key_order(tmp_path):
    raw = tmp_path / "raw"
    (raw / "docs" / "000002").mkdir(parents=True)
    with open(raw / "docs.jsonl", "w") as f:
        for i in range(1, 8):
            f.write(json.dumps({"text": f"doc {i}"}) + "\n")
    (raw / "docs" / "000003.txt").write_text("collides with docs.jsonl line 3")
    (raw / "docs" / "000005x.txt").write_text("sorts between lines 5 and 6")
    (raw / "docs" / "000002" / "inner.jsonl").write_text(json.dumps({"text": "nested"}) + "\n")
    out = tmp_path / "out"
    result = _build(raw, out, labels=False, format="parquet", max_samples_per_shard=3)
    keys = [k for s in result.manifest.shards for k in pq.read_table(out / s.path).column("__key__").to_pylist()]
    assert keys == sorted(keys) and len(keys) == len(set(keys)) == 10
    assert keys.index("docs/000002") < keys.index("docs/000002/inner/000001") < keys.index("docs/000004")
    assert keys.index("docs/000005") < keys.index("docs/000005x") < keys.index("docs/000006")
    assert sum(k.startswith("docs/000003_") for k in keys) == 2  # both colliding samples, renamed


def test_the_client_holds_one_entry_per_row_file_not_per_row(tmp_path):
    from shardkit.sources.inventory import make_inventory, scan_options
    from shardkit.sources.plan import plan_shards
    from shardkit.sources.rows import count_rows
    from shardkit.sources.walk import walk

    raw = tmp_path / "raw"
    os.makedirs(raw)
    for f in range(3):
        with open(raw / f"part-{f}.jsonl", "w") as out:
            out.writelines(json.dumps({"text": f"doc {f} {i}"}) + "\n" for i in range(5000))
    cfg = BuildConfig(src=str(raw), out=str(tmp_path / "out"))
    listing = walk(str(raw))
    opts = scan_options(cfg)
    inv = make_inventory(listing, {rf.id: count_rows(rf, opts) for rf in listing.row_files}, cfg, opts)
    assert len(inv.atoms) == 0 and len(inv.pieces) == 3 and inv.samples == 15000
    plans = plan_shards(inv, cfg.shard_size, 4000)
    assert [p.samples for p in plans] == [4000, 4000, 4000, 3000]
    assert max(len(p.pieces) for p in plans) == 2  # ranges of rows, never a list of rows


def test_rerun_reuses_shards_and_redoes_only_a_changed_row_file(tmp_path):
    raw = tmp_path / "raw"
    os.makedirs(raw)
    for f in range(3):
        (raw / f"p{f}.jsonl").write_text("".join(json.dumps({"text": f"{f}-{i}"}) + "\n" for i in range(30)))
    out = tmp_path / "out"
    first = _build(raw, out, max_samples_per_shard=10)
    before = tree_bytes(out)
    assert _build(raw, out, max_samples_per_shard=10).reused_shards == len(first.shards) == 9
    assert tree_bytes(out) == before
    (raw / "p1.jsonl").write_text("".join(json.dumps({"text": f"new {i}"}) + "\n" for i in range(30)))
    assert _build(raw, out, max_samples_per_shard=10).reused_shards == 6


def test_rerun_after_a_new_class_relabels_shards_whose_inputs_did_not_change(tmp_path):
    raw, out, fresh = tmp_path / "raw", tmp_path / "out", tmp_path / "fresh"
    for name in ("BIRD", "CAT"):
        os.makedirs(raw / name)
        for i in range(4):
            (raw / name / f"{i}.jpg").write_bytes(_jpeg(i))
    _build(raw, out, max_samples_per_shard=4)
    # " new" sorts before BIRD as a class name, but its key "_new_…/0" sorts after CAT/…: the earlier
    # shards keep exactly their inputs, and only their labels change (BIRD 0 -> 1, CAT 1 -> 2).
    os.makedirs(raw / " new")
    (raw / " new" / "0.jpg").write_bytes(_jpeg(9))
    _build(raw, out, max_samples_per_shard=4)
    _build(raw, fresh, max_samples_per_shard=4)
    assert load_manifest(str(out)).classes == [" new", "BIRD", "CAT"]
    assert tree_bytes(out) == tree_bytes(fresh)


def test_packed_tokens_are_packed_per_shard_whatever_the_units(tmp_path):
    raw = tmp_path / "raw"
    os.makedirs(raw)
    (raw / "c.jsonl").write_text("".join(json.dumps({"text": f"document {i} " * (i % 7 + 1)}) + "\n"
                                         for i in range(60)))
    opts = dict(tokenizer="bpe:300", seq_len=16, max_samples_per_shard=25, format="both")
    _build(raw, tmp_path / "a", unit_samples=7, **opts)
    _build(raw, tmp_path / "b", **opts)
    assert tree_bytes(tmp_path / "a") == tree_bytes(tmp_path / "b")
    assert load_manifest(str(tmp_path / "a")).extra["tokenizer"]["stats"]["documents"] == 60


def test_dedup_removes_rows_inside_a_jsonl_and_accounts_for_them(tmp_path):
    from shardkit.demo.datagen import words

    raw = tmp_path / "raw"
    os.makedirs(raw)
    rng = np.random.default_rng(3)
    docs = [words(rng, 120) for _ in range(8)]
    docs.insert(4, docs[1])  # line 5 repeats line 2
    (raw / "c.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    out = tmp_path / "out"
    result = _build(raw, out, dedup=True, max_samples_per_shard=3, format="parquet")
    keys = [k for s in result.manifest.shards for k in pq.read_table(out / s.path).column("__key__").to_pylist()]
    assert result.duplicates == 1 and "c/000005" not in keys and len(keys) == 8
    assert result.inputs == result.samples + result.duplicates + len(result.rejections)


def test_a_broken_or_changed_row_file_is_rejected_not_fatal(tmp_path):
    from shardkit.errors import RejectedInput
    from shardkit.sources.read import SourceReader
    from shardkit.sources.index import ScanOptions
    from shardkit.sources.rows import count_rows
    from shardkit.sources.walk import walk

    raw = tmp_path / "raw"
    os.makedirs(raw)
    (raw / "broken.parquet").write_bytes(b"PAR1 this is not a parquet file")
    (raw / "ok.jsonl").write_text("".join(json.dumps({"text": f"t{i}"}) + "\n" for i in range(5)))
    out = tmp_path / "out"
    result = _build(raw, out)
    assert result.samples == 5 and _errors(out)["broken.parquet"].startswith("unreadable")
    # A file cut short after it was counted: its rows are rejected one by one, the task goes on.
    opts = ScanOptions(str(raw), str(tmp_path / "scan"))
    rf = next(r for r in walk(str(raw)).row_files if r.rel == "ok.jsonl")
    count = count_rows(rf, opts)
    (raw / "ok.jsonl").write_text("")
    reader = SourceReader(opts, (None,) * rf.id + (rf,), {rf.id: count}, {rf.id: -1}, None, None)
    refs = list(reader._row_refs(rf.id, 0, 5, None, None))
    assert [r.source for r in refs] == [f"ok.jsonl:{n}" for n in range(1, 6)]
    with pytest.raises(RejectedInput, match="unreadable"):
        refs[0].make()


def test_a_rerun_with_nothing_to_do_starts_no_cluster(raw_folder, tmp_path, monkeypatch):
    import shardkit.jobs.cluster

    out = tmp_path / "out"
    _build(raw_folder, out, workers=1, max_samples_per_shard=8)
    started = []
    real = shardkit.jobs.cluster.dask_client

    def counting(scheduler, workers, threads=False):
        started.append(workers)
        return real(scheduler, workers, threads)

    monkeypatch.setattr(shardkit.jobs.cluster, "dask_client", counting)
    again = _build(raw_folder, out, workers=1, max_samples_per_shard=8)
    assert again.reused_shards == len({s.id for s in again.shards}) and started == []
    (raw_folder / "corpus.jsonl").write_text(json.dumps({"text": "changed"}) + "\n")
    third = _build(raw_folder, out, workers=1, max_samples_per_shard=8)
    assert started == [1] and 0 < third.reused_shards < len({s.id for s in third.shards})


def test_parquet_images_kept_as_they_are_under_their_format(tmp_path):
    raw = tmp_path / "raw"
    hf_image_parquet(raw / "imgs.parquet", n=6, bad=False)
    out = tmp_path / "out"
    result = _build(raw, out, encode="keep", text_field="caption", format="parquet")
    m = result.manifest
    assert m.fields["jpg"] == {"kind": "image", "encoding": "keep"} and result.samples == 6
    rows = pq.read_table(out / m.shards[0].path).to_pylist()
    assert rows[2]["jpg"] == _jpeg(2) and rows[2]["__source__"] == "imgs.parquet" and rows[2]["__source_row__"] == 2


def test_parquet_dictionary_and_view_string_columns_are_strings(tmp_path):
    """pandas categoricals and dictionary-encoding writers store strings as dictionary columns; newer
    writers use string views: their rows are strings like any other, for text and for labels."""
    raw = tmp_path / "raw"
    os.makedirs(raw)
    pq.write_table(pa.table({"text": pa.array(["a b", "c d", "a b"]).dictionary_encode(),
                             "tag": pa.array(["x", "y", "x"]).dictionary_encode()}), raw / "d.parquet")
    pq.write_table(pa.table({"text": pa.array(["q", "r"], pa.string_view()),
                             "tag": pa.array(["x", "z"], pa.large_string()),
                             "image": pa.array([_jpeg(1), _jpeg(2)], pa.binary_view())}), raw / "e.parquet")
    out = tmp_path / "out"
    result = _build(raw, out, label_field="tag", format="parquet", encode="keep")
    assert result.samples == 5 and not result.rejections, [r.reason for r in result.rejections]
    m = load_manifest(str(out))
    assert m.classes == ["x", "y", "z"]
    rows = pq.read_table(out / m.shards[0].path).to_pylist()
    assert [(r["txt"], r["cls"]) for r in rows] == [("a b", 0), ("c d", 1), ("a b", 0), ("q", 0), ("r", 2)]
    assert rows[3]["jpg"] == _jpeg(1)


def test_dedup_finds_parquet_images_under_the_image_field_given(tmp_path):
    """`--image-field photo` names the image column for the dedup step too (build --dedup and dedup
    of a raw folder), not only for the build: else every row looked image-less and nothing was removed."""
    from shardkit.config import DedupConfig
    from shardkit.jobs.dedup import dedup

    raw = tmp_path / "raw"
    os.makedirs(raw)
    pq.write_table(pa.table({"photo": [_jpeg(i % 3) for i in range(9)],
                             "caption": [f"caption {i}" for i in range(9)]}), raw / "p.parquet")
    result = _build(raw, tmp_path / "out", dedup=True, image_field="photo", text_field="caption", encode="keep")
    assert (result.samples, result.duplicates) == (3, 6)
    res = dedup(DedupConfig(src=str(raw), out=str(tmp_path / "d"), image_field="photo", text_field="caption",
                            workers=0, progress=False))
    assert (res.summary["kept"], res.summary["image"]["images"]) == (3, 9)


def test_rerun_rebuilds_a_shard_whose_parquet_rows_name_a_changed_image_file(tmp_path):
    """An HF image stored by path only is an input of its shard: changing that file must rebuild
    the shard (the Parquet file itself did not change), as a fresh build's bytes change."""
    raw = tmp_path / "raw"
    os.makedirs(raw / "pics")
    os.makedirs(raw / "z")
    for i in range(2):
        (raw / "pics" / f"{i}.jpg").write_bytes(_jpeg(i))
    image_type = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    rows = [{"bytes": None, "path": f"../pics/{i}.jpg"} for i in range(2)]
    pq.write_table(pa.table({"image": pa.array(rows, image_type)}), raw / "z" / "rows.parquet")
    kw = dict(encode="keep", labels=False, max_samples_per_shard=2)
    out = tmp_path / "out"
    assert len(_build(raw, out, **kw).shards) == 2  # pics/0, pics/1 | z/rows/0, z/rows/1
    (raw / "pics" / "1.jpg").write_bytes(_jpeg(7, (30, 40)))
    assert _build(raw, out, **kw).reused_shards == 0
    _build(raw, tmp_path / "fresh", **kw)
    assert tree_bytes(out) == tree_bytes(tmp_path / "fresh")


def test_summary_says_labels_come_from_the_label_column(tmp_path):
    raw = tmp_path / "raw"
    os.makedirs(raw)
    pq.write_table(pa.table({"text": ["one", "two"], "tag": ["dog", "cat"]}), raw / "a.parquet")
    res = CliRunner().invoke(main, ["build", str(raw), str(tmp_path / "out"), "--workers", "0", "--no-progress",
                                    "--label-field", "tag"])
    assert res.exit_code == 0, res.output
    assert "2 classes from column 'tag' (--label-field)" in res.output and "subfolders" not in res.output


def test_an_unlabelled_row_marked_minus_one_says_how_to_keep_it(tmp_path):
    raw = tmp_path / "raw"
    os.makedirs(raw)
    pq.write_table(pa.table({"text": ["a", "b", "c"], "label": [0, -1, 1]}), raw / "test.parquet")
    out = tmp_path / "out"
    result = _build(raw, out, label_field="label", format="parquet")
    errors = _errors(out)
    assert result.inputs == 3 and result.samples == 2 and list(errors) == ["test.parquet:1"]
    assert errors["test.parquet:1"].startswith("no label: -1 in column 'label'")
    assert "without --label-field" in errors["test.parquet:1"]
