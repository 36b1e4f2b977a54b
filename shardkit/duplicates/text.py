"""Text normalisation and word n-gram shingle hashes, vectorised over a whole batch of documents."""

from __future__ import annotations

import re
import unicodedata

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


# The token hash: fmix64(sum_i value(byte_i) * P^i mod 2^64), value = the byte ASCII-lowercased,
# + 1 (so that a trailing NUL still changes it). P is odd, hence invertible mod 2^64: every token
# of a batch is hashed by numpy over the batch's bytes (`_word_hashes`), no Python object per word.
_P = 0xD6E8FEB86659FD93
_P_INV = pow(_P, -1, 1 << 64)
_LOWER_1 = [(c + 32 if 65 <= c <= 90 else c) + 1 for c in range(256)]
_VALUE = np.array(_LOWER_1, np.uint64)
# Byte -> value of the prose path (0 for a separator: anything but an ASCII letter or digit), as a
# bytes.translate table: one C pass instead of a numpy gather, ~5x faster.
_PROSE_VALUES = bytes(0 if c in _ASCII_NON_ALNUM else _LOWER_1[c] for c in range(256))
# Byte -> value of pre-split tokens (0 for ASCII whitespace); values reach 256, hence uint16.
_LISTED_VALUES = np.array([0 if c in _ASCII_SPACE else _LOWER_1[c] for c in range(256)], np.uint16)
# Bytes hashed per numpy pass: the uint64 work arrays (~2 MiB) stay in cache and the power tables
# small, which matters more here than fewer, larger passes.
CHUNK_BYTES = 1 << 18
# Multipliers of the two 64-bit lanes of a document's content digest (over its token hashes).
_DIGEST_K = (0xA0761D6478BD642F, 0xE7037ED1A0B428DB)
_SYMBOLS_SALT = 0x8EBC6AF09C88C6E3
# Names the token, shingle and digest hashes: partition files record it, so that files signed
# under another scheme are never mixed with these.
SCHEME = "poly64-fmix64-v2"


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


def token_hash(token: bytes) -> int:
    """64-bit hash of one token's bytes: the scalar reference of the batch path (`token_hashes`)."""
    acc, power = 0, 1
    for byte in token:
        acc = (acc + int(_VALUE[byte]) * power) & _MASK64
        power = (power * _P) & _MASK64
    return _fmix64_py(acc)


def shingle_hash(shingle: str | bytes) -> int:
    """32-bit hash of one shingle given as its tokens joined by single spaces.

    The scalar reference of `shingle_hashes`: pass it as `hashfunc=` to `datasketch.MinHash`
    fed with `shingles(...)` and the signatures equal shardkit's.
    """
    if isinstance(shingle, str):
        shingle = shingle.encode("utf-8")
    acc = 0
    for word in shingle.split(b" "):
        acc = (acc * _K + token_hash(word)) & _MASK64
    return _fmix64_py(acc) & 0xFFFFFFFF


def shingles(normalised: str, ngram: int) -> list[str]:
    """The word n-grams of a normalised document (one shingle of all words when shorter than n)."""
    ws = normalised.split(" ") if normalised else []
    if not ws:
        return []
    if len(ws) < ngram:
        return [" ".join(ws)]
    return [" ".join(ws[i:i + ngram]) for i in range(len(ws) - ngram + 1)]


def _powers(base: int, n: int) -> np.ndarray:
    """base^0 .. base^(n-1) mod 2^64."""
    table = np.full(max(n, 1), base, np.uint64)
    table[0] = 1
    return np.cumprod(table)  # uint64 products wrap mod 2^64, as wanted


class _Tables:
    """P^i and P^-i for i up to a chunk's size, made once per process (a larger input gets its own)."""

    up = down = None

    @classmethod
    def upto(cls, n: int) -> tuple[np.ndarray, np.ndarray]:
        if n > CHUNK_BYTES + 1:
            return _powers(_P, n), _powers(_P_INV, n)
        if cls.up is None or len(cls.up) < n:
            cls.up, cls.down = _powers(_P, CHUNK_BYTES + 1), _powers(_P_INV, CHUNK_BYTES + 1)
        return cls.up, cls.down


