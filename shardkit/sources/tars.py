"""WebDataset tar shards as a source: one listing entry per .tar, its samples counted on the cluster.

A tar is read as the folder it would extract to, named by its stem (as `docs.jsonl` line 7 is
`docs/000007`): members are grouped by key (WebDataset's rule: the name up to the first dot of its
last part; a sample's members are consecutive) and their extensions become fields, as files beside
each other do in a raw folder: an image (`jpg`, `png`, `webp`, ...), `txt`, `json` (metadata), and
`cls` (the label). `shards/00012.tar` member `000120034.jpg` is sample `shards/00012/000120034`.

A counting task streams the tar's headers (sources.tar_members: data is skipped, never held) and
writes the row index of its samples in key order (byte span of each sample's members, size
estimate) and a keys file (keys, where each field lies in its span); the client gets a few
numbers. A work unit reads its samples' spans by offset (sources.tar_rows). A damaged member, a
damaged header or a truncated end rejects only the samples it touches, each with its reason; the
rest of the tar is built.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import asdict, dataclass, field

import numpy as np

from shardkit.errors import ConfigError
from shardkit.store.remote import RemoteError
from shardkit.sample import make_key
from shardkit.sources import tar_members as T
from shardkit.sources.index import INDEX_DTYPE, RowCount
from shardkit.sources.walk import IMAGE_EXTS, TEXT_EXTS

IMAGES = frozenset(e[1:] for e in IMAGE_EXTS)
TEXTS = frozenset(e[1:] for e in TEXT_EXTS)
FIELDS = {**{e: "image" for e in IMAGES}, **{e: "txt" for e in TEXTS}, "json": "json", "cls": "cls"}
CLS_MEMBERS = -2  # Inventory.row_labels of a tar whose labels are its `cls` members
MAX_CLS_BYTES = 32  # a cls member is a class number; a longer one is not read as a label
MAX_CLASSES = 1_000_000  # cls members label at most this many classes (the manifest lists them all)
_NAME = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")  # webdataset's base_plus_ext: key, all extensions
META = re.compile(r"__[^/]*__($|/)")  # webdataset's metadata members (`__index__.json`), never samples


def open_source(root: str, rel: str, policy=None):
    """The one place a source tar is opened (a local path, or a URL: store.open_source: bounded,
    retried reads that resume where they stopped, waiting as `policy`, the job's RemotePolicy), seekable."""
    import shardkit.store as store

    return store.open_source(store.join(root, rel), policy)


def split_name(name: str) -> tuple[str | None, str | None]:
    """(key, lowercase extension) of a member name, as WebDataset groups them; (None, None) for none.
    A leading `./` or `/` goes, as extracting the tar drops it (`tar cf x.tar -C folder .`)."""
    while name.startswith(("./", "/")):
        name = name[1:].lstrip("/")
    match = _NAME.match(name)
    return (match.group(1), match.group(2).lower()) if match else (None, None)


NOT_UTF8 = "member name is not valid UTF-8: keys, shards and reports are UTF-8 text (rename it, e.g. with `convmv`, and pack the tar again)"


def printable(name: str) -> str:
    """A member name for errors.jsonl and the screen: bytes that are not UTF-8 (kept by the header reader
    as lone surrogates) shown as \\xNN escapes."""
    return name.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def passed_over(name: str) -> str | None:
    """Why a regular member is no part of a sample (a name that is not UTF-8, hidden, WebDataset metadata,
    no extension), or None."""
    if printable(name) != name:
        return NOT_UTF8
    key = split_name(name)[0]
    if name.rstrip("/").rsplit("/", 1)[-1].startswith("."):  # .DS_Store, macOS tar's ._name files
        return "hidden member"
    if key is None:
        return "no extension"
    return "WebDataset metadata member" if META.match(key) else None


@dataclass
class _Group:
    """One sample of the tar while counting: its members' byte span and what they hold."""

    key: str
    number: int  # position among the tar's samples, in file order
    start: int
    end: int
    sizes: dict = field(default_factory=dict)  # extension -> bytes (every member of the key)
    layout: list = field(default_factory=list)  # [extension, data offset in the span, bytes] of fields
    problem: str | None = None
    cls: int | None = None


class _Count:
    """Members → samples of one tar, with everything passed over (counted, never silent)."""

    def __init__(self, rel: str, f):
        self.rel, self.f = rel, f
        self.groups: list[_Group] = []
        self.passed: dict[str, list] = {}  # reason -> [members, first member name]
        self.rejections: list[list[str]] = []  # [source, reason]
        self.pending = None  # (key or None, reason, offset) of a damaged header, until the next sample starts
        self.seen = 0  # members that could belong to a sample
        self.no_header = False  # the file does not start with a valid header

    def pass_over(self, reason: str, name: str) -> None:
        self.passed.setdefault(reason, [0, printable(name)])[0] += 1

    def member(self, m: T.Member) -> None:
        if not m.regular:
            self.pass_over("not a regular file (a link or device)", m.name)
            return
        if reason := passed_over(m.name):
            self.pass_over(reason, m.name)
            return
        key, ext = split_name(m.name)
        self.seen += 1
        g = self.groups[-1] if self.groups else None
        if g is None or g.key != key:
            g = self._new_group(key, m.start)
        else:
            if ext in g.sizes:
                g.problem = g.problem or f"ambiguous sample: two members named {m.name!r}"
            if self.pending is not None and self.pending[0] is None:
                self.pending = None  # the damaged header lay inside this sample, which carries it
        g.end, g.sizes[ext] = m.end, m.size
        if ext in FIELDS:
            g.layout.append([ext, m.data - g.start, m.size])
        if ext not in FIELDS:
            self.pass_over(f"unsupported extension: {'.' + ext!r}", m.name)
        elif ext == "cls" and m.size <= MAX_CLS_BYTES:
            g.cls = parse_cls(T.read_at(self.f, m.data, m.size))

    def _new_group(self, key: str, start: int) -> _Group:
        g = _Group(key, len(self.groups), start, start)
        if self.pending is not None:
            damaged, reason, _ = self.pending
            if damaged is None or damaged == key:
                g.problem = reason
            if damaged != key:  # a sample between the two may be lost whole
                self._lost()
            self.pending = None
        self.groups.append(g)
        return g

    def _lost(self) -> None:
        damaged, reason, start = self.pending
        if damaged is None:
            self.rejections.append([f"{self.rel}@{start}", reason.split(";", 1)[0]])
        else:
            self.rejections.append([f"{self.rel}:{printable(damaged)}", reason])

    def damage(self, d: T.Damage) -> None:
        """A damaged header: its sample is rejected when its name still reads, else the samples on both
        sides (each may have lost the member), and the span itself when a whole sample may be lost."""
        self.no_header |= d.start == 0
        key = split_name(d.name)[0] if d.name else None
        where = f"bytes {d.start:,}-{d.stop:,} skipped to the next valid header"
        g = self.groups[-1] if self.groups else None
        if key is None:
            reason = f"damaged tar header: {where}; this sample may lack a member"
            if g is not None:
                g.problem = g.problem or reason
        else:
            reason = f"damaged tar header: member {d.name!r} lost ({where})"
            if g is not None and g.key == key:
                g.problem = g.problem or reason
                return
        if self.pending is not None:
            self._lost()
        self.pending = (key, reason, d.start)

    def truncated(self, t: T.Truncated) -> None:
        g = self.groups[-1] if self.groups else None
        key = split_name(t.name)[0] if t.name else None
        if t.name is None:
            reason = (f"truncated tar: the file ends at byte {t.at:,} without the end-of-archive blocks; "
                      "this sample may lack members")
        else:
            reason = f"truncated tar: the file ends at byte {t.at:,}, inside member {printable(t.name)!r}"
        if g is not None and (key is None or g.key == key):
            g.problem = g.problem or reason
        elif key is not None:
            self.rejections.append([f"{self.rel}:{printable(key)}", reason])

    def finish(self) -> list[_Group]:
        """The samples to build; the others become rejections (duplicate keys, no content, ...)."""
        if self.pending is not None:
            self._lost()
        seen: dict[str, int] = {}
        for g in self.groups:
            seen[g.key] = seen.get(g.key, 0) + 1
        good = []
        for g in self.groups:
            problem = g.problem or _problem(g, seen[g.key])
            if problem:
                self.rejections.append([f"{self.rel}:{g.key}", problem])
            elif any(ext in FIELDS for ext in g.sizes):
                good.append(g)
        for reason, (n, example) in sorted(self.passed.items()):
            self.rejections.append([self.rel, f"{reason}, {n:,} member(s) not read (e.g. {example!r})"])
        return good


def _problem(g: _Group, times: int) -> str | None:
    """Why a sample cannot be built from its members, as the raw folder says it of files."""
    if times > 1:
        return (f"ambiguous sample: key {g.key!r} appears {times} times in the tar, apart (a WebDataset "
                "sample's members are consecutive)")
    kinds = [FIELDS[ext] for ext in g.sizes if ext in FIELDS]
    for kind, what in (("image", "images"), ("txt", "text members")):
        if kinds.count(kind) > 1:
            return f"ambiguous sample: several {what} share the key {g.key!r}"
    if kinds and set(kinds) == {"cls"}:
        return "no content: only a cls member (a label without an image, text or json)"
    return None


def parse_cls(data: bytes) -> int | None:
    """A cls member's class number (webdataset writes `str(int)`), or None if it holds none."""
    try:
        return int(data.decode("ascii").strip())
    except (UnicodeDecodeError, ValueError):
        return None


def _estimate(g: _Group, image_estimate: int | None) -> int:
    """Estimated stored bytes: a resized image by its pixels, the other members as they are."""
    sizes = {ext: n for ext, n in g.sizes.items() if ext in FIELDS}
    images = sum(n for ext, n in sizes.items() if ext in IMAGES)
    if image_estimate is not None and images:
        return image_estimate + sum(sizes.values()) - images
    return sum(sizes.values())


def _info(groups: list[_Group], rejections: list) -> dict:
    exts = {ext for g in groups for ext in g.sizes if ext in FIELDS}
    labelled = [g.cls for g in groups if g.cls is not None and g.cls >= 0 and "cls" in g.sizes]
    return {"kinds": sorted({FIELDS[e] for e in exts} - {"cls"}), "image_exts": sorted(exts & IMAGES),
            "cls": {"samples": len(labelled), "max": max(labelled, default=-1)}, "rejections": rejections}


def _write_index(groups: list, keys: list[str], opts, base: str) -> np.ndarray:
    """Writes a tar's row index (base.npy) and keys file (base.keys.arrow), samples in key order; returns the index."""
    import pyarrow as pa

    from shardkit.store import writer

    order = sorted(range(len(groups)), key=keys.__getitem__)
    index = np.empty(len(groups), INDEX_DTYPE)
    index["number"] = [groups[i].number for i in order]
    index["offset"] = [groups[i].start for i in order]
    index["length"] = [groups[i].end - groups[i].start for i in order]
    index["cum"] = np.cumsum([_estimate(groups[i], opts.image_estimate) for i in order]) if order else []
    with writer(base + ".npy", policy=opts.policy) as f:
        np.save(f, index)
    # Where each field's bytes lie in the sample's span: a unit slices them out without parsing headers.
    layout = pa.list_(pa.struct([("ext", pa.string()), ("offset", pa.int64()), ("size", pa.int64())]))
    table = pa.table({"key": pa.array([keys[i] for i in order], pa.string()),
                      "member": pa.array([groups[i].key for i in order], pa.string()),
                      "layout": pa.array([[dict(zip(("ext", "offset", "size"), m)) for m in groups[i].layout]
                                          for i in order], layout)})
    with writer(base + ".keys.arrow", policy=opts.policy) as f, pa.ipc.new_file(f, table.schema) as ipc:
        ipc.write_table(table)
    return index


def count_tar(rf, opts, base: str) -> RowCount:
    """The counting task of one tar: its row index (samples in key order), keys file and count,
    written under `base` (.npy, .keys.arrow, then .json last: it marks the count complete)."""
    from shardkit.store import write

    try:
        with open_source(opts.root, rf.rel, opts.policy) as f:
            size = f.seek(0, os.SEEK_END)
            count = _Count(rf.rel, f)
            for event in T.members(f, size):
                if isinstance(event, T.Member):
                    count.member(event)
                elif isinstance(event, T.Damage):
                    count.damage(event)
                else:
                    count.truncated(event)
            groups = count.finish()
    except (OSError, RemoteError) as e:
        if isinstance(e, RemoteError) and not e.not_found:
            raise  # a store that did not answer fails the task, naming the URL
        return RowCount(0, 0, 0, 0, 0, "", error=f"unreadable: {getattr(e, 'strerror', None) or e}")
    if not count.seen and (size == 0 or count.no_header):
        return RowCount(0, 0, 0, 0, 0, "", error=_not_a_tar(size))
    groups, keys = _unique(rf, groups, count.rejections)
    index = _write_index(groups, keys, opts, base)
    rows = len(index)
    result = RowCount(rows, 0, max(rows - 1, 0), max(rows - 1, 0), int(index["cum"][-1]) if rows else 0,
                      base + ".npy", keys=base + ".keys.arrow", tar=_info(groups, count.rejections))
    write(base + ".json", json.dumps(asdict(result), sort_keys=True), opts.policy)  # last: marks the count complete
    return result


def _unique(rf, groups: list[_Group], rejections: list) -> tuple[list[_Group], list[str]]:
    """The samples whose keys are the tar's own, with their keys: members whose names differ only in what
    the key sanitising drops would give one key twice (the other sources' keys are checked later, by
    key_order); every sample of such a key is rejected, whatever their order in the tar."""
    keys = [f"{rf.stem_key}/{make_key(g.key)}" for g in groups]
    times: dict[str, list[str]] = {}
    for g, key in zip(groups, keys):
        times.setdefault(key, []).append(g.key)
    if all(len(names) == 1 for names in times.values()):
        return groups, keys
    for key, names in sorted(times.items()):
        for name in sorted(names) if len(names) > 1 else []:
            rejections.append([f"{rf.rel}:{name}", f"ambiguous sample: the members {sorted(names)!r} of one tar all "
                                                   f"give the key {key!r}; rename them apart"])
    kept = [(g, k) for g, k in zip(groups, keys) if len(times[k]) == 1]
    return [g for g, _ in kept], [k for _, k in kept]


def _not_a_tar(size: int) -> str:
    if size == 0:
        return "empty file: a .tar of no bytes"
    return ("not a tar file: no valid tar header where members were due (a compressed tar? shardkit reads "
            "uncompressed .tar: decompress it first)")


def tar_rejections(row_files, counts) -> list[tuple[str, str]]:
    """(path, reason) of everything the counting tasks passed over inside tars."""
    return [tuple(r) for rf in row_files if rf.kind == "tar" for r in counts[rf.id].tar.get("rejections", [])]


def tar_labels(row_files, counts, cfg) -> tuple[list[str] | None, dict | None, list[str]]:
    """(classes, row labels, notes) when the tars' cls members are the labels, else (None, None, notes).

    cls members label their samples when some tar has them and no other label source was asked
    for (--labels, --no-labels, --label-field): classes are "0".."max", folder labels are not used
    (two numberings cannot share one class list), and samples without a cls member have no label."""
    tars = [rf for rf in row_files if rf.kind == "tar" and counts[rf.id].tar.get("cls", {}).get("samples")]
    if not tars:
        return None, None, []
    if cfg.labels is not None or cfg.label_field:
        flag = "--label-field" if cfg.label_field else "--labels" if cfg.labels else "--no-labels"
        return None, None, [f"{len(tars)} tar(s) hold cls members: not used as labels ({flag})"]
    top, where = max((counts[rf.id].tar["cls"]["max"], rf.rel) for rf in tars)
    if top >= MAX_CLASSES:  # the class list holds a name per class
        raise ConfigError(f"the cls members of {where} go up to {top:,}: more than {MAX_CLASSES:,} classes, too many "
                          "for the class list; build with --no-labels (cls members are then not read) or "
                          "number the classes from 0")
    ids = {rf.id for rf in tars}
    note = (f"labels: the cls members of {len(tars)} tar(s), classes 0..{top}; folder labels are not used "
            "(--labels uses them instead)")
    return [str(i) for i in range(top + 1)], {rf.id: CLS_MEMBERS if rf.id in ids else -1 for rf in row_files}, [note]
