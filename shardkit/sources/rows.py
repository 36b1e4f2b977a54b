"""Row files on the cluster: each .jsonl/.parquet/.tar file is counted by a task that writes its row index
(line numbers, byte offsets, cumulative size estimates) under OUT/.shardkit/scan and returns a few
numbers; tasks later read their rows by that index. The client never holds a per-row array."""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict

import numpy as np

from shardkit.contract import decode_text
from shardkit.errors import ConfigError, RejectedInput
from shardkit.sample import Sample
from shardkit.sources.index import INDEX_DTYPE, RowCount, RowRef, ScanOptions, load_index, row_key

INDEX_VERSION = 1
BLOCK = 4 << 20  # bytes read per step while indexing a jsonl file: bounds the task's memory
_WHITESPACE = np.zeros(256, bool)
_WHITESPACE[[9, 10, 11, 12, 13, 32]] = True  # what bytes.strip() removes: a line of only these is blank
# A JSON "\ud800" escape without its pair decodes to a lone surrogate, which no UTF-8 writer or
# encoder accepts: replaced like an invalid byte (and counted with them), or the line stops the run.
_LONE_SURROGATE = re.compile(r"[\ud800-\udfff]")



def _index_name(rf, opts: ScanOptions) -> str:
    """The index file's name: changes with the file's stats and with what the estimates depend on."""
    text = (f"{INDEX_VERSION}|{rf.stamp()}|{rf.kind}|{opts.image_estimate}|{opts.text_field}|{opts.image_field}|"
            f"{opts.label_field}|{opts.image_exts}")
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:24]


def jsonl_index(path: str, policy=None) -> tuple[np.ndarray, int]:
    """(index, lines in the file) of a jsonl file (a path or URL), vectorised over 4 MiB blocks; blank
    lines are no samples."""
    from shardkit.store import open_source

    parts, pending, line_no, line_start, pos = [], 0, 1, 0, 0
    with open_source(path, policy) as f:
        while block := f.read(BLOCK):
            a = np.frombuffer(block, np.uint8)
            nonws = np.concatenate(([0], np.cumsum(~_WHITESPACE[a], dtype=np.int32)))
            ends = np.flatnonzero(a == 10) + 1
            if len(ends):
                starts = np.concatenate(([0], ends[:-1]))
                counts = (nonws[ends] - nonws[starts]).astype(np.int64)
                counts[0] += pending
                gstart = pos + starts
                gstart[0] = line_start
                keep = counts > 0
                part = np.empty(int(keep.sum()), INDEX_DTYPE)
                part["number"] = (line_no + np.arange(len(ends)))[keep]
                part["offset"] = gstart[keep]
                part["length"] = (pos + ends - gstart)[keep]
                parts.append(part)
                line_no += len(ends)
                line_start = pos + int(ends[-1])
                pending = int(nonws[-1] - nonws[ends[-1]])
            else:
                pending += int(nonws[-1])
            pos += len(a)
    lines = line_no - 1
    if pos > line_start:  # a last line without a newline is a line too
        lines += 1
        if pending:
            part = np.empty(1, INDEX_DTYPE)
            part[0] = (line_no, line_start, pos - line_start, 0)
            parts.append(part)
    index = np.concatenate(parts) if parts else np.empty(0, INDEX_DTYPE)
    index["cum"] = np.cumsum(index["length"])  # a jsonl sample's size estimate is its line's length
    return index, lines


def counted(rf, opts: ScanOptions) -> RowCount | None:
    """The count of a row file from an earlier build, if the file did not change since."""
    from shardkit.store import join, read

    try:
        count = RowCount(**json.loads(read(join(opts.state_dir, _index_name(rf, opts)) + ".json", opts.policy)))
    except (OSError, ValueError, TypeError):
        return None
    # the files it names must still be there (a state folder cleaned by hand): else count again
    from shardkit.store import exists

    return count if all(exists(p, opts.policy) for p in (count.index, count.keys) if p) else None


def count_rows(rf, opts: ScanOptions) -> RowCount:
    """The counting task: write the row index of one row file (reused while the file is unchanged)."""
    from shardkit.store.remote import RemoteError
    from shardkit.store import join, makedirs, write, writer

    makedirs(opts.state_dir)
    base = join(opts.state_dir, _index_name(rf, opts))
    if (done := counted(rf, opts)) is not None:
        return done
    if rf.kind == "tar":
        from shardkit.sources.tars import count_tar

        return count_tar(rf, opts, base)
    path = join(opts.root, rf.rel)
    try:
        if rf.kind == "jsonl":
            index, top, info = *jsonl_index(path, opts.policy), {}
        else:
            from shardkit.sources.parquet_files import parquet_index

            index, top, info = parquet_index(path, opts)
    except ConfigError:
        raise
    except (OSError, ValueError, RemoteError) as e:  # pyarrow's errors for a broken file: ValueError / OSError
        if isinstance(e, RemoteError) and not e.not_found:
            raise  # a store that did not answer fails the task, naming the URL
        return RowCount(0, 0, 0, 0, 0, "", error=f"unreadable: {getattr(e, 'detail', None) or getattr(e, 'strerror', None) or e}")

    with writer(base + ".npy", policy=opts.policy) as f:
        np.save(f, index)
    count = RowCount(len(index), int(index["number"][0]) if len(index) else 0,
                     int(index["number"][-1]) if len(index) else 0, top,
                     int(index["cum"][-1]) if len(index) else 0, base + ".npy", info)
    write(base + ".json", json.dumps(asdict(count), sort_keys=True), opts.policy)  # last: marks the index complete
    return count


def parse_jsonl_line(data: bytes, key: str, source: str, text_field: str, number: int | None = None) -> Sample:
    """One jsonl line → a Sample (txt, and json for the other keys); a bad line is a RejectedInput."""
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
    if not value.isascii():
        value, lone = _LONE_SURROGATE.subn("\ufffd", value)
        replaced += lone
    fields = {"txt": value}
    if obj:
        fields["json"] = obj
    path = source.rsplit(":", 1)[0]
    return Sample(key, fields, {"source": source, "source_path": path, "source_row": number, "utf8_replaced": replaced})


def jsonl_rows(opts: ScanOptions, rf, count: RowCount, start: int, stop: int, keys=None):
    """RowRefs of rows [start, stop) of a jsonl file, read with one seek; `keys` overrides the row keys."""
    rows = load_index(count, opts.policy)[start:stop]
    if not len(rows):
        return
    from shardkit.store import join, read_source

    lo = int(rows["offset"][0])
    data = read_source(join(opts.root, rf.rel), lo, int(rows["offset"][-1] + rows["length"][-1]), opts.policy)
    if len(data) < int(rows["offset"][-1] + rows["length"][-1]) - lo:
        raise ValueError(f"{rf.rel} is shorter than when it was counted")
    width = count.width
    for i, (number, offset, length) in enumerate(zip(rows["number"].tolist(), rows["offset"].tolist(),
                                                     rows["length"].tolist())):
        key = keys[i] if keys is not None else row_key(rf.stem_key, number, width)
        line = data[offset - lo:offset - lo + length]
        source = f"{rf.rel}:{number}"
        yield RowRef(source, lambda line=line, key=key, source=source, number=number:
                     parse_jsonl_line(line, key, source, opts.text_field, number))
