"""A mixture's arithmetic: sources and options, per-source counts per epoch, the weight schedule,
and where each source's own stream stands at the start of every epoch. Pure: no I/O.

Every source is read as an endless stream of passes, each pass a full permutation of the source
(its own seeded `EpochOrder`, pass p shuffled as epoch p). Epoch e of the mixture takes the next
n_i(e) samples of source i's stream, so a source that needs less than a pass per epoch continues
where the previous epoch stopped (no sample repeats before all have been seen) and one that needs
more takes whole passes plus a part of the next. Where a stream stands is a sum of earlier epochs'
counts, computed, never carried as mutable state.

An epoch is cut into phases (one per epoch without a schedule); each phase has fixed per-source
counts, and `mix_order` interleaves a phase's samples smoothly.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field

import numpy as np

from shardkit.errors import ConfigError

MIXING = ("sample", "batch")
# With a schedule an epoch is cut into phases of this many samples, each at the weights in effect
# at its middle: the ramp is followed to within a phase, and a process holds one row of counts
# per phase of the current epoch (8 bytes x sources; 61k rows for a 1e9-sample epoch).
DEFAULT_PHASE = 16384
# The interleave multiplies positions by counts in int64: a phase stays below this many units.
MAX_PHASE_UNITS = 3_000_000_000


@dataclass(frozen=True)
class Source:
    """One dataset of a mixture: where it is and how much of it an epoch takes.

    At most one of `weight` (a share of the epoch, relative to the other weighted sources),
    `repeat` (passes per epoch: 0.5 is half the source, 3 is three passes) or `choose` (samples
    per epoch). None of them: one pass per epoch (repeat=1). `format` picks tar or Parquet shards.
    `where` keeps only the source's samples whose attributes satisfy it (reader.where): its size, and
    so its weight's pass and repeat, count those alone.
    """

    path: str
    weight: float | None = None
    repeat: float | None = None
    choose: int | None = None
    format: str | None = None
    where: str | None = None

    def __post_init__(self):
        given = [k for k in ("weight", "repeat", "choose") if getattr(self, k) is not None]
        if len(given) > 1:
            raise ConfigError(f"source {self.path!r} sets {' and '.join(given)}: give one of weight, repeat or choose")
        for name in ("weight", "repeat"):
            value = getattr(self, name)
            if value is not None and (not _real(value) or not math.isfinite(value) or value < 0):
                raise ConfigError(f"source {self.path!r}: {name}={value!r}; expected a number >= 0")
            if value is not None:  # numpy numbers too (weights computed with numpy)
                object.__setattr__(self, name, float(value))
        if self.choose is not None and (not _integer(self.choose) or self.choose < 0):
            raise ConfigError(f"source {self.path!r}: choose={self.choose!r}; expected samples per epoch, an integer >= 0")
        if self.choose is not None:
            object.__setattr__(self, "choose", int(self.choose))
        if self.format not in (None, "tar", "parquet"):
            raise ConfigError(f"source {self.path!r}: format={self.format!r}; expected 'tar', 'parquet' or None")
        if self.where is not None and not isinstance(self.where, str):
            raise ConfigError(f"source {self.path!r}: where={self.where!r}; expected an expression string")


def _real(value) -> bool:
    """A number (Python's or numpy's), not a bool."""
    return isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_))


def _integer(value) -> bool:
    """An integer (Python's or numpy's), not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_))


def _is_path(value) -> bool:
    return isinstance(value, str) or hasattr(value, "__fspath__")


def source_of(name: str, spec) -> Source:
    """A Source from what a script or a config file gives: a Source, a path, (path, weight),
    or a dict {"path": ..., "weight" | "repeat" | "choose": ..., "format": ..., "where": ...}."""
    if isinstance(spec, Source):
        return spec
    if _is_path(spec):
        return Source(str(spec))
    if isinstance(spec, (tuple, list)) and len(spec) in (1, 2) and _is_path(spec[0]):
        return Source(str(spec[0]), *spec[1:])
    if isinstance(spec, dict) and "path" in spec:
        unknown = set(spec) - {"path", "weight", "repeat", "choose", "format", "where"}
        if unknown:
            raise ConfigError(f"source {name!r}: unknown keys {sorted(unknown)}; expected path, weight, repeat, "
                              "choose, format, where")
        return Source(**{**spec, "path": str(spec["path"])})
    raise ConfigError(f"source {name!r}: {spec!r} is not a source; give a path, (path, weight), or "
                      "{'path': ..., 'weight' | 'repeat' | 'choose': ...}")