def _word_hashes(values: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(starts, ends, token hashes) of the maximal runs of non-zero `values` (bytes mapped to
    their value, 0 for a separator): hash_k = fmix64(P^-start_k * sum_(start_k <= i < next start)
    value_i P^i), the separators adding nothing."""
    edge = np.diff((values != 0).view(np.int8), prepend=np.int8(0), append=np.int8(0))
    where = np.flatnonzero(edge != 0)  # alternately a run's start and its end (bool: ~2x faster)
    starts, ends = where[0::2], where[1::2]
    if not len(starts):
        return starts, ends, np.empty(0, np.uint64)
    up, down = _Tables.upto(len(values) + 1)
    sums = np.add.reduceat(np.multiply(values, up[:len(values)], dtype=np.uint64), starts)
    return starts, ends, fmix64(sums * down[starts])


def _ascii_tokens(texts: list[str], buf: bytes) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Token hashes and counts of ASCII texts (`buf`: each followed by a space), and which are
    mostly symbols (`tokens`' rule: letters and digits under half of the non-space bytes); the
    latter get no tokens here."""
    lens = np.fromiter(map(len, texts), np.int64, len(texts))
    first = np.cumsum(lens + 1) - (lens + 1)
    starts, ends, hashes = _word_hashes(np.frombuffer(buf.translate(_PROSE_VALUES), np.uint8))
    bounds = np.append(np.searchsorted(starts, first), len(starts))
    alnum = np.diff(np.concatenate([[0], np.cumsum(ends - starts)])[bounds])  # prose words are alnum runs
    # Prose whatever its whitespace when alnum >= half its length; only the others are counted.
    symbolic = 2 * alnum < lens
    for i in np.flatnonzero(symbolic).tolist():
        visible = len(texts[i].encode("ascii").translate(None, _ASCII_SPACE))
        symbolic[i] = 2 * alnum[i] < visible
    counts = np.diff(bounds)
    if symbolic.any():
        hashes = hashes[np.repeat(~symbolic, counts)]
        counts[symbolic] = 0
    return hashes, counts, symbolic


def _listed_tokens(docs: list[list[bytes]]) -> tuple[np.ndarray, np.ndarray]:
    """Token hashes and counts of documents given as token lists (tokens hold no ASCII whitespace)."""
    lens = np.fromiter((sum(map(len, d)) + len(d) for d in docs), np.int64, len(docs))
    first = np.cumsum(lens) - lens
    buf = np.frombuffer(b"".join(b" ".join(d) + b" " for d in docs), np.uint8)
    starts, _, hashes = _word_hashes(_LISTED_VALUES[buf])
    return hashes, np.diff(np.append(np.searchsorted(starts, first), len(starts)))


def _chunk_tokens(texts: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`token_hashes` of one chunk: its ASCII texts in one pass; the others, and ASCII texts that
    are mostly symbols, through `tokens` one by one (rare in practice)."""
    n = len(texts)
    counts, symbolic = np.zeros(n, np.int64), np.zeros(n, bool)
    try:
        plain, buf = np.arange(n), (" ".join(texts) + " ").encode("ascii")
    except UnicodeEncodeError:
        plain = np.flatnonzero(np.fromiter(map(str.isascii, texts), bool, n))
        buf = (" ".join([texts[i] for i in plain.tolist()]) + " ").encode("ascii")
    hashes, counts[plain], symbolic[plain] = _ascii_tokens(
        texts if len(plain) == n else [texts[i] for i in plain.tolist()], buf)
    listed = np.ones(n, bool)
    listed[plain] = symbolic[plain]
    rest = np.flatnonzero(listed)
    if not len(rest):
        return hashes, counts, symbolic
    docs = [tokens(texts[i]) for i in rest.tolist()]
    extra, counts[rest] = _listed_tokens([d for d, _ in docs])
    symbolic[rest] = [s for _, s in docs]
    owner = np.concatenate([np.repeat(np.flatnonzero(~listed), counts[~listed]), np.repeat(rest, counts[rest])])
    return np.concatenate([hashes, extra])[np.argsort(owner, kind="stable")], counts, symbolic


def token_hashes(texts: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(token hashes uint64, tokens per text, mostly-symbols flags) of many texts at once.

    The tokens are `tokens(text)`'s, in order, each hashed as `token_hash`; ASCII texts (nearly
    all, in practice) are lowercased, split and hashed by numpy over a chunk's bytes.
    """
    lens = np.cumsum(np.fromiter(map(len, texts), np.int64, len(texts)) + 1)
    parts, start = [], 0
    while start < len(texts):  # chunks of about CHUNK_BYTES, at least one text each
        stop = max(start + 1, int(np.searchsorted(lens, (lens[start - 1] if start else 0) + CHUNK_BYTES, "right")))
        parts.append(_chunk_tokens(texts[start:stop]))
        start = stop
    if not parts:
        return np.empty(0, np.uint64), np.empty(0, np.int64), np.empty(0, bool)
    return tuple(np.concatenate(p) for p in zip(*parts))


def _positions(counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(index of each token's first sibling, each token's position in its document)."""
    first = np.cumsum(counts) - counts
    return first, np.arange(int(counts.sum())) - np.repeat(first, counts)


def shingles_of(tok: np.ndarray, counts: np.ndarray, ngram: int) -> tuple[np.ndarray, np.ndarray]:
    """Shingle hashes (uint32) of documents given as token hashes, and offsets: document i's are
    hashes[offsets[i]:offsets[i+1]], in order. A shingle hashes as Horner over its tokens with
    multiplier K, then fmix64; a document shorter than n tokens is one shingle; an empty one has none."""
    k = np.uint64(_K)
    short = (counts > 0) & (counts < ngram)
    per_doc = np.where(short, 1, np.maximum(counts - ngram + 1, 0))
    offsets = np.concatenate([[0], np.cumsum(per_doc)]).astype(np.int64)
    out = np.empty(int(offsets[-1]), np.uint64)
    if len(tok) >= ngram:
        m = len(tok) - ngram + 1
        acc = tok[:m].copy()
        for j in range(1, ngram):  # Horner over the window: acc = acc*K + tok[i+j], in place
            acc *= k
            acc += tok[j:m + j]
        # A window is valid unless it starts in the last n-1 tokens of its document.
        late = (np.cumsum(counts)[:, None] - np.arange(1, ngram)[None, :]).ravel()
        valid = np.ones(m, bool)
        valid[late[(late >= 0) & (late < m)]] = False
        if short.any():
            out[np.repeat(~short, per_doc)] = acc[valid]
        else:
            out = acc[valid]
    if short.any():  # documents shorter than n tokens: one shingle of them all
        first, pos = _positions(counts)
        mine = np.repeat(short, counts)
        power = _powers(_K, ngram)[(np.repeat(counts, counts) - 1 - pos)[mine]]
        out[offsets[:-1][short]] = np.add.reduceat(tok[mine] * power, np.cumsum(counts[short]) - counts[short])
    return (fmix64(out) & np.uint64(0xFFFFFFFF)).astype(np.uint32), offsets


def shingle_hashes(texts: list[str], ngram: int) -> tuple[np.ndarray, np.ndarray]:
    """Shingle hashes (uint32) and offsets of many texts: `shingles_of(token_hashes(texts))`."""
    tok, counts, _ = token_hashes(texts)
    return shingles_of(tok, counts, ngram)


def content_digests(tok: np.ndarray, counts: np.ndarray, symbolic: np.ndarray) -> np.ndarray:
    """(n, 2) uint64 digests of documents' token sequences: equal digests are exact duplicates
    (the same tokens in the same order, both prose or both mostly symbols).

    Each lane sums fmix64(token_j * K^(j+1)), not token_j * K^(j+1): a sum linear in the token
    hashes is zero mod 2^64 over the Thue-Morse signs (+-+--+-+...) of 2048 terms for every odd K,
    so two texts that swap two words along that pattern, with no shingle in common, were equal.
    """
    out = np.zeros((len(counts), 2), np.uint64)
    docs = np.flatnonzero(counts > 0)
    if len(docs):
        first, pos = _positions(counts)
        for lane, k in enumerate(_DIGEST_K):
            out[docs, lane] = np.add.reduceat(fmix64(tok * _powers(k, int(counts.max()) + 1)[pos + 1]), first[docs])
    salt = counts.astype(np.uint64) ^ np.where(symbolic, np.uint64(_SYMBOLS_SALT), np.uint64(0))
    return fmix64(out ^ salt[:, None])


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
