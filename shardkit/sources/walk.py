"""Listing SRC: files grouped by stem become file samples held as Arrow columns; row files are set apart.

The listing is the one part of a build that is O(files) in the client: each file sample costs about
100 bytes of Arrow columns (key, paths, sizes, a stamp digest), never a Python object per file once
its folder is listed. Row files (.jsonl, .parquet, .tar) are one entry each; their rows are counted on
the cluster (sources.rows).
"""

from __future__ import annotations

import hashlib
import os
import stat
from dataclasses import dataclass, field
from typing import NamedTuple

from shardkit.errors import Rejection
from shardkit.sample import make_key
from shardkit.store.local import is_url

IMAGE_EXTS = frozenset({".jpg", ".jpeg", ".png", ".webp", ".bmp", ".gif", ".tif", ".tiff"})
TEXT_EXTS = frozenset({".txt", ".md"})
JSON_EXTS = frozenset({".json"})
JSONL_EXTS = frozenset({".jsonl"})
PARQUET_EXTS = frozenset({".parquet"})
TAR_EXTS = frozenset({".tar"})  # WebDataset shards: samples grouped by member key (sources.tars)
ARRAY_EXTS = frozenset({".npy"})  # float arrays (embeddings, features): field 'array'
ROW_EXTS = JSONL_EXTS | PARQUET_EXTS | TAR_EXTS  # one sample per line / row / member key
KNOWN_EXTS = IMAGE_EXTS | TEXT_EXTS | JSON_EXTS | ROW_EXTS | ARRAY_EXTS

_ROW_KIND = {".jsonl": "jsonl", ".parquet": "parquet", ".tar": "tar"}

# Bits of the `kinds` column: which fields a file sample brings.
IMAGE, TXT, JSON, ARRAY = 1, 2, 4, 8
KIND_NAMES = {IMAGE: "image", TXT: "txt", JSON: "json", ARRAY: "array"}
FLUSH_ROWS = 8192  # file samples per Arrow batch: bounds the Python objects alive while listing (~4 MB)
SEEN_EVERY = 1000  # keys of a store between two reports of the walk's progress
# Why a file or folder below SRC is passed over: the same words from the walk of a disk and of a store.
HIDDEN_FILE, HIDDEN_FOLDER = "hidden file: not read", "hidden folder: not read"
OUT_FOLDER = "the build's output folder (OUT): not read"
DATASET = "a shardkit dataset (manifest.json, shards/ or .shardkit/): not read"


@dataclass
class RowFile:
    """One .jsonl, .parquet or .tar file: a run of samples whose keys are `{stem_key}/{number}` (a tar's:
    `{stem_key}/{member key}`)."""

    id: int
    rel: str
    kind: str  # "jsonl", "parquet" or "tar"
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
    notes: list[str] = field(default_factory=list)  # read, but maybe not as the user meant (summary)
    tops: set[str] = field(default_factory=set)  # first-level folders holding files of samples
    images: int = 0  # image files seen
    top_images: int = 0  # … of them directly in SRC (not in a class folder)
    image_exts: set[str] = field(default_factory=set)  # extensions of the file samples' images ('jpg', …)
    markers: int = 0  # keys on a store that end in '/' (folder markers): passed over, counted in a note


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
        self.batches, self.cols, self.rows = [], {name: [] for name in schema().names}, 0

    def add(self, key: str, files: list, top: str | None, size: int, kinds: int, stamp: int) -> None:
        """One file sample (its row_file and row: -1)."""
        c = self.cols
        c["key"].append(key), c["files"].append(files), c["top"].append(top), c["size"].append(size)
        c["kinds"].append(kinds), c["stamp"].append(stamp), c["row_file"].append(-1), c["row"].append(-1)
        self.rows += 1
        if len(c["key"]) >= FLUSH_ROWS:
            self.flush()

    def truncate(self, rows: int) -> None:
        """Forget every row after the first `rows`: the cost of what is forgotten, not of what is kept."""
        flushed = self.rows - len(self.cols["key"])
        keep = max(0, rows - flushed)
        for col in self.cols.values():
            del col[keep:]
        while flushed > rows:
            last = self.batches.pop()
            flushed -= last.num_rows
            if flushed < rows:
                self.batches.append(last.slice(0, rows - flushed))
                flushed = rows
        self.rows = min(self.rows, rows)

    def flush(self) -> None:
        import pyarrow as pa

        if self.cols["key"]:
            self.batches.append(pa.record_batch(list(self.cols.values()), schema=schema()))
            self.cols = {name: [] for name in self.cols}

    def table(self):
        import pyarrow as pa

        self.flush()
        return pa.Table.from_batches(self.batches, schema=schema())