@dataclass(frozen=True)
class MixConfig:
    """How sources are mixed: epoch size, sample- or batch-level mixing, the weight schedule.

    samples: samples per epoch over all ranks (None: the weighted sources' sizes added up, plus
    what repeat/choose sources take). mixing: "sample" (sources interleaved inside batches) or
    "batch" (every batch from one source; batch_size must then be the loader's). schedule:
    [(step, weights), ...] with weights a {name: weight} dict or a list in source order, linear
    between steps; a step is `step_samples` samples over all ranks (the global batch size, to
    give steps in training steps). phase: samples per piece of an epoch at constant weights.
    """

    samples: int | None = None
    mixing: str = "sample"
    batch_size: int | None = None
    schedule: tuple | None = None
    step_samples: int = 1
    phase: int = DEFAULT_PHASE

    def __post_init__(self):
        if self.mixing not in MIXING:
            raise ConfigError(f"mixing={self.mixing!r}: expected 'sample' (inside batches) or 'batch' (one source "
                              "per batch) (Mixture(mixing=...))")
        for name in ("samples", "batch_size", "step_samples", "phase"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value <= 0):
                raise ConfigError(f"{name}={value!r}: expected a positive integer (Mixture({name}=...))")
        if self.mixing == "batch" and self.batch_size is None:
            raise ConfigError("mixing='batch' needs the loader's batch size: Mixture(..., mixing='batch', "
                              "batch_size=B) and make_loader(..., batch_size=B)")
        if self.schedule is not None:
            object.__setattr__(self, "schedule", _schedule_points(self.schedule))

    @property
    def unit(self) -> int:
        """Samples per unit of the interleave: 1, or a whole batch with batch-level mixing."""
        return self.batch_size if self.mixing == "batch" else 1


def _schedule_points(schedule) -> tuple:
    """((step, weights), ...) from a list of (step, weights) pairs or a {step: weights} dict."""
    points = list(schedule.items()) if isinstance(schedule, dict) else list(schedule)
    for point in points:
        if not isinstance(point, (tuple, list)) or len(point) != 2:
            raise ConfigError(f"schedule point {point!r}: expected (step, weights), e.g. schedule=[(0, {{'web': 0.7, "
                              "'code': 0.3}), (10000, {'web': 0.5, 'code': 0.5})]")
    return tuple((int(p[0]) if _integer(p[0]) else p[0], p[1]) for p in points)


def apportion(total: int, weights) -> np.ndarray:
    """Integers proportional to `weights` adding up to `total` exactly (largest remainder; ties go
    to the earlier source). `weights` is (k,) or (rows, k) with `total` per row."""
    w = np.asarray(weights, np.float64)
    one = w.ndim == 1
    w = np.atleast_2d(w)
    total = np.broadcast_to(np.asarray(total, np.int64), (len(w),))
    share = w / w.sum(axis=1, keepdims=True) * total[:, None]
    out = np.floor(share).astype(np.int64)
    left = total - out.sum(axis=1)
    order = np.argsort(-(share - out), axis=1, kind="stable")
    ranks = np.empty_like(order)
    np.put_along_axis(ranks, order, np.arange(w.shape[1])[None, :].repeat(len(w), 0), axis=1)
    out += ranks < left[:, None]
    return out[0] if one else out


class Schedule:
    """Weights as a function of the mixture's global sample position (epoch * epoch size + position):
    piecewise linear between points, constant before the first and after the last."""

    def __init__(self, points, names: list[str], step_samples: int = 1):
        if not points:
            raise ConfigError("schedule=[]: give at least one (step, weights) point, or leave schedule out")
        steps, rows = [], []
        for point in points:
            step, weights = point
            if not isinstance(step, int) or isinstance(step, bool) or step < 0:
                raise ConfigError(f"schedule step {step!r}: expected an integer >= 0 (a training step)")
            rows.append(_weights_row(weights, names, step))
            steps.append(step * step_samples)
        if any(b <= a for a, b in zip(steps, steps[1:])):
            raise ConfigError(f"schedule steps {[p[0] for p in points]}: expected strictly increasing steps")
        self.at = np.asarray(steps, np.float64)
        self.weights = np.asarray(rows, np.float64)
        self.weights /= self.weights.sum(axis=1, keepdims=True)
        self.last = int(steps[-1])

    def __call__(self, t) -> np.ndarray:
        """Weights (len(t), k) at global sample positions t."""
        t = np.asarray(t, np.float64)
        return np.stack([np.interp(t, self.at, self.weights[:, i]) for i in range(self.weights.shape[1])], axis=1)


def _weights_row(weights, names: list[str], step) -> list[float]:
    if isinstance(weights, dict):
        unknown = set(weights) - set(names)
        if unknown:
            raise ConfigError(f"schedule step {step}: {sorted(unknown)} are not sources of this mixture ({names})")
        row = [weights.get(n, 0.0) for n in names]
    else:
        row = list(weights)
        if len(row) != len(names):
            raise ConfigError(f"schedule step {step}: {len(row)} weights for {len(names)} sources {names}")
    if any(not _real(w) or not math.isfinite(w) or w < 0 for w in row) \
            or sum(row) <= 0:
        raise ConfigError(f"schedule step {step}: weights {row}; expected numbers >= 0, not all 0")
    return [float(w) for w in row]


