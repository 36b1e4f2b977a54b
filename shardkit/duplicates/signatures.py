"""Per-partition dedup inputs: samples → digests, text signatures, image hashes; then band entries.

One partition file per signature task, one band file per (partition, LSH parameters): a new
threshold recomputes band entries from the stored signatures, never the signatures. Rows keep
the input order; a row's global id is its partition's base + its row.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from shardkit.config import MAX_MIN_SHINGLES
from shardkit.contract import IMAGE_FIELDS as DATASET_IMAGE_FIELDS
from shardkit.contract import decode_text
from shardkit.errors import RejectedInput, Rejection
from shardkit.duplicates import phash as image_mod
from shardkit.duplicates.links import hash_order
from shardkit.duplicates.lsh import band_keys
from shardkit.duplicates.minhash import MinHasher
from shardkit.duplicates.store import pack_strings, save_arrays
from shardkit.duplicates.text import content_digests, distinct_counts, fmix64, shingles_of, token_hashes

# "image": a raw-folder sample before the image stage; then the dataset's own image fields.
IMAGE_FIELDS = ("image",) + DATASET_IMAGE_FIELDS
MODALITY_CODES = {"none": 0, "text": 1, "image": 2, "rejected": 3}
MODALITY_NAMES = {v: k for k, v in MODALITY_CODES.items()}
EXACT_ENTRY = np.dtype([("h", "<u8"), ("x", "<u8"), ("row", "<u4")])  # digest halves, row
BAND_ENTRY = np.dtype([("h", "<u8"), ("row", "<u4")])  # mixed (band, band key), row
IMAGE_ENTRY = np.dtype([("h", "<u8"), ("x", "<u8"), ("row", "<u4")])  # mixed (band, bits), hash, row
_TEXT_SALT, _IMAGE_SALT = 0x9E3779B97F4A7C15, 0xC2B2AE3D27D4EB4F


@dataclass(frozen=True)
class SignatureParams:
    """What a partition file depends on besides its inputs (part of its fingerprint)."""

    num_perm: int = 128
    seed: int = 1
    ngram: int = 5
    modality: str = "auto"
    image_hash: str = "phash"
    keep_sets: bool = False  # store shingle sets for exact-Jaccard --verify
    exact_only: bool = False  # content digests only: no shingles, no MinHash (exact duplicates alone)


@dataclass(frozen=True)
class Unreadable:
    """An input the reader could not turn into a sample: it still takes a row (counted, never lost)."""

    key: str
    source: str
    reason: str
    source_row: int | None = None


@dataclass(frozen=True)
class StoredTexts:
    """A whole shard of a dataset without image fields, as columns: its rows are texts (or have
    nothing to compare), added in bulk rather than as one Sample each. `sources`/`source_rows` as
    `_source_of` gives them; texts None where a row has no text."""

    keys: list
    texts: list
    sources: list
    source_rows: list


def image_fields(modality: str, specs: dict | None) -> tuple[str, ...]:
    """The fields looked at for an image, in order (none when only text is compared)."""
    if modality not in ("auto", "image"):
        return ()
    extra = sorted(n for n, s in (specs or {}).items() if s.get("kind") == "image" and n not in IMAGE_FIELDS)
    return IMAGE_FIELDS + tuple(extra)


def modality_of(sample, modality: str, images: tuple[str, ...]) -> tuple[str, str | None]:
    """('image'|'text'|'none', field): a sample with an image is compared as an image under 'auto'."""
    for name in images:
        if name in sample.fields:
            return "image", name
    if modality in ("auto", "text") and "txt" in sample.fields:
        return "text", "txt"
    return "none", None


def _where(sample) -> str:
    """How errors.jsonl names a sample: its recorded source (path:line), else its key."""
    path, row = sample.meta.get("source_path"), sample.meta.get("source_row")
    if path is not None:
        return path if row is None else f"{path}:{row}"
    return sample.key if "shard_row" in sample.meta else sample.meta.get("source", sample.key)


def _source_of(sample) -> tuple[str, int]:
    meta = sample.meta
    path = meta.get("source_path") or meta.get("source") or sample.key
    row = meta.get("source_row", meta.get("shard_row"))
    return path, -1 if row is None else int(row)


# Texts tokenised, shingled and signed together (dropped once signed, so a task's memory follows
# this, not its partition size).
TEXT_BATCH = 4096


class _Rows:
    """Column builders for one partition, one row per input; texts are signed in batches."""

    def __init__(self, params: SignatureParams):
        self.keys, self.sources, self.source_rows, self.kind, self.digests = [], [], [], [], []
        self.image_hashes, self.text_rows, self.symbolic = [], [], []
        self.rejections, self.utf8_replaced = [], 0
        self.params, self.hasher = params, MinHasher(params.num_perm, params.seed)
        self.pending: list[str] = []  # texts not signed yet
        self.counts, self.signatures, self.sets, self.text_digests = [], [], [], []

    def add(self, key: str, source: tuple[str, int], kind: str, digest: bytes = b"\0" * 16, phash: int = 0):
        self.keys.append(key)
        self.sources.append(source[0])
        self.source_rows.append(source[1])
        self.kind.append(MODALITY_CODES[kind])
        self.digests.append(digest)
        self.image_hashes.append(phash)

    def add_text(self, text: str) -> None:
        self.text_rows.append(len(self.keys))
        self.pending.append(text)
        if len(self.pending) >= TEXT_BATCH:
            self.sign()

    def add_texts(self, block: StoredTexts, compared: bool) -> None:
        """A shard's rows at once (`compared`: its texts are; else every row is one of 'none')."""
        base, n = len(self.keys), len(block.keys)
        has = np.fromiter((t is not None for t in block.texts), bool, n) if compared else np.zeros(n, bool)
        self.keys += block.keys
        self.sources += block.sources
        self.source_rows += block.source_rows
        self.kind += np.where(has, MODALITY_CODES["text"], MODALITY_CODES["none"]).tolist()
        self.digests += [b"\0" * 16] * n
        self.image_hashes += [0] * n
        self.text_rows += (base + np.flatnonzero(has)).tolist()
        self.pending += block.texts if has.all() else [t for t, h in zip(block.texts, has.tolist()) if h]
        while len(self.pending) >= TEXT_BATCH:
            self.sign()

    def sign(self) -> None:
        """Tokenise, shingle and sign the pending texts (TEXT_BATCH at most); keep their content
        digests, distinct counts, mostly-symbols flags, signatures (and shingle sets)."""
        texts, self.pending = self.pending[:TEXT_BATCH], self.pending[TEXT_BATCH:]
        tok, per_text, symbolic = token_hashes(texts)
        self.text_digests.append(content_digests(tok, per_text, symbolic))
        self.symbolic.append(symbolic)
        if self.params.exact_only:  # a text with a token has content to compare; nothing is signed
            self.counts.append(np.minimum(per_text, 1).astype(np.int32))
            return
        hashes, offsets = shingles_of(tok, per_text, self.params.ngram)
        counts = distinct_counts(hashes, offsets, MAX_MIN_SHINGLES)  # exact up to any min_shingles
        nonempty = np.flatnonzero(counts > 0)
        self.counts.append(counts)
        self.signatures.append(self.hasher.signatures(hashes, offsets)[nonempty])
        if self.params.keep_sets:
            self.sets += [np.unique(hashes[offsets[i]:offsets[i + 1]]) for i in nonempty.tolist()]


