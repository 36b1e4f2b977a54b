"""Rows of a remote Parquet shard read by range (ds[i], ds.get, `shardkit show`), not its whole file.

The first round trip reads the file's tail (TAIL bytes: the footer and, when the shard was written
with a page index, the offset indexes just before it). The second reads, all at once: the keys and
every checksum and integer column whole (small: the keys compress, a checksum is 8 bytes a row; they
are what ShardInfo.sums is checked over, and what every value is checked against), the row group of
each asked row for text and JSON columns, and for media columns the data page holding the row (its
place from the offset index; without one, the row's whole column chunk). The bytes land at their own
offsets in an anonymous mapping the shard's size, which pyarrow and the page slicer read as the file.
A footer or offset indexes larger than the tail take one round trip more each.
"""

from __future__ import annotations

import mmap

import numpy as np

from shardkit.contract import CHECKSUM_SUFFIX, ShardInfo
from shardkit.errors import ShardError
from shardkit.reader import parquet_pages

# The tail read first: a shard's footer is a few KB per row group, its offset indexes ~30 bytes a page.
TAIL = 64 << 10
MERGE_GAP = 64 << 10  # ranges this close are read in one GET (as reader.ranged merges rows)
WHOLE_KINDS = ("int",)  # columns read whole (as ParquetShard reads them)
GROUP_KINDS = ("text", "json")  # columns read a row group at a time (compressed: no page slicing)


class LandedParquet:
    """One Parquet shard's bytes read by range so far, in this process: `buf` (the shard's size),
    `landed` (rows whose every column is in `buf`), `meta` (pyarrow FileMetaData). `read(lo, hi)`
    fetches bytes [lo, hi) into buf. `pinned` (reader.cache.PinnedShard) is what the reader opens."""

    def __init__(self, shard: ShardInfo, url: str, specs: dict, read, pinned):
        import pyarrow as pa
        import pyarrow.parquet as pq

        self.url, self.specs, self.pinned = url, specs, pinned
        n = shard.bytes
        self.buf = mmap.mmap(-1, max(1, n))
        self.have: list[tuple[int, int]] = []
        self.landed = np.zeros(shard.samples, bool)
        self._read = read
        self._direct: dict = {}  # field -> (offsets, sizes) sliced from the pages landed
        self._fetch(max(0, n - TAIL), n)
        if n < 12 or self.buf[n - 4:n] != b"PAR1":
            raise ShardError(f"shard {url} does not end as a Parquet file does; restore or rebuild it")
        start = n - 8 - int.from_bytes(self.buf[n - 8:n - 4], "little")
        if start < 4:
            raise ShardError(f"shard {url}: its Parquet footer length is corrupt; restore or rebuild it")
        self._fetch(start, n)
        try:
            self.meta = pq.ParquetFile(pa.BufferReader(pa.py_buffer(self.buf)), pre_buffer=False).metadata
        except Exception as e:  # pyarrow errors: the footer cannot be used
            raise ShardError(f"cannot open shard {url}: {type(e).__name__}: {e}; rebuild the dataset") from e
        names = [self.meta.schema.column(j).path for j in range(self.meta.num_columns)]
        self.column = {name: j for j, name in enumerate(names)}
        fields = [f for f in specs if f in self.column]
        if any(f + CHECKSUM_SUFFIX not in self.column for f in fields):
            raise Unchecked(url)
        counts = [self.meta.row_group(g).num_rows for g in range(self.meta.num_row_groups)]
        self.starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        self.pages = _offset_indexes(self.buf, start, self.meta)  # (group, column) -> (offset, length)
        if self.pages:
            lo = min(o for o, _ in self.pages.values())
            self._fetch(lo, max(o + k for o, k in self.pages.values()))
            try:
                self.pages = {gc: _page_locations(self.buf, o, k) for gc, (o, k) in self.pages.items()}
            except (parquet_pages.Unsupported, IndexError, KeyError, TypeError):
                self.pages = {}  # unreadable: each row's column chunk is read whole

    def _fetch(self, lo: int, hi: int) -> None:
        todo = _uncovered(self.have, lo, hi)
        for a, b in todo:
            self._read(a, b, self.buf)
        self.arrived(todo)

    def arrived(self, ranges) -> None:
        """Bytes `ranges` [(lo, hi)] are in buf now."""
        self.have = _merged(self.have + list(ranges), 0)
        self._direct.clear()  # offsets sliced from pages: more pages may have landed

    def missing(self, rows) -> np.ndarray:
        rows = np.unique(np.asarray(rows, np.int64))
        return rows[~self.landed[rows]]

    def gets(self, rows) -> list[tuple[int, int]]:
        """The (lo, hi) GETs that bring every column of `rows` (and the keys, checksums and integer
        columns whole) that buf lacks, merged while their gaps are at most MERGE_GAP."""
        want = []
        for name, j in self.column.items():
            field = name[:-len(CHECKSUM_SUFFIX)] if name.endswith(CHECKSUM_SUFFIX) else name
            whole = name == "__key__" or name.endswith(CHECKSUM_SUFFIX) and field in self.specs or \
                self.specs.get(name, {}).get("kind") in WHOLE_KINDS
            if whole:
                want += [self._chunk(g, j) for g in range(self.meta.num_row_groups)]
            elif name in self.specs:
                want += [self._span(g, j, local) for g, local in self._groups(rows)]
        wanted = [r for lo, hi in _merged(want, MERGE_GAP) for r in _uncovered(self.have, lo, hi)]
        return _merged(wanted, MERGE_GAP)

    def _groups(self, rows):
        rows = np.asarray(rows, np.int64)
        groups = np.searchsorted(self.starts, rows, side="right") - 1
        return [(int(g), int(r - self.starts[g])) for g, r in zip(groups, rows)]

    def _chunk(self, g: int, j: int) -> tuple[int, int]:
        c = self.meta.row_group(g).column(j)
        start = c.dictionary_page_offset if c.has_dictionary_page else c.data_page_offset
        return int(start), int(start + c.total_compressed_size)

    def _span(self, g: int, j: int, local: int) -> tuple[int, int]:
        """The bytes holding row `local` of row group g in column j: its data page when the offset
        index says where that is and the chunk has no dictionary page, else the whole chunk."""
        pages = self.pages.get((g, j))
        if pages is None or not self._pageable(g, j):
            return self._chunk(g, j)
        p = int(np.searchsorted(pages[:, 2], local, side="right")) - 1
        return int(pages[p, 0]), int(pages[p, 0] + pages[p, 1])

    def _pageable(self, g: int, j: int) -> bool:
        """Whether values of column j in row group g are sliced out of their pages (as
        parquet_pages.chunk_offsets can): else pyarrow reads the whole chunk."""
        c, col = self.meta.row_group(g).column(j), self.meta.schema.column(j)
        return (self.specs.get(col.path, {}).get("kind") not in GROUP_KINDS + WHOLE_KINDS
                and c.compression == "UNCOMPRESSED" and not c.has_dictionary_page
                and c.physical_type in ("FIXED_LEN_BYTE_ARRAY", "BYTE_ARRAY")
                and not col.max_repetition_level and col.max_definition_level <= 1)

    def direct(self, field: str, nbytes: int | None):
        """(offsets, sizes) of the values of `field` in the pages that landed (-1 elsewhere), or None
        when the column's pages are not known (no offset index: pyarrow reads its chunk instead)."""
        if field not in self._direct:
            self._direct[field] = self._sliced(field, nbytes)
        return self._direct[field]

    def _sliced(self, field: str, nbytes: int | None):
        j = self.column.get(field)
        if j is None or any((g, j) not in self.pages or not self._pageable(g, j)
                            for g in range(self.meta.num_row_groups)):
            return None
        n = int(self.starts[-1])
        offsets, sizes = np.full(n, -1, np.int64), np.full(n, -1, np.int64)
        max_def = self.meta.schema.column(j).max_definition_level
        for g in range(self.meta.num_row_groups):
            pages, rows = self.pages[(g, j)], self.meta.row_group(g).num_rows
            ends = np.append(pages[1:, 2], rows)
            for (at, size, first), end in zip(pages.tolist(), ends.tolist()):
                if _uncovered(self.have, at, at + size):
                    continue
                try:
                    o, s = parquet_pages.value_offsets(self.buf, at, at + size, end - first, max_def, nbytes)
                except (parquet_pages.Unsupported, IndexError, KeyError, TypeError, ValueError):
                    return None
                offsets[self.starts[g] + first:self.starts[g] + end] = o
                sizes[self.starts[g] + first:self.starts[g] + end] = s
        return offsets, sizes

    def check(self, rows) -> None:
        """Rows read from this shard must be rows that landed (else a value would read as null)."""
        if len(self.missing(rows)):
            raise ShardError(f"shard {self.url}: rows {self.missing(rows)[:5].tolist()} were not read by range; "
                             "this is a bug in shardkit's reader")


