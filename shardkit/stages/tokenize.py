"""Tokenize stage: documents -> uint16/uint32 token ids (one row per document, or one packed shard)."""

from __future__ import annotations

import functools
import hashlib
import os
import sys
from dataclasses import dataclass
from typing import Iterable, Iterator

import numpy as np

from shardkit.config import BuildConfig, remote_policy
from shardkit.errors import ConfigError, RejectionLog
from shardkit.sample import Sample
from shardkit.stages import source_of

TOKENIZER_NAME = "tokenizer.json"
TOKENS_FIELD, OFFSETS_FIELD = "tokens", "doc_offsets"
# Token field layouts (spec["layout"]). "packed": a shard is one (rows, seq_len+1) id array plus the
# offsets of its documents in the flattened rows (writers/token_rows.py); "documents": one sample per
# document. Datasets built before layouts existed have no "layout" and read as they always did.
PACKED, DOCUMENTS = "packed", "documents"
BPE_EOS = "<|endoftext|>"
# Looked for, in this order, when --eos-token is not given: the usual end-of-document tokens.
EOS_CANDIDATES = (BPE_EOS, "</s>", "<|end_of_text|>", "<eos>", "<|eot_id|>", "[SEP]", "<EOS>")
BATCH_DOCS = 1024  # documents per encode_batch call: enough for the tokenizer's threads, bounded memory


@dataclass(frozen=True)
class TokenizerInfo:
    """The tokenizer of a build, as recorded in the manifest (extra "tokenizer") and field specs."""

    path: str  # relative to OUT
    sha256: str
    source: str  # "bpe:N" or the file name it was copied from
    vocab_size: int
    eos_id: int
    eos_token: str

    @property
    def dtype(self) -> str:
        # The top value of the dtype marks padding, so it must never be a real id.
        return "uint16" if self.vocab_size <= 0xFFFF else "uint32"

    @property
    def pad_id(self) -> int:
        return int(np.iinfo(self.dtype).max)

    def fields(self, seq_len: int | None) -> dict:
        """The tokens field spec for the manifest (packed rows of seq_len + 1 ids, or one per document)."""
        spec = {"kind": "tokens", "dtype": self.dtype, "eos_id": self.eos_id, "pad_id": self.pad_id,
                "tokenizer": self.path, "tokenizer_sha256": self.sha256, "layout": DOCUMENTS}
        if seq_len is not None:
            spec.update(layout=PACKED, seq_len=seq_len, shape=[seq_len + 1])
        return {TOKENS_FIELD: spec}

    def to_dict(self) -> dict:
        return {"path": self.path, "sha256": self.sha256, "source": self.source, "vocab_size": self.vocab_size,
                "eos_id": self.eos_id, "eos_token": self.eos_token}


def token_fields(fields: dict, kinds: set, tok: TokenizerInfo, seq_len: int | None) -> dict:
    """The build's field specs once text is tokenized: `txt` becomes `tokens`; packed rows hold many
    documents, so per-document fields (json, cls) are not kept and nothing else may share the shards."""
    if fields.pop("txt", None) is None:
        return fields
    if seq_len is not None and kinds & {"image", "array"}:
        what = " and ".join(sorted(kinds & {"image", "array"}))
        raise ConfigError(f"--seq-len {seq_len} packs documents into rows, but the source folder also holds "
                          f"{what} samples (captions would lose their images): drop --seq-len to keep one "
                          "token row per sample, or build the text on its own")
    fields.update(tok.fields(seq_len))
    if seq_len is not None:
        fields.pop("json", None)
        fields.pop("cls", None)
    return fields


def train_bpe(texts: Iterable[str], vocab_size: int, count: int | None = None):
    """A byte-level BPE trained on `texts` (offline, deterministic for the same texts in the same order)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[BPE_EOS], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer, length=count)
    return tok


def find_eos(tok, eos_token: str | None) -> tuple[str, int]:
    """(token, id) of the end-of-document token: --eos-token, else the tokenizer's own."""
    if eos_token is not None:
        eos_id = tok.token_to_id(eos_token)
        if eos_id is None:
            raise ConfigError(f"--eos-token {eos_token!r} is not in the tokenizer's vocabulary; pass a token it has "
                              "(e.g. one of its special tokens)")
        return eos_token, eos_id
    for name in EOS_CANDIDATES:
        if (eos_id := tok.token_to_id(name)) is not None:
            return name, eos_id
    raise ConfigError(f"the tokenizer has none of the usual end-of-document tokens ({', '.join(EOS_CANDIDATES)}); "
                      "name its separator with --eos-token TOKEN")


