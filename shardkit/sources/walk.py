"""Listing SRC: files grouped by stem become file samples held as Arrow columns; row files are set apart.

The listing is the one part of a build that is O(files) in the client: each file sample costs about
100 bytes of Arrow columns (key, paths, sizes, a stamp digest), never a Python object per file once
its folder is listed. Row files (.jsonl, .parquet) are one entry each; their rows are counted on
the cluster (sources.rows).
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field

from shardkit.errors import Rejection
from shardkit.sample import make_key

IMAGE_EXTS = frozenset({".jpg", ".jpeg", ".png", ".webp", ".bmp", ".gif", ".tif", ".tiff"})
TEXT_EXTS = frozenset({".txt", ".md"})
JSON_EXTS = frozenset({".json"})
JSONL_EXTS = frozenset({".jsonl"})
PARQUET_EXTS = frozenset({".parquet"})
ARRAY_EXTS = frozenset({".npy"})  # float arrays (embeddings, features): field 'array'
ROW_EXTS = JSONL_EXTS | PARQUET_EXTS  # one sample per line / row
KNOWN_EXTS = IMAGE_EXTS | TEXT_EXTS | JSON_EXTS | ROW_EXTS | ARRAY_EXTS

# Bits of the `kinds` column: which fields a file sample brings.
IMAGE, TXT, JSON, ARRAY = 1, 2, 4, 8
KIND_NAMES = {IMAGE: "image", TXT: "txt", JSON: "json", ARRAY: "array"}
FLUSH_ROWS = 65536  # file samples per Arrow batch: bounds the Python objects alive while listing


@dataclass
class RowFile:
    """One .jsonl or .parquet file: a run of samples whose keys are `{stem_key}/{number}`."""

    id: int
    rel: str
    kind: str  # "jsonl" or "parquet"
    size: int
    mtime_ns: int
    stem_key: str
    top: str | None  # first folder of the path: the label under folder labelling

    def stamp(self) -> str:
        return f"{self.rel}|{self.size}|{self.mtime_ns}"


@dataclass
class Listing:
    """What walking SRC found: file samples (Arrow table, unsorted), row files, and what was passed over."""

    files: object  # pyarrow.Table, see SCHEMA
    row_files: list[RowFile]
    rejections: list[Rejection] = field(default_factory=list)


def schema():
    import pyarrow as pa

    return pa.schema([("key", pa.string()), ("files", pa.list_(pa.string())), ("top", pa.string()),
                      ("size", pa.int64()), ("kinds", pa.int8()), ("stamp", pa.int64()),
                      ("row_file", pa.int32()), ("row", pa.int64())])


def stamp_digest(text: str) -> int:
    """A 64-bit digest of a sample's identity and file stats: its part of a shard's rerun fingerprint."""
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8).digest(),
                          "little", signed=True)


def _kind_bit(ext: str) -> int:
    return IMAGE if ext in IMAGE_EXTS else TXT if ext in TEXT_EXTS else ARRAY if ext in ARRAY_EXTS else JSON


def top_folder(rel: str) -> str | None:
    return rel.split("/", 1)[0] if "/" in rel else None


class _Columns:
    """Column lists flushed into Arrow batches every FLUSH_ROWS rows."""

    def __init__(self):
        self.batches, self.cols = [], {name: [] for name in schema().names}

    def add(self, **row) -> None:
        for name, col in self.cols.items():
            col.append(row.get(name, -1))
        if len(self.cols["key"]) >= FLUSH_ROWS:
            self.flush()

    def flush(self) -> None:
        import pyarrow as pa

        if self.cols["key"]:
            self.batches.append(pa.record_batch(list(self.cols.values()), schema=schema()))
            self.cols = {name: [] for name in self.cols}

    def table(self):
        import pyarrow as pa

        self.flush()
        return pa.Table.from_batches(self.batches, schema=schema())


def _entries(root: str, rel_dir: str, real_root: str, rejections: list[Rejection], subdirs: list[str]):
    """(relpath, stat) of the regular files of one folder, sorted; subfolders to visit go to `subdirs`."""
    full_dir = os.path.join(root, rel_dir) if rel_dir else root
    try:
        entries = sorted(os.scandir(full_dir), key=lambda e: e.name)
    except OSError as e:
        rejections.append(Rejection(rel_dir + "/", "source", f"unreadable folder: {e.strerror or e}"))
        return []
    files = []
    for entry in entries:
        rel = f"{rel_dir}/{entry.name}" if rel_dir else entry.name
        if entry.is_dir():  # follows symlinks, as os.walk lists them
            if entry.name.startswith("."):
                rejections.append(Rejection(rel + "/", "source", "hidden folder: not read"))
            elif entry.is_symlink():
                rejections.append(Rejection(rel + "/", "source", "symlinked folder: not followed"))
            else:
                subdirs.append(rel)
            continue
        if entry.name.startswith("."):
            rejections.append(Rejection(rel, "source", "hidden file: not read"))
            continue
        if entry.is_symlink():
            target = os.path.realpath(entry.path)
            if os.path.commonpath([real_root, target]) != real_root:
                rejections.append(Rejection(rel, "source", "symlink leaves the source folder: not followed"))
                continue
        try:
            files.append((rel, entry.stat()))
        except OSError as e:
            rejections.append(Rejection(rel, "source", f"unreadable: {e.strerror or e}"))
    return files


def _group(stem: str, files: list, cols: _Columns, rejections: list[Rejection]) -> None:
    """One stem's files → one file sample (image first, then text, then the rest), or rejections."""
    exts = [e for _, e, _ in files]
    n_img, n_txt, n_arr = (sum(e in s for e in exts) for s in (IMAGE_EXTS, TEXT_EXTS, ARRAY_EXTS))
    if n_img > 1 or n_txt > 1 or n_arr > 1:
        what = "images" if n_img > 1 else "text files" if n_txt > 1 else "arrays"
        for rel, _, _ in files:
            rejections.append(Rejection(rel, "source", f"ambiguous sample: several {what} share the stem {stem!r}"))
        return
    # The image (or the text) leads: its path is the sample's source in reports.
    files.sort(key=lambda t: (t[1] not in IMAGE_EXTS, t[1] not in TEXT_EXTS, t[0]))
    key, rels = make_key(stem), [r for r, _, _ in files]
    stamps = tuple((st.st_size, st.st_mtime_ns) for _, _, st in files)
    kinds = 0
    for e in exts:
        kinds |= _kind_bit(e)
    cols.add(key=key, files=rels, top=top_folder(rels[0]), size=sum(st.st_size for _, _, st in files),
             kinds=kinds, stamp=stamp_digest(f"{key}|{'|'.join(rels)}|{stamps}"))