def _read_rows(samples, params: SignatureParams, specs: dict | None) -> _Rows:
    rows, images = _Rows(params), image_fields(params.modality, specs)
    for s in samples:
        if isinstance(s, StoredTexts):
            rows.add_texts(s, params.modality in ("auto", "text"))
            continue
        if isinstance(s, Unreadable):
            rows.rejections.append(Rejection(s.source if s.source_row is None else f"{s.source}:{s.source_row}",
                                             "read", s.reason))
            rows.add(s.key, (s.source, -1 if s.source_row is None else s.source_row), "rejected")
            continue
        kind, name = modality_of(s, params.modality, images)
        if kind == "image":
            try:
                digest, phash = image_mod.image_signature(s.fields[name], (specs or {}).get(name), params.image_hash)
            except RejectedInput as e:
                rows.rejections.append(Rejection(_where(s), "dedup", e.reason))
                rows.add(s.key, _source_of(s), "rejected")
                continue
            rows.add(s.key, _source_of(s), "image", digest, phash)
        elif kind == "text":
            text, bad = decode_text(s.fields[name])
            rows.utf8_replaced += bad + s.meta.get("utf8_replaced", 0)
            rows.add_text(text)
            rows.add(s.key, _source_of(s), "text")
        else:
            rows.add(s.key, _source_of(s), "none")
    rows.sign()  # once at least: a partition without texts still gets its (empty) text arrays
    while rows.pending:
        rows.sign()
    return rows


