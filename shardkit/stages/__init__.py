"""Stages are generator functions over samples; compose() chains them, map_samples() applies the error policy."""

from __future__ import annotations

from typing import Callable, Iterable, Iterator

from shardkit.errors import RejectedInput, RejectionLog
from shardkit.sample import Sample


def compose(source: Iterable[Sample], *stages: Callable[[Iterable[Sample]], Iterable[Sample]]) -> Iterator[Sample]:
    """compose(src, a, b) == b(a(src)): each stage takes and yields samples."""
    it = iter(source)
    for stage in stages:
        it = stage(it)
    return it


def source_of(sample: Sample) -> str:
    return sample.meta.get("source", sample.key)


def map_samples(samples: Iterable, fn: Callable, *, stage: str, log: RejectionLog,
                where: Callable = source_of) -> Iterator:
    """Apply fn to each item; a RejectedInput goes to the log (which may fail fast) and the item is dropped.

    `where(item)` names the input in errors.jsonl (the source path by default).
    """
    for item in samples:
        try:
            out = fn(item)
        except RejectedInput as e:
            log.reject(where(item), stage, e.reason)
            continue
        yield out