class Unchecked(ShardError):
    """A field of the shard has no checksum column: its rows are read from the whole shard."""

    def __init__(self, url: str):
        super().__init__(f"shard {url}: a field has no checksum column, so its rows are read from the whole shard")


def _merged(ranges, gap: int) -> list[tuple[int, int]]:
    out: list = []
    for lo, hi in sorted(r for r in ranges if r[1] > r[0]):
        if out and lo - out[-1][1] <= gap:
            out[-1][1] = max(out[-1][1], hi)
        else:
            out.append([lo, hi])
    return [(lo, hi) for lo, hi in out]


def _uncovered(have, lo: int, hi: int) -> list[tuple[int, int]]:
    """The parts of [lo, hi) outside the merged, sorted ranges `have`."""
    out, at = [], lo
    for a, b in have:
        if b <= at or a >= hi:
            continue
        if a > at:
            out.append((at, a))
        at = max(at, b)
    if at < hi:
        out.append((at, hi))
    return out


def _offset_indexes(buf, footer: int, meta) -> dict:
    """{(row group, column): (offset, length) of its offset index} from the footer's Thrift
    (FileMetaData.row_groups[].columns[]: fields 4 and 5); {} when the file has none (or they cannot
    be told)."""
    try:
        file_meta, _ = parquet_pages.struct(buf, footer, lists=True)
        out = {}
        for g, group in enumerate(file_meta.get(4) or []):
            for j, chunk in enumerate(group.get(1) or []):
                if chunk.get(4) is None or not chunk.get(5):
                    return {}
                out[(g, j)] = (chunk[4], chunk[5])
        return out if len(out) == meta.num_row_groups * meta.num_columns else {}
    except (parquet_pages.Unsupported, IndexError, KeyError, TypeError, AttributeError):
        return {}


def _page_locations(buf, offset: int, length: int) -> np.ndarray:
    """An OffsetIndex's page locations as rows (offset, compressed size, first row)."""
    index, _ = parquet_pages.struct(buf, offset, lists=True)
    return np.array([(p[1], p[2], p[3]) for p in index[1]], np.int64).reshape(-1, 3)