def _text_arrays(rows: _Rows, n: int) -> tuple[dict, dict]:
    """Every text's distinct shingle count, and the signature of each with a shingle (whether it
    has enough to be compared by similarity is decided with the LSH parameters, in `band_entries`)."""
    counts = np.concatenate(rows.counts)
    text_rows = np.asarray(rows.text_rows, np.int64)
    nonempty = np.flatnonzero(counts > 0)
    distinct = np.zeros(n, np.int32)
    distinct[text_rows] = counts
    sig_row = np.full(n, -1, np.int32)
    sig_row[text_rows[nonempty]] = np.arange(len(nonempty), dtype=np.int32)
    signatures = np.concatenate(rows.signatures) if rows.signatures else np.empty((0, rows.params.num_perm), np.uint32)
    if rows.params.exact_only:
        sig_row[:] = -1
    arrays = {"distinct_shingles": distinct, "sig_row": sig_row, "signatures": signatures}
    if rows.params.keep_sets:
        arrays["set_offsets"] = np.concatenate([[0], np.cumsum([len(x) for x in rows.sets])]).astype(np.int64)
        arrays["set_values"] = np.concatenate(rows.sets) if rows.sets else np.empty(0, np.uint32)
    symbolic = np.concatenate(rows.symbolic)
    stats = {"texts": len(text_rows), "empty": int(np.sum(counts == 0)), "symbolic": int(np.sum(symbolic & (counts > 0))),
             "utf8_replaced": rows.utf8_replaced}
    return arrays, stats


def compute(samples, params: SignatureParams, specs: dict | None = None) -> tuple[dict, dict]:
    """Arrays for one partition (keys, sources, kinds, digests, signatures, image hashes, distinct
    shingle counts) and its meta (counts, rejections, key order)."""
    rows = _read_rows(samples, params, specs)
    n = len(rows.keys)
    kind = np.asarray(rows.kind, np.uint8)
    arrays, stats = _text_arrays(rows, n)
    digests = np.frombuffer(b"".join(rows.digests), "<u8").reshape(n, 2).copy() if n else np.empty((0, 2), "<u8")
    digests[rows.text_rows] = np.concatenate(rows.text_digests)
    keys, sources = pack_strings(rows.keys), pack_strings(rows.sources)
    arrays.update({"kind": kind, "digests": digests, "image_hashes": np.asarray(rows.image_hashes, np.uint64),
                   "source_rows": np.asarray(rows.source_rows, np.int64),
                   "keys.data": keys["data"], "keys.offsets": keys["offsets"],
                   "sources.data": sources["data"], "sources.offsets": sources["offsets"]})
    stats.update(images=int(np.sum(kind == MODALITY_CODES["image"])), none=int(np.sum(kind == MODALITY_CODES["none"])),
                 rejected=int(np.sum(kind == MODALITY_CODES["rejected"])), rows=n)
    in_order = all(a < b for a, b in zip(rows.keys, rows.keys[1:]))
    meta = {"stats": stats, "rejections": [[r.path, r.stage, r.reason] for r in rows.rejections],
            "first_key": rows.keys[0] if n else None, "last_key": rows.keys[-1] if n else None,
            "key_order": in_order}
    return arrays, meta


