"""The inventory of SRC in compact columns: file samples (one sorted Arrow table), row files (one entry
each, counted on the cluster), their order as pieces, labels, kinds and what was rejected."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np

from shardkit.config import BuildConfig, remote_policy
from shardkit.errors import ConfigError, Rejection
from shardkit.sources import key_order as O
from shardkit.sources import walk as W
from shardkit.sources.index import RowCount, ScanOptions
from shardkit.sources.tars import tar_labels, tar_rejections

STATE_SCAN = os.path.join(".shardkit", "scan")
_PER_PX = {"raw": 3.0, "png": 1.5, "jpeg": 0.3, "webp": 0.2}  # stored bytes per pixel, roughly


def image_estimate(cfg: BuildConfig) -> int | None:
    """Estimated stored bytes of one resized image (shards are cut before anything is encoded)."""
    if cfg.image_size is None or cfg.resize_mode == "none":
        return None
    px = cfg.stored_size ** 2 if cfg.stored_size else cfg.image_size ** 2 * 4 / 3
    return int(px * _PER_PX[cfg.encode])


def scan_options(cfg: BuildConfig, state_dir: str | None = None) -> ScanOptions:
    return ScanOptions(cfg.src, state_dir or os.path.join(cfg.out, STATE_SCAN), cfg.text_field,
                       cfg.image_field, cfg.label_field, image_estimate(cfg), cfg.encode == "keep",
                       remote_policy(cfg))


@dataclass
class Inventory:
    """Everything shard planning needs, O(file samples + row files), never O(rows)."""

    opts: ScanOptions
    atoms: object  # pyarrow.Table of file samples and exploded rows, sorted by key (walk.schema())
    labels: np.ndarray  # int32 label of each atom, -1 for none
    est: np.ndarray  # int64 estimated stored bytes of each atom
    row_files: list[W.RowFile]
    counts: dict[int, RowCount]
    row_labels: dict[int, int]  # label of every row of a row file (folder labels), -1 for none
    label_index: dict | int | None  # --label-field: string → class index, or the number of int classes
    pieces: list[O.Piece]
    rejections: list[Rejection]
    classes: list[str] | None
    kinds: set[str] = field(default_factory=set)
    notes: list[str] = field(default_factory=list)  # read, but maybe not as the user meant (summary)
    image_exts: set[str] = field(default_factory=set)  # image formats seen ('jpg', 'png', …), lowercase
    renamed: list[Rejection] = field(default_factory=list)  # kept under a new key (key_order.unique_keys)

    @property
    def samples(self) -> int:
        return sum(len(p) for p in self.pieces)

    @property
    def inputs(self) -> int:
        return self.samples + len(self.rejections)


def _folder_classes(table, listing: W.Listing, counts, cfg: BuildConfig):
    """(class names, atom labels, row-file labels) from first-level folders, only classes in use."""
    row_files = listing.row_files
    tops = table.column("top").to_pylist() if len(table) else []
    live = [rf for rf in row_files if counts[rf.id].rows]
    if not W.labels_on(cfg.labels, listing.tops, listing.images, listing.top_images) or cfg.label_field:
        return None, np.full(len(tops), -1, np.int32), {rf.id: -1 for rf in row_files}
    names = sorted({t for t in tops if t is not None} | {rf.top for rf in live if rf.top is not None})
    index = {c: i for i, c in enumerate(names)}
    labels = np.array([index.get(t, -1) if t is not None else -1 for t in tops], np.int32)
    return (names or None), labels, {rf.id: index.get(rf.top, -1) if rf.top else -1 for rf in row_files}


def _column_classes(infos: list[dict], cfg: BuildConfig):
    """(class names, label index) of --label-field from every Parquet file's label description."""
    labels = [i["label"] for i in infos if i.get("label") and not i["label"]["type"].startswith("bad:")]
    if not labels:
        raise ConfigError(f"--label-field {cfg.label_field!r}: no Parquet file in SRC has that column (as "
                          "integers or strings); name the label column, or leave the flag out")
    types = {lab["type"] for lab in labels}
    if len(types) > 1:
        raise ConfigError(f"--label-field {cfg.label_field!r} holds integers in some Parquet files and strings in "
                          "others; make the column one type in every file")
    if types == {"string"}:
        names = sorted({v for lab in labels for v in lab["values"]})
        return names, {v: i for i, v in enumerate(names)}
    named = {tuple(lab["names"]) for lab in labels if lab.get("names")}
    if len(named) > 1:
        raise ConfigError(f"--label-field {cfg.label_field!r}: the Parquet files record different class names; "
                          "write them with one ClassLabel")
    names = list(named.pop()) if named else [str(i) for i in range(max(lab["max"] for lab in labels) + 1)]
    return names, len(names)


