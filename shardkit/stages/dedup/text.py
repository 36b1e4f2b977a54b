"""Text normalisation and word n-gram shingle hashes, vectorised over a whole batch of documents."""

from __future__ import annotations

import hashlib
import itertools
import re
import unicodedata
import zlib

import numpy as np

# Runs of anything that is not a letter or digit (punctuation, symbols, '_', whitespace) fold
# to one space, so "Hello,  world!" and "hello world" normalise to the same words.
_NON_WORD = re.compile(r"[\W_]+")
_MASK64 = (1 << 64) - 1
# Odd 64-bit multiplier of the polynomial that combines token hashes into a shingle hash.
_K = 0x9E3779B97F4A7C15
_FMIX64 = (33, 0xFF51AFD7ED558CCD, 33, 0xC4CEB9FE1A85EC53, 33)


def normalise(text: str) -> str:
    """Unicode NFKC, lowercase, punctuation and whitespace folded to single spaces, stripped."""
    return _NON_WORD.sub(" ", unicodedata.normalize("NFKC", text).lower()).strip()


# ASCII fast path of `normalise`: NFKC leaves ASCII unchanged, and `[\W_]` on ASCII is exactly
# "not a letter or digit", so one bytes.translate does the work of three Unicode passes.
_ASCII_TABLE = bytes(
    c + 32 if 65 <= c <= 90 else c if (48 <= c <= 57 or 97 <= c <= 122) else 32 for c in range(256)
)


def words(text: str) -> list[bytes]:
    """The normalised words of a document, UTF-8 encoded (`normalise(text).split()`, faster)."""
    if text.isascii():
        return text.encode("ascii").translate(_ASCII_TABLE).split()
    return normalise(text).encode("utf-8").split()


# ASCII bytes that are not letters or digits, and ASCII whitespace: deleted to count the others.
_ASCII_NON_ALNUM = bytes(c for c in range(256) if not (48 <= c <= 57 or 65 <= c <= 90 or 97 <= c <= 122))
_ASCII_SPACE = b" \t\n\r\x0b\x0c"  # what bytes.split() splits on


def tokens(text: str) -> tuple[list[bytes], bool]:
    """The tokens a document's shingles are made of, and whether it is mostly symbols.

    Prose: the normalised words (`words`). A document whose letters and digits are under half of
    its non-space characters (ASCII art, punctuation rows, tables of symbols) would fold to a few
    stray words, and two unrelated ones would then look identical; it keeps its punctuation
    instead: NFKC, lowercase, split on whitespace. A document with no visible character at all
    has no tokens.
    """
    if text.isascii():
        raw = text.encode("ascii")
        visible = len(raw.translate(None, _ASCII_SPACE))
        alnum = len(raw.translate(None, _ASCII_NON_ALNUM))
        if 2 * alnum >= visible:
            return raw.translate(_ASCII_TABLE).split(), False
        return raw.lower().split(), True
    folded = unicodedata.normalize("NFKC", text).lower()
    visible = sum(map(len, folded.split()))
    alnum = len(_NON_WORD.sub("", folded))
    if 2 * alnum >= visible:
        return _NON_WORD.sub(" ", folded).strip().encode("utf-8").split(), False
    return folded.encode("utf-8").split(), True


def content_hash(doc_words: list[bytes], symbolic: bool = False) -> bytes:
    """16-byte digest of the normalised text: equal digests are exact duplicates."""
    return hashlib.blake2b(b" ".join(doc_words), digest_size=16, person=b"symbols" if symbolic else b"").digest()


def _fmix64_py(h: int) -> int:
    s1, m1, s2, m2, s3 = _FMIX64
    h ^= h >> s1
    h = (h * m1) & _MASK64
    h ^= h >> s2
    h = (h * m2) & _MASK64
    return h ^ (h >> s3)


def fmix64(h: np.ndarray) -> np.ndarray:
    """MurmurHash3's 64-bit finaliser, element-wise: spreads any input over all 64 bits."""
    s1, m1, s2, m2, s3 = (np.uint64(v) for v in _FMIX64)
    h = h ^ (h >> s1)
    h = h * m1
    h = h ^ (h >> s2)
    h = h * m2
    return h ^ (h >> s3)


