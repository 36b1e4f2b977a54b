"""Gopher's quality and repetition rules (Rae et al. 2021, table A1), with datatrove 0.10.1's defaults,
order of checks and word splitting (spaCy's English tokenizer rules: filters/words.py).

Every filter here computes its signals in the order its rules check them; `score` computes them
all, `check` stops at the first rule that rejects (what a build without attributes runs).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from itertools import filterfalse
from typing import ClassVar

import numpy as np
from shardkit.stages.filters.base import F64, I32, RuleFilter, over, ratio, under
from shardkit.stages.filters.limits import parse_grams
from shardkit.stages.filters.words import words

# Characters that make a word a "symbol word" when it holds nothing else (datatrove's PUNCTUATION
# plus its terminal punctuation list).
TERMINAL_PUNCTUATION = frozenset(
    "!.?\u0589\u061d\u061e\u061f\u06d4\u0700\u0701\u0702\u07f9\u0837\u0839\u083d\u083e\u0964\u0965\u104a\u104b"
    "\u1362\u1367\u1368\u166e\u1735\u1736\u17d4\u17d5\u17d6\u17d9\u17da\u1803\u1809\u1944\u1945\u1aa8\u1aa9\u1aaa"
    "\u1aab\u1b5a\u1b5b\u1b5e\u1b5f\u1b7d\u1b7e\u1c3b\u1c3c\u1c7e\u1c7f\u203c\u203d\u2047\u2048\u2049\u2e2e\u2e3c"
    "\u2e53\u2e54\u3002\ua4ff\ua60e\ua60f\ua6f3\ua6f7\ua876\ua877\ua8ce\ua8cf\ua92f\ua9c8\ua9c9\uaa5d\uaa5e\uaa5f"
    "\uaaf0\uaaf1\uabeb\ufe52\ufe56\ufe57\uff01\uff0e\uff1f\uff61\U00010a56\U00010a57\U00010f55\U00010f56"
    "\U00010f57\U00010f58\U00010f59\U00010f86\U00010f87\U00010f88\U00010f89\U00011047\U00011048\U000110be"
    "\U000110bf\U000110c0\U000110c1\U00011141\U00011142\U00011143\U000111c5\U000111c6\U000111cd\U000111de"
    "\U000111df\U00011238\U00011239\U0001123b\U0001123c\U000112a9\U0001144b\U0001144c\U000115c2\U000115c3"
    "\U000115c9\U000115ca\U000115cb\U000115cc\U000115cd\U000115ce\U000115cf\U000115d0\U000115d1\U000115d2"
    "\U000115d3\U000115d4\U000115d5\U000115d6\U000115d7\U00011641\U00011642\U0001173c\U0001173d\U0001173e"
    "\U00011944\U00011946\U00011a42\U00011a43\U00011a9b\U00011a9c\U00011c41\U00011c42\U00011ef7\U00011ef8"
    "\U00011f43\U00011f44\U00016a6e\U00016a6f\U00016af5\U00016b37\U00016b38\U00016b44\U00016e98\U0001bc9f"
    "\U0001da88")
PUNCTUATION = frozenset(
    "!/\u2014\u201d:\uff05\uff11\u3008&(\u3001\u2501\\\u3010#%\u300c\u300d\uff0c\u3011\uff1b+^]~\u201c\u300a"
    "\u201e';\u2019{|\u2236\xb4[=-`*\uff0e\uff08\u2013\uff1f\uff01\uff1a$\uff5e\xab\u3009,><\u300b)?\uff09\u3002"
    "\u2026@_.\"}\u25ba\xbb" + "".join(map(chr, [*range(0, 9), *range(11, 32), *range(127, 160)]))) | TERMINAL_PUNCTUATION
STOP_WORDS = ("the", "be", "to", "of", "and", "that", "have", "with")


@dataclass(frozen=True)
class GopherQuality(RuleFilter):
    """Documents too short or long, of odd word lengths, full of symbols, bullets or trailing
    ellipses, with too few alphabetic words or stop words."""

    name: ClassVar[str] = "gopher-quality"
    min_doc_words: int | None = 50
    max_doc_words: int | None = 100_000
    min_avg_word_length: float | None = 3
    max_avg_word_length: float | None = 10
    max_symbol_word_ratio: float | None = 0.1  # '#' per word, and '...'/'…' per word
    max_bullet_lines_ratio: float | None = 0.9
    max_ellipsis_lines_ratio: float | None = 0.3
    min_alpha_words_ratio: float | None = 0.8  # datatrove's max_non_alpha_words_ratio
    min_stop_words: int | None = 2
    stop_words: tuple[str, ...] = STOP_WORDS

    SIGNALS: ClassVar[dict] = {"words": I32, "avg_word_length": F64, "hash_ratio": F64, "ellipsis_ratio": F64,
                               "bullet_lines_ratio": F64, "ellipsis_lines_ratio": F64, "alpha_words_ratio": F64,
                               "stop_words": I32}
    FRACTIONS: ClassVar[frozenset] = frozenset({"max_symbol_word_ratio", "max_bullet_lines_ratio",
                                                "max_ellipsis_lines_ratio", "min_alpha_words_ratio"})
    OFF: ClassVar[dict] = {name: 0 for name in ("min_doc_words", "max_doc_words", "min_avg_word_length",
                                                "max_avg_word_length", "min_stop_words") + tuple(FRACTIONS)}

    def _steps(self, text: str):
        toks = words(text)
        n = len(toks)
        # A token of letters only (most of them) is a word and alphabetic: no character of PUNCTUATION
        # is a letter, so the per-character tests run only on the others.
        other = list(filterfalse(str.isalpha, toks))
        mixed = list(filterfalse(PUNCTUATION.issuperset, other))  # the rest are symbols: not words, no letter
        kept = n - len(other) + len(mixed)
        yield "words", kept
        yield "avg_word_length", ratio(sum(map(len, toks)) - sum(map(len, other)) + sum(map(len, mixed)), kept)
        yield "hash_ratio", ratio(text.count("#"), n)
        yield "ellipsis_ratio", ratio(text.count("...") + text.count("…"), n)
        lines = text.splitlines()
        yield "bullet_lines_ratio", ratio(sum(s.lstrip().startswith(("•", "-")) for s in lines), len(lines))
        yield "ellipsis_lines_ratio", ratio(sum(s.rstrip().endswith(("...", "…")) for s in lines), len(lines))
        yield "alpha_words_ratio", ratio(n - len(other) + sum(any(map(str.isalpha, w)) for w in mixed), n)
        yield "stop_words", len(set(self.stop_words).intersection(toks))

    def _rules(self, s: dict):
        """(rule, rejects?) in datatrove's order, each evaluated once its signal exists."""
        yield "words", "short_doc", lambda: under(self.min_doc_words, s["words"])
        yield "words", "long_doc", lambda: over(self.max_doc_words, s["words"])
        yield "avg_word_length", "short_words", lambda: s["words"] > 0 and under(self.min_avg_word_length,
                                                                                    s["avg_word_length"])
        yield "avg_word_length", "long_words", lambda: over(self.max_avg_word_length, s["avg_word_length"])
        yield "hash_ratio", "hashes", lambda: over(self.max_symbol_word_ratio, s["hash_ratio"])
        yield "ellipsis_ratio", "ellipses", lambda: over(self.max_symbol_word_ratio, s["ellipsis_ratio"])
        yield "bullet_lines_ratio", "bullet_lines", lambda: over(self.max_bullet_lines_ratio, s["bullet_lines_ratio"])
        yield "ellipsis_lines_ratio", "ellipsis_lines", lambda: over(self.max_ellipsis_lines_ratio,
                                                                      s["ellipsis_lines_ratio"])
        yield "alpha_words_ratio", "alpha_words", lambda: under(self.min_alpha_words_ratio, s["alpha_words_ratio"])
        yield "stop_words", "stop_words", lambda: under(self.min_stop_words, s["stop_words"])



