"""Reading a tar's samples in a task: each sample's span (its members, headers included) read by offset
through the one opener (sources.tars.open_source), its members made into fields."""

from __future__ import annotations

import io
import json
import os
import weakref

from shardkit.contract import decode_text
from shardkit.errors import RejectedInput
from shardkit.sample import Sample
from shardkit.sources import tar_members as T
from shardkit.sources.index import RowCount, RowRef, keys_of, keys_table, load_index
from shardkit.sources.tars import FIELDS, IMAGES, MAX_CLS_BYTES, open_source, parse_cls, passed_over, split_name


class _Spans:
    """Reads sample spans from one open tar; closes it after the last (or when dropped)."""

    def __init__(self, f, reads: int):
        self.f, self.left = f, reads
        weakref.finalize(self, f.close)

    def read(self, offset: int, length: int) -> bytes:
        self.f.seek(offset)
        data = self.f.read(length)
        self.left -= 1
        if self.left <= 0:
            self.f.close()
        return data


def tar_rows(opts, rf, count: RowCount, start: int, stop: int, keys=None, cls: bool = False):
    """RowRefs of rows [start, stop) of a tar, in key order; `keys` overrides the row keys, `cls`
    reads the cls members as labels. The tar is opened here (a vanished or resized file fails now:
    its rows are rejected, see sources.read) and each sample's span is read when its RowRef makes it;
    its fields are sliced where the count found them (the keys file's layout column)."""
    rows = load_index(count, opts.policy)[start:stop]
    if not len(rows):
        return
    keys = keys if keys is not None else keys_of(rf.stem_key, count, start, stop, opts.policy)
    table = keys_table(count.keys, opts.policy).slice(start, stop - start)
    names, layouts = table.column("member").to_pylist(), table.column("layout").to_pylist()
    f = open_source(opts.root, rf.rel, opts.policy)
    if f.seek(0, os.SEEK_END) != rf.size:
        f.close()
        raise ValueError(f"{rf.rel} is no longer the size it was counted at")
    spans = _Spans(f, len(rows))
    for i, (number, offset, length) in enumerate(zip(rows["number"].tolist(), rows["offset"].tolist(),
                                                     rows["length"].tolist())):
        def make(number=number, offset=offset, length=length, key=keys[i], member=names[i], layout=layouts[i]):
            span = _checked(spans.read(offset, length), length)
            sample = Sample(key, {}, {"source": f"{rf.rel}:{member}", "source_path": rf.rel, "source_row": number,
                                      "utf8_replaced": 0})
            for m in layout:
                at = m["offset"]
                _add_member(sample, f"{member}.{m['ext']}", m["ext"], span[at:at + m["size"]], cls)
            return sample

        yield RowRef(f"{rf.rel}:{names[i]}", make)


def _checked(span: bytes, length: int) -> bytes:
    if len(span) < length:
        raise RejectedInput("unreadable: the tar is shorter than when it was counted (it changed while the "
                            "build ran?)")
    return span


def parse_span(span: bytes, length: int, key: str, member: str | None, rel: str, number: int,
               cls: bool) -> Sample:
    """One sample from the bytes of its members (headers included): image, txt, json, and cls when
    `cls`. A member that does not parse rejects the sample, naming the member. `member`: the key
    its members must have (None: any one key)."""
    span = _checked(span, length)
    source = f"{rel}:{key if member is None else member}"
    sample = Sample(key, {}, {"source": source, "source_path": rel, "source_row": number, "utf8_replaced": 0})
    for m in T.members(io.BytesIO(span), len(span)):
        if isinstance(m, T.Truncated):  # a span ends at its last member, without end-of-archive blocks
            continue
        if isinstance(m, T.Member) and (not m.regular or passed_over(m.name)):
            continue  # passed over (and counted) when the tar was counted
        name_key, ext = split_name(m.name) if isinstance(m, T.Member) else (None, None)
        member = name_key if member is None else member
        if name_key is None or name_key != member:
            raise RejectedInput("unreadable: the tar changed since it was counted (its members moved); rerun "
                                "the build")
        _add_member(sample, m.name, ext, span[m.data:m.end], cls)
    return sample


def _add_member(sample: Sample, name: str, ext: str, data: bytes, cls: bool) -> None:
    kind = FIELDS.get(ext)
    if kind == "image":
        sample.fields["image"] = data
        sample.meta["image_ext"] = ext  # what `--encode keep` names the field
    elif kind == "txt":
        sample.fields["txt"], sample.meta["utf8_replaced"] = decode_text(data)
    elif kind == "json":
        try:
            sample.fields["json"] = json.loads(data)
        except ValueError as e:
            raise RejectedInput(f"invalid JSON member {name!r}: {e}") from None
    elif kind == "cls" and cls:
        label = parse_cls(data) if len(data) <= MAX_CLS_BYTES else None
        if label is None or label < 0:
            shown = data[:MAX_CLS_BYTES].decode("utf-8", "replace")
            raise RejectedInput(f"bad label: member {name!r} holds {shown!r}, expected a class number >= 0 "
                                "(build without the tar labels: --no-labels)")
        sample.fields["cls"] = label


def first_images(root: str, rels: list[str], n: int, policy=None) -> list[bytes]:
    """The first n image members of these tars, in order (what the worker-pool probe measures on)."""
    out = []
    for rel in rels:
        try:
            with open_source(root, rel, policy) as f:
                size = f.seek(0, os.SEEK_END)
                for m in T.members(f, size):
                    if isinstance(m, T.Member) and m.regular and split_name(m.name)[1] in IMAGES:
                        out.append(T.read_at(f, m.data, m.size))
                        if len(out) == n:
                            return out
        except OSError:
            continue  # unreadable: the build's to reject, not the probe's
    return out