def not_input(folder: str, out: str | None) -> str | None:
    """Why `folder` (below SRC) holds no input, or None: it is OUT, or a shardkit dataset. Reading
    either would feed a build's output back into the next build."""
    if out is not None and os.path.realpath(folder) == os.path.realpath(out):
        return OUT_FOLDER
    if os.path.isdir(os.path.join(folder, ".shardkit")) or (
            os.path.isfile(os.path.join(folder, "manifest.json")) and os.path.isdir(os.path.join(folder, "shards"))):
        return DATASET
    return None


def labels_on(setting: bool | None, subfolders: set[str], images: int, top_images: int) -> bool:
    """--labels/--no-labels, else whether SRC has class subfolders: two or more first-level subfolders
    hold samples, or one holds every image (an image folder of one class). A text corpus kept in
    one folder (corpus/docs/*.txt) gets no labels."""
    if setting is not None:
        return setting
    if len(subfolders) >= 2:
        return True
    return len(subfolders) == 1 and images > 0 and top_images == 0


def _folder(entry, rel: str, listing: Listing, subdirs: list[str], out: str | None) -> None:
    """A subfolder met in the walk: to visit (appended to `subdirs`), or rejected with the reason."""
    rejections = listing.rejections
    if entry.name.startswith("."):
        rejections.append(Rejection(rel + "/", "source", HIDDEN_FOLDER))
    elif entry.is_symlink():
        rejections.append(Rejection(rel + "/", "source", "symlinked folder: not followed"))
    elif reason := not_input(entry.path, out):
        rejections.append(Rejection(rel + "/", "source", reason))
    else:
        _note_named_like_a_file(entry.name, rel + "/", listing)
        subdirs.append(rel)


def _note_named_like_a_file(name: str, rel: str, listing: Listing) -> None:
    """A folder read (`rel`, ending in '/') whose name looks like a file's: said in the summary."""
    if os.path.splitext(name)[1].lower() in KNOWN_EXTS:
        listing.notes.append(f"folder {rel!r} is named like a file: read as a folder")


def _entries(root: str, rel_dir: str, real_root: str, listing: Listing, subdirs: list[str], out: str | None):
    """(relpath, stat) of the regular files of one folder, sorted; subfolders to visit go to `subdirs`."""
    rejections = listing.rejections
    full_dir = os.path.join(root, rel_dir) if rel_dir else root
    try:
        entries = sorted(os.scandir(full_dir), key=lambda e: e.name)
    except OSError as e:
        rejections.append(Rejection(rel_dir + "/", "source", f"unreadable folder: {e.strerror or e}"))
        return []
    files = []
    for entry in entries:
        rel = f"{rel_dir}/{entry.name}" if rel_dir else entry.name
        if (reason := _unusable(entry)) is not None:
            rejections.append(Rejection(_printable(rel), "source", reason))
            continue
        if entry.is_dir():  # follows symlinks, as os.walk lists them
            _folder(entry, rel, listing, subdirs, out)
            continue
        if entry.name.startswith("."):
            rejections.append(Rejection(rel, "source", HIDDEN_FILE))
            continue
        if entry.is_symlink():
            target = os.path.realpath(entry.path)
            if os.path.commonpath([real_root, target]) != real_root:
                rejections.append(Rejection(rel, "source", "symlink leaves the source folder: not followed"))
                continue
        try:
            st = entry.stat()
        except OSError as e:
            rejections.append(Rejection(rel, "source", f"unreadable: {e.strerror or e}"))
            continue
        if not stat.S_ISREG(st.st_mode):  # a FIFO would block the read forever; a device or socket is no file
            rejections.append(Rejection(rel, "source", f"not a regular file ({_file_type(st.st_mode)}): not read"))
            continue
        files.append((rel, st))
    return files


