"""Tokenize once: ids equal encode_batch, packed rows equal the EOS-joined stream, dtype choice, streaming."""

from __future__ import annotations

import base64
import io
import json
import tarfile

import numpy as np
import pyarrow.parquet as pq
import pytest
import webdataset as wds

from shardkit.config import BuildConfig
from shardkit.errors import ConfigError
from shardkit.jobs.build import build
from shardkit.manifest import load_manifest
from shardkit.stages.tokenize import TokenizerInfo, pack_stream

from conftest import tree_bytes


@pytest.fixture
def corpus(tmp_path):
    """28 documents: .txt files of varied length (some non-ASCII, one with bad UTF-8) and a .jsonl."""
    from shardkit.demo.datagen import words

    rng = np.random.default_rng(3)
    root = tmp_path / "corpus"
    (root / "docs").mkdir(parents=True)
    for i in range(24):
        extra = " Ünïcödé 日本語 😀" if i % 5 == 0 else ""
        (root / "docs" / f"d{i:03d}.txt").write_text(words(rng, int(rng.integers(1, 120))) + extra, encoding="utf-8")
    (root / "docs" / "latin1.txt").write_bytes(b"caf\xe9 cr\xe8me and \xff\xfe bytes")  # 4 bad bytes
    lines = [json.dumps({"text": words(rng, 40), "id": i}) for i in range(3)]
    (root / "lines.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return root


def _build(src, out, **kw):
    kw.setdefault("workers", 0)
    kw.setdefault("progress", False)
    kw.setdefault("labels", False)
    return build(BuildConfig(src=str(src), out=str(out), **kw))


def _texts(src) -> dict[str, str]:
    """What the build should have tokenized, by key (UTF-8 decoded with replacement)."""
    from shardkit.sources import read_record, scan

    cfg = BuildConfig(src=str(src), out="unused", labels=False)
    return {r.key: read_record(str(src), r).fields["txt"] for r in scan(cfg).records}


def _tokenizer(out):
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(out / "tokenizer.json"))


def _tar_members(path) -> dict[str, bytes]:
    with tarfile.open(path) as tf:
        return {m.name: tf.extractfile(m).read() for m in tf}


def test_unpacked_ids_equal_encode_batch_for_every_document(corpus, tmp_path):
    out = tmp_path / "out"
    result = _build(corpus, out, tokenizer="bpe:400", format="both", max_samples_per_shard=10)
    m = load_manifest(str(out))
    spec = m.fields["tokens"]
    assert "txt" not in m.fields and spec["dtype"] == "uint16" and m.extra["tokenizer"]["source"] == "bpe:400"
    texts = _texts(corpus)
    tok = _tokenizer(out)
    eos = tok.token_to_id("<|endoftext|>")
    assert spec["eos_id"] == eos == m.extra["tokenizer"]["eos_id"]
    keys = sorted(texts)
    expected = {k: e.ids + [eos] for k, e in zip(keys, tok.encode_batch([texts[k] for k in keys],
                                                                          add_special_tokens=False))}
    from_parquet, from_tar = {}, {}
    for shard in m.shards_of("parquet"):
        for row in pq.read_table(out / shard.path).to_pylist():
            from_parquet[row["__key__"]] = np.frombuffer(row["tokens"], "<u2").tolist()
    for shard in m.shards_of("tar"):
        for name, data in _tar_members(out / shard.path).items():
            key, field = name.split(".", 1)
            if field == "tokens":
                from_tar[key] = np.frombuffer(data, "<u2").tolist()
    assert from_parquet == expected == from_tar
    assert m.extra["tokenizer"]["stats"]["tokens"] == sum(map(len, expected.values()))
    assert result.utf8_replaced == 4  # the latin-1 document: replaced, counted, still tokenized
    assert "\ufffd" in texts["docs/latin1"] and "latin1" in " ".join(from_parquet)


