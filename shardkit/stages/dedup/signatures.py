"""Per-partition dedup inputs: samples → text signatures / image hashes, saved to one .npz file."""

from __future__ import annotations

import io
import json
from dataclasses import dataclass

import numpy as np

from shardkit.contract import IMAGE_FIELDS as DATASET_IMAGE_FIELDS
from shardkit.contract import decode_text
from shardkit.errors import RejectedInput, Rejection
from shardkit.fs import atomic_writer
from shardkit.stages.dedup import image as image_mod
from shardkit.stages.dedup.minhash import MinHasher
from shardkit.stages.dedup.text import content_hash, shingle_hashes, words

# "image": a raw-folder sample before the image stage; then the dataset's own image fields.
IMAGE_FIELDS = ("image",) + DATASET_IMAGE_FIELDS
MODALITY_CODES = {"none": 0, "text": 1, "image": 2}


@dataclass(frozen=True)
class SignatureParams:
    """What a partition file depends on besides its inputs (part of its fingerprint)."""

    num_perm: int = 128
    seed: int = 1
    ngram: int = 5
    modality: str = "auto"
    image_hash: str = "phash"
    keep_sets: bool = False  # store shingle sets for exact-Jaccard --verify


def modality_of(sample, modality: str) -> tuple[str, str | None]:
    """('image'|'text'|'none', field): a sample with an image is compared as an image under 'auto'."""
    if modality in ("auto", "image"):
        for name in IMAGE_FIELDS:
            if name in sample.fields:
                return "image", name
    if modality in ("auto", "text") and "txt" in sample.fields:
        return "text", "txt"
    return "none", None


def _image_row(sample, name: str, specs: dict | None, params: SignatureParams):
    spec = (specs or {}).get(name)
    img = image_mod.decode(sample.fields[name], spec)
    return image_mod.pixel_hash(img), image_mod.perceptual_hash(img, params.image_hash)


def compute(samples, params: SignatureParams, specs: dict | None = None) -> tuple[dict, list[Rejection]]:
    """Arrays for one partition: keys, modality, digests, text signatures, image hashes, stats."""
    keys, mods, digests, text_words, img_hashes = [], [], [], [], []
    rejections, rejected_keys, replaced = [], [], 0
    for s in samples:
        kind, name = modality_of(s, params.modality)
        if kind == "image":
            try:
                digest, phash = _image_row(s, name, specs, params)
            except RejectedInput as e:
                rejections.append(Rejection(s.meta.get("source", s.key), "dedup", e.reason))
                rejected_keys.append(s.key)
                continue
            img_hashes.append(phash)
        elif kind == "text":
            text, bad = decode_text(s.fields[name])
            replaced += bad + s.meta.get("utf8_replaced", 0)
            doc = words(text)
            text_words.append(doc)
            digest = content_hash(doc)
        else:
            digest = b"\0" * 16
        keys.append(s.key)
        mods.append(MODALITY_CODES[kind])
        digests.append(digest)
    hashes, offsets = shingle_hashes(text_words, params.ngram)
    hasher = MinHasher(params.num_perm, params.seed)
    arrays = {
        "keys": np.array(keys, dtype=str),
        "modality": np.array(mods, np.uint8),
        "digests": np.array(digests, dtype="S16"),
        "signatures": hasher.signatures(hashes, offsets),
        "image_hashes": np.array(img_hashes, np.uint64),
        "rejected_keys": np.array(rejected_keys, dtype=str),
        "stats": np.array(json.dumps({"utf8_replaced": replaced})),
    }
    if params.keep_sets:
        sets = [np.unique(hashes[offsets[i]:offsets[i + 1]]) for i in range(len(offsets) - 1)]
        arrays["set_offsets"] = np.concatenate([[0], np.cumsum([len(x) for x in sets])]).astype(np.int64)
        arrays["set_values"] = np.concatenate(sets) if sets else np.empty(0, np.uint32)
    arrays["shingle_counts"] = np.diff(offsets)
    return arrays, rejections


def save(path: str, arrays: dict, rejections: list[Rejection]) -> None:
    """Write the partition file atomically: a rerun sees it whole or not at all."""
    payload = dict(arrays, rejections=np.array(json.dumps([[r.path, r.stage, r.reason] for r in rejections])))
    buf = io.BytesIO()
    np.savez(buf, **payload)
    with atomic_writer(path) as f:
        f.write(buf.getvalue())


def load(path: str) -> tuple[dict, list[Rejection]]:
    with np.load(path, allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    rejections = [Rejection(*r) for r in json.loads(str(arrays.pop("rejections")))]
    return arrays, rejections
