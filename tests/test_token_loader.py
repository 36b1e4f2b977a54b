"""Token datasets through the loader: training fields that round-trip every document, padding that never
reaches the loss, exactly-once and resume over packed rows, and datasets of the older row layout."""

from __future__ import annotations

import json
from collections import Counter, defaultdict

import numpy as np
import pytest
import torch

from shardkit.config import BuildConfig
from shardkit.errors import ConfigError
from shardkit.jobs.build import build
from shardkit.loader import make_loader
from shardkit.manifest import Manifest, load_manifest, write_manifest
from shardkit.reader.dataset import StreamingDataset
from shardkit.reader.tokens import IGNORE_INDEX, TRAIN_FIELDS, TokenOptions, segment_ids, split_rows, train_fields
from shardkit.sample import Sample
from shardkit.writers import get_writer

SEQ = 15  # rows of 16 ids: most documents span rows


def _np_empty(shape):
    return np.empty(shape, np.uint8)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """40 documents of 1 to 60 words in two shards' worth, one empty-ish, some non-ASCII."""
    from shardkit.demo.datagen import words

    rng = np.random.default_rng(7)
    root = tmp_path_factory.mktemp("corpus")
    for i in range(40):
        text = words(rng, int(rng.integers(1, 60))) + (" Ünïcödé 日本" if i % 7 == 0 else "")
        (root / f"d{i:03d}.txt").write_text(text, encoding="utf-8")
    return root


def _build(src, out, **kw):
    return build(BuildConfig(src=str(src), out=str(out), tokenizer=kw.pop("tokenizer", "bpe:300"), workers=0,
                             progress=False, **kw))


@pytest.fixture(scope="module")
def packed(corpus, tmp_path_factory):
    out = tmp_path_factory.mktemp("packed")
    _build(corpus, out, seq_len=SEQ, format="both", max_samples_per_shard=17)
    return out


