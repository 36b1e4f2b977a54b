"""Raw folder → ordered input records: files grouped by stem, label from the first subfolder."""

from __future__ import annotations

import hashlib
import json
import os
from collections import defaultdict
from dataclasses import dataclass, field

from shardkit.config import BuildConfig
from shardkit.contract import decode_text
from shardkit.errors import RejectedInput, Rejection
from shardkit.sample import Sample, make_key

IMAGE_EXTS = frozenset({".jpg", ".jpeg", ".png", ".webp", ".bmp", ".gif", ".tif", ".tiff"})
TEXT_EXTS = frozenset({".txt", ".md"})
JSON_EXTS = frozenset({".json"})
JSONL_EXTS = frozenset({".jsonl"})
ARRAY_EXTS = frozenset({".npy"})  # float arrays (embeddings, features): field 'array'
KNOWN_EXTS = IMAGE_EXTS | TEXT_EXTS | JSON_EXTS | JSONL_EXTS | ARRAY_EXTS


@dataclass(frozen=True, slots=True)
class InputRecord:
    """One input sample before any stage ran: its files, label, and (for jsonl) its line."""

    key: str
    files: tuple[str, ...]  # paths relative to the source folder, posix separators
    label: int | None
    size: int  # bytes read for this record (a line's length for jsonl)
    stamp: tuple = ()  # (size, mtime_ns) of each file: the rerun fingerprint
    line: tuple[int, int, int] | None = None  # (line number, byte offset, byte length) in a jsonl

    @property
    def source(self) -> str:
        return f"{self.files[0]}:{self.line[0]}" if self.line else self.files[0]

    def fingerprint(self) -> str:
        return f"{self.key}|{'|'.join(self.files)}|{self.line}|{self.stamp}"


@dataclass
class ScanResult:
    records: list[InputRecord]
    rejections: list[Rejection]
    classes: list[str] | None
    kinds: set[str] = field(default_factory=set)  # 'image', 'txt', 'json' seen among the records
    notes: list[str] = field(default_factory=list)  # read, but maybe not as the user meant (summary)
    image_exts: set[str] = field(default_factory=set)  # image extensions seen ('jpg', 'png', …), lowercase

    @property
    def inputs(self) -> int:
        return len(self.records) + len(self.rejections)


def _not_input(folder: str, out: str | None) -> str | None:
    """Why `folder` (below SRC) holds no input, or None: it is OUT, or a shardkit dataset. Reading
    either would feed a build's output back into the next build."""
    if out is not None and os.path.realpath(folder) == os.path.realpath(out):
        return "the build's output folder (OUT): not read"
    if os.path.isdir(os.path.join(folder, ".shardkit")) or (
            os.path.isfile(os.path.join(folder, "manifest.json")) and os.path.isdir(os.path.join(folder, "shards"))):
        return "a shardkit dataset (manifest.json, shards/ or .shardkit/): not read"
    return None


def _walk(root: str, rejections: list[Rejection], out: str | None = None, notes: list[str] | None = None):
    """Yield (relpath, stat) of regular files below root, sorted; record what is passed over."""
    real_root = os.path.realpath(root)
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = os.path.relpath(dirpath, root)
        rel_dir = "" if rel_dir == "." else rel_dir.replace(os.sep, "/")
        keep = []
        for d in sorted(dirnames):
            rel = f"{rel_dir}/{d}" if rel_dir else d
            if d.startswith("."):
                rejections.append(Rejection(rel + "/", "source", "hidden folder: not read"))
            elif os.path.islink(os.path.join(dirpath, d)):
                rejections.append(Rejection(rel + "/", "source", "symlinked folder: not followed"))
            elif reason := _not_input(os.path.join(dirpath, d), out):
                rejections.append(Rejection(rel + "/", "source", reason))
            else:
                if notes is not None and os.path.splitext(d)[1].lower() in KNOWN_EXTS:
                    notes.append(f"folder {rel + '/'!r} is named like a file: read as a folder")
                keep.append(d)
        dirnames[:] = keep
        for name in sorted(filenames):
            rel = f"{rel_dir}/{name}" if rel_dir else name
            full = os.path.join(dirpath, name)
            if name.startswith("."):
                rejections.append(Rejection(rel, "source", "hidden file: not read"))
                continue
            if os.path.islink(full):
                target = os.path.realpath(full)
                if os.path.commonpath([real_root, target]) != real_root:
                    rejections.append(Rejection(rel, "source", "symlink leaves the source folder: not followed"))
                    continue
            try:
                st = os.stat(full)
            except OSError as e:
                rejections.append(Rejection(rel, "source", f"unreadable: {e.strerror or e}"))
                continue
            yield rel, st


