"""Tar members streamed header by header: names, offsets and sizes, and where the file is damaged.

Python's tarfile ends its iteration silently at a damaged header in mid-archive, and at a file cut
short between members, so every member after the damage would be dropped without a word. This
reads the headers itself (each one checksum-checked and parsed as `tarfile.TarInfo.frombuf` does,
GNU long names and pax records applied here) and reports the damage: a `Damage` span skipped up to
the next valid header, a `Truncated` end. Member data is skipped by seeking, never read, so a
listing reads 512 bytes (plus long names) per member and never holds a whole tar.
"""

from __future__ import annotations

import re
import tarfile
from dataclasses import dataclass

BLOCK = tarfile.BLOCKSIZE
MAX_META = 1 << 20  # a long name or pax header larger than this is damage, not a name
RESYNC_READ = 64 << 10  # bytes read at a time while looking for the next valid header
_PAX_RECORD = re.compile(rb"(\d+) ([^=]+)=")
_META_TYPES = frozenset({tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK, tarfile.XHDTYPE,
                         tarfile.SOLARIS_XHDTYPE, tarfile.XGLTYPE})
_FILE_TYPES = frozenset({tarfile.REGTYPE, tarfile.AREGTYPE, tarfile.CONTTYPE})
# Member types without data blocks (tarfile's rule: regular files and unknown types have data).
_NO_DATA = frozenset(tarfile.SUPPORTED_TYPES) - frozenset(tarfile.REGULAR_TYPES)


@dataclass(frozen=True, slots=True)
class Member:
    """One member: its name, its first header block (long-name and pax blocks included), its data."""

    name: str
    start: int
    data: int
    size: int
    regular: bool  # a file (not a link or device; folders are not yielded)

    @property
    def end(self) -> int:
        return self.data + self.size


@dataclass(frozen=True, slots=True)
class Damage:
    """Bytes [start, stop) that hold no valid header where one was due: skipped to the next one."""

    start: int
    stop: int
    name: str | None  # the member name the damaged header still shows, if readable


@dataclass(frozen=True, slots=True)
class Truncated:
    """The file ends early: inside member `name`, or (name None) after a member, without the
    end-of-archive blocks (what is cut off there is unknown)."""

    at: int
    name: str | None


def header(block: bytes) -> tuple[str, int, bytes]:
    """(name, size, type) of a 512-byte header, as `tarfile.TarInfo.frombuf` reads them, which parses
    every field and sums the bytes twice (~100 us a header: it was most of a tar build's overhead with
    `--encode keep`); `tarfile.HeaderError` when the checksum fails. Numeric fields nobody reads here
    (mode, owner, times) are not checked: the checksum is the header's integrity check."""
    field = block[148:156]
    try:
        stored = tarfile.nti(field)
    except tarfile.HeaderError:
        raise tarfile.InvalidHeaderError("bad checksum") from None
    if stored != sum(block) - sum(field) + 256:  # unsigned: what every tar writes; else tarfile decides
        info = tarfile.TarInfo.frombuf(block, "utf-8", "surrogateescape")
        return info.name, info.size, info.type
    kind, name = block[156:157], tarfile.nts(block[:100], "utf-8", "surrogateescape")
    if kind == tarfile.AREGTYPE and name.endswith("/"):
        kind = tarfile.DIRTYPE
    if kind == tarfile.DIRTYPE:
        name = name.rstrip("/")
    prefix = tarfile.nts(block[345:500], "utf-8", "surrogateescape")
    if prefix and kind not in tarfile.GNU_TYPES:
        name = prefix + "/" + name
    return name, tarfile.nti(block[124:136]), kind


def padded(n: int) -> int:
    return (n + BLOCK - 1) // BLOCK * BLOCK


def read_at(f, pos: int, n: int) -> bytes:
    f.seek(pos)
    return f.read(n)


def _pax(payload: bytes) -> dict:
    """The `path` and `size` records of a pax header (the others do not change what is read)."""
    out, pos = {}, 0
    while match := _PAX_RECORD.match(payload, pos):
        length, key = int(match.group(1)), match.group(2)
        value = payload[match.end():pos + length - 1]
        if length <= 0:
            break
        if key == b"path":
            out["path"] = value.decode("utf-8", "surrogateescape")
        elif key == b"size":
            out["size"] = int(value)
        pos += length
    return out


def name_hint(block: bytes) -> str | None:
    """The name field of a header that failed its checksum, when it still reads as a name."""
    raw = block[:100].split(b"\0", 1)[0]
    try:
        name = raw.decode("utf-8")
    except UnicodeDecodeError:
        return None
    return name if name and name.isprintable() else None


def _resync(f, pos: int, size: int) -> int:
    """The offset of the first valid header at or after `pos` (a block boundary), or `size`."""
    while pos < size:
        chunk = read_at(f, pos, min(RESYNC_READ, size - pos))
        if not chunk:
            return size
        for at in range(0, len(chunk) - BLOCK + 1, BLOCK):
            block = chunk[at:at + BLOCK]
            if block.count(0) == BLOCK:
                continue
            try:
                header(block)
            except tarfile.HeaderError:
                continue
            return pos + at
        pos += len(chunk) - len(chunk) % BLOCK or BLOCK
    return size


def _damaged(f, start: int, after: int, size: int, block: bytes):
    """Yields the Damage from `start` to the next header found from `after` on; returns that header's offset."""
    stop = _resync(f, after, size)
    yield Damage(start, stop, name_hint(block))
    return stop


def _read_meta(f, kind: bytes, data: int, length: int, extra: dict) -> None:
    """Adds what a meta member at `data` says of the next member to `extra`: its GNU long name, or its pax records."""
    payload = read_at(f, data, length)
    if kind == tarfile.GNUTYPE_LONGNAME:
        extra["path"] = payload.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
    elif kind in (tarfile.XHDTYPE, tarfile.SOLARIS_XHDTYPE):
        extra.update(_pax(payload))


def members(f, size: int):
    """Members (folders left out), Damage and Truncated events of the tar in `f` (a seekable binary file
    of `size` bytes), in file order. The end is clean when the file ends in end-of-archive (zero) blocks; a
    `Truncated` event says it does not."""
    pos, start, extra, zeros = 0, None, {}, False
    while pos < size:
        block = read_at(f, pos, BLOCK)
        if len(block) < BLOCK:
            yield Truncated(size, None if block.count(0) == len(block) else name_hint(block))
            return
        if block.count(0) == BLOCK:  # end-of-archive; another archive may follow (cat a.tar b.tar)
            zeros, pos = True, pos + BLOCK
            continue
        try:
            name, length, kind = header(block)
        except tarfile.HeaderError:
            pos, start, extra = (yield from _damaged(f, pos, pos + BLOCK, size, block)), None, {}
            continue
        zeros, start = False, pos if start is None else start
        data = pos + BLOCK
        if kind in _META_TYPES:
            if length > MAX_META or data + length > size:
                pos, start, extra = (yield from _damaged(f, start, data, size, block)), None, {}
                continue
            _read_meta(f, kind, data, length, extra)
            pos = data + padded(length)
            continue
        length = 0 if kind in _NO_DATA else extra.get("size", length)
        name = extra.get("path", name)
        if data + length > size:
            yield Truncated(size, name)
            return
        if kind != tarfile.DIRTYPE:  # folders are structure, as the walk of a folder treats them
            yield Member(name, start, data, length, kind in _FILE_TYPES)
        pos, start, extra = data + padded(length), None, {}
    if not zeros:
        yield Truncated(size, None)
