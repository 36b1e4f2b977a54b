"""text-length: a document's length in characters, and whether it lies within bounds."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from shardkit.stages.filters import limits


@dataclass(frozen=True)
class TextLength:
    """Keeps documents of at least `min_chars` characters and at most `max_chars` (None: no upper
    bound), counted after stripping surrounding whitespace: the simplest quality rule, a floor
    against stubs, and a scorer whose decisions anyone can check by hand."""

    min_chars: int | None = 100  # None: no lower bound
    max_chars: int | None = None
    name: ClassVar[str] = "text-length"
    decides: ClassVar[bool] = True
    verdict: ClassVar[str] = "text_length"  # keep()'s answer; score() gives the length only

    def __post_init__(self):
        limits.settle(self)
        for field, value in (("min_chars", self.min_chars), ("max_chars", self.max_chars)):
            if value is not None and not isinstance(value, int):
                raise ValueError(f"text-length: {field}={value!r}; expected an integer >= 0")

    @property
    def columns(self) -> dict:
        import pyarrow as pa

        return {"text_chars": pa.int64(), "text_length": pa.bool_()}

    def score(self, text: str) -> dict:
        return {"text_chars": len(text.strip())}  # the verdict column text_length is keep()'s answer

    def check(self, text: str) -> tuple[bool, str | None]:
        """keep(score(text)): what a build with --filter text-length runs (stages.filters.Curation)."""
        return self.keep(self.score(text))

    def edit(self, text: str) -> str:
        return text  # decides, never edits

    def keep(self, scores: dict) -> tuple[bool, str | None]:
        n = scores["text_chars"]
        if self.min_chars is not None and n < self.min_chars:
            return False, f"text-length: fewer than {self.min_chars} characters"
        if self.max_chars is not None and n > self.max_chars:
            return False, f"text-length: more than {self.max_chars} characters"
        return True, None
