"""Sources: SRC (a raw folder of files, .jsonl, .parquet and WebDataset .tar) → samples in key order.

Files sharing a stem are one sample, labelled by their first folder; every non-blank line of a
.jsonl, every row of a .parquet and every member key of a .tar is a sample. A build holds SRC as an Inventory (compact
columns, row files counted on the cluster: see inventory.py); `scan` below is the per-sample view
for small tools and tests.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass, field

from shardkit.config import BuildConfig
from shardkit.contract import decode_text
from shardkit.errors import RejectedInput
from shardkit.store.remote import RemoteError
from shardkit.sample import Sample
from shardkit.store import join, read_source
from shardkit.sources.walk import (ARRAY_EXTS, IMAGE_EXTS, JSON_EXTS, JSONL_EXTS, KNOWN_EXTS, PARQUET_EXTS,
                                   ROW_EXTS, TAR_EXTS, TEXT_EXTS)

__all__ = ["ARRAY_EXTS", "IMAGE_EXTS", "JSON_EXTS", "JSONL_EXTS", "KNOWN_EXTS", "PARQUET_EXTS", "ROW_EXTS",
           "TAR_EXTS", "TEXT_EXTS", "InputRecord", "ScanResult", "read_record", "records", "scan"]


@dataclass(frozen=True, slots=True)
class InputRecord:
    """One input sample before any stage ran: its files, label, and (for a row file) its row."""

    key: str
    files: tuple[str, ...]  # paths relative to the source folder, posix separators
    label: int | None
    size: int  # bytes read for this record (a line's length for jsonl)
    stamp: tuple = ()  # what identifies the inputs' versions: the rerun fingerprint
    line: tuple[int, int, int] | None = None  # (line or row number, byte offset, byte length) in a row file

    @property
    def source(self) -> str:
        return f"{self.files[0]}:{self.line[0]}" if self.line else self.files[0]

    def fingerprint(self) -> str:
        return f"{self.key}|{'|'.join(self.files)}|{self.line}|{self.stamp}"


@dataclass
class ScanResult:
    """The per-sample view of SRC (see `scan`): its records, and the inventory they come from."""

    records: list[InputRecord]
    inventory: object = field(repr=False)  # sources.inventory.Inventory

    rejections = property(lambda self: self.inventory.rejections)
    classes = property(lambda self: self.inventory.classes)
    kinds = property(lambda self: self.inventory.kinds)
    notes = property(lambda self: self.inventory.notes)
    image_exts = property(lambda self: self.inventory.image_exts)

    @property
    def inputs(self) -> int:
        return len(self.records) + len(self.rejections)


def records(inv) -> list[InputRecord]:
    """Every sample of an Inventory as an InputRecord, in key order: O(samples), for small tools and
    for deduplication (which reads samples one by one)."""
    from shardkit.sources.key_order import ATOMS
    from shardkit.sources.index import keys_of, load_index

    out = []
    for piece in inv.pieces:
        if piece.source == ATOMS:
            rows = inv.atoms.slice(piece.start, len(piece)).to_pylist()
            for row, label, est in zip(rows, inv.labels[piece.start:piece.stop].tolist(),
                                       inv.est[piece.start:piece.stop].tolist()):
                line = None
                if row["row_file"] >= 0:
                    index = load_index(inv.counts[row["row_file"]], inv.opts.policy)[row["row"]]
                    line = (int(index["number"]), int(index["offset"]), int(index["length"]))
                out.append(InputRecord(row["key"], tuple(row["files"]), None if label < 0 else label, est,
                                       (row["stamp"],), line))
            continue
        rf, count = inv.row_files[piece.source], inv.counts[piece.source]
        label = inv.row_labels.get(rf.id, -1)
        index = load_index(count, inv.opts.policy)[piece.start:piece.stop]
        for key, number, offset, length in zip(keys_of(rf.stem_key, count, piece.start, piece.stop, inv.opts.policy),
                                               index["number"].tolist(), index["offset"].tolist(),
                                               index["length"].tolist()):
            out.append(InputRecord(key, (rf.rel,), None if label < 0 else label, length, (rf.stamp(),),
                                   (number, offset, length)))
    return out


def scan(cfg: BuildConfig) -> ScanResult:
    """SRC as InputRecords sorted by key, counted in this process: everything passed over is a Rejection."""
    from shardkit.sources.inventory import make_inventory, scan_options
    from shardkit.sources.rows import count_rows
    from shardkit.sources.walk import walk

    if not os.path.isdir(cfg.src):
        raise FileNotFoundError(f"source folder {cfg.src!r} does not exist or is not a folder")
    with tempfile.TemporaryDirectory(prefix="shardkit-scan-") as tmp:
        opts = scan_options(cfg, tmp)
        listing = walk(cfg.src, cfg.out)
        counts = {rf.id: count_rows(rf, opts) for rf in listing.row_files}
        inv = make_inventory(listing, counts, cfg, opts)
        return ScanResult(records(inv), inv)


def _read_row(root: str, rec: InputRecord, text_field: str, image_field: str, policy=None) -> Sample:
    """One row of a row file, read alone (the build reads rows in runs, see sources.read)."""
    from shardkit.sources.rows import parse_jsonl_line

    number, offset, length = rec.line
    rel = rec.files[0]
    if os.path.splitext(rel)[1].lower() in TAR_EXTS:  # its cls members are its labels unless it has one
        from shardkit.sources.tar_rows import parse_span
        from shardkit.sources.tars import open_source

        with open_source(root, rel, policy) as f:
            f.seek(offset)
            return parse_span(f.read(length), length, rec.key, None, rel, number, rec.label is None)
    if os.path.splitext(rel)[1].lower() in JSONL_EXTS:
        data = read_source(join(root, rel), offset, offset + length, policy)
        return parse_jsonl_line(data, rec.key, rec.source, text_field, number)
    from shardkit.sources.parquet_files import RowConverter, row_group_of
    from shardkit.sources.index import ScanOptions

    opts = ScanOptions(root, "", text_field, image_field, policy=policy)
    info, table, first = row_group_of(join(root, rel), number, opts)
    row = table.slice(number - first, 1).to_pylist()[0]
    return RowConverter(opts, info, None, rel)(row, rec.key, rec.source)


def read_records(root: str, records: list[InputRecord], text_field: str = "text", image_field: str = "image",
                 policy=None):
    """(record, Sample or RejectedInput) for each record, in order. Consecutive rows of one .jsonl
    file are read with one open and one read (the build reads pieces in runs: sources.read). `policy`:
    the job's RemotePolicy, for a root on a store."""
    from shardkit.sources.rows import parse_jsonl_line

    i = 0
    while i < len(records):
        rec = records[i]
        j = i + 1
        if rec.line is not None and os.path.splitext(rec.files[0])[1].lower() in JSONL_EXTS:
            while j < len(records) and records[j].line is not None and records[j].files[0] == rec.files[0]:
                j += 1
        if j == i + 1:
            try:
                yield rec, read_record(root, rec, text_field, image_field, policy=policy)
            except RejectedInput as e:
                yield rec, e
            i = j
            continue
        run = records[i:j]
        lo, hi = run[0].line[1], max(r.line[1] + r.line[2] for r in run)
        try:
            span = read_source(join(root, rec.files[0]), lo, hi, policy)
        except (OSError, RemoteError) as e:
            span, error = None, RejectedInput(f"unreadable: {_why(e)}")
        for r in run:
            try:
                if span is None:
                    raise error
                sample = parse_jsonl_line(span[r.line[1] - lo:r.line[1] - lo + r.line[2]], r.key, r.source,
                                          text_field, r.line[0])
                if r.label is not None:
                    sample.fields["cls"] = r.label
                yield r, sample
            except RejectedInput as e:
                yield r, e
        i = j