def _printable(rel: str) -> str:
    """A path for errors.jsonl and the screen: bytes that are not UTF-8 (kept by os.fsdecode as lone
    surrogates) shown as \\xNN escapes."""
    return os.fsencode(rel).decode("utf-8", "backslashreplace")


def _unusable(entry) -> str | None:
    """Why a folder entry cannot be read at all, or None: a name that is not UTF-8 (keys, shards and
    reports are UTF-8 text), or a symlink that loops (is_dir() raises ELOOP)."""
    try:
        entry.name.encode("utf-8")
    except UnicodeEncodeError:
        return "file name is not valid UTF-8: not read (rename it, e.g. with `convmv -f latin1 -t utf8`)"
    try:
        entry.is_dir()
    except OSError as e:
        return f"unreadable: {e.strerror or e}"
    return None


def _file_type(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device")):
        if test(mode):
            return name
    return "another kind of entry"


def _group(stem: str, files: list, cols: _Columns, listing: "Listing") -> None:
    """One stem's files → one file sample (image first, then text, then the rest), or rejections."""
    if len(files) == 1:  # most stems: the rule below, without its counting and sorting
        rel, ext, st = files[0]
        if ext in IMAGE_EXTS:
            listing.image_exts.add(ext[1:])
        key = make_key(stem)
        cols.add(key, [rel], top_folder(rel), st.st_size, _kind_bit(ext),
                 stamp_digest(f"{key}|{rel}|{((st.st_size, st.st_mtime_ns),)}"))
        return
    exts = [e for _, e, _ in files]
    n_img, n_txt, n_arr = (sum(e in s for e in exts) for s in (IMAGE_EXTS, TEXT_EXTS, ARRAY_EXTS))
    if n_img > 1 or n_txt > 1 or n_arr > 1:
        what = "images" if n_img > 1 else "text files" if n_txt > 1 else "arrays"
        for rel, _, _ in files:
            listing.rejections.append(Rejection(rel, "source",
                                                f"ambiguous sample: several {what} share the stem {stem!r}"))
        return
    listing.image_exts |= {e[1:] for e in exts if e in IMAGE_EXTS}
    # The image (or the text) leads: its path is the sample's source in reports.
    files.sort(key=lambda t: (t[1] not in IMAGE_EXTS, t[1] not in TEXT_EXTS, t[0]))
    key, rels = make_key(stem), [r for r, _, _ in files]
    stamps = tuple((st.st_size, st.st_mtime_ns) for _, _, st in files)
    kinds = 0
    for e in exts:
        kinds |= _kind_bit(e)
    cols.add(key, rels, top_folder(rels[0]), sum(st.st_size for _, _, st in files), kinds,
             stamp_digest(f"{key}|{'|'.join(rels)}|{stamps}"))


def walk(root: str, out: str | None = None, policy=None, seen=None) -> Listing:
    """List SRC (a local folder or a URL): file samples (unsorted Arrow table), row files (in path
    order), rejections. OUT, when inside SRC, and shardkit datasets below SRC are left out (counted
    rejections). A folder is read entry by entry in name order and each stem's files become a sample
    as soon as the names pass them, so a folder of a million objects on a store costs the client its
    columns only. `policy`: the job's RemotePolicy, for a store; `seen(n)`: told of the entries
    met, a folder (on a disk) or SEEN_EVERY keys (on a store) at a time (a progress bar)."""
    listing, cols, seen = Listing(None, []), _Columns(), seen or (lambda n: None)
    if is_url(root):
        _walk_store(root, out, policy, listing, cols, seen)
    else:
        _walk_disk(root, out, listing, cols, seen)
    listing.files = cols.table()
    listing.row_files.sort(key=lambda rf: rf.rel)  # the same ids whatever order the walk met them in
    for i, rf in enumerate(listing.row_files):
        rf.id = i
    return listing


def _walk_disk(root: str, out: str | None, listing: Listing, cols: _Columns, seen) -> None:
    """A local folder, folder by folder: its files in name order, then its subfolders."""
    real_root, todo = os.path.realpath(root), [""]
    while todo:
        rel_dir = todo.pop()
        subdirs: list[str] = []
        stems = _Stems(cols, listing)
        entries = _entries(root, rel_dir, real_root, listing, subdirs, out)
        for rel, st in entries:
            _add_file(rel, bool(rel_dir), st, stems, listing)
        stems.close()
        seen(len(entries))
        todo.extend(reversed(sorted(subdirs)))


def _add_file(rel: str, below: bool, st, stems: "_Stems", listing: Listing) -> None:
    """One readable file met in the walk: a row file, a file of a sample (to its stem), or rejected.
    `below`: the file is in a subfolder of SRC (its first folder may be a label)."""
    stem, ext = os.path.splitext(rel)
    ext = ext.lower()
    if ext not in KNOWN_EXTS:
        listing.rejections.append(Rejection(rel, "source", f"unsupported extension: {ext or '(none)'!r}"))
        return
    if below:
        listing.tops.add(rel.split("/", 1)[0])
    if ext in ROW_EXTS:
        listing.row_files.append(RowFile(len(listing.row_files), rel, _ROW_KIND[ext], st.st_size,
                                         st.st_mtime_ns, make_key(stem), top_folder(rel)))
        return
    if ext in IMAGE_EXTS:
        listing.images += 1
        listing.top_images += not below
    stems.add(stem, (rel, ext, st))


class _Stems:
    """Files of one folder, in name order, grouped by stem: a stem's files are all seen once a name
    arrives that does not start with `stem.` (names sharing that prefix sort together), so only
    the stems along one such prefix chain wait at any time."""

    def __init__(self, cols: _Columns, listing: Listing):
        self.cols, self.listing, self.open = cols, listing, []  # [(stem, files)], each a prefix of the next

    def add(self, stem: str, file: tuple) -> None:
        rel = file[0]
        while self.open and not rel.startswith(self.open[-1][0] + "."):
            _group(*self.open.pop(), self.cols, self.listing)
        if self.open and self.open[-1][0] == stem:
            self.open[-1][1].append(file)
        else:
            self.open.append((stem, [file]))

    def close(self) -> None:
        while self.open:
            _group(*self.open.pop(), self.cols, self.listing)


class _Stat(NamedTuple):
    """What the walk reads of a file on a store: its size, and its version (ETag) as a number."""

    st_size: int
    st_mtime_ns: int


class _Mark(NamedTuple):
    """The listing as it stood when the walk entered a folder: what to go back to if the folder
    turns out to be a shardkit dataset (seen only once its `.shardkit/` or `shards/` comes by)."""

    rows: int
    row_files: int
    rejections: int
    notes: int
    markers: int
    images: int
    top_images: int
    image_exts: frozenset
    had_top: bool


class _Open:
    """A folder of the store the walk is in: its stems, its mark, and whether its manifest.json came."""

    __slots__ = ("rel", "stems", "mark", "manifest")

    def __init__(self, rel: str, stems: "_Stems", mark: _Mark | None):
        self.rel, self.stems, self.mark, self.manifest = rel, stems, mark, False


def _walk_store(root: str, out: str | None, policy, listing: Listing, cols: _Columns, seen) -> None:
    """A folder on a store, as one stream of keys in key order (store.listing.Keys): no request per
    folder. The keys of a folder's subfolders come between its own files, so each folder on the way
    down keeps its stems open (_Open) until the keys leave it. A hidden folder and OUT are skipped
    where they start; a shardkit dataset is known by its `.shardkit/`, or by `shards/` after a
    `manifest.json`: what the walk took from it is taken back (_Mark) and the rest skipped. The
    rejections are the local walk's, but for keys a disk has no name for (empty, '.' or '..' folder
    names) and folder markers (keys that end in '/': counted in a note)."""
    from shardkit.store.listing import Keys, version_number

    keys, path = Keys(root, policy, parallel=True), [_Open("", _Stems(cols, listing), None)]
    base = root.rstrip("/") + "/"
    out_rel = out.rstrip("/")[len(base):] + "/" if out and out.startswith(base) else None  # OUT inside SRC
    n = 0
    for n, (rel, size, version) in enumerate(keys, 1):
        if not n % SEEN_EVERY:
            seen(SEEN_EVERY)
        folder, _, name = rel.rpartition("/")
        if (folder + "/" if folder else "") != path[-1].rel and not _enter(rel, path, keys, listing, cols, out_rel):
            continue
        if not name:
            listing.markers += 1
        elif name.startswith("."):
            listing.rejections.append(Rejection(rel, "source", HIDDEN_FILE))
        else:
            path[-1].manifest |= name == "manifest.json"
            _add_file(rel, bool(folder), _Stat(size, version_number(version)), path[-1].stems, listing)
    for open_ in reversed(path):
        open_.stems.close()
    seen(n % SEEN_EVERY)
    if listing.markers:
        listing.notes.append(f"{listing.markers} folder markers (keys that end in '/') passed over")


def _enter(key: str, path: list, keys, listing: Listing, cols: _Columns, out_rel: str | None) -> bool:
    """Move the walk's open folders to the folder of `key` (relative): leave those the keys left,
    enter the new ones. False when the key is not read: rejected, skipped, or its folder a dataset."""
    folder = key.rpartition("/")[0]
    target = folder + "/" if folder else ""
    while not target.startswith(path[-1].rel):
        path.pop().stems.close()
    for name in target[len(path[-1].rel):-1].split("/") if target != path[-1].rel else ():
        parent = path[-1]
        rel = parent.rel + name + "/"
        if name in ("", ".", ".."):
            listing.rejections.append(Rejection(key, "source", "a key with an empty, '.' or '..' folder "
                                                "name: not read (a disk has no such path; rename the objects)"))
            return False
        if parent.rel and (name == ".shardkit" or (name == "shards" and parent.manifest)):
            _dataset(parent, path, keys, listing, cols)
            return False
        if name.startswith("."):
            listing.rejections.append(Rejection(rel, "source", HIDDEN_FOLDER))
        elif rel == out_rel:
            listing.rejections.append(Rejection(rel, "source", OUT_FOLDER))
        else:
            mark = _Mark(cols.rows, len(listing.row_files), len(listing.rejections), len(listing.notes),
                         listing.markers, listing.images, listing.top_images, frozenset(listing.image_exts),
                         rel.split("/", 1)[0] in listing.tops)
            _note_named_like_a_file(name, rel, listing)
            path.append(_Open(rel, _Stems(cols, listing), mark))
            continue
        keys.skip(rel)
        return False
    return True


def _dataset(found: _Open, path: list, keys, listing: Listing, cols: _Columns) -> None:
    """`found` is a shardkit dataset: the walk forgets what it took from it and skips the rest."""
    while path[-1] is not found:
        path.pop()
    path.pop()
    mark = found.mark
    cols.truncate(mark.rows)
    del listing.row_files[mark.row_files:], listing.rejections[mark.rejections:], listing.notes[mark.notes:]
    listing.images, listing.top_images, listing.image_exts = mark.images, mark.top_images, set(mark.image_exts)
    listing.markers = mark.markers
    if not mark.had_top:
        listing.tops.discard(found.rel.split("/", 1)[0])
    listing.rejections.append(Rejection(found.rel, "source", DATASET))
    keys.skip(found.rel)