def epoch_units(sources: list[Source], sizes: list[int], cfg: MixConfig) -> np.ndarray:
    """Units (samples, or whole batches with batch-level mixing) each source gives one epoch without
    a schedule; a schedule's sources share `samples` (default: their sizes added up) by its weights."""
    unit, names = cfg.unit, [s.path for s in sources]
    if cfg.schedule is not None:
        set_ = [n for s, n in zip(sources, names) if s.weight is not None or s.repeat is not None
                or s.choose is not None]
        if set_:  # a weight beside the schedule would be silently overridden by it
            raise ConfigError(f"a schedule sets every source's share; drop weight/repeat/choose from {set_} (give "
                              "the starting weights as the schedule's first point, at step 0)")
        return np.zeros(len(sources), np.int64)  # phases take their counts from the schedule
    fixed = np.zeros(len(sources), np.int64)
    weighted = [i for i, s in enumerate(sources) if s.weight is not None]
    for i, s in enumerate(sources):
        if s.choose is not None:
            fixed[i] = s.choose // unit
        elif s.weight is None:  # repeat, or nothing (one pass)
            fixed[i] = round((1.0 if s.repeat is None else s.repeat) * sizes[i] / unit)
    if not weighted:
        if cfg.samples is not None and int(fixed.sum()) * unit != cfg.samples:
            raise ConfigError(f"samples={cfg.samples} but repeat/choose give {int(fixed.sum()) * unit} samples per "
                              "epoch; leave samples out, or give some sources a weight")
        return fixed
    pool = (cfg.samples if cfg.samples is not None else sum(sizes[i] for i in weighted)) // unit - int(fixed.sum())
    if pool < 0:
        raise ConfigError(f"samples={cfg.samples}: repeat/choose sources already take {int(fixed.sum()) * unit}; "
                          "raise samples or lower their counts")
    weights = [sources[i].weight for i in weighted]
    if sum(weights) <= 0:
        raise ConfigError("every weighted source has weight 0; give one a positive weight")
    fixed[weighted] = apportion(pool, weights)
    return fixed


@dataclass
class EpochTable:
    """One epoch's phases: phase j covers units [j * length, min((j + 1) * length, total)) and holds
    cum[j + 1] - cum[j] units of each source (cum: (phases + 1, sources), cumulative)."""

    length: int
    total: int
    cum: np.ndarray

    @property
    def counts(self) -> np.ndarray:
        return self.cum[-1]


@dataclass
class MixPlan:
    """Per-source counts of every epoch and where each source's stream starts: O(sources) without a
    schedule; with one, O(epochs before its last point) totals, computed once."""

    units: np.ndarray  # per source, units per epoch (no schedule)
    total: int  # units per epoch
    unit: int
    schedule: Schedule | None = None
    phase: int = DEFAULT_PHASE
    _totals: list = field(default_factory=list)  # per epoch (schedule): units of each source
    _table: tuple | None = None  # (epoch, EpochTable) last computed

    @property
    def steady(self) -> int:
        """The first epoch whose every phase lies after the schedule's last point."""
        if self.schedule is None:
            return 0
        return -(-self.schedule.last // (self.total * self.unit))

    def table(self, epoch: int) -> EpochTable:
        """Epoch `epoch`'s phases and their counts (the last one asked for is kept)."""
        if self._table is None or self._table[0] != epoch:
            self._table = (epoch, self._compute(epoch))
        return self._table[1]

    def _compute(self, epoch: int) -> EpochTable:
        if self.schedule is None:
            return EpochTable(self.total, self.total, np.stack([np.zeros_like(self.units), self.units]))
        length = max(1, min(self.phase // self.unit, MAX_PHASE_UNITS))
        starts = np.arange(0, self.total, length, dtype=np.int64)
        sizes = np.minimum(starts + length, self.total) - starts
        mids = (epoch * self.total + starts + sizes / 2) * self.unit  # global sample positions
        counts = apportion(sizes, self.schedule(mids))
        return EpochTable(length, self.total, np.concatenate([np.zeros((1, counts.shape[1]), np.int64),
                                                              np.cumsum(counts, axis=0)]))

    def counts(self, epoch: int) -> np.ndarray:
        """Units of each source in epoch `epoch`."""
        if self.schedule is None:
            return self.units
        epoch = min(epoch, self.steady)
        while len(self._totals) <= epoch:  # each epoch's phases once, then only their totals
            self._totals.append(self._compute(len(self._totals)).counts)
        return self._totals[epoch]

    def starts(self, epoch: int) -> np.ndarray:
        """Units of each source's stream taken by the epochs before `epoch` (where it starts)."""
        if self.schedule is None:
            return self.units * epoch
        head = min(epoch, self.steady)
        self.counts(head)
        done = np.sum(self._totals[:head], axis=0, dtype=np.int64) if head else np.zeros(len(self.units), np.int64)
        if epoch == head:  # not past the schedule: the steady epoch (maybe far ahead) is not needed
            return done
        return done + (epoch - head) * self.counts(self.steady)

    def weights(self, epoch: int, position: int) -> np.ndarray:
        """The target weights at unit `position` of epoch `epoch`."""
        if self.schedule is None:
            return self.units / max(1, self.total)
        return self.schedule([(epoch * self.total + position) * self.unit])[0]