def shingle_hash(shingle: str | bytes) -> int:
    """32-bit hash of one shingle given as its words joined by single spaces.

    The scalar reference of `shingle_hashes`: pass it as `hashfunc=` to `datasketch.MinHash`
    fed with `shingles(...)` and the signatures equal shardkit's.
    """
    if isinstance(shingle, bytes):
        shingle = shingle.decode("utf-8")
    acc = 0
    for word in shingle.split(" "):
        acc = (acc * _K + zlib.crc32(word.encode("utf-8")) + 1) & _MASK64
    return _fmix64_py(acc) & 0xFFFFFFFF


def shingles(normalised: str, ngram: int) -> list[str]:
    """The word n-grams of a normalised document (one shingle of all words when shorter than n)."""
    ws = normalised.split(" ") if normalised else []
    if not ws:
        return []
    if len(ws) < ngram:
        return [" ".join(ws)]
    return [" ".join(ws[i:i + ngram]) for i in range(len(ws) - ngram + 1)]


def shingle_hashes(docs: list[list[bytes]], ngram: int) -> tuple[np.ndarray, np.ndarray]:
    """Shingle hashes of many documents (each a list of normalised words, see `words`) at once.

    Returns (hashes uint32, offsets int64) with document i's shingles at
    hashes[offsets[i]:offsets[i+1]], in order; empty documents have none. One crc32 call per
    word (C, via map) and a handful of numpy passes per batch: no Python work per shingle.
    """
    counts = np.fromiter(map(len, docs), np.int64, len(docs))
    total = int(counts.sum())
    tok = np.fromiter(map(zlib.crc32, itertools.chain.from_iterable(docs)), np.uint64, total)
    tok += np.uint64(1)
    starts = np.concatenate([[0], np.cumsum(counts)])
    n_win = np.maximum(counts - ngram + 1, 0)
    short = (counts > 0) & (counts < ngram)
    per_doc = np.where(short, 1, n_win)
    offsets = np.concatenate([[0], np.cumsum(per_doc)]).astype(np.int64)
    out = np.empty(int(offsets[-1]), np.uint64)
    if len(tok) >= ngram:
        acc = np.zeros(len(tok) - ngram + 1, np.uint64)
        k = np.uint64(_K)
        for j in range(ngram):  # Horner over the window: acc = acc*K + tok[i+j]
            acc = acc * k + tok[j:len(tok) - ngram + 1 + j]
        # Window i is valid when it ends inside the document it starts in.
        doc_of = np.repeat(np.arange(len(counts)), counts)
        valid = doc_of[: len(acc)] == doc_of[ngram - 1:]
        full = ~short & (n_win > 0)
        out[np.repeat(full, per_doc)] = acc[valid]
    for i in np.flatnonzero(short):  # rare: documents shorter than n words, one shingle each
        acc = 0
        for t in tok[starts[i]:starts[i + 1]].tolist():
            acc = (acc * _K + t) & _MASK64
        out[offsets[i]] = acc
    return (fmix64(out) & np.uint64(0xFFFFFFFF)).astype(np.uint32), offsets


def distinct_counts(hashes: np.ndarray, offsets: np.ndarray, cap: int = 32) -> np.ndarray:
    """Distinct shingle hashes per document (repeated shingles count once), counted up to `cap`.

    Each document's count comes from `cap` + 1 of its hashes spread over it: when those hold
    `cap` distinct values the document has at least that many and is done. Only documents with
    fewer (short, or repetitive like 'ha ha ha …') are counted exactly, by one sort of theirs.
    """
    n = len(offsets) - 1
    lengths = np.diff(offsets)
    out = np.zeros(n, np.int64)
    if not len(hashes):
        return out
    k = cap + 1
    docs = np.flatnonzero(lengths > 0)
    pos = offsets[docs][:, None] + (np.arange(k)[None, :] * lengths[docs][:, None]) // k
    sample = np.sort(hashes[pos], axis=1)
    seen = 1 + np.count_nonzero(sample[:, 1:] != sample[:, :-1], axis=1)
    out[docs] = np.minimum(seen, cap)
    exact = docs[(seen < cap) & (lengths[docs] > k)]  # the sample may have missed some: count them all
    if len(exact):
        idx = np.concatenate([np.arange(offsets[d], offsets[d + 1]) for d in exact.tolist()])
        doc = np.repeat(np.arange(len(exact), dtype=np.uint64), lengths[exact])
        keyed = np.sort((doc << np.uint64(32)) | hashes[idx].astype(np.uint64))
        first = np.concatenate([[True], keyed[1:] != keyed[:-1]])
        counts = np.bincount((keyed[first] >> np.uint64(32)).astype(np.int64), minlength=len(exact))
        out[exact] = np.minimum(counts, cap)
    return out
