"""From partition files to the dedup decision: bucket ranges, the bucket task, components.

The bucket task owns one range of the mixed-hash space and reads only the entries of every
partition that fall in it (exact digests, text band keys, image band bits), so a task holds
1/Q of the corpus's entries whatever the corpus size. Its links go to one union-find over the
linked ids alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from shardkit.duplicates.links import (EMPTY_PAIRS, MAX_BUCKET_PAIRS, band_candidates, exact_links,
                                           image_links, jaccard_exact)
from shardkit.duplicates.partitions import PartitionSet
from shardkit.duplicates.unionfind import linked_components

# Entries one bucket task holds (~70 bytes each while sorting): ~70 MB a task, whatever the corpus.
ENTRIES_PER_TASK = 1_000_000
VERIFY_CHUNK = 65_536  # candidate pairs checked at once: bounds the gathered signature rows


@dataclass(frozen=True)
class BucketParams:
    threshold: float
    verify: bool
    image_distance: int
    max_pairs: int = MAX_BUCKET_PAIRS


@dataclass
class BucketResult:
    """One bucket range's output: checked text candidates (with their verdict) and other links."""

    candidates: np.ndarray  # (m, 2) text candidate pairs, i < j
    linked: np.ndarray  # (m,) bool: the candidate reached the threshold
    links: np.ndarray  # (k, 2) exact-digest and image links
    stats: dict = field(default_factory=dict)


def bucket_count(rows: int, bands: int) -> int:
    """How many bucket tasks for a corpus of `rows` inputs: ~ENTRIES_PER_TASK entries each (an
    input gives one exact entry and at most `bands` band entries). Decided before the signature
    stage, which files every partition's entries by bucket range."""
    return max(1, -(-rows * (1 + bands) // ENTRIES_PER_TASK))


def check_text_pairs(parts: PartitionSet, pairs: np.ndarray, threshold: float, verify: bool) -> np.ndarray:
    """Similarity of each candidate pair: the MinHash estimate, or exact Jaccard of the shingle sets."""
    scores = np.empty(len(pairs))
    for lo in range(0, len(pairs), VERIFY_CHUNK):
        chunk = pairs[lo:lo + VERIFY_CHUNK]
        if verify:
            scores[lo:lo + len(chunk)] = jaccard_exact(parts.sets(chunk[:, 0]), parts.sets(chunk[:, 1]))
        else:
            a, b = parts.signatures(chunk[:, 0]), parts.signatures(chunk[:, 1])
            scores[lo:lo + len(chunk)] = np.count_nonzero(a == b, axis=1) / a.shape[1]
    return scores


def bucket_task(task: int, parts: PartitionSet, params: BucketParams) -> BucketResult:
    """Links among the entries of bucket range `task`, read from every partition."""
    parts = PartitionSet(parts.refs, parts.policy)  # this task's own open files, released when it returns
    exact, exact_ids = parts.entries("exact", task)
    links = [exact_links(exact["h"], exact["x"], exact_ids)]
    n_entries = len(exact)
    del exact, exact_ids
    image, image_ids = parts.entries("image", task)
    links.append(image_links(image["h"], image["x"], image_ids, params.image_distance))
    n_entries += len(image)
    del image, image_ids
    text, text_ids = parts.entries("text", task)
    candidates = band_candidates(text["h"], text_ids, params.max_pairs)
    n_entries += len(text)
    del text, text_ids
    linked = check_text_pairs(parts, candidates, params.threshold, params.verify) >= params.threshold
    return BucketResult(candidates, linked, np.concatenate(links), {"entries": n_entries})


def merge_links(results: list[BucketResult]) -> tuple[np.ndarray, dict]:
    """Every link of every bucket task, once; candidate counts over unique pairs."""
    candidates = np.concatenate([r.candidates for r in results] or [EMPTY_PAIRS])
    linked = np.concatenate([r.linked for r in results] or [np.empty(0, bool)])
    candidates, first = np.unique(candidates, axis=0, return_index=True) if len(candidates) else (candidates, [])
    linked = linked[first] if len(candidates) else linked
    other = np.concatenate([r.links for r in results] or [EMPTY_PAIRS])
    links = np.concatenate([candidates[linked], np.sort(other, axis=1)])
    links = np.unique(links, axis=0) if len(links) else EMPTY_PAIRS
    stats = {"candidate_pairs": int(len(candidates)), "linked_pairs": int(linked.sum()),
             "rejected_pairs": int(len(candidates) - linked.sum())}
    return links, stats


def decide(links: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(nodes, labels) of every clustered id: the label is the smallest id of its cluster (kept)."""
    return linked_components(links)