def _encoded(out, texts, keys) -> list[list[int]]:
    """What the build should store per document: encode_batch ids + EOS."""
    tok = _tokenizer(out)
    eos = load_manifest(str(out)).fields["tokens"]["eos_id"]
    return [e.ids + [eos] for e in tok.encode_batch([texts[k] for k in keys], add_special_tokens=False)]


def test_packed_shards_hold_the_eos_joined_stream_and_document_offsets(corpus, tmp_path):
    out = tmp_path / "out"
    _build(corpus, out, tokenizer="bpe:400", seq_len=31, format="both", max_samples_per_shard=9)
    m = load_manifest(str(out))
    spec, stats = m.fields["tokens"], m.extra["tokenizer"]["stats"]
    assert set(m.fields) == {"tokens"} and spec["layout"] == "packed" and spec["shape"] == [32]
    texts = _texts(corpus)
    keys = sorted(texts)
    padded = 0
    for tar, parquet, docs in zip(m.shards_of("tar"), m.shards_of("parquet"), [keys[i:i + 9] for i in range(0, 28, 9)]):
        encoded = _encoded(out, texts, docs)
        stream = [i for ids in encoded for i in ids]
        # webdataset reads a packed tar shard as one sample of two arrays
        (sample,) = list(wds.WebDataset(str(out / tar.path), shardshuffle=False).decode())
        assert sample["__key__"] == f"tokens-{tar.id:05d}"
        rows, offsets = sample["tokens.npy"], sample["doc_offsets.npy"]
        assert rows.dtype == np.uint16 and rows.shape == (tar.samples, 32) and tar.documents == len(docs)
        assert (rows[1:, 0] == rows[:-1, -1]).all()  # consecutive rows share one id
        flat = np.concatenate([rows[0], rows[1:, 1:].reshape(-1)])
        assert flat[:len(stream)].tolist() == stream and (flat[len(stream):] == spec["pad_id"]).all()
        assert len(rows) == -(-len(stream) // 31)  # every id is an input once
        assert offsets.tolist() == np.cumsum([0] + [len(ids) for ids in encoded]).tolist()
        # pyarrow reads the same rows from the Parquet shard, the offsets from its metadata
        f = pq.ParquetFile(out / parquet.path)
        column = f.read().column("tokens").combine_chunks()
        assert np.frombuffer(column.buffers()[1], "<u2").reshape(-1, 32).tolist() == rows.tolist()
        stored = np.load(io.BytesIO(base64.b64decode(f.schema_arrow.metadata[b"shardkit.doc_offsets"])))
        assert stored.tolist() == offsets.tolist() and parquet.documents == len(docs)
        # the ids cost their own bytes (+1 per row shared with the next): a fixed overhead per shard
        # (tar headers, NPY headers, the tar end), nothing per row
        assert tar.bytes - rows.nbytes - offsets.nbytes < 4 * 512 + 2 * 128 + 10240
        padded += len(flat) - len(stream)
    assert stats["pad_tokens"] == padded and stats["dropped_tokens"] == 0 and stats["rows"] == m.samples


def test_rows_overlap_by_one_id_and_tail_drop_is_counted_never_silent():
    flat, lengths = np.arange(10, dtype=np.uint16), np.array([3, 7])
    rows, offsets, stats = pack_stream(flat, lengths, 3, "drop", 65535)
    assert rows.tolist() == [[0, 1, 2, 3], [3, 4, 5, 6], [6, 7, 8, 9]] and offsets.tolist() == [0, 3, 10]
    assert stats == {"pad_tokens": 0, "dropped_tokens": 0}
    rows, offsets, stats = pack_stream(flat, lengths, 4, "drop", 65535)
    assert rows.tolist() == [[0, 1, 2, 3, 4], [4, 5, 6, 7, 8]] and stats == {"pad_tokens": 0, "dropped_tokens": 1}
    assert offsets.tolist() == [0, 3, 9]  # the second document keeps its stored part
    rows, offsets, stats = pack_stream(flat, lengths, 4, "pad", 65535)
    assert rows[-1].tolist() == [8, 9, 65535, 65535, 65535] and stats == {"pad_tokens": 3, "dropped_tokens": 0}
    assert offsets.tolist() == [0, 3, 10] and offsets.dtype == np.dtype("<u4")
    rows, offsets, stats = pack_stream(np.arange(3, dtype=np.uint16), np.array([3]), 4, "drop", 65535)
    assert rows.shape == (0, 5) and offsets.tolist() == [0] and stats["dropped_tokens"] == 3


def test_trained_bpe_round_trips_text_and_is_deterministic(corpus, tmp_path):
    _build(corpus, tmp_path / "a", tokenizer="bpe:400")
    _build(corpus, tmp_path / "b", tokenizer="bpe:400")
    assert (tmp_path / "a" / "tokenizer.json").read_bytes() == (tmp_path / "b" / "tokenizer.json").read_bytes()
    tok = _tokenizer(tmp_path / "a")
    for text in _texts(corpus).values():
        assert tok.decode(tok.encode(text, add_special_tokens=False).ids) == text


def test_dtype_is_uint16_when_the_vocabulary_fits_else_uint32(corpus, tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    assert TokenizerInfo("t", "s", "x", 0xFFFF, 0, "e").dtype == "uint16"  # 65535 is kept for padding
    assert TokenizerInfo("t", "s", "x", 0x10000, 0, "e").dtype == "uint32"
    words = sorted({w for t in _texts(corpus).values() for w in t.split()})
    vocab = {f"filler{i}": i for i in range(70_000 - len(words) - 2)}
    vocab.update({w: len(vocab) + i for i, w in enumerate(words)})
    vocab.update({"[UNK]": len(vocab), "</s>": len(vocab) + 1})
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(tmp_path / "big.json"))
    out = tmp_path / "out"
    _build(corpus, out, tokenizer=str(tmp_path / "big.json"), format="parquet")
    m = load_manifest(str(out))
    assert m.fields["tokens"]["dtype"] == "uint32" and m.fields["tokens"]["eos_id"] == 69_999
    row = pq.read_table(out / m.shards_of("parquet")[0].path).to_pylist()[0]
    ids = np.frombuffer(row["tokens"], "<u4")
    assert ids.max() > 0xFFFF and ids[-1] == 69_999
    assert (out / "tokenizer.json").read_bytes() == (tmp_path / "big.json").read_bytes()


def test_a_hub_name_or_missing_eos_is_a_clear_error(corpus, tmp_path):
    with pytest.raises(ConfigError, match="neither a tokenizer.json file nor bpe:VOCAB_SIZE.*hub"):
        BuildConfig(src=str(corpus), out=str(tmp_path / "o"), tokenizer="gpt2")
    with pytest.raises(ConfigError, match="--tokenizer"):
        BuildConfig(src=str(corpus), out=str(tmp_path / "o"), seq_len=128)
    with pytest.raises(ConfigError, match="--eos-token 'nope' is not in the tokenizer"):
        _build(corpus, tmp_path / "o", tokenizer="bpe:300", eos_token="nope")


def test_worker_count_does_not_change_bytes_and_options_change_markers(corpus, tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    _build(corpus, a, tokenizer="bpe:300", seq_len=15, format="both", max_samples_per_shard=8)
    _build(corpus, b, tokenizer="bpe:300", seq_len=15, format="both", max_samples_per_shard=8, workers=2)
    assert tree_bytes(a) == tree_bytes(b)
    again = _build(corpus, a, tokenizer="bpe:300", seq_len=15, format="both", max_samples_per_shard=8)
    assert again.reused_shards == 4
    for change in ({"seq_len": 16}, {"tail": "drop"}, {"eos_token": "<|endoftext|>"}):
        kw = {"tokenizer": "bpe:300", "seq_len": 15, "format": "both", "max_samples_per_shard": 8, **change}
        assert _build(corpus, a, **kw).reused_shards == 0, change
    # the same --tokenizer path with other content: a different tokenizer, so nothing is reused
    path = tmp_path / "tok.json"
    path.write_bytes((a / "tokenizer.json").read_bytes())
    assert _build(corpus, b, tokenizer=str(path), max_samples_per_shard=8).reused_shards == 0
    assert _build(corpus, b, tokenizer=str(path), max_samples_per_shard=8).reused_shards == 4
    _build(corpus, tmp_path / "c", tokenizer="bpe:260")
    path.write_bytes((tmp_path / "c" / "tokenizer.json").read_bytes())
    assert _build(corpus, b, tokenizer=str(path), max_samples_per_shard=8).reused_shards == 0


def test_rerun_reuses_the_trained_tokenizer_until_the_corpus_changes(corpus, tmp_path, monkeypatch):
    import shardkit.stages.tokenize as stage

    out = tmp_path / "out"
    first = _build(corpus, out, tokenizer="bpe:300", max_samples_per_shard=8)
    trained = []
    real = stage.train_bpe
    monkeypatch.setattr(stage, "train_bpe", lambda *a, **k: trained.append(1) or real(*a, **k))
    again = _build(corpus, out, tokenizer="bpe:300", max_samples_per_shard=8)
    assert not trained and again.reused_shards == 4 and again.manifest.to_json() == first.manifest.to_json()
    (corpus / "docs" / "d000.txt").write_text("a new first document", encoding="utf-8")
    changed = _build(corpus, out, tokenizer="bpe:300", max_samples_per_shard=8)
    assert trained == [1] and changed.reused_shards < 4


def test_packed_builds_keep_text_only_and_say_why(tmp_path):
    from shardkit.cli.build import build_summary
    from shardkit.demo.datagen import words

    rng = np.random.default_rng(0)
    src = tmp_path / "src"
    for cls in ("news", "books"):  # class subfolders: labels for one row per document, none for packed rows
        (src / cls).mkdir(parents=True)
        for i in range(4):
            (src / cls / f"{i}.txt").write_text(words(rng, 30), encoding="utf-8")
    (src / "news" / "meta.json").write_text('{"a": 1}')  # no text to pack: rejected, counted
    packed = _build(src, tmp_path / "packed", tokenizer="bpe:300", seq_len=16, labels=None)
    m = packed.manifest
    assert set(m.fields) == {"tokens"} and m.classes is None
    assert [(r.path, r.stage) for r in packed.rejections] == [("news/meta.json", "tokenize")]
    assert "no text" in packed.rejections[0].reason
    summary = build_summary(packed)
    assert "images/s" not in summary and "tokens/s" in summary and "labels" not in summary
    docs = _build(src, tmp_path / "docs", tokenizer="bpe:300", labels=None)
    assert docs.manifest.classes == ["books", "news"] and "cls" in docs.manifest.fields
    assert "2 classes from the subfolders" in build_summary(docs)
    (src / "news" / "photo.jpg").write_bytes(b"not even an image")
    with pytest.raises(ConfigError, match="--seq-len 16 packs documents into rows.*image"):
        _build(src, tmp_path / "mixed", tokenizer="bpe:300", seq_len=16)


def test_dedup_of_packed_rows_says_to_dedup_the_raw_text(corpus, tmp_path):
    from shardkit.config import DedupConfig
    from shardkit.jobs.dedup import dedup

    out = tmp_path / "packed"
    _build(corpus, out, tokenizer="bpe:300", seq_len=16)
    with pytest.raises(ConfigError, match="packed token rows.*--dedup"):
        dedup(DedupConfig(src=str(out), out=str(tmp_path / "dd"), workers=0, progress=False))