_PARAGRAPH = re.compile(r"\n{2,}")
_LINES = re.compile("\n+")
_MIX = np.uint64(0x9E3779B97F4A7C15)


def duplicates(items: list[str]) -> tuple[int, int]:
    """(repeated elements, their characters): every occurrence after the first counts."""
    seen: set = set()
    n = chars = 0
    for x in items:
        if x in seen:
            n += 1
            chars += len(x)
        else:
            seen.add(x)
    return n, chars


def _gram_hashes(ids: np.ndarray, n: int) -> np.ndarray:
    """A 64-bit hash of every run of n consecutive word ids (ids are per document, so distinct
    words never share one; a collision of two different runs has odds ~ runs² / 2^64)."""
    h = np.zeros(len(ids) - n + 1, np.uint64)
    with np.errstate(over="ignore"):
        for k in range(n):
            h = h * _MIX + ids[k:len(ids) - n + 1 + k]
    return h


def top_gram_chars(ids: np.ndarray, lengths: np.ndarray, n: int) -> int:
    """Characters of the most frequent n-gram (words joined by spaces) times its count; among
    equally frequent ones, the first to occur."""
    h = _gram_hashes(ids, n)
    _, first, counts = np.unique(h, return_index=True, return_counts=True)
    best = counts.max()
    start = int(first[counts == best].min())
    return (int(lengths[start:start + n].sum()) + n - 1) * int(best)