def _kinds(table, row_files, counts) -> set[str]:
    bits = 0
    for b in np.unique(table.column("kinds").to_numpy()).tolist() if len(table) else []:
        bits |= b
    kinds = {name for bit, name in W.KIND_NAMES.items() if bits & bit}
    for rf in row_files:
        c = counts[rf.id]
        if not c.rows:
            continue
        if rf.kind == "jsonl":
            kinds.add("txt")
            continue
        if rf.kind == "tar":
            kinds |= set(c.tar["kinds"])
            continue
        info = c.parquet
        kinds |= {"txt"} if info["text"] == "string" else set()
        kinds |= {"image"} if info["image"] in ("binary", "struct") else set()
        kinds |= {"json"} if info["meta"] else set()
    return kinds


def _estimates(table, opts: ScanOptions) -> np.ndarray:
    """Stored-size estimate of each atom: resized images by pixels (+ an eighth of their sidecars)."""
    import pyarrow.compute as pc

    if not len(table):
        return np.zeros(0, np.int64)
    size = table.column("size").to_numpy().astype(np.int64)
    if opts.image_estimate is None:
        return size
    has_image = (table.column("kinds").to_numpy() & W.IMAGE) != 0
    is_file = table.column("row_file").to_numpy() < 0
    multi = pc.list_value_length(table.column("files")).to_numpy() > 1
    resized = opts.image_estimate + np.where(multi, size, 0) // 8
    return np.where(has_image & is_file, resized, size).astype(np.int64)


def _check_parquet(parquet: list[dict], cfg: BuildConfig, opts: ScanOptions) -> None:
    """ConfigError when SRC's Parquet rows (their files' infos) hold none of the columns asked for."""
    if parquet and not any(i["text"] or i["image"] for i in parquet):
        raise ConfigError(f"no Parquet file in SRC has a column {opts.text_field!r} (--text-field) or "
                          f"{opts.image_field!r} (--image-field); its columns are e.g. "
                          f"{', '.join(parquet[0]['columns'])}")
    if cfg.label_field and not parquet:
        raise ConfigError("--label-field names a column of Parquet sources, and SRC holds no Parquet rows")