def walk(root: str, skip=lambda rel: False) -> Listing:
    """List SRC: file samples (unsorted Arrow table), row files, rejections. `skip(rel_dir)` leaves a
    folder out (e.g. OUT inside SRC)."""
    real_root = os.path.realpath(root)
    rejections: list[Rejection] = []
    cols, row_files, todo = _Columns(), [], [""]
    while todo:
        rel_dir = todo.pop()
        subdirs: list[str] = []
        groups: dict[str, list] = {}
        for rel, st in _entries(root, rel_dir, real_root, rejections, subdirs):
            stem, ext = os.path.splitext(rel)
            ext = ext.lower()
            if ext not in KNOWN_EXTS:
                rejections.append(Rejection(rel, "source", f"unsupported extension: {ext or '(none)'!r}"))
            elif ext in ROW_EXTS:
                row_files.append(RowFile(len(row_files), rel, "jsonl" if ext in JSONL_EXTS else "parquet",
                                         st.st_size, st.st_mtime_ns, make_key(stem), top_folder(rel)))
            else:
                groups.setdefault(stem, []).append((rel, ext, st))
        for stem in sorted(groups):
            _group(stem, groups[stem], cols, rejections)
        todo.extend(d for d in reversed(subdirs) if not skip(d))
    return Listing(cols.table(), row_files, rejections)
