"""Where each value of an uncompressed, PLAIN-encoded Parquet column lies in the file.

shardkit writes media and fixed-size columns without compression or dictionary, so a value's
bytes sit in the file as they are. Reading one sample then needs no row-group decode: the
reader maps the file and slices the value out, as the tar reader does. The offsets come from
the page headers (Thrift compact protocol), parsed once per column chunk. Anything else
(compressed, dictionary-encoded, nested, an unexpected header) gives None, and the caller reads
row groups through pyarrow instead.
"""

from __future__ import annotations

import numpy as np

DATA_PAGE, DICTIONARY_PAGE, DATA_PAGE_V2 = 0, 2, 3
PLAIN = 0


class Unsupported(Exception):
    """This column chunk cannot be sliced by offset (the caller falls back to pyarrow)."""


def _varint(buf, pos: int) -> tuple[int, int]:
    shift = result = 0
    while True:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise Unsupported("varint too long")


def _zigzag(n: int) -> int:
    return (n >> 1) ^ -(n & 1)


def _value(buf, pos: int, kind: int, lists: bool = False):
    """One Thrift compact value of type `kind` at pos -> (value, next pos); binaries are skipped, and
    lists too unless `lists` (then a list of their values)."""
    if kind in (1, 2):  # booleans live in the field header
        return kind == 1, pos
    if kind == 3:
        return buf[pos], pos + 1
    if kind in (4, 5, 6):
        v, pos = _varint(buf, pos)
        return _zigzag(v), pos
    if kind == 7:
        return None, pos + 8
    if kind == 8:  # statistics min/max can be large: skip them
        n, pos = _varint(buf, pos)
        return None, pos + n
    if kind in (9, 10):
        head = buf[pos]
        pos += 1
        size, elem = head >> 4, head & 0x0F
        if size == 15:
            size, pos = _varint(buf, pos)
        items = []
        for _ in range(size):
            item, pos = (buf[pos] == 1, pos + 1) if elem in (1, 2) else _value(buf, pos, elem, lists)
            items.append(item)
        return (items if lists else None), pos
    if kind == 11:
        size, pos = _varint(buf, pos)
        if size:
            kv = buf[pos]
            pos += 1
            for _ in range(size):
                _, pos = _value(buf, pos, kv >> 4, lists)
                _, pos = _value(buf, pos, kv & 0x0F, lists)
        return None, pos
    if kind == 12:
        return struct(buf, pos, lists)
    raise Unsupported(f"unknown Thrift type {kind}")


def struct(buf, pos: int, lists: bool = False) -> tuple[dict, int]:
    """A Thrift compact struct at pos -> ({field id: value}, next pos); `lists`: with the values of
    its lists (else None for each)."""
    fields, last = {}, 0
    while True:
        head = buf[pos]
        pos += 1
        if head == 0:
            return fields, pos
        delta, kind = head >> 4, head & 0x0F
        if delta:
            fid = last + delta
        else:
            v, pos = _varint(buf, pos)
            fid = _zigzag(v)
        fields[fid], pos = _value(buf, pos, kind, lists)
        last = fid


def present_levels(buf, pos: int, end: int, count: int) -> np.ndarray:
    """Definition levels of bit width 1 (RLE / bit-packed hybrid) -> a mask of non-null values."""
    out = np.empty(count, bool)
    i = 0
    while i < count:
        if pos >= end:
            raise Unsupported("definition levels end early")
        head, pos = _varint(buf, pos)
        if head & 1:  # bit-packed: (head >> 1) groups of 8 values, one byte per group
            groups = head >> 1
            bits = np.unpackbits(np.frombuffer(buf[pos:pos + groups], np.uint8), bitorder="little")
            take = min(count - i, len(bits))
            out[i:i + take] = bits[:take]
            pos += groups
        else:
            take = min(count - i, head >> 1)
            out[i:i + take] = bool(buf[pos])
            pos += 1
        i += take
    return out


def _page(buf, pos: int, max_def: int):
    """One data page at pos -> (mask of non-null rows, first value byte, page end)."""
    header, data = struct(buf, pos)
    kind, size = header.get(1), header.get(3)
    end = data + size
    if kind == DATA_PAGE:
        page = header[5]
        if page.get(2) != PLAIN:
            raise Unsupported("not PLAIN")
        count, values = page[1], data
        present = np.ones(count, bool)
        if max_def:
            length = int.from_bytes(buf[data:data + 4], "little")
            present = present_levels(buf, data + 4, data + 4 + length, count)
            values = data + 4 + length
        return present, values, end
    if kind == DATA_PAGE_V2:
        page = header[8]
        if page.get(4) != PLAIN or page.get(6, 0):
            raise Unsupported("not PLAIN, or repeated")
        count, levels = page[3], page.get(5, 0)
        present = present_levels(buf, data, data + levels, count) if max_def else np.ones(count, bool)
        return present, data + levels, end
    raise Unsupported(f"page type {kind}")


def value_offsets(buf, start: int, end: int, rows: int, max_def: int, nbytes: int | None):
    """(offsets, sizes) of each row's value in a column chunk spanning buf[start:end]: -1 where
    null. `nbytes` is the fixed value size, None for variable-size binary (length-prefixed)."""
    offsets = np.full(rows, -1, np.int64)
    sizes = np.full(rows, -1, np.int64)
    row, pos = 0, start
    while pos < end:
        present, at, page_end = _page(buf, pos, max_def)
        idx = np.nonzero(present)[0] + row
        if nbytes is not None:
            offsets[idx] = at + nbytes * np.arange(len(idx))
            sizes[idx] = nbytes
            at += nbytes * len(idx)
        else:
            for i in idx.tolist():
                n = int.from_bytes(buf[at:at + 4], "little")
                offsets[i], sizes[i] = at + 4, n
                at += 4 + n
        if at != page_end:
            raise Unsupported("values do not fill the page")
        row += len(present)
        pos = page_end
    if row != rows or pos != end:
        raise Unsupported("pages do not add up to the column chunk")
    return offsets, sizes


def chunk_offsets(buf, column, schema_column, nbytes: int | None):
    """Offsets and sizes of every value of one column chunk (pyarrow metadata), or None."""
    if (column.compression != "UNCOMPRESSED" or column.has_dictionary_page
            or column.physical_type not in ("FIXED_LEN_BYTE_ARRAY", "BYTE_ARRAY")
            or schema_column.max_repetition_level or schema_column.max_definition_level > 1):
        return None
    start = column.data_page_offset
    try:
        return value_offsets(buf, start, start + column.total_compressed_size, column.num_values,
                             schema_column.max_definition_level, nbytes)
    except (Unsupported, IndexError, KeyError, TypeError, ValueError):
        return None


def field_offsets(meta, buf, field: str, nbytes: int | None):
    """(offsets, sizes) of every row's value of column `field` over the whole file (pyarrow
    FileMetaData), or None unless every row group's chunk of it can be sliced by offset."""
    j = next((i for i in range(meta.num_columns) if meta.schema.column(i).path == field), None)
    if j is None or not meta.num_row_groups:
        return None
    chunks = [chunk_offsets(buf, meta.row_group(g).column(j), meta.schema.column(j), nbytes)
              for g in range(meta.num_row_groups)]
    if any(c is None for c in chunks):
        return None
    return np.concatenate([c[0] for c in chunks]), np.concatenate([c[1] for c in chunks])
