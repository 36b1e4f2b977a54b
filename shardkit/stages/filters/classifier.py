"""fasttext: a user's own fastText classifier (DCLM's baseline, FineWeb-Edu-style quality models) as
a scorer and a filter: the probability of one label becomes the attribute `fasttext_score`, and a
document is kept when it reaches the threshold (datatrove's FastTextClassifierFilter rule).

The model is checked in the process that builds the filter (the client: a missing file, a file
that is not a supervised model, a label it does not have: one BadOption, exit 2, before any worker
starts) and loaded once per process where it scores (`model()`), never pickled to workers.
"""

from __future__ import annotations

import hashlib
import os
import threading
from dataclasses import dataclass, field
from typing import ClassVar

from shardkit.errors import BadOption, ConfigError
from shardkit.stages.filters import limits

INSTALL = "pip install 'shardkit[fasttext]'"
_MODELS: dict = {}  # (path, size, mtime_ns) -> this process's loaded model
_PREDICT: dict = {}  # (path, digest) -> this process's predict function (_predictor)
_LOCK = threading.Lock()


def _binding():
    try:
        import fasttext
    except ImportError:
        raise ConfigError(f"--filter fasttext needs a fastText binding: {INSTALL}") from None
    return fasttext


def _file_id(path: str) -> tuple:
    st = os.stat(path)
    return path, st.st_size, st.st_mtime_ns


def model(path: str):
    """This process's fastText model from `path` (loaded once per process and file version)."""
    key = _file_id(path)
    with _LOCK:
        if key not in _MODELS:
            _MODELS[key] = _binding().load_model(path)
        return _MODELS[key]


def _predictor(path: str, digest: str):
    """text line (ending in '\n') -> [(probability, label), ...] for this process's model of `path`:
    the call the binding's own `predict` makes (`model.f.predict`), without its per-call numpy array;
    found once per process and model version (`digest`: FastText's hash of the file's bytes)."""
    fn = _PREDICT.get((path, digest))
    if fn is None:
        m = model(path)
        core = getattr(m, "f", None)
        if core is not None and hasattr(core, "predict"):
            fn = lambda line: core.predict(line, -1, 0.0, "strict")  # noqa: E731
        else:  # a binding without that attribute: its public predict, zipped the same way
            fn = lambda line: list(zip(*reversed(m.predict(line[:-1], k=-1))))  # noqa: E731
        _PREDICT[(path, digest)] = fn
    return fn


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()[:16]


@dataclass(frozen=True)
class FastText:
    """`model` (a supervised fastText .bin), the `label` whose probability is the score, and the
    `threshold` a kept document reaches (None: score only, keep all). Newlines are read as spaces
    (fastText predicts one line); `max_chars` (None: all) bounds the text read, as the model's cost is
    per word. `digest` (not an option) names the model's bytes in the build's fingerprint."""

    name: ClassVar[str] = "fasttext"
    prefix: ClassVar[str] = "fasttext"
    decides: ClassVar[bool] = True
    verdict: ClassVar[str] = "fasttext"  # the bool column keep() fills; score() gives fasttext_score
    FRACTIONS: ClassVar[frozenset] = frozenset({"threshold"})  # a probability
    OFF: ClassVar[dict] = {"max_chars": 0}  # the older spelling of "read the whole text"
    model: str = ""
    label: str = "__label__hq"
    threshold: float | None = 0.5
    max_chars: int | None = None
    digest: str = field(default="", init=False)

    def __post_init__(self):
        try:
            limits.settle(self)  # threshold a probability in [0, 1] (or none), max_chars a count
        except ValueError as e:
            raise BadOption(f"--filter-option {e}") from None
        if not self.model:
            raise BadOption("--filter fasttext needs its model: --filter-option fasttext.model=PATH "
                              "(a supervised fastText .bin)")
        path = os.path.abspath(os.path.expanduser(str(self.model)))
        if not os.path.isfile(path):
            raise BadOption(f"fasttext.model={self.model}: no such file; give the path of a supervised "
                              "fastText model (.bin)")
        object.__setattr__(self, "model", path)
        labels = self._labels(path)
        if self.label not in labels:
            raise BadOption(f"fasttext.label={self.label}: the model {self.model} has no such label; its labels: "
                              f"{', '.join(labels[:20])}")
        object.__setattr__(self, "digest", _sha256(path))

    def _labels(self, path: str) -> list[str]:
        try:
            m = model(path)
        except ValueError as e:  # the binding's error for a file that is not a fastText model
            raise BadOption(f"fasttext.model={path}: not a fastText model ({str(e).strip()}); give a "
                              "supervised .bin (fasttext.train_supervised(...).save_model)") from None
        kind = m.f.getArgs().model.name  # the binding's own record of how the model was trained
        if kind != "supervised":
            raise BadOption(f"fasttext.model={path}: a {kind} (word vector) model has no labels to score; give a "
                              "supervised one (fasttext.train_supervised)")
        return list(m.get_labels())

    @property
    def columns(self) -> dict:
        import pyarrow as pa

        return {"fasttext_score": pa.float32(), "fasttext": pa.bool_()}

    def score(self, text: str) -> dict:
        """{'fasttext_score': the label's probability} (0.0 where the model does not rank it)."""
        if self.max_chars:
            text = text[:self.max_chars]
        for p, label in _predictor(self.model, self.digest)(text.replace("\n", " ") + "\n"):
            if label == self.label:
                return {"fasttext_score": min(1.0, float(p))}
        return {"fasttext_score": 0.0}

    def keep(self, scores: dict) -> tuple[bool, str | None]:
        if self.threshold is not None and scores["fasttext_score"] < self.threshold:
            return False, "low_score"
        return True, None

    def check(self, text: str) -> tuple[bool, str | None]:
        return self.keep(self.score(text))

    def edit(self, text: str) -> str:
        return text  # decides, never edits