def _documents(corpus, out) -> list[list[int]]:
    """Every document's ids + EOS, in build (key) order: what document_ids number."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    eos = load_manifest(str(out)).fields["tokens"]["eos_id"]
    texts = [p.read_text(encoding="utf-8") for p in sorted(corpus.glob("*.txt"))]
    return [e.ids + [eos] for e in tok.encode_batch(texts, add_special_tokens=False)]


def _stored_rows(out) -> dict[str, list[int]]:
    """key -> stored row (padding included), read straight from the shard files."""
    import webdataset as wds

    m = load_manifest(str(out))
    rows = {}
    for shard in m.shards_of("tar"):
        (sample,) = list(wds.WebDataset(str(out / shard.path), shardshuffle=False).decode())
        for r, row in enumerate(sample["tokens.npy"].tolist()):
            rows[f"tokens-{shard.id:05d}-{r:07d}"] = row
    return rows


@pytest.mark.parametrize("fmt", ["tar", "parquet"])
@pytest.mark.parametrize("workers", [0, 2])
def test_documents_round_trip_through_document_ids_and_position_ids(corpus, packed, fmt, workers):
    """Rows in stored order: grouping the inputs by document_ids gives back every document's ids + EOS
    exactly, each piece at positions 0, 1, 2, ...; labels are the rows shifted by one with
    IGNORE_INDEX exactly at padding."""
    documents = _documents(corpus, packed)
    ds = StreamingDataset(str(packed), format=fmt, shuffle=False, keys=True, fields=TRAIN_FIELDS)
    batches = list(make_loader(ds, batch_size=3, num_workers=workers, prefetch_factor=2))
    stored = _stored_rows(packed)
    pad, eos = ds.manifest.fields["tokens"]["pad_id"], ds.manifest.fields["tokens"]["eos_id"]
    rebuilt = defaultdict(list)
    for b in batches:
        assert set(b) == {"__key__", "input_ids", "labels", "position_ids", "document_ids"}
        for name in ("input_ids", "labels", "position_ids", "document_ids"):
            assert b[name].dtype == torch.int64 and b[name].shape == (len(b["__key__"]), SEQ)
        for key, x, y, pos, doc in zip(b["__key__"], b["input_ids"].tolist(), b["labels"].tolist(),
                                       b["position_ids"].tolist(), b["document_ids"].tolist()):
            row = stored[key]
            assert y == [t if t != pad else IGNORE_INDEX for t in row[1:]]
            assert x == [t if t != pad else eos for t in row[:-1]]
            pieces = defaultdict(list)
            for j, (t, p, d) in enumerate(zip(x, pos, doc)):
                assert (d == -1) == (row[j] == pad)
                pieces[d].append((p, t))
            for d, piece in pieces.items():
                assert [p for p, _ in piece] == list(range(len(piece)))  # restarts per document and row
                if d >= 0:
                    rebuilt[d] += [t for _, t in piece]
    assert [rebuilt[d] for d in range(len(rebuilt))] == documents


def test_boundary_masking_ignores_the_first_id_of_each_next_document(corpus, packed):
    every = dict(shuffle=False, format="tar", fields=TRAIN_FIELDS)
    plain = next(iter(make_loader(StreamingDataset(str(packed), **every), batch_size=1000, num_workers=0)))
    masked = next(iter(make_loader(StreamingDataset(str(packed), mask_boundaries=True, **every),
                                   batch_size=1000, num_workers=0)))
    doc = plain["document_ids"]
    starts = torch.zeros((len(doc), SEQ + 1), dtype=torch.bool)  # column j of each stored row starts a document
    starts[:, 1:SEQ] = (doc[:, 1:] != doc[:, :-1]) & (doc[:, 1:] >= 0)
    starts[:-1, SEQ] = (doc[1:, 0] != doc[:-1, -1]) & (doc[:-1, -1] >= 0)  # = the next row's column 0
    expected = plain["labels"].clone()
    expected[starts[:, 1:]] = IGNORE_INDEX  # the label at j - 1 is that document's first id
    assert starts[:, 1:SEQ].any() and starts[:, SEQ].any()
    assert torch.equal(masked["labels"], expected) and torch.equal(masked["input_ids"], plain["input_ids"])


def test_padding_never_reaches_the_loss_unless_rows_are_asked_for(corpus, packed):
    ds = StreamingDataset(str(packed), seed=2)
    vocab = load_manifest(str(packed)).extra["tokenizer"]["vocab_size"]
    pad = ds.manifest.fields["tokens"]["pad_id"]
    batches = list(make_loader(ds, batch_size=5, num_workers=2, prefetch_factor=2))
    labels = torch.cat([b["labels"] for b in batches])
    inputs = torch.cat([b["input_ids"] for b in batches])
    assert (labels == IGNORE_INDEX).any()  # the shards' padded last rows are in there
    assert ((labels >= 0) & (labels < vocab) | (labels == IGNORE_INDEX)).all() and (inputs < vocab).all()
    loss = torch.nn.functional.cross_entropy(torch.zeros(labels.numel(), vocab), labels.reshape(-1))
    assert torch.isfinite(loss)
    rows = StreamingDataset(str(packed), seed=2, tokens="rows")
    raw = torch.cat([b["tokens"] for b in make_loader(rows, batch_size=5, num_workers=0)])
    assert raw.shape[1] == SEQ + 1 and (raw == pad).any()  # asked for: the stored rows, padding included


@pytest.mark.filterwarnings("ignore:This DataLoader will create")
@pytest.mark.parametrize("workers", [0, 2])
def test_packed_rows_are_exactly_once_over_ranks_and_workers(packed, monkeypatch, workers):
    stored = _stored_rows(packed)
    for world in (1, 3):
        seen, sizes = Counter(), set()
        for rank in range(world):
            monkeypatch.setenv("RANK", str(rank))
            monkeypatch.setenv("WORLD_SIZE", str(world))
            ds = StreamingDataset(str(packed), seed=3, shuffle_buffer=8, keys=True, tokens="rows")
            batches = list(make_loader(ds, batch_size=4, num_workers=workers, prefetch_factor=2))
            for b in batches:
                assert [r.tolist() for r in b["tokens"]] == [stored[k] for k in b["__key__"]]
                seen.update(b["__key__"])
            sizes.add(sum(len(b["__key__"]) for b in batches))
        assert len(sizes) == 1 and set(seen) == set(stored)
        assert sum(seen.values()) - len(stored) == ds.padding <= world - 1


@pytest.mark.filterwarnings("ignore:This DataLoader will create")
@pytest.mark.parametrize("before, after", [(2, 0), (0, 3)])
def test_resume_with_another_worker_count_yields_exactly_the_rest(packed, monkeypatch, before, after):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")

    def loader(workers, bs=4):
        ds = StreamingDataset(str(packed), seed=5, shuffle_buffer=8, keys=True)
        return make_loader(ds, batch_size=bs, num_workers=workers, prefetch_factor=2)

    full = [k for b in loader(0) for k in b["__key__"]]
    first = loader(before)
    it = iter(first)
    done = [k for _ in range(3) for k in next(it)["__key__"]]
    state = first.state_dict()
    fresh = loader(after, bs=3)
    fresh.load_state_dict(state)
    rest = [k for b in fresh for k in b["__key__"]]
    assert done + rest == full


@pytest.mark.parametrize("drop_last", [False, True])
def test_grouped_worker_items_keep_batches_order_and_sizes(packed, monkeypatch, drop_last):
    """Workers send several consecutive batches per item (GROUP_ROWS): the loader still yields the
    batches, sizes and order of num_workers=0."""
    monkeypatch.setattr("shardkit.reader.base.GROUP_ROWS", 12)  # 2 batches of 5 (+ a short last group)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")

    def keys(workers):
        ds = StreamingDataset(str(packed), seed=6, shuffle_buffer=8, keys=True)
        loader = make_loader(ds, batch_size=5, num_workers=workers, prefetch_factor=2, drop_last=drop_last)
        batches = [b["__key__"] for b in loader]
        assert len(batches) == len(loader) and all(len(b) == 5 for b in batches[:-1])
        return batches

    assert keys(2) == keys(0) and (len(keys(0)[-1]) == 5 or not drop_last)


def test_keys_dtype_and_field_choice(packed):
    plain = StreamingDataset(str(packed), shuffle=False)
    assert {s.format for s in plain.shards} == {"tar"}  # packed rows of a --format both build: tar, the faster
    default = next(iter(make_loader(plain, batch_size=2, num_workers=0)))
    assert set(default) == {"input_ids", "labels"}  # no keys for packed rows, document fields when asked
    ds = StreamingDataset(str(packed), shuffle=False, dtype="int32", fields=["labels", "document_ids"], keys=True)
    b = next(iter(make_loader(ds, batch_size=2, num_workers=0)))
    assert set(b) == {"__key__", "labels", "document_ids"} and b["__key__"] == ["tokens-00000-0000000",
                                                                                 "tokens-00000-0000001"]
    assert b["labels"].dtype == torch.int32 and torch.equal(b["labels"].long(), default["labels"])
    with pytest.raises(ConfigError, match="tokens='rows' gives the stored rows"):
        StreamingDataset(str(packed), tokens="rows", fields=["labels"])
    with pytest.raises(ConfigError, match="dtype='int8'"):
        StreamingDataset(str(packed), dtype="int8")


def test_unpacked_documents_get_training_fields_per_sample(corpus, tmp_path):
    out = tmp_path / "docs"
    _build(corpus, out, format="parquet", max_samples_per_shard=11)
    documents = _documents(corpus, out)
    ds = StreamingDataset(str(out), shuffle=False, fields=TRAIN_FIELDS)
    batches = list(make_loader(ds, batch_size=6, num_workers=0))
    for j, b in enumerate(batches):
        assert len(b["__key__"]) == len(b["input_ids"])  # keys stay: they name the source documents
        for i, (x, y, pos, doc) in enumerate(zip(b["input_ids"], b["labels"], b["position_ids"], b["document_ids"])):
            ids = documents[j * 6 + i]
            n = min(len(ids), len(x))  # ids + EOS; the EOS is an input (label ignored) unless it is the longest
            assert x[:n].tolist() == ids[:n] and y[:len(ids) - 1].tolist() == ids[1:]
            assert (y[len(ids) - 1:] == IGNORE_INDEX).all() and pos[:n].tolist() == list(range(n))
            assert (doc[:n] == j * 6 + i).all() and (doc[n:] == -1).all()


def test_train_fields_segments_on_a_hand_made_batch():
    ids = np.array([[5, 6, 7, 8, 9, 10], [11, 12, 99, 99, 99, 99]], np.uint16)
    # row 0: document 3 holds column 0, documents start at columns 2 and 5; row 1: padding from column 2
    opts = TokenOptions(outputs=("input_ids", "labels", "position_ids", "document_ids"), eos_id=1)
    f = train_fields(ids, np.array([3, 7]), np.array([6, 2]), (np.array([0, 0]), np.array([2, 5])), opts)
    assert f["input_ids"].tolist() == [[5, 6, 7, 8, 9], [11, 12, 1, 1, 1]]
    assert f["labels"].tolist() == [[6, 7, 8, 9, 10], [12, -100, -100, -100, -100]]
    assert f["position_ids"].tolist() == [[0, 1, 0, 1, 2], [0, 1, 0, 1, 2]]
    assert f["document_ids"].tolist() == [[3, 3, 4, 4, 4], [7, 7, -1, -1, -1]]
    masked = train_fields(ids, np.array([3, 7]), np.array([6, 2]), (np.array([0, 0]), np.array([2, 5])),
                          TokenOptions(outputs=("labels",), mask_boundaries=True))
    assert masked["labels"].tolist() == [[6, -100, 8, 9, -100], [12, -100, -100, -100, -100]]


def test_inputs_and_labels_are_views_of_one_widened_array_unless_they_must_differ():
    ids = np.array([[5, 6, 7, 8, 9, 10], [11, 12, 13, 14, 15, 16]], np.uint16)
    full, first, starts = np.array([6, 6]), np.array([0, 1]), (np.array([0]), np.array([3]))
    opts = TokenOptions(eos_id=1)
    shared = train_fields(ids, first, full, starts, opts, shared=True)
    x, y = shared["input_ids"], shared["labels"]
    assert np.shares_memory(x, y) and x.dtype == y.dtype == np.int64  # each id widened once
    assert x.tolist() == ids[:, :-1].tolist() and y.tolist() == ids[:, 1:].tolist()
    apart = train_fields(ids, first, full, starts, opts, shared=False)
    assert not np.shares_memory(apart["input_ids"], apart["labels"])
    assert all((apart[k] == shared[k]).all() for k in ("input_ids", "labels"))
    # Padding (EOS as input, ignored as target) or masked boundaries: inputs and targets differ.
    padded = train_fields(ids, first, np.array([6, 4]), starts, opts, shared=True)
    assert not np.shares_memory(padded["input_ids"], padded["labels"])
    assert padded["input_ids"][1].tolist() == [11, 12, 13, 14, 1] and padded["labels"][1].tolist() == [12, 13, 14, -100, -100]
    masked = train_fields(ids, first, full, starts, TokenOptions(mask_boundaries=True), shared=True)
    assert not np.shares_memory(masked["input_ids"], masked["labels"]) and masked["labels"][0, 2] == IGNORE_INDEX


def test_labels_held_alone_keep_their_slot(packed, monkeypatch):
    """Workers send input_ids and labels as two views of one slot: the slot is reused only once neither
    is referenced, so labels kept after their input_ids are dropped stay intact."""
    monkeypatch.setattr("shardkit.loader.transport.SMALL_BYTES", 0)  # these tiny rows would travel by value
    monkeypatch.setattr("shardkit.reader.base.GROUP_ROWS", 4)  # items of 2 batches: most hold no padding

    def dataset():
        return StreamingDataset(str(packed), seed=6)

    loader = make_loader(dataset(), batch_size=2, num_workers=2, prefetch_factor=2)
    kept, views = [], 0
    for _ in range(3):  # more batches than slots: later ones take DataLoader's own path
        for b in loader:
            x, y = b["input_ids"], b["labels"]
            views += x.untyped_storage().data_ptr() == y.untyped_storage().data_ptr()
            kept.append(y)
            del b, x, y
    assert views > 0  # both crossed in one slot
    reference = make_loader(dataset(), batch_size=2, num_workers=0)
    expected = [b["labels"] for _ in range(3) for b in reference]
    assert len(kept) == len(expected) and all(torch.equal(a, b) for a, b in zip(kept, expected))
    del kept
    loader._transport.release()
    assert int(loader._transport.flags.sum()) == 0


@pytest.mark.parametrize("workers", [0, 2])
def test_transforms_that_edit_input_ids_in_place_leave_labels_alone(packed, workers):
    """A transform is where ids get edited in place (masking, noise): it gets input_ids and labels as two
    arrays, never as the two views of one, so its edits never reach the targets."""
    def mask_batch(batch):
        batch["input_ids"][:, ::2] = 0
        return batch

    def mask_sample(sample):
        sample["input_ids"][::2] = 0
        return sample

    labels = [b["labels"] for b in make_loader(StreamingDataset(str(packed), seed=2), batch_size=4, num_workers=0)]
    for kw in (dict(batch_transform=mask_batch), dict(transform=mask_sample)):
        ds = StreamingDataset(str(packed), seed=2, **kw)
        got = list(make_loader(ds, batch_size=4, num_workers=workers, prefetch_factor=2))
        assert len(got) == len(labels) and all((b["input_ids"][:, ::2] == 0).all() for b in got)
        assert all(torch.equal(b["labels"], y) for b, y in zip(got, labels))
    sample = StreamingDataset(str(packed), transform=mask_sample)[0]  # random access applies transform too
    assert sample["labels"].tolist() == StreamingDataset(str(packed))[0]["labels"].tolist()


def test_token_fields_travel_in_reused_slots(packed):
    def dataset():
        return StreamingDataset(str(packed), seed=4, fields=TRAIN_FIELDS)

    loader = make_loader(dataset(), batch_size=3, num_workers=2, prefetch_factor=2)
    held = [b for _ in range(3) for b in loader]  # more batches than slots, over three epochs
    transport = loader._transport
    assert int((transport.flags != 0).sum()) > 0  # the fields the loop holds sit in the workers' slots
    assert len(transport._main) <= transport.flags.numel()  # a bounded set of slots, reused
    reference = make_loader(dataset(), batch_size=3, num_workers=0)
    again = [b for _ in range(3) for b in reference]
    assert len(held) == len(again)
    for a, b in zip(held, again):  # batches the loop still holds stay intact while slots are reused
        assert set(a) == set(TRAIN_FIELDS) and all(torch.equal(a[k], b[k]) for k in b)
    del held, a, b
    transport.release()
    assert int(transport.flags.sum()) == 0


def test_with_pinned_memory_rows_cross_as_stored_and_widen_once_into_pinned_memory(packed, monkeypatch):
    """The pin_memory (CUDA) path, on CPU: a worker sends the rows as stored (uint16) with their
    document layout; the main process cuts a group into batches and widens each straight into
    pinned memory (recorded here), giving what num_workers=0 gives."""
    import shardkit.reader.base as base_module

    pinned = []
    monkeypatch.setattr(base_module, "_pinned", lambda shape: pinned.append(shape) or _np_empty(shape))
    reference = make_loader(StreamingDataset(str(packed), shuffle=False, fields=TRAIN_FIELDS, keys=True),
                            batch_size=4, num_workers=0)
    expected = [b for _, b in zip(range(3), reference)]
    ds = StreamingDataset(str(packed), shuffle=False, fields=TRAIN_FIELDS, keys=True)
    # What a worker with a pinning transport sends for a group of three batches of 4: rows as stored.
    item = ds.load(np.arange(12), epoch=0, alloc=_np_empty, cross=True)
    assert item["__ids__"].dtype == torch.uint16 and item["__ids__"].shape == (12, SEQ + 1)
    assert set(item) == {"__key__", "__ids__", "__docs__", "__starts__"}
    item["__batches__"] = [4, 4, 4]
    got = list(ds.received(item))
    assert len(got) == 3 and len(pinned) == 3 * len(TRAIN_FIELDS)
    for a, b in zip(got, expected):
        assert a["__key__"] == b["__key__"] and all(torch.equal(a[k], b[k]) for k in TRAIN_FIELDS)


# Datasets built before the packed layout: one tar member (or Parquet row) per row, a doc_starts field.

def _legacy_dataset(corpus, packed, out, seq_len=SEQ, per_shard=17):
    """The same documents written the way earlier builds wrote them (per-row samples of seq_len + 1 ids
    that do not overlap, a doc_starts array per row); returns (folder, key -> (row, starts))."""
    from tokenizers import Tokenizer

    m = load_manifest(str(packed))
    spec = {k: v for k, v in m.fields["tokens"].items() if k != "layout"}
    fields = {"tokens": spec, "doc_starts": {"kind": "array", "dtype": "int32"}}
    tok = Tokenizer.from_file(str(packed / "tokenizer.json"))
    texts = [p.read_text(encoding="utf-8") for p in sorted(corpus.glob("*.txt"))]
    shards, width, stored = [], seq_len + 1, {}
    for sid, lo in enumerate(range(0, len(texts), per_shard)):
        docs = [e.ids + [spec["eos_id"]] for e in tok.encode_batch(texts[lo:lo + per_shard], add_special_tokens=False)]
        flat = np.array([t for d in docs for t in d], np.uint16)
        n = -(-len(flat) // width)
        rows = np.full((n, width), spec["pad_id"], np.uint16)
        rows.reshape(-1)[:len(flat)] = flat
        begins = set(np.cumsum([0] + [len(d) for d in docs])[:-1].tolist()) | {len(flat)}
        samples = []
        for r in range(n):
            starts = sorted({0} | {b - r * width for b in begins if r * width <= b < (r + 1) * width})
            samples.append(Sample(f"tokens-{sid:05d}-{r:07d}", {"tokens": rows[r].astype("<u2").tobytes(),
                                                               "doc_starts": np.array(starts, "<i4").tobytes()}))
            stored[samples[-1].key] = (rows[r].tolist(), starts)
        shards += [get_writer(fmt)(samples, str(out), sid, fields) for fmt in ("tar", "parquet")]
    write_manifest(str(out), Manifest(samples=sum(s.samples for s in shards if s.format == "tar"), fields=fields,
                                      shards=shards, extra={"tokenizer": m.extra["tokenizer"]}))
    return out, stored


@pytest.mark.parametrize("fmt", ["tar", "parquet"])
def test_older_row_layout_streams_as_it_always_did(corpus, packed, tmp_path, fmt):
    legacy, stored = _legacy_dataset(corpus, packed, tmp_path / "legacy")
    ds = StreamingDataset(str(legacy), format=fmt, seed=1)
    assert ds.tokens is None  # no training fields: the old batches, keys and doc_starts included
    batches = list(make_loader(ds, batch_size=4, num_workers=2, prefetch_factor=2))
    for b in batches:
        assert set(b) == {"__key__", "tokens", "doc_starts"} and b["tokens"].dtype == torch.int64
        for key, row, starts in zip(b["__key__"], b["tokens"].tolist(), b["doc_starts"].tolist()):
            assert row == stored[key][0] and starts == stored[key][1] + [-1] * (len(starts) - len(stored[key][1]))
        seg = segment_ids(b["doc_starts"], SEQ + 1)
        assert seg.shape == b["tokens"].shape and (seg[:, 0] == 0).all()
    assert sorted(k for b in batches for k in b["__key__"]) == sorted(stored)
    pad = ds.manifest.fields["tokens"]["pad_id"]
    inputs, targets = split_rows(batches[0]["tokens"], pad)
    assert torch.equal(inputs[:, 1:], targets[:, :-1].clamp(min=0))
    with pytest.raises(ConfigError, match="rebuild it"):
        StreamingDataset(str(legacy), tokens="train")
    assert json.loads((legacy / "manifest.json").read_text())["fields"]["tokens"].get("layout") is None


def test_older_unpacked_datasets_keep_their_padded_tokens(corpus, tmp_path):
    out = tmp_path / "docs"
    _build(corpus, out, format="tar", max_samples_per_shard=11)
    manifest = json.loads((out / "manifest.json").read_text())
    del manifest["fields"]["tokens"]["layout"]  # as builds wrote it before token layouts existed
    (out / "manifest.json").write_text(json.dumps(manifest))
    documents = _documents(corpus, out)
    ds = StreamingDataset(str(out), shuffle=False)
    b = next(iter(make_loader(ds, batch_size=5, num_workers=0)))
    pad = ds.manifest.fields["tokens"]["pad_id"]
    assert set(b) == {"__key__", "tokens"} and b["tokens"].dtype == torch.int64
    for row, ids in zip(b["tokens"].tolist(), documents):
        assert row[:len(ids)] == ids and all(t == pad for t in row[len(ids):])