def read_record(root: str, rec: InputRecord, text_field: str = "text", image_field: str = "image",
                data: dict | None = None, policy=None) -> Sample:
    """Read one record's files into a Sample: image → original bytes under 'image', txt, json, cls.
    `data`: the files' bytes (or the errors reading them) fetched already, by relative path; `policy`:
    the job's RemotePolicy, for a root on a store."""
    try:
        if rec.line is not None:
            sample = _read_row(root, rec, text_field, image_field, policy)
        else:
            sample = Sample(rec.key, {}, {"source": rec.source, "source_path": rec.files[0], "utf8_replaced": 0})
            for rel in rec.files:
                ext = os.path.splitext(rel)[1].lower()
                got = data.pop(rel, None) if data is not None else None
                if isinstance(got, BaseException):
                    raise got
                content = got if got is not None else read_source(join(root, rel), policy=policy)
                if ext in IMAGE_EXTS:
                    sample.fields["image"] = content
                    sample.meta["image_ext"] = ext[1:]  # what `--encode keep` names the field
                elif ext in TEXT_EXTS:
                    sample.fields["txt"], sample.meta["utf8_replaced"] = decode_text(content)
                elif ext in ARRAY_EXTS:
                    sample.fields["array"] = content  # .npy bytes; the array stage parses them
                else:
                    try:
                        sample.fields["json"] = json.loads(content)
                    except ValueError as e:
                        raise RejectedInput(f"invalid JSON sidecar {rel!r}: {e}") from None
    except (OSError, RemoteError) as e:
        raise RejectedInput(f"unreadable: {_why(e)}") from None
    if rec.label is not None:
        sample.fields["cls"] = rec.label
    return sample


def _why(error: BaseException) -> str:
    """Why a source file could not be read, in a rejection's words. A store that failed to answer is
    no reason to reject an input: that RemoteError goes on and fails the task, naming the URL."""
    if isinstance(error, RemoteError) and not error.not_found:
        raise error
    return getattr(error, "detail", None) or getattr(error, "strerror", None) or str(error)
