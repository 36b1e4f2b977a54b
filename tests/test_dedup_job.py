"""dedup on Dask end to end: determinism, nothing lost, bad inputs, reruns, datasets in and out, CLI."""

import io
import json
import os
import shutil

import numpy as np
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner
from PIL import Image

from shardkit.config import BuildConfig, DedupConfig
from shardkit.jobs.dedup_tasks import dedup_inventory, find_duplicates
from shardkit.jobs.dedup import dedup
from shardkit.duplicates.review import write_report
from shardkit.jobs.cluster import dask_client
from shardkit.manifest import Manifest, load_manifest, write_manifest
from shardkit.reader.shards import read_shard_samples
from shardkit.sample import Sample
from shardkit.sources import records
from shardkit.writers.parquet import write_parquet
from shardkit.writers.tar import write_tar

LETTERS = list("abcdefghijklmnopqrstuvwxyz")
FIELDS = {"txt": {"kind": "text"}, "png": {"kind": "image", "encoding": "png"}, "cls": {"kind": "int", "dtype": "int64"}}


def _png(seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    coarse = rng.uniform(0, 255, (6, 8, 3)).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(coarse).resize((64, 48), Image.Resampling.BICUBIC).save(buf, "PNG")
    return buf.getvalue()


def corpus(n=120, seed=0) -> list[Sample]:
    """Text documents with exact, near and far copies, a few images with copies, and bad inputs."""
    rng = np.random.default_rng(seed)
    vocab = np.array(["".join(rng.choice(LETTERS, 6)) for _ in range(5000)])
    samples = []
    for i in range(n):
        text = " ".join(rng.choice(vocab, 80))
        samples.append(Sample(f"doc/{i:04d}", {"txt": text, "cls": i % 3}))
        if i % 7 == 0:
            samples.append(Sample(f"e-copy/{i:04d}", {"txt": text.upper() + "!", "cls": 0}))
        if i % 7 == 1:
            samples.append(Sample(f"e-near/{i:04d}", {"txt": text + " one more", "cls": 1}))
        if i % 7 == 2:  # shares two thirds of its words: J well under the threshold
            samples.append(Sample(f"e-far/{i:04d}", {"txt": " ".join(text.split()[:55] + list(rng.choice(vocab, 25))),
                                                   "cls": 2}))
    for i in range(6):
        samples.append(Sample(f"img/{i:02d}", {"png": _png(i), "cls": 0}))
    samples.append(Sample("img/99", {"png": _png(2), "cls": 1}))
    samples += [Sample("bad/utf8", {"txt": b"caf\xe9 \xff ok"}), Sample("bad/empty", {"txt": "  ...  "}),
                Sample("bad/image", {"png": b"\x89PNG broken"}), Sample("bad/none", {"cls": 2})]
    return sorted(samples, key=lambda s: s.key)


def make_dataset(root, samples, per_shard=40, formats=("tar", "parquet")) -> Manifest:
    # A built dataset stores text as valid UTF-8 (the build decoded it with replacement).
    samples = [Sample(s.key, {k: v.decode("utf-8", "replace") if isinstance(v, bytes) and k == "txt" else v
                              for k, v in s.fields.items()}) for s in samples]
    infos = []
    for shard_id, start in enumerate(range(0, len(samples), per_shard)):
        chunk = samples[start:start + per_shard]
        infos += [{"tar": write_tar, "parquet": write_parquet}[f](chunk, str(root), shard_id, FIELDS) for f in formats]
    manifest = Manifest(samples=len(samples), fields=FIELDS, shards=infos, classes=["a", "b", "c"])
    write_manifest(str(root), manifest)
    return manifest


def _table(folder):
    return pq.read_table(os.path.join(folder, "clusters.parquet")).to_pylist()


def _run(samples, cfg, client, folder, **kw):
    """find_duplicates + its report under FOLDER/report (what callers do once a run ends)."""
    result = find_duplicates(samples, cfg, client, str(folder), **kw)
    result.summary.pop("execution")  # how the run was cut, not what it found
    write_report(str(folder / "report"), result)
    return result


def test_kept_set_and_clusters_do_not_depend_on_workers_or_partitions(tmp_path):
    samples = corpus()
    cfg = DedupConfig(progress=False)
    runs = [_run(samples, cfg, None, tmp_path / "local", per_partition=7)]
    with dask_client(None, 1) as client:
        runs.append(_run(samples, cfg, client, tmp_path / "one", per_partition=50, bucket_tasks=3))
    with dask_client(None, 2) as client:
        runs.append(_run(samples, cfg, client, tmp_path / "two", per_partition=13, bucket_tasks=7))
    reports = [{n: (tmp_path / name / "report" / n).read_bytes() for n in ("clusters.parquet", "summary.json")}
               for name in ("local", "one", "two")]
    assert reports[0] == reports[1] == reports[2]
    assert all(np.array_equal(runs[0].removed_ids, r.removed_ids) for r in runs)
    assert len(_table(tmp_path / "local" / "report")) > 0


def test_nothing_lost_and_every_removal_is_explained(tmp_path):
    samples = corpus()
    result = find_duplicates(samples, DedupConfig(progress=False), None, str(tmp_path), per_partition=30)
    rows = {r["key"]: r for r in result.rows}
    removed = {k: r for k, r in rows.items() if not r["kept"]}
    keys = [s.key for s in samples]
    assert [keys[i] for i in result.rejected_ids] == ["bad/image"]
    assert sorted(keys[i] for i in result.removed_ids) == sorted(removed)
    assert result.kept + len(removed) + 1 == len(samples) == result.summary["inputs"]
    for key, r in removed.items():
        assert rows[r["duplicate_of"]]["kept"] and r["duplicate_of"] < key  # smallest key is kept
        assert r["cluster"] == rows[r["duplicate_of"]]["cluster"]
    assert {k for k in removed if k.startswith("e-copy/")} == {s.key for s in samples if s.key.startswith("e-copy/")}
    assert all(removed[k]["reason"] == "exact" for k in removed if k.startswith("e-copy/"))
    assert all(removed[k]["reason"] == "near" for k in removed if k.startswith("e-near/"))
    assert not any(k.startswith(("e-far/", "doc/")) for k in removed)
    assert removed["img/99"]["duplicate_of"] == "img/02" and removed["img/99"]["reason"] == "exact"
    s = result.summary
    assert s["text"]["utf8_replaced"] == 2 and s["text"]["symbolic"] == 1 and s["no_content"] == 1
    assert (s["parameters"]["bands"], s["parameters"]["rows"]) == (14, 9) and 0.8 < s["text"]["detection_at_threshold"] < 0.9


def test_signature_files_are_reused_and_stale_ones_removed(tmp_path):
    samples = corpus(n=40)
    cfg = DedupConfig(progress=False)
    first = find_duplicates(samples, cfg, None, str(tmp_path), per_partition=10)
    folder = tmp_path / "signatures"
    stamps = {p: os.stat(folder / p).st_mtime_ns for p in os.listdir(folder)}
    # A new threshold recomputes band entries from the stored signatures, never the signatures.
    again = find_duplicates(samples, DedupConfig(threshold=0.9, progress=False), None, str(tmp_path), per_partition=10)
    assert {p: os.stat(folder / p).st_mtime_ns for p in os.listdir(folder)} == stamps
    assert len(again.removed_ids) <= len(first.removed_ids)
    assert len(os.listdir(tmp_path / "bands")) == len(stamps)  # the 0.8 band files were replaced
    changed = samples[:-1] + [Sample(samples[-1].key, {"txt": "something else entirely"})]
    find_duplicates(changed, cfg, None, str(tmp_path), per_partition=10)
    after = set(os.listdir(folder))
    assert len(after) == len(stamps) and len(after - set(stamps)) == 1


def test_signature_files_of_another_text_hashing_scheme_are_never_reused(tmp_path, monkeypatch):
    import shardkit.jobs.dedup_tasks as engine

    samples = corpus(n=40)
    cfg = DedupConfig(progress=False)
    find_duplicates(samples, cfg, None, str(tmp_path), per_partition=10)
    folder = tmp_path / "signatures"
    before = set(os.listdir(folder))
    monkeypatch.setattr(engine, "TEXT_SCHEME", "an-earlier-scheme")
    seen = []
    compute = engine.sigmod.compute
    monkeypatch.setattr(engine.sigmod, "compute", lambda *a, **k: seen.append(1) or compute(*a, **k))
    find_duplicates(samples, cfg, None, str(tmp_path), per_partition=10)
    after = set(os.listdir(folder))
    assert len(seen) == len(before) == len(after) and not after & before  # all signed again, old files gone


def test_verify_drops_pairs_under_the_threshold(tmp_path):
    samples = corpus(n=40)
    result = find_duplicates(samples, DedupConfig(verify=True, progress=False), None, str(tmp_path))
    assert result.summary["parameters"]["verify"] is True
    assert all(r["similarity"] >= 0.8 for r in result.rows if r["modality"] == "text" and not r["kept"])


def test_parquet_shards_are_filtered_as_tables_into_the_bytes_the_samples_make(tmp_path, monkeypatch):
    import shardkit.jobs.dedup as job

    src = tmp_path / "src"
    manifest = make_dataset(src, corpus(), formats=("parquet",))
    shard = manifest.shards_of()[1]
    outs, taken = [], []
    filter_parquet = job._filter_parquet
    for fast in (True, False):
        out = tmp_path / f"out-{fast}"
        os.makedirs(out / "shards")
        monkeypatch.setattr(job, "_filter_parquet", lambda *a: taken.append(1) or filter_parquet(*a) if fast else None)
        info, _ = job._filter_shard((shard, 0, np.array([0, 5, 39])), str(src), manifest, str(out))
        outs.append((info, (out / info.path).read_bytes()))
    assert taken and outs[0] == outs[1] and outs[0][0].samples == shard.samples - 3
    # A file without the columns the writer makes now (an older layout) goes through samples.
    old = pq.read_table(src / shard.path).drop_columns(["txt.xxh3"])
    pq.write_table(old, src / shard.path)
    assert filter_parquet(str(src / shard.path), shard, np.array([0]), manifest.fields) is None


def test_a_damaged_parquet_shard_met_on_a_rerun_is_a_shard_error_naming_it(tmp_path):
    from shardkit.errors import ShardError

    manifest = make_dataset(tmp_path / "src", corpus(n=40), formats=("parquet",))
    cfg = DedupConfig(str(tmp_path / "src"), str(tmp_path / "out"), workers=0, progress=False)
    dedup(cfg)  # the rerun below reuses its signature files: the first read of the shards is the filter's
    path = tmp_path / "src" / manifest.shards_of()[0].path
    group = pq.ParquetFile(path).metadata.row_group(0)
    column = next(c for c in map(group.column, range(group.num_columns)) if c.path_in_schema == "txt")
    data = bytearray(path.read_bytes())
    data[(column.dictionary_page_offset or column.data_page_offset) + column.total_compressed_size // 2] ^= 1
    path.write_bytes(bytes(data))
    with pytest.raises(ShardError, match="data-00000.parquet: cannot read .*rebuild"):
        dedup(cfg)


def test_text_datasets_are_read_in_blocks_with_the_report_of_one_sample_at_a_time(tmp_path):
    from shardkit.jobs.dedup_tasks import ShardReader

    fields = {"txt": {"kind": "text"}, "cls": {"kind": "int", "dtype": "int64"}}
    samples = [Sample(s.key, {k: v for k, v in s.fields.items() if k in fields}) for s in corpus(n=60)
               if isinstance(s.fields.get("txt", ""), str)]
    samples += [Sample("zz/no-text", {"cls": 1}), Sample("zz/symbols", {"txt": "### *** ### ***"}),
                Sample("zz/unicode", {"txt": "Ünïcödé ｆｕｌｌ " * 5})]
    for i, s in enumerate(samples):
        if i % 3:  # some rows record where they came from, the others are named by shard and row
            s.meta.update(source_path=f"raw/{i % 4}.jsonl", source_row=i if i % 5 else None)
    reports = []
    for fmt in ("parquet", "tar"):
        root = tmp_path / fmt
        infos = [{"tar": write_tar, "parquet": write_parquet}[fmt](samples[i:i + 25], str(root), i // 25, fields)
                 for i in range(0, len(samples), 25)]
        manifest = Manifest(samples=len(samples), fields=fields, shards=infos)
        write_manifest(str(root), manifest)
        for blocks in (True, False):
            reader = ShardReader(str(root), manifest)
            assert reader.texts_only
            reader.texts_only = blocks
            result = find_duplicates(infos, DedupConfig(progress=False), None, str(tmp_path / f"w-{fmt}-{blocks}"),
                                     reader=reader, specs=fields, per_partition=2)
            result.summary.pop("execution")
            write_report(str(tmp_path / f"r-{fmt}-{blocks}"), result)
            reports.append([(tmp_path / f"r-{fmt}-{blocks}" / f).read_bytes() for f in ("clusters.parquet", "summary.json")])
    assert reports[0] == reports[1] and reports[2] == reports[3]  # per format: they name their shards
    summary = json.loads(reports[0][1])
    assert summary["removed"] > 0 and summary["text"]["symbolic"] == 2 and summary["no_content"] >= 1


def test_dataset_in_dataset_out(tmp_path):
    samples = corpus()
    src, out = tmp_path / "src", tmp_path / "out"
    make_dataset(src, samples)
    result = dedup(DedupConfig(str(src), str(out), workers=2, progress=False))
    m = load_manifest(str(out))
    dropped = result.removed_keys | {"bad/image"}
    expected = [s.key for s in samples if s.key not in dropped]
    assert m.fields == FIELDS and m.classes == ["a", "b", "c"] and m.samples == len(expected)
    for fmt in ("tar", "parquet"):
        keys = [s.key for shard in m.shards_of(fmt) for s in read_shard_samples(str(out), m, shard)]
        assert keys == expected
    assert [s.id for s in m.shards_of("tar")] == list(range(len(m.shards_of("tar"))))
    kept = {s.key: s for shard in m.shards_of("tar") for s in read_shard_samples(str(out), m, shard)}
    original = {s.key: s for s in samples}
    assert all(kept[k].fields == original[k].fields for k in ("doc/0000", "img/02"))
    errors = (out / "errors.jsonl").read_text().splitlines()
    assert len(errors) == 1 and "bad/image" in errors[0] and m.errors["count"] == 1
    summary = json.loads((out / "dedup" / "summary.json").read_text())
    assert m.build["dedup"]["removed"] == len(result.removed_ids) == summary["removed"]
    assert m.build["dedup"]["source_samples"] == m.samples + summary["removed"]
    assert summary["output"] == {"samples": m.samples, "shards": len(m.shards_of()), "images": "stored bytes kept"}
    assert summary["execution"]["mode"] == "embedded cluster" and summary["execution"]["workers"] == 2


def test_a_shard_that_loses_nothing_is_copied_as_it_was(tmp_path):
    samples = [Sample(f"a{i}", {"txt": f"document number {i} with its own words here"}) for i in range(4)]
    samples += [Sample("b0", {"txt": "the same words in every one of these documents here"}),
                Sample("b1", {"txt": "the same words in every one of these documents here"})]
    make_dataset(tmp_path / "src", samples, per_shard=4, formats=("tar", "parquet"))
    dedup(DedupConfig(str(tmp_path / "src"), str(tmp_path / "out"), workers=0, progress=False))
    for name in ("data-00000.tar", "data-00000.tar.idx.parquet", "data-00000.parquet"):
        assert (tmp_path / "out" / "shards" / name).read_bytes() == (tmp_path / "src" / "shards" / name).read_bytes()
    m = load_manifest(str(tmp_path / "out"))
    assert m.samples == 5 and [s.samples for s in m.shards_of("tar")] == [4, 1]


def test_shard_left_empty_is_dropped_and_stale_shards_removed(tmp_path):
    text = "the same words in every one of these documents here"
    samples = [Sample(f"a{i}", {"txt": text}) for i in range(3)] + [Sample(f"b{i}", {"txt": text}) for i in range(3)]
    make_dataset(tmp_path / "src", samples, per_shard=3, formats=("parquet",))
    (tmp_path / "out" / "shards").mkdir(parents=True)
    (tmp_path / "out" / "shards" / "data-00007.parquet").write_bytes(b"left by an earlier run")
    dedup(DedupConfig(str(tmp_path / "src"), str(tmp_path / "out"), workers=0, progress=False))
    m = load_manifest(str(tmp_path / "out"))
    assert m.samples == 1 and [s.id for s in m.shards] == [0]
    assert os.listdir(tmp_path / "out" / "shards") == ["data-00000.parquet"]


def test_raw_folder_and_cli(tmp_path):
    from shardkit.cli import main
    from shardkit.demo.datagen import raw_folder

    raw = tmp_path / "raw"
    raw_folder(str(raw), images_per_class=3, documents=4, bad=False)
    shutil.copy(raw / "doc_000.txt", raw / "doc_100.txt")
    shutil.copy(raw / "cat" / "000001.jpg", raw / "cat" / "000101.jpg")
    run = CliRunner().invoke(main, ["dedup", str(raw), str(tmp_path / "out"), "--workers", "0", "--no-progress",
                                    "--num-perm", "96", "--ngram", "3", "--format", "both"])
    assert run.exit_code == 0, run.output
    assert "removed" in run.output and "clusters.parquet" in run.output
    m = load_manifest(str(tmp_path / "out"))
    # one pass: built straight into OUT (no staging copy), with every option of the command
    assert m.build["dedup"]["config"]["num_perm"] == 96 and m.build["dedup"]["config"]["ngram"] == 3
    assert m.build["dedup"]["removed"] == 2 and m.formats == ["parquet", "tar"]
    assert not list((tmp_path / "out").rglob("staging"))
    summary = json.loads((tmp_path / "out" / "dedup" / "summary.json").read_text())
    assert summary["output"]["samples"] == m.samples and summary["inputs"] == m.samples + 2
    assert summary["output"]["images"] == "original bytes kept" and summary["execution"]["mode"] == "in-process"
    keys = {s.key for shard in m.shards_of() for s in read_shard_samples(str(tmp_path / "out"), m, shard)}
    assert {"doc_000", "cat/000001"} <= keys and not {"doc_100", "cat/000101"} & keys
    bad = CliRunner().invoke(main, ["dedup", str(raw), str(tmp_path / "o2"), "--bands", "3"])
    assert bad.exit_code != 0 and "--rows" in bad.output
    # The step `shardkit build --dedup` runs between scan and shard assignment: positions to remove.
    from shardkit.jobs.build.dedup import source_reader
    from shardkit.sources.inventory import make_inventory, scan_options, without
    from shardkit.sources.rows import count_rows
    from shardkit.sources.walk import walk

    cfg = BuildConfig(str(raw), str(tmp_path / "b"))
    opts, listing = scan_options(cfg), walk(cfg.src, cfg.out)
    inv = make_inventory(listing, {rf.id: count_rows(rf, opts) for rf in listing.row_files}, cfg, opts)
    removed, result = dedup_inventory(inv, source_reader(inv), DedupConfig(progress=False), None, str(tmp_path / "w"))
    keys = [r.key for r in records(inv)]
    assert {keys[i] for i in removed.tolist()} == result.removed_keys == {"doc_100", "cat/000101"}
    assert [r.key for r in records(without(inv, removed))] == [k for k in keys if k not in result.removed_keys]


def test_jsonl_texts_with_lone_surrogate_escapes_are_deduplicated_and_written(tmp_path):
    from shardkit.cli import main

    (tmp_path / "raw").mkdir()
    lines = ['{"text": "\\ud800\\ud800 ### *** !!"}', '{"text": "\\ud800\\ud800 ### *** !!"}', '{"text": "plain words"}']
    (tmp_path / "raw" / "d.jsonl").write_text("\n".join(lines) + "\n")
    run = CliRunner().invoke(main, ["dedup", str(tmp_path / "raw"), str(tmp_path / "out"), "--workers", "0",
                                    "--no-progress"])
    assert run.exit_code == 0, run.output
    summary = json.loads((tmp_path / "out" / "dedup" / "summary.json").read_text())
    assert summary["inputs"] == 3 and summary["removed"] == 1 and summary["text"]["utf8_replaced"] == 4
    m = load_manifest(str(tmp_path / "out"))
    texts = [s.fields["txt"] for shard in m.shards_of() for s in read_shard_samples(str(tmp_path / "out"), m, shard)]
    assert texts == ["\ufffd\ufffd ### *** !!", "plain words"]


def test_config_errors_name_the_flag():
    for kwargs, flag in [({"threshold": 1.5}, "--threshold"), ({"bands": 20, "rows": 9}, "--num-perm"),
                         ({"image_distance": 40}, "--image-distance"), ({"modality": "audio"}, "--modality")]:
        with pytest.raises(ValueError, match=flag):
            DedupConfig(**kwargs)


def _jsonl_folder(root, files=3, per_file=60, seed=5):
    """Raw jsonl files with exact, near and far copies of earlier documents (also across files), and a bad line."""
    rng = np.random.default_rng(seed)
    vocab = np.array(["".join(rng.choice(LETTERS, 6)) for _ in range(3000)])
    docs = []
    root.mkdir()
    for f in range(files):
        lines = []
        for i in range(per_file):
            if docs and i % 9 == 4:
                lines.append(json.dumps({"text": docs[int(rng.integers(len(docs)))].upper(), "id": i}))
            elif docs and i % 9 == 7:
                lines.append(json.dumps({"text": docs[int(rng.integers(len(docs)))] + " plus two", "id": i}))
            else:
                docs.append(" ".join(rng.choice(vocab, 60)))
                lines.append(json.dumps({"text": docs[-1], "id": i}))
        if f == 1:
            lines.insert(10, "{not json")
        (root / f"part-{f}.jsonl").write_text("\n".join(lines) + "\n")
    return root


def test_raw_jsonl_dedup_equals_build_then_dedup(tmp_path):
    """Same clusters and kept set whether a raw jsonl folder is deduplicated directly (partitions of
    row-file pieces signed on 2 workers) or built first and the dataset deduplicated."""
    from shardkit.jobs.build import build

    raw = _jsonl_folder(tmp_path / "raw")
    cfg = dict(progress=False, partition_size=50, format="parquet")
    direct = dedup(DedupConfig(str(raw), str(tmp_path / "direct"), workers=2, **cfg))
    build(BuildConfig(str(raw), str(tmp_path / "built"), format="parquet", workers=0, progress=False))
    later = dedup(DedupConfig(str(tmp_path / "built"), str(tmp_path / "later"), workers=0, **cfg))
    assert direct.removed_keys and direct.removed_keys == later.removed_keys
    assert direct.clusters.to_pylist() == later.clusters.to_pylist()
    kept = [{s.key for sh in load_manifest(str(tmp_path / d)).shards_of()
             for s in read_shard_samples(str(tmp_path / d), load_manifest(str(tmp_path / d)), sh)}
            for d in ("direct", "later")]
    assert kept[0] == kept[1] and len(kept[0]) == 3 * 60 - len(direct.removed_keys)


def test_raw_jsonl_dedup_sends_pieces_and_builds_no_record_per_row(tmp_path, monkeypatch):
    """The driver of a raw-folder dedup holds compact columns: sources.records (one object per row)
    is never called, and each signature task gets a partition of pieces, not of rows."""
    import shardkit.jobs.dedup_tasks as engine
    import shardkit.sources as sources
    from shardkit.sources.key_order import Piece

    raw = _jsonl_folder(tmp_path / "raw")
    monkeypatch.setattr(sources, "records", lambda inv: pytest.fail("records() builds one object per row"))
    sent, real = [], engine.run_tasks

    def recording(fn, items, **kw):
        if kw.get("name") == "dedup-sig":
            sent.extend(items)
        return real(fn, items, **kw)
    monkeypatch.setattr(engine, "run_tasks", recording)
    result = dedup(DedupConfig(str(raw), str(tmp_path / "out"), workers=0, progress=False, partition_size=70))
    assert result.removed_keys
    assert [sum(len(p) for p in part.items) for part in sent] == [70, 70, 41]  # 181 lines, the bad one included
    assert all(isinstance(p, Piece) for part in sent for p in part.items)
    assert len({p.source for part in sent for p in part.items}) == 3  # one block per row file