def _trained(cfg: BuildConfig, texts, corpus_key: str) -> str:
    """The bpe:N tokenizer JSON: reused from the last build when the corpus and N are unchanged
    (training is the slow part of a rerun), else trained on `texts()`."""
    from shardkit.store import join, read, write

    marker, policy = join(cfg.out, ".shardkit", "tokenizer.json.key"), remote_policy(cfg)
    key = hashlib.sha256(f"{cfg.tokenizer}|{corpus_key}".encode()).hexdigest()
    try:
        recorded, blob = read(marker, policy).decode().split(), read(join(cfg.out, TOKENIZER_NAME), policy).decode()
        if recorded == [key, hashlib.sha256(blob.encode("utf-8")).hexdigest()]:
            return blob
    except (OSError, ValueError):
        pass
    docs = texts()
    blob = train_bpe(docs, int(cfg.tokenizer[4:]), len(docs)).to_str(pretty=True)
    write(marker, f"{key} {hashlib.sha256(blob.encode('utf-8')).hexdigest()}\n", policy)
    return blob


def prepare_tokenizer(cfg: BuildConfig, texts, corpus_key: str = "") -> TokenizerInfo:
    """Load --tokenizer FILE or train bpe:N on `texts()` (a callable: only read when training; skipped
    when `corpus_key` matches the last training), save it as OUT/tokenizer.json (the file every task
    loads) and describe it."""
    from tokenizers import Tokenizer

    from shardkit.store import join, write

    if cfg.tokenizer.startswith("bpe:") and not os.path.isfile(cfg.tokenizer):
        blob = _trained(cfg, texts, corpus_key)
        source = cfg.tokenizer
    else:
        with open(cfg.tokenizer, encoding="utf-8") as f:
            blob = f.read()
        source = os.path.basename(cfg.tokenizer)
        try:
            Tokenizer.from_str(blob)
        except Exception as e:  # the Rust side raises a plain Exception for any parse error
            raise ConfigError(f"--tokenizer {cfg.tokenizer!r} is not a tokenizer.json that tokenizers can load "
                              f"({e}); save one with Tokenizer.save('tokenizer.json')") from None
    write(join(cfg.out, TOKENIZER_NAME), blob, remote_policy(cfg))
    tok = Tokenizer.from_str(blob)
    eos_token, eos_id = find_eos(tok, cfg.eos_token)
    return TokenizerInfo(TOKENIZER_NAME, hashlib.sha256(blob.encode("utf-8")).hexdigest(), source,
                         tok.get_vocab_size(with_added_tokens=True), eos_id, eos_token)


@functools.lru_cache(maxsize=4)
def load_tokenizer(path: str, sha256: str, policy=None):
    """The tokenizer a task uses, read from OUT (files, not pickles, hand work to tasks; OUT may be on a
    store, read with `policy`, the job's RemotePolicy); cached per process."""
    from tokenizers import Tokenizer

    from shardkit.store import read

    blob = read(path, policy).decode("utf-8")
    if hashlib.sha256(blob.encode("utf-8")).hexdigest() != sha256:
        raise ConfigError(f"{path} changed while the build was running; rerun the build")
    _allow_threads()
    return Tokenizer.from_str(blob)


def _allow_threads() -> None:
    """Decide TOKENIZERS_PARALLELISM for the tokenizer's Rayon thread pool.

    A Dask worker is a spawned process that never forks afterwards, so the pool is safe there and
    encode_batch over a shard's documents uses it: we set "true" unless the user chose. In any other
    process (workers=0: the user's own) we leave the setting alone: a later fork (a DataLoader) after
    the pool started makes tokenizers warn and fall back to one thread, which the user should decide.
    """
    if "TOKENIZERS_PARALLELISM" in os.environ or "distributed" not in sys.modules:
        return
    from distributed import get_worker

    try:
        get_worker()
    except ValueError:  # not inside a Dask worker
        return
    os.environ["TOKENIZERS_PARALLELISM"] = "true"


def token_counter(spec: dict, root: str, policy=None):
    """text -> its number of tokens (no EOS) under the build's tokenizer: what the curation counts."""
    from shardkit.store import join

    tok = load_tokenizer(join(root, spec["tokenizer"]), spec["tokenizer_sha256"], policy)
    return lambda text: len(tok.encode(text, add_special_tokens=False).ids)


def encode_ids(tok, texts: list[str], dtype: str, eos_id: int) -> tuple[np.ndarray, np.ndarray]:
    """All documents' ids, each followed by EOS, as one flat array + document lengths (incl. EOS)."""
    parts = []
    for lo in range(0, len(texts), BATCH_DOCS):
        # encode_batch_fast skips character offsets (not stored); ids are the same as encode_batch's.
        for enc in tok.encode_batch_fast(texts[lo:lo + BATCH_DOCS], add_special_tokens=False):
            ids = enc.ids
            ids.append(eos_id)
            parts.append(np.array(ids, np.int64))  # a C loop over the list, no per-token Python
    lengths = np.array([len(p) for p in parts], np.int64)
    flat = np.concatenate(parts) if parts else np.zeros(0, np.int64)
    if len(flat) and int(flat.max()) >= np.iinfo(dtype).max:
        raise ConfigError(f"token id {int(flat.max())} does not fit {dtype}: the tokenizer's vocabulary is "
                          "larger than it reports; fix the tokenizer.json passed to --tokenizer")
    return flat.astype(dtype), np.asarray(lengths, np.int64)


