"""C4's line filters (Raffel et al. 2020, section 2.2) and FineWeb's extra rules (Penedo et al. 2024),
with datatrove 0.10.1's defaults and order of checks.

C4 drops lines (no terminal punctuation, too few words, a word over 1,000 characters,
'javascript', cookie and policy notices, Wikipedia-style citations are cut out), and whole
documents ('lorem ipsum', a curly bracket, fewer than 5 sentences in the kept lines); the next
filter sees the kept lines, as in datatrove. FineWeb rejects documents whose lines mostly lack
terminal punctuation, are mostly short, repeat, or that are lists (many newlines per word).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import ClassVar

from shardkit.stages.filters.base import F64, I32, RuleFilter, over, ratio, under
from shardkit.stages.filters.gopher import TERMINAL_PUNCTUATION, duplicates
from shardkit.stages.filters.words import sentences, words

CITATION = re.compile(r"\[\d*]|\[edit]|\[citation needed]")
END_PUNCTUATION = (".", "?", "!", '"', "'")
POLICY = ("terms of use", "privacy policy", "cookie policy", "uses cookies", "use of cookies", "use cookies")


@dataclass(frozen=True)
class C4(RuleFilter):
    """C4's heuristics. A limit of None is off (-1, C4's own spelling, is read as None); a rule's flag
    False is off."""

    name: ClassVar[str] = "c4"
    remove_citations: bool = True
    filter_no_terminal_punct: bool = True
    min_num_sentences: int | None = 5
    min_words_per_line: int | None = 3
    max_word_length: int | None = 1000
    filter_lorem_ipsum: bool = True
    filter_javascript: bool = True
    filter_curly_bracket: bool = True
    filter_policy: bool = True

    SIGNALS: ClassVar[dict] = {"lines": I32, "kept_lines": I32, "lorem_ipsum_line": I32,
                               "curly_bracket_line": I32, "sentences": I32}
    OFF: ClassVar[dict] = {"min_num_sentences": -1, "min_words_per_line": -1, "max_word_length": -1}

    def _lines(self, text: str, stop_early: bool):
        """(kept lines, sentences in them, first line with lorem ipsum, first with '{', lines)."""
        kept, count, lorem, curly = [], 0, -1, -1
        lines = text.splitlines()
        for i, line in enumerate(lines):
            line = line.strip()
            parts = line.split()
            if self.max_word_length is not None and any(len(w) > self.max_word_length for w in parts):
                continue
            if self.remove_citations:
                line = CITATION.sub("", line)
            if self.filter_no_terminal_punct and (not line.endswith(END_PUNCTUATION) or line.endswith("...")):
                continue
            if under(self.min_words_per_line, len(parts)):
                continue
            lower = line.lower()
            if self.filter_lorem_ipsum and "lorem ipsum" in lower:
                lorem = i if lorem < 0 else lorem
                if stop_early:
                    break
                continue
            if self.filter_javascript and "javascript" in lower:
                continue
            if self.filter_curly_bracket and "{" in line:
                curly = i if curly < 0 else curly
                if stop_early:
                    break
                continue
            if self.filter_policy and any(p in lower for p in POLICY):
                continue
            if self.min_num_sentences is not None:
                count += sentences(line)
            kept.append(line)
        return kept, count, lorem, curly, len(lines)

    def _steps(self, text: str, stop_early: bool = False):
        kept, count, lorem, curly, n = self._lines(text, stop_early)
        yield "lines", n
        yield "kept_lines", len(kept)
        yield "lorem_ipsum_line", lorem
        yield "curly_bracket_line", curly
        yield "sentences", count

    def _rules(self, s: dict):
        def first(which: str) -> bool:  # the document stops at whichever line comes first
            mine, other = s[f"{which}_line"], s["curly_bracket_line" if which == "lorem_ipsum" else "lorem_ipsum_line"]
            return mine >= 0 and (other < 0 or mine < other)
        yield "curly_bracket_line", "lorem_ipsum", lambda: first("lorem_ipsum")
        yield "curly_bracket_line", "curly_bracket", lambda: first("curly_bracket")
        yield "sentences", "too_few_sentences", lambda: under(self.min_num_sentences, s["sentences"])

    def check(self, text: str) -> tuple[bool, str | None]:
        kept, count, lorem, curly, _ = self._lines(text, True)
        if lorem >= 0:
            return False, "lorem_ipsum"
        if curly >= 0:
            return False, "curly_bracket"
        if under(self.min_num_sentences, count):
            return False, "too_few_sentences"
        return True, None

    def edit(self, text: str) -> str:
        """The kept lines, joined by newlines (what C4 keeps of a page)."""
        return "\n".join(self._lines(text, False)[0]).strip()


@dataclass(frozen=True)
class FineWeb(RuleFilter):
    """FineWeb's rules over lines: terminal punctuation, short lines, repeated lines, list-like. A limit
    of None is off (short_line_length None: no line counts as short)."""

    name: ClassVar[str] = "fineweb"
    line_punct_thr: float | None = 0.12
    line_punct_exclude_zero: bool = False
    short_line_thr: float | None = 0.67
    short_line_length: int | None = 30
    char_duplicates_ratio: float | None = 0.01
    new_line_ratio: float | None = 0.3  # newlines per word: may pass 1
    FRACTIONS: ClassVar[frozenset] = frozenset({"line_punct_thr", "short_line_thr", "char_duplicates_ratio"})

    SIGNALS: ClassVar[dict] = {"lines": I32, "line_punct_ratio": F64, "short_line_ratio": F64,
                               "char_dup_ratio": F64, "list_ratio": F64}

    def _steps(self, text: str):
        lines = [line for line in text.split("\n") if line.strip() != ""]
        yield "lines", len(lines)
        yield "line_punct_ratio", ratio(sum(1 for ln in lines if ln and ln[-1] in TERMINAL_PUNCTUATION), len(lines))
        short = self.short_line_length
        yield "short_line_ratio", 0.0 if short is None else ratio(sum(len(ln) <= short for ln in lines), len(lines))
        yield "char_dup_ratio", ratio(duplicates(lines)[1], len(text.replace("\n", "")))
        yield "list_ratio", ratio(text.count("\n"), len(words(text)))

    def _rules(self, s: dict):
        yield "lines", "empty", lambda: s["lines"] == 0
        yield "line_punct_ratio", "line_punct_ratio", lambda: under(self.line_punct_thr, s["line_punct_ratio"]) and (
            not (s["line_punct_ratio"] == 0 and self.line_punct_exclude_zero))
        yield "short_line_ratio", "short_line_ratio", lambda: over(self.short_line_thr, s["short_line_ratio"])
        yield "char_dup_ratio", "char_dup_ratio", lambda: over(self.char_duplicates_ratio, s["char_dup_ratio"])
        yield "list_ratio", "list_ratio", lambda: over(self.new_line_ratio, s["list_ratio"])