def make_inventory(listing: W.Listing, counts: dict[int, RowCount], cfg: BuildConfig,
                   opts: ScanOptions) -> Inventory:
    """Order everything by key (exploding the rare row files that interleave with other keys)."""
    import pyarrow as pa

    from shardkit.sources.parquet_files import reject_odd_label_types

    if cfg.label_field:  # a file whose label column has the other type is rejected alone
        counts = reject_odd_label_types(listing.row_files, counts, cfg.label_field)
    parquet = [counts[rf.id].parquet for rf in listing.row_files if rf.kind == "parquet" and counts[rf.id].rows]
    _check_parquet(parquet, cfg, opts)
    blow = O.exploded(listing.files, listing.row_files, counts, opts.policy)
    extra = [O.explode(rf, counts[rf.id], _row_kinds(rf, counts[rf.id]), opts.policy) for rf in listing.row_files
             if rf.id in blow]
    table, renamed = O.unique_keys(pa.concat_tables([listing.files, *extra]), counts, opts.policy)
    if renamed:
        listing.notes.append(f"{len(renamed)} samples share a key with another source's: each kept under a key of "
                             f"its own, `KEY_<8 hex digits>` (listed in errors.jsonl as {O.RENAMED!r})")
    classes, labels, row_labels = _folder_classes(table, listing, counts, cfg)
    tar_classes, tar_row_labels, notes = tar_labels(listing.row_files, counts, cfg)
    if tar_classes is not None:  # the tars' cls members label their samples (sources.tars.tar_labels)
        classes, labels, row_labels = tar_classes, np.full(len(table), -1, np.int32), tar_row_labels
    label_index = None
    if cfg.label_field:
        classes, label_index = _column_classes(parquet, cfg)
    blocks = [(O.key_bounds(rf.stem_key, counts[rf.id], opts.policy)[0], rf.id, counts[rf.id].rows)
              for rf in listing.row_files if rf.id not in blow and counts[rf.id].rows]
    rejections = listing.rejections + [Rejection(rf.rel, "source", counts[rf.id].error)
                                       for rf in listing.row_files if counts[rf.id].error]
    rejections += [Rejection(path, "source", reason) for path, reason in tar_rejections(listing.row_files, counts)]
    rejections.sort(key=lambda r: (r.path, r.stage, r.reason))
    return Inventory(opts, table, labels, _estimates(table, opts), listing.row_files, counts, row_labels,
                     label_index, O.pieces_in_order(table, blocks), rejections, classes,
                     _kinds(table, listing.row_files, counts), listing.notes + notes,
                     listing.image_exts | {e for info in parquet for e in info.get("image_exts", [])}
                     | {e for c in counts.values() for e in c.tar.get("image_exts", [])}, renamed)


def _row_kinds(rf: W.RowFile, count: RowCount) -> int:
    if rf.kind == "jsonl":
        return W.TXT
    if rf.kind == "tar":
        bits = {name: bit for bit, name in W.KIND_NAMES.items()}
        return sum(bits[kind] for kind in count.tar["kinds"])
    info = count.parquet
    return ((W.TXT if info["text"] == "string" else 0) | (W.IMAGE if info["image"] in ("binary", "struct") else 0)
            | (W.JSON if info["meta"] else 0))


def without(inv: Inventory, positions) -> Inventory:
    """The inventory minus the samples at these positions of the key order (e.g. duplicates found by
    the dedup step): atoms are filtered, row-file blocks split around the rows that go. O(atoms +
    pieces + positions): never a per-row object for the rows of row files."""
    import pyarrow as pa
    from dataclasses import replace

    positions = np.unique(np.asarray(positions, np.int64))
    if not len(positions):
        return inv
    keep = np.ones(len(inv.atoms), bool)
    gone, base = [], 0  # per piece: the positions in its source (atom rows or row-file index) that go
    for p in inv.pieces:
        lo, hi = np.searchsorted(positions, [base, base + len(p)])
        gone.append(positions[lo:hi] - base + p.start)
        if p.source == O.ATOMS:
            keep[gone[-1]] = False
        base += len(p)
    before = np.concatenate(([0], np.cumsum(keep)))  # old atom position -> new position
    pieces = []
    for p, out in zip(inv.pieces, gone):
        if p.source == O.ATOMS:
            start, stop = int(before[p.start]), int(before[p.stop])
            pieces += [O.Piece(O.ATOMS, start, stop)] if stop > start else []
            continue
        at = p.start
        for pos in out.tolist() + [p.stop]:
            pieces += [O.Piece(p.source, at, pos)] if pos > at else []
            at = pos + 1
    return replace(inv, atoms=inv.atoms.filter(pa.array(keep)), labels=inv.labels[keep], est=inv.est[keep],
                   pieces=pieces)