def _jsonl_lines(root: str, rel: str):
    """(line number, offset, length) of each non-blank line; blank lines are not records."""
    out, offset = [], 0
    with open(os.path.join(root, rel), "rb") as f:
        for number, line in enumerate(f, start=1):
            if line.strip():
                out.append((number, offset, len(line)))
            offset += len(line)
    return out


def _unique_keys(records: list[InputRecord]) -> list[InputRecord]:
    """Disambiguate colliding keys (e.g. 'a.jsonl' line 1 vs 'a/000001.txt') with a source hash."""
    by_key = defaultdict(list)
    for r in records:
        by_key[r.key].append(r)
    out = []
    for key, group in by_key.items():
        if len(group) == 1:
            out.append(group[0])
            continue
        for r in group:
            digest = hashlib.sha1(r.source.encode("utf-8")).hexdigest()[:8]
            out.append(InputRecord(f"{key}_{digest}", r.files, r.label, r.size, r.stamp, r.line))
    out.sort(key=lambda r: r.key)
    assert len({r.key for r in out}) == len(out), "sample keys must be unique"
    return out


def labels_on(setting: bool | None, subfolders: set[str], images: list[str]) -> bool:
    """--labels/--no-labels, else whether SRC has class subfolders: two or more first-level subfolders
    hold samples, or one holds every image (an image folder of one class). A text corpus kept in
    one folder (corpus/docs/*.txt) gets no labels."""
    if setting is not None:
        return setting
    if len(subfolders) >= 2:
        return True
    return len(subfolders) == 1 and bool(images) and all("/" in rel for rel in images)


def scan(cfg: BuildConfig) -> ScanResult:
    """List the raw folder into records sorted by key; everything passed over is a Rejection."""
    root = cfg.src
    if not os.path.isdir(root):
        raise FileNotFoundError(f"source folder {root!r} does not exist or is not a folder")
    rejections: list[Rejection] = []
    notes: list[str] = []
    groups: dict[tuple[str, str], list[tuple[str, str, os.stat_result]]] = defaultdict(list)
    jsonl: list[tuple[str, os.stat_result]] = []
    for rel, st in _walk(root, rejections, cfg.out, notes):
        stem, ext = os.path.splitext(rel)
        ext = ext.lower()
        if ext not in KNOWN_EXTS:
            rejections.append(Rejection(rel, "source", f"unsupported extension: {ext or '(none)'!r}"))
        elif ext in JSONL_EXTS:
            jsonl.append((rel, st))
        else:
            groups[(os.path.dirname(rel), stem)].append((rel, ext, st))
    top = {rel.split("/", 1)[0] for files in groups.values() for rel, _, _ in files if "/" in rel}
    top |= {rel.split("/", 1)[0] for rel, _ in jsonl if "/" in rel}
    labelled = labels_on(cfg.labels, top, [rel for files in groups.values() for rel, ext, _ in files
                                           if ext in IMAGE_EXTS])
    class_names = sorted(top) if labelled else []
    class_index = {c: i for i, c in enumerate(class_names)}

    def label(rel: str):
        return class_index.get(rel.split("/", 1)[0]) if labelled and "/" in rel else None

    records, kinds, image_exts = [], set(), set()
    for (_, stem), files in groups.items():
        files.sort()
        exts = [e for _, e, _ in files]
        n_img = sum(e in IMAGE_EXTS for e in exts)
        n_txt = sum(e in TEXT_EXTS for e in exts)
        n_arr = sum(e in ARRAY_EXTS for e in exts)
        if n_img > 1 or n_txt > 1 or n_arr > 1:
            what = "images" if n_img > 1 else "text files" if n_txt > 1 else "arrays"
            for rel, _, _ in files:
                rejections.append(Rejection(rel, "source", f"ambiguous sample: several {what} share the stem {stem!r}"))
            continue
        kinds |= {"image" if e in IMAGE_EXTS else "txt" if e in TEXT_EXTS else "array" if e in ARRAY_EXTS
                  else "json" for e in exts}
        image_exts |= {e[1:] for e in exts if e in IMAGE_EXTS}
        # The image (or the text) leads: its path is the record's source in reports.
        files.sort(key=lambda t: (t[1] not in IMAGE_EXTS, t[1] not in TEXT_EXTS, t[0]))
        records.append(InputRecord(
            make_key(stem), tuple(r for r, _, _ in files), label(files[0][0]),
            sum(st.st_size for _, _, st in files), tuple((st.st_size, st.st_mtime_ns) for _, _, st in files)))
    for rel, st in jsonl:
        stem = os.path.splitext(rel)[0]
        try:
            lines = _jsonl_lines(root, rel)
        except OSError as e:
            rejections.append(Rejection(rel, "source", f"unreadable: {e.strerror or e}"))
            continue
        if lines:
            kinds.add("txt")
        for number, offset, length in lines:
            records.append(InputRecord(f"{make_key(stem)}/{number:06d}", (rel,), label(rel), length,
                                       ((st.st_size, st.st_mtime_ns),), (number, offset, length)))
    records = _unique_keys(records)
    used = sorted({r.label for r in records if r.label is not None})
    classes = [class_names[i] for i in used] if labelled and used else None
    if classes is not None and len(used) != len(class_names):  # re-index onto classes that have samples
        remap = {old: new for new, old in enumerate(used)}
        records = [InputRecord(r.key, r.files, remap.get(r.label), r.size, r.stamp, r.line) for r in records]
    rejections.sort(key=lambda r: (r.path, r.stage, r.reason))
    return ScanResult(records, rejections, classes, kinds, notes, image_exts)