def pack_stream(flat: np.ndarray, lengths: np.ndarray, seq_len: int, tail: str, pad_id: int):
    """Cut the document stream into rows of seq_len + 1 ids; returns (rows, offsets, stats).

    Row r is stream[r * seq_len : r * seq_len + seq_len + 1]: consecutive rows share one id, so every
    stored id is an input once and every id but the first a target once (the Megatron convention);
    no transition between rows is lost. Document k is stream[offsets[k]:offsets[k + 1]]; offsets[-1]
    is where the real ids end (padding after it, in the last row only). tail="drop" keeps full rows
    only: the cut ids are counted, and a cut document keeps its stored part.
    """
    total = len(flat)
    if tail == "pad":
        n_rows, kept = -(-total // seq_len), total
    else:
        n_rows = (total - 1) // seq_len if total > seq_len else 0
        kept = n_rows * seq_len + 1 if n_rows else 0
    stream = np.full(n_rows * seq_len + 1 if n_rows else seq_len + 1, pad_id, dtype=flat.dtype)
    stream[:kept] = flat[:kept]
    rows = np.lib.stride_tricks.sliding_window_view(stream, seq_len + 1)[::seq_len][:n_rows].copy()
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    offsets = np.concatenate([starts[starts < kept], [kept]])
    # uint32 holds any shard under 4G ids (8 GB of uint16 rows): 4 bytes per document, not 8
    offsets = offsets.astype("<u4" if kept < 2**32 else "<u8")
    stats = {"pad_tokens": n_rows * seq_len + 1 - kept if n_rows else 0, "dropped_tokens": total - kept}
    return rows, offsets, stats


def tokenize(samples: Iterable[Sample], *, spec: dict, root: str, tail: str, shard_id: int,
             stats: dict, log: RejectionLog | None = None, policy=None) -> Iterator[Sample]:
    """Stage: the `txt` of every sample -> `tokens` (ids + EOS), per the manifest's tokens `spec`.

    Packed (spec["layout"] == "packed"): the shard's documents become one sample
    `tokens-{shard}` holding the rows and the document offsets (`pack_stream`); a sample without
    text cannot be stored there and goes to `log` as rejected. Otherwise each text sample gets
    its ids and keeps its other fields. `stats` receives documents, tokens, rows, pad_tokens and
    dropped_tokens. `policy`: the job's RemotePolicy, for a tokenizer file on a store.
    """
    samples = list(samples)
    docs = [s for s in samples if "txt" in s.fields]
    packed = spec.get("layout") == PACKED
    if packed:
        for s in samples:
            if "txt" not in s.fields:
                _reject(log, s, "no text: a packed build (--seq-len) stores token rows only")
    if not docs:
        yield from ([] if packed else samples)
        return
    from shardkit.store import join

    tok = load_tokenizer(join(root, spec["tokenizer"]), spec["tokenizer_sha256"], policy)
    flat, lengths = encode_ids(tok, [s.fields.pop("txt") for s in docs], spec["dtype"], spec["eos_id"])
    _add(stats, documents=len(docs), tokens=len(flat))
    le = flat.dtype.newbyteorder("<")  # stored little-endian whatever the machine
    if packed:
        rows, offsets, pack_stats = pack_stream(flat, lengths, spec["seq_len"], tail, spec["pad_id"])
        _add(stats, rows=len(rows), **pack_stats)
        if len(rows):
            yield Sample(f"tokens-{shard_id:05d}", {TOKENS_FIELD: rows.astype(le, copy=False),
                                                     OFFSETS_FIELD: offsets})
        return
    ends = np.cumsum(lengths).tolist()
    flat = flat.astype(le, copy=False)
    for s, lo, hi in zip(docs, [0] + ends[:-1], ends):
        s.fields[TOKENS_FIELD] = flat[lo:hi].tobytes()
    _add(stats, rows=len(docs))
    yield from samples


def _reject(log: RejectionLog | None, sample: Sample, reason: str) -> None:
    if log is None:
        raise ConfigError(f"{source_of(sample)}: {reason}")
    log.reject(source_of(sample), "tokenize", reason)


def _add(stats: dict, **counts) -> None:
    for k, v in counts.items():
        stats[k] = stats.get(k, 0) + int(v)
