"""A build's field specs, known before any task runs (every shard has the same schema), and the
corpus a tokenizer is trained on."""

from __future__ import annotations

import hashlib
from collections import namedtuple
from dataclasses import replace

import numpy as np

from shardkit.config import BuildConfig
from shardkit.errors import RejectedInput
from shardkit.sources import walk as W
from shardkit.sources.inventory import Inventory
from shardkit.sources.key_order import ATOMS
from shardkit.sources.read import SourceReader
from shardkit.stages.arrays import array_spec
from shardkit.stages.augment import variant_fields
from shardkit.stages.tokenize import TokenizerInfo, token_fields

_Files = namedtuple("_Files", "files")  # what array_spec reads of a sample


def field_specs(inv: Inventory, cfg: BuildConfig) -> dict:
    """The manifest's field specs, known before any task runs so every shard has the same schema."""
    fields = {}
    if "image" in inv.kinds and cfg.encode == "keep":  # each input's own bytes, under its own extension
        fields.update({ext: {"kind": "image", "encoding": "keep"} for ext in sorted(inv.image_exts)})
    elif "image" in inv.kinds:
        spec = {"kind": "image", "encoding": cfg.encode}
        if cfg.encode == "raw":
            spec.update(dtype="uint8", shape=[cfg.stored_size, cfg.stored_size, 3])
        fields[cfg.output_image_field] = spec
    if "txt" in inv.kinds:
        fields["txt"] = {"kind": "text"}
    if "json" in inv.kinds:
        fields["json"] = {"kind": "json"}
    if inv.classes is not None:
        fields["cls"] = {"kind": "int", "dtype": "int64"}
    return fields


def _npy_samples(inv: Inventory):
    """File samples holding a .npy array, in key order (array_spec reads the first readable header)."""
    kinds = inv.atoms.column("kinds").to_numpy() if len(inv.atoms) else np.zeros(0, np.int8)
    for i in np.flatnonzero(kinds & W.ARRAY).tolist():
        yield _Files(tuple(inv.atoms.column("files")[i].as_py()))


def cache_fields(fields: dict, inv: Inventory, cfg: BuildConfig, tok: TokenizerInfo | None) -> dict:
    """field_specs plus the caching stages: augmented variants, arrays, tokens (txt becomes tokens)."""
    fields = dict(fields)
    if cfg.augment and cfg.output_image_field in fields:
        fields.update(variant_fields(cfg.output_image_field, fields.pop(cfg.output_image_field), cfg))
    if "array" in inv.kinds and (spec := array_spec(cfg.src, _npy_samples(inv), cfg.half, inv.opts.policy)) is not None:
        fields["array"] = spec
    return fields if tok is None else token_fields(fields, inv.kinds, tok, cfg.seq_len)


def corpus_key(inv: Inventory) -> str:
    """Fingerprint of every input (names, sizes, mtimes): a trained tokenizer is reused while it holds."""
    h = hashlib.sha256(str([(p.source, p.start, p.stop) for p in inv.pieces]).encode())
    if len(inv.atoms):
        h.update(inv.atoms.column("stamp").to_numpy().tobytes())
    for rf in inv.row_files:
        h.update(rf.stamp().encode("utf-8", "surrogatepass"))
    return h.hexdigest()


class Corpus:
    """Every document's text in key order, read lazily, to train a tokenizer on (bad inputs are
    rejected later, by the tasks), as the shards will hold it: through --dedup-paragraphs and the
    curation filters (`curating`: (Curation or None, ParagraphDrops or None)), so the vocabulary is
    learnt from the curated text, not from what the filters remove. Sized, as the trainer's progress
    wants (the count before curation: a progress estimate only)."""

    def __init__(self, inv: Inventory, reader: SourceReader, curating: tuple = (None, None)):
        self.inv, self.reader = inv, reader
        self.curation, self.paragraphs = curating

    def __len__(self) -> int:
        return self.inv.samples

    def __iter__(self):
        for sample in self._curated(self._samples()):
            text = sample.fields.get("txt")
            if text is not None:
                yield text

    def _curated(self, samples):
        """The build's own stages over the samples (their counts and lists are the tasks' to keep)."""
        if self.paragraphs:
            from shardkit.jobs.paragraph_tasks import drop_paragraphs

            samples = drop_paragraphs(samples, drops=self.paragraphs, stats={}, dropped=[])
        if self.curation:
            from shardkit.stages.filters import curate

            samples = curate(samples, curation=self.curation, stats={}, dropped=[])
        return samples

    def _samples(self):
        kinds = self.inv.atoms.column("kinds").to_numpy() if len(self.inv.atoms) else None
        for piece in self.inv.pieces:
            if piece.source == ATOMS:  # only samples with text: images are not read for this
                wanted = np.flatnonzero(kinds[piece.start:piece.stop] & W.TXT) + piece.start
                pieces = [replace(piece, start=i, stop=i + 1) for i in wanted.tolist()]
            else:
                pieces = [piece]
            for ref in self.reader.refs(pieces):
                try:
                    sample = ref.make()
                except RejectedInput:
                    continue
                if sample.fields.get("txt") is not None:
                    yield sample