def _read_jsonl_line(root: str, rec: InputRecord, text_field: str) -> Sample:
    _, offset, length = rec.line
    with open(os.path.join(root, rec.files[0]), "rb") as f:
        f.seek(offset)
        return _jsonl_sample(rec, f.read(length), text_field)


def _jsonl_sample(rec: InputRecord, data: bytes, text_field: str) -> Sample:
    text, replaced = decode_text(data)
    try:
        obj = json.loads(text)
    except ValueError as e:
        raise RejectedInput(f"invalid JSON line: {e}") from None
    if not isinstance(obj, dict):
        raise RejectedInput("invalid JSON line: not an object")
    value = obj.pop(text_field, None)
    if not isinstance(value, str):
        raise RejectedInput(f"missing text field: no string {text_field!r} in the JSON line (choose it with --text-field)")
    fields = {"txt": value}
    if obj:
        fields["json"] = obj
    if rec.label is not None:
        fields["cls"] = rec.label
    return Sample(rec.key, fields, {"source": rec.source, "source_path": rec.files[0], "source_row": rec.line[0],
                                    "utf8_replaced": replaced})


def _jsonl_run(records: list[InputRecord], i: int) -> int:
    """End of the run of records from the same .jsonl file that starts at i."""
    j = i
    while j < len(records) and records[j].line is not None and records[j].files[0] == records[i].files[0]:
        j += 1
    return j


def read_records(root: str, records: list[InputRecord], text_field: str = "text"):
    """(record, Sample or RejectedInput) for each record, in order. The lines of one .jsonl file
    that follow each other are read with one open and one read, not one per line."""
    i = 0
    while i < len(records):
        if records[i].line is None:
            try:
                yield records[i], read_record(root, records[i], text_field)
            except RejectedInput as e:
                yield records[i], e
            i += 1
            continue
        j = _jsonl_run(records, i)
        lo, hi = records[i].line[1], max(r.line[1] + r.line[2] for r in records[i:j])
        try:
            with open(os.path.join(root, records[i].files[0]), "rb") as f:
                f.seek(lo)
                span = f.read(hi - lo)
        except OSError as e:
            span, error = None, RejectedInput(f"unreadable: {e.strerror or e}")
        for rec in records[i:j]:
            if span is None:
                yield rec, error
                continue
            try:
                yield rec, _jsonl_sample(rec, span[rec.line[1] - lo:rec.line[1] - lo + rec.line[2]], text_field)
            except RejectedInput as e:
                yield rec, e
        i = j


def read_record(root: str, rec: InputRecord, text_field: str = "text") -> Sample:
    """Read one record's files into a Sample: image → original bytes under 'image', txt, json, cls."""
    try:
        if rec.line is not None:
            return _read_jsonl_line(root, rec, text_field)
        sample = Sample(rec.key, {}, {"source": rec.source, "source_path": rec.files[0], "utf8_replaced": 0})
        for rel in rec.files:
            ext = os.path.splitext(rel)[1].lower()
            with open(os.path.join(root, rel), "rb") as f:
                data = f.read()
            if ext in IMAGE_EXTS:
                sample.fields["image"] = data
                sample.meta["image_ext"] = ext[1:]  # what `--encode keep` names the field
            elif ext in TEXT_EXTS:
                sample.fields["txt"], sample.meta["utf8_replaced"] = decode_text(data)
            elif ext in ARRAY_EXTS:
                sample.fields["array"] = data  # .npy bytes; the array stage parses them
            else:
                try:
                    sample.fields["json"] = json.loads(data)
                except ValueError as e:
                    raise RejectedInput(f"invalid JSON sidecar {rel!r}: {e}") from None
    except OSError as e:
        raise RejectedInput(f"unreadable: {e.strerror or e}") from None
    if rec.label is not None:
        sample.fields["cls"] = rec.label
    return sample
