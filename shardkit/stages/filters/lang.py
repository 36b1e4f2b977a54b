"""Language identification with py3langid (langid.py's naive Bayes model over byte n-grams, 97
languages, shipped inside the package: nothing is downloaded). Probabilities are the package's
calibrated ones (norm_probs); a document is kept when its most likely language is one of those
asked for with a probability above the threshold (datatrove's rule: any asked language above the
threshold; with a threshold of 0.5 or more the two agree, probabilities adding up to 1)."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import ClassVar

import pyarrow as pa

from shardkit.errors import ConfigError
from shardkit.stages.filters.base import RuleFilter

UNDETERMINED = "und"  # ISO 639-2: what a document the model cannot score is labelled
_MODEL: dict = {}
_LOCK = threading.Lock()


def identifier():
    """This process's py3langid model (loaded once: ~0.5 s to decompress its 4.6 MB)."""
    with _LOCK:
        if "model" not in _MODEL:
            try:
                from py3langid.langid import MODEL_FILE, LanguageIdentifier
            except ImportError:
                raise ConfigError("--lang needs the language model package: pip install 'shardkit[lang]'") from None

            _MODEL["model"] = LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True)
        return _MODEL["model"]


def known_languages() -> list[str]:
    return sorted(set(identifier().nb_classes))


@dataclass(frozen=True)
class Lang(RuleFilter):
    """`languages` (ISO 639-1 codes, empty: any) and `threshold` on the top language's probability.
    Reads the first `max_chars` characters (0: all): the language of a page shows in its start,
    and the model's cost is per byte."""

    name: ClassVar[str] = "lang"
    languages: tuple[str, ...] = ()
    threshold: float | None = 0.65  # None: any probability
    max_chars: int | None = 4096  # None (or 0): the whole text
    FRACTIONS: ClassVar[frozenset] = frozenset({"threshold"})
    OFF: ClassVar[dict] = {"max_chars": 0}

    def __post_init__(self):
        langs = self.languages.split(",") if isinstance(self.languages, str) else self.languages
        object.__setattr__(self, "languages", tuple(sorted({x.strip() for x in langs or () if x.strip()})))
        if self.threshold is not None and (not isinstance(self.threshold, (int, float)) or isinstance(
                self.threshold, bool) or not 0.0 <= self.threshold < 1.0):
            raise ConfigError(f"lang threshold {self.threshold!r}: expected a probability in [0, 1) "
                              "(--lang-threshold, e.g. 0.65)")
        unknown = sorted(set(self.languages) - set(known_languages()))
        if unknown:
            raise ConfigError(f"--lang {','.join(unknown)}: not a language the model knows; choose among "
                              f"{', '.join(known_languages())}")
        super().__post_init__()

    @property
    def verdict(self) -> str | None:
        return None  # its columns are the language and its probability; keep() decides from them

    @property
    def columns(self) -> dict:
        return {"lang": pa.string(), "lang_score": pa.float32()}

    def score(self, text: str) -> dict:
        """{'lang', 'lang_score'}; 'und' and 0.0 for a text with no letter (nothing to go on)."""
        sample = text[:self.max_chars] if self.max_chars else text
        if not any(ch.isalpha() for ch in sample):
            return {"lang": UNDETERMINED, "lang_score": 0.0}
        try:
            lang, prob = identifier().classify(sample)
        except Exception:  # noqa: BLE001 — a text the model fails on is one it cannot score, not a failed build
            return {"lang": UNDETERMINED, "lang_score": 0.0}
        return {"lang": lang, "lang_score": float(prob)}

    def keep(self, scores: dict) -> tuple[bool, str | None]:
        if scores["lang"] == UNDETERMINED:
            return False, "unscored"
        if self.languages and scores["lang"] not in self.languages:
            return False, "other_language"
        if self.threshold is not None and scores["lang_score"] <= self.threshold:
            return False, "low_score"
        return True, None

    def check(self, text: str) -> tuple[bool, str | None]:
        return self.keep(self.score(text))