def repeated_gram_chars(ids: np.ndarray, lengths: np.ndarray, n: int) -> int:
    """Characters in n-grams seen before, scanning left to right and jumping past each repeat."""
    h = _gram_hashes(ids, n)
    if len(np.unique(h)) == len(h):
        return 0  # no n-gram repeats: nothing to scan
    csum = np.concatenate([[0], np.cumsum(lengths)])
    seen: set = set()
    chars, i, hl = 0, 0, h.tolist()
    while i < len(hl):
        if hl[i] in seen:
            chars += int(csum[i + n] - csum[i])
            i += n
        else:
            seen.add(hl[i])
            i += 1
    return chars


@dataclass(frozen=True)
class GopherRepetition(RuleFilter):
    """Documents that repeat lines, paragraphs or word n-grams (as shares of the text's characters)."""

    name: ClassVar[str] = "gopher-repetition"
    dup_para_frac: float | None = 0.3
    dup_para_char_frac: float | None = 0.2
    dup_line_frac: float | None = 0.3
    dup_line_char_frac: float | None = 0.2
    top_n_grams: tuple = ((2, 0.2), (3, 0.18), (4, 0.16))
    dup_n_grams: tuple = ((5, 0.15), (6, 0.14), (7, 0.13), (8, 0.12), (9, 0.11), (10, 0.10))

    FRACTIONS: ClassVar[frozenset] = frozenset({"dup_para_frac", "dup_para_char_frac", "dup_line_frac",
                                                "dup_line_char_frac"})
    OFF: ClassVar[dict] = {name: 0 for name in FRACTIONS}  # datatrove's spelling of off

    def __post_init__(self):
        super().__post_init__()  # off as None (none for a list of n-grams: no n-gram rule), ranges checked
        object.__setattr__(self, "top_n_grams", parse_grams(self.top_n_grams))
        object.__setattr__(self, "dup_n_grams", parse_grams(self.dup_n_grams))

    def signals(self) -> dict:
        out = {"chars": I32, "dup_para_frac": F64, "dup_para_char_frac": F64, "dup_line_frac": F64,
               "dup_line_char_frac": F64}
        out.update({f"top_{n}_gram": F64 for n, _ in self.top_n_grams})
        out.update({f"dup_{n}_gram": F64 for n, _ in self.dup_n_grams})
        return out

    def _steps(self, text: str):
        size = len(text)
        yield "chars", size
        paragraphs = _PARAGRAPH.split(text.strip())
        n, chars = duplicates(paragraphs)
        yield "dup_para_frac", ratio(n, len(paragraphs))
        yield "dup_para_char_frac", ratio(chars, size)
        lines = _LINES.split(text)
        n, chars = duplicates(lines)
        yield "dup_line_frac", ratio(n, len(lines))
        yield "dup_line_char_frac", ratio(chars, size)
        toks = words(text)
        vocab: dict = {}
        ids = np.array([vocab.setdefault(w, len(vocab)) for w in toks], np.uint64)
        lengths = np.fromiter(map(len, toks), np.int64, len(toks))
        for n, _ in self.top_n_grams:
            yield f"top_{n}_gram", ratio(top_gram_chars(ids, lengths, n), size) if len(toks) >= n else 0.0
        for n, _ in self.dup_n_grams:
            yield f"dup_{n}_gram", ratio(repeated_gram_chars(ids, lengths, n), size) if len(toks) >= n else 0.0

    def _rules(self, s: dict):
        yield "chars", "empty", lambda: s["chars"] == 0
        yield "dup_para_frac", "dup_para_frac", lambda: over(self.dup_para_frac, s["dup_para_frac"])
        yield "dup_para_char_frac", "dup_para_char_frac", lambda: over(self.dup_para_char_frac,
                                                                        s["dup_para_char_frac"])
        yield "dup_line_frac", "dup_line_frac", lambda: over(self.dup_line_frac, s["dup_line_frac"])
        yield "dup_line_char_frac", "dup_line_char_frac", lambda: over(self.dup_line_char_frac,
                                                                        s["dup_line_char_frac"])
        for n, limit in self.top_n_grams:
            yield f"top_{n}_gram", f"top_{n}_gram", lambda k=f"top_{n}_gram", x=limit: s[k] > x
        for n, limit in self.dup_n_grams:
            yield f"dup_{n}_gram", f"dup_{n}_gram", lambda k=f"dup_{n}_gram", x=limit: s[k] > x