def save(path: str, arrays: dict, meta: dict, policy=None) -> None:
    """Write the partition file atomically: a rerun sees it whole or not at all."""
    save_arrays(path, arrays, meta, policy)


def range_starts(tasks: int) -> np.ndarray:
    """Where each of `tasks` equal ranges of the 64-bit mixed-hash space begins (the first at 0)."""
    return np.array([(i * 2**64) // tasks for i in range(tasks)], np.uint64)


def _sorted(entries: np.ndarray, tasks: int) -> tuple[np.ndarray, np.ndarray]:
    """Entries sorted by (mixed hash, row), and the position where each bucket range starts in them
    (plus the end): a bucket task reads its two bounds and one slice, whatever the file's size."""
    entries = entries[hash_order(entries["h"], entries["row"])]
    bounds = np.searchsorted(entries["h"], range_starts(tasks), side="left").astype(np.int64)
    return entries, np.append(bounds, len(entries))


def _exact_entries(part) -> np.ndarray:
    kind, distinct = np.asarray(part["kind"]), np.asarray(part["distinct_shingles"])
    rows = np.flatnonzero(((kind == MODALITY_CODES["text"]) & (distinct > 0)) | (kind == MODALITY_CODES["image"]))
    digests = np.asarray(part["digests"])
    exact = np.empty(len(rows), EXACT_ENTRY)
    exact["h"], exact["x"], exact["row"] = digests[rows, 0], digests[rows, 1], rows
    return exact


def band_entries(part, lsh: tuple[int, int, int, int], tasks: int) -> tuple[dict, dict]:
    """The entries one partition gives the bucket stage (from its ArrayFile): exact digests (two
    halves, row), text bands (mixed band key, row), image bands (mixed band bits, hash, row), each
    sorted by the mixed hash that picks its bucket task, with the bounds of the `tasks` ranges.

    `lsh` = (bands, rows, image distance, min shingles). Texts with fewer than `min_shingles`
    distinct shingles get no band entries: compared for exact equality only (`too_few_shingles`).
    """
    bands, rows, image_distance, min_shingles = lsh
    distinct = np.asarray(part["distinct_shingles"])
    compared = np.flatnonzero(distinct >= min_shingles).astype(np.uint32)
    text = np.empty(len(compared) * bands, BAND_ENTRY)
    if len(compared):
        sig = np.asarray(part["signatures"])[np.asarray(part["sig_row"])[compared]]
        salt = (np.arange(1, bands + 1, dtype=np.uint64) * np.uint64(_TEXT_SALT))
        text["h"] = fmix64(band_keys(sig, bands, rows) ^ salt[None, :]).ravel()
        text["row"] = np.repeat(compared, bands)
    image_rows = np.flatnonzero(np.asarray(part["kind"]) == MODALITY_CODES["image"]).astype(np.uint32)
    masks = image_mod.band_masks(image_distance)
    image = np.empty(len(image_rows) * len(masks), IMAGE_ENTRY)
    if len(image_rows):
        hashes = np.asarray(part["image_hashes"])[image_rows]
        for j, (shift, width) in enumerate(masks):
            bits = (hashes >> np.uint64(shift)) & np.uint64((1 << width) - 1)
            sl = slice(j * len(image_rows), (j + 1) * len(image_rows))
            image["h"][sl] = fmix64(bits ^ np.uint64((j + 1) * _IMAGE_SALT % 2**64))
            image["x"][sl], image["row"][sl] = hashes, image_rows
    out = {}
    for name, entries in (("exact", _exact_entries(part)), ("text", text), ("image", image)):
        out[name], out[f"{name}.bounds"] = _sorted(entries, tasks)
    return out, {"too_few_shingles": int(np.sum((distinct > 0) & (distinct < min_shingles)))}
