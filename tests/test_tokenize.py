"""Tokenize once: ids equal encode_batch, packed rows equal the EOS-joined stream, dtype choice, streaming."""

from __future__ import annotations

import json
import tarfile

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from shardkit.config import BuildConfig
from shardkit.errors import ConfigError
from shardkit.executor import build
from shardkit.loader import make_loader
from shardkit.manifest import load_manifest
from shardkit.reader.dataset import StreamingDataset
from shardkit.reader.tokens import IGNORE_INDEX, segment_ids, split_rows
from shardkit.stages.tokenize import TokenizerInfo, pack_rows

from conftest import tree_bytes


@pytest.fixture
def corpus(tmp_path):
    """28 documents: .txt files of varied length (some non-ASCII, one with bad UTF-8) and a .jsonl."""
    from shardkit.datagen import words

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


def test_packed_rows_are_the_eos_joined_stream_with_document_starts(corpus, tmp_path):
    out = tmp_path / "out"
    _build(corpus, out, tokenizer="bpe:400", seq_len=31, format="parquet", max_samples_per_shard=9)
    m = load_manifest(str(out))
    spec, stats = m.fields["tokens"], m.extra["tokenizer"]["stats"]
    assert spec["shape"] == [32] and spec["seq_len"] == 31 and m.fields["doc_starts"]["dtype"] == "int32"
    texts = _texts(corpus)
    tok = _tokenizer(out)
    eos, pad = spec["eos_id"], spec["pad_id"]
    keys = sorted(texts)
    padded = 0
    for shard, docs in zip(m.shards_of("parquet"), [keys[i:i + 9] for i in range(0, len(keys), 9)]):
        stream = [i for e in tok.encode_batch([texts[k] for k in docs], add_special_tokens=False)
                  for i in e.ids + [eos]]
        rows = pq.read_table(out / shard.path).to_pylist()
        ids = np.concatenate([np.frombuffer(r["tokens"], "<u2") for r in rows])
        assert all(len(r["tokens"]) == 64 for r in rows)
        n_pad = int((ids == pad).sum())
        assert ids[:len(ids) - n_pad].tolist() == stream and n_pad == len(ids) - len(stream) < 32
        padded += n_pad
        starts = [np.frombuffer(r["doc_starts"], "<i4") + 32 * j for j, r in enumerate(rows)]
        doc_begins = np.cumsum([0] + [len(e.ids) + 1 for e in tok.encode_batch([texts[k] for k in docs],
                                                                               add_special_tokens=False)])
        expected = sorted(set(doc_begins.tolist()) | set(range(0, len(ids), 32)))
        assert np.concatenate(starts).tolist() == [s for s in expected if s < len(ids)]
    assert stats["pad_tokens"] == padded and stats["dropped_tokens"] == 0
    assert stats["rows"] == m.samples


def test_tail_drop_is_counted_never_silent():
    flat, lengths = np.arange(10, dtype=np.uint16), np.array([3, 7])
    rows, starts, stats = pack_rows(flat, lengths, 4, "drop", 65535)
    assert rows.tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]] and stats == {"pad_tokens": 0, "dropped_tokens": 2}
    assert [s.tolist() for s in starts] == [[0, 3], [0]]
    rows, starts, stats = pack_rows(flat, lengths, 4, "pad", 65535)
    assert rows[-1].tolist() == [8, 9, 65535, 65535] and stats == {"pad_tokens": 2, "dropped_tokens": 0}
    assert [s.tolist() for s in starts] == [[0, 3], [0], [0, 2]]  # the padding begins a segment


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


def test_streaming_yields_long_rows_and_padded_documents(corpus, tmp_path):
    packed, docs = tmp_path / "packed", tmp_path / "docs"
    _build(corpus, packed, tokenizer="bpe:400", seq_len=31, format="both")
    _build(corpus, docs, tokenizer="bpe:400", format="parquet")
    rows = pq.read_table(packed / load_manifest(str(packed)).shards_of("parquet")[0].path).to_pylist()
    by_key = {r["__key__"]: r for r in rows}
    for fmt in ("tar", "parquet"):
        ds = StreamingDataset(str(packed), format=fmt, shuffle=False)
        batch = next(iter(make_loader(ds, batch_size=4, num_workers=0)))
        assert batch["tokens"].dtype == torch.int64 and batch["tokens"].shape == (4, 32)
        for key, row, starts in zip(batch["__key__"], batch["tokens"], batch["doc_starts"]):
            assert row.tolist() == np.frombuffer(by_key[key]["tokens"], "<u2").tolist()
            stored = np.frombuffer(by_key[key]["doc_starts"], "<i4").tolist()
            assert starts.tolist() == stored + [-1] * (len(starts) - len(stored))
        pad = ds.manifest.fields["tokens"]["pad_id"]
        inputs, targets = split_rows(batch["tokens"], pad)
        assert torch.equal(inputs[:, 1:], targets[:, :-1].clamp(min=0))
        seg = segment_ids(batch["doc_starts"], 32)
        assert seg.shape == (4, 32) and (seg[:, 0] == 0).all() and (seg.diff(dim=1) >= 0).all()
        for r, starts in enumerate(batch["doc_starts"]):
            real = [s for s in starts.tolist() if s >= 0]
            assert [int(seg[r, s]) for s in real] == list(range(len(real)))
    ds = StreamingDataset(str(docs), shuffle=False)
    batch = next(iter(make_loader(ds, batch_size=5, num_workers=0)))
    pad = ds.manifest.fields["tokens"]["pad_id"]
    lengths = (batch["tokens"] != pad).sum(1)
    assert batch["tokens"].dtype == torch.int64 and batch["tokens"].shape == (5, int(lengths.max()))
    tok = _tokenizer(docs)
    texts = _texts(corpus)
    _, targets = split_rows(batch["tokens"], pad)
    for key, row, n, target in zip(batch["__key__"], batch["tokens"], lengths.tolist(), targets):
        assert row[:n].tolist() == tok.encode(texts[key], add_special_tokens=False).ids + [0]
        assert (row[n:] == pad).all() and (target[n - 1:] == IGNORE_INDEX).all()


def test_token_rows_through_workers_are_exact_and_travel_in_reused_slots(corpus, tmp_path):
    packed = tmp_path / "packed"
    _build(corpus, packed, tokenizer="bpe:400", seq_len=15, format="parquet", max_samples_per_shard=8)
    m = load_manifest(str(packed))
    stored = {r["__key__"]: np.frombuffer(r["tokens"], "<u2").tolist()
              for s in m.shards_of("parquet") for r in pq.read_table(packed / s.path).to_pylist()}
    loader = make_loader(StreamingDataset(str(packed), seed=4), batch_size=3, num_workers=2, prefetch_factor=2)
    held = [b for _ in range(3) for b in loader]  # kept: more batches than slots, over three epochs
    transport = loader._transport
    assert len(held) > transport.flags.shape[1] * transport.flags.shape[0]
    assert int((transport.flags != 0).sum()) > 0  # the int64 rows sit in the workers' shared slots
    for b in held:
        assert b["tokens"].dtype == torch.int64 and b["tokens"].shape[1] == 16
        assert [row.tolist() for row in b["tokens"]] == [stored[k] for k in b["__key__"]]
    assert sorted(k for b in held for k in b["__key__"]) == sorted(list(stored) * 3)
    del held, b
    transport.release()
    assert int(transport.flags.sum()) == 0


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
