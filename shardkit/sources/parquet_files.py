"""Parquet sources: one sample per row. The text, image and label columns are named by --text-field,
--image-field and --label-field; every other column is kept as JSON metadata. Images may be a
binary column or a struct {bytes, path} as Hugging Face datasets writes them. A bad row (null
value, wrong type, undecodable image) is rejected alone, named `file.parquet:ROW`."""

from __future__ import annotations

import base64
import contextlib
import datetime
import decimal
import functools
import json
import os
import posixpath

import numpy as np

from shardkit.errors import ConfigError, RejectedInput
from shardkit.sample import Sample
from shardkit.store.local import is_url

MAX_STRING_CLASSES = 100_000  # a string label column with more distinct values is not a label


def _values(t):
    """The type of a column's values: a dictionary-encoded column (pandas categoricals, writers that
    dictionary-encode strings) holds its dictionary's type; pyarrow hands rows out as plain values."""
    import pyarrow as pa

    return t.value_type if pa.types.is_dictionary(t) else t


def _is_string(t) -> bool:
    import pyarrow as pa

    t = _values(t)
    return pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t)


def _is_binary(t) -> bool:
    import pyarrow as pa

    t = _values(t)
    return pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_binary_view(t)


def _text_kind(t) -> str:
    return "string" if _is_string(t) else f"bad:{t}"


def _image_kind(t) -> str:
    import pyarrow as pa

    if _is_binary(t):
        return "binary"
    if pa.types.is_struct(t) and t.get_field_index("bytes") >= 0 and _is_binary(t.field("bytes").type):
        return "struct"
    return f"bad:{t}"


def hf_class_names(schema, column: str) -> list[str] | None:
    """ClassLabel names that Hugging Face datasets records in the Parquet schema metadata, if any."""
    meta = (schema.metadata or {}).get(b"huggingface")
    if not meta:
        return None
    try:
        feature = json.loads(meta)["info"]["features"][column]
    except (ValueError, KeyError, TypeError):
        return None
    names = feature.get("names") if isinstance(feature, dict) else None
    return [str(n) for n in names] if isinstance(names, list) else None


def _label_info(pf, column: str, t) -> dict:
    import pyarrow as pa
    import pyarrow.compute as pc

    values = pf.read(columns=[column]).column(0)
    if pa.types.is_dictionary(t):
        values, t = values.cast(t.value_type), t.value_type
    if pa.types.is_integer(t):
        top = pc.max(values).as_py()
        return {"type": "int", "max": -1 if top is None else int(top),
                "names": hf_class_names(pf.schema_arrow, column)}
    if _is_string(t):
        distinct = sorted(v for v in pc.unique(values).to_pylist() if v is not None)
        if len(distinct) > MAX_STRING_CLASSES:
            raise ConfigError(f"--label-field {column!r} has more than {MAX_STRING_CLASSES:,} distinct values: not "
                              "a class label; choose a label column with --label-field, or leave it out")
        return {"type": "string", "values": distinct}
    return {"type": f"bad:{t}"}


def reject_odd_label_types(row_files, counts: dict, column: str) -> dict:
    """`counts` with every Parquet file whose label column holds the minority type (integers vs
    strings) turned into one rejected input, with its reason; the other files build.

    The type of most label rows wins, integers on a tie (Hugging Face's ClassLabel stores integers,
    with the names in the schema): string labels would be sorted into a class list that renumbers
    the integer ones, so the two cannot share one list."""
    import dataclasses

    typed = [(rf, c) for rf in row_files if rf.kind == "parquet" and (c := counts[rf.id]).rows
             and (c.parquet.get("label") or {}).get("type") in ("int", "string")]
    rows = {"int": 0, "string": 0}
    for _, c in typed:
        rows[c.parquet["label"]["type"]] += c.rows
    if not rows["int"] or not rows["string"]:
        return counts
    winner = "string" if rows["string"] > rows["int"] else "int"
    names = {"int": "integers", "string": "strings"}
    out = dict(counts)
    for rf, c in typed:
        kind = c.parquet["label"]["type"]
        if kind != winner:
            out[rf.id] = dataclasses.replace(c, rows=0, error=(
                f"wrong type: label column {column!r} (--label-field) holds {names[kind]} in this file and "
                f"{names[winner]} in the other Parquet files ({rows[winner]:,} rows against {rows[kind]:,}); "
                f"write it as {names[winner]} to build this file's {c.rows:,} rows"))
    return out


def describe(pf, opts) -> dict:
    """What a Parquet file holds for the build: content columns, their kinds, metadata columns, labels."""
    schema = pf.schema_arrow
    names = schema.names
    info = {"columns": names, "text": None, "image": None, "label": None}
    if opts.text_field in names:
        info["text"] = _text_kind(schema.field(opts.text_field).type)
    if opts.image_field in names:
        info["image"] = _image_kind(schema.field(opts.image_field).type)
    if opts.label_field and opts.label_field in names:
        info["label"] = _label_info(pf, opts.label_field, schema.field(opts.label_field).type)
    used = {opts.text_field, opts.image_field, opts.label_field}
    info["meta"] = [n for n in names if n not in used]
    if opts.image_exts and info["image"] in ("binary", "struct"):  # reads the image column, no decode
        values = pf.read(columns=[opts.image_field]).column(0).to_pylist()
        if info["image"] == "struct":
            values = [None if v is None else v.get("bytes") for v in values]
        info["image_exts"] = sorted({image_ext(v) for v in values if v})
    return info


def parquet_index(path: str, opts) -> tuple[np.ndarray, int, dict]:
    """(row index, last row number, description) from the file's metadata: no data is read, except a
    label column. Size estimates are per row group: its uncompressed bytes spread over its rows."""
    from shardkit.sources.index import INDEX_DTYPE

    with _opened(path, opts.policy) as pf:
        info = describe(pf, opts)
    md = pf.metadata
    names = pf.schema_arrow.names
    estimates = []
    for g in range(md.num_row_groups):
        rg = md.row_group(g)
        sizes = {}
        for c in range(rg.num_columns):
            top = rg.column(c).path_in_schema.split(".", 1)[0]
            sizes[top] = sizes.get(top, 0) + rg.column(c).total_uncompressed_size
        rows = max(rg.num_rows, 1)
        if info["image"] and opts.image_estimate is not None:
            rest = sum(v for k, v in sizes.items() if k != opts.image_field and k in names)
            est = np.full(rg.num_rows, opts.image_estimate + rest // rows, np.int64)
        else:
            est = np.full(rg.num_rows, sum(sizes.values()) // rows, np.int64)
        estimates.append((est, g))
    index = np.empty(md.num_rows, INDEX_DTYPE)
    index["number"] = np.arange(md.num_rows)
    index["offset"] = np.concatenate([np.full(len(e), g) for e, g in estimates]) if estimates else []
    index["length"] = 0
    index["cum"] = np.cumsum(np.concatenate([e for e, _ in estimates])) if estimates else []
    return index, md.num_rows - 1, info


IMAGE_MAGIC = ((b"\xff\xd8\xff", "jpg"), (b"\x89PNG\r\n\x1a\n", "png"), (b"GIF8", "gif"), (b"BM", "bmp"),
               (b"II*\x00", "tif"), (b"MM\x00*", "tif"))


def image_ext(data: bytes) -> str:
    """The extension of image bytes by their magic number (Parquet images come without a file name)."""
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "webp"
    return next((ext for magic, ext in IMAGE_MAGIC if data.startswith(magic)), "img")


def jsonable(value):
    """A Parquet value as JSON: bytes → base64 text, dates/times → ISO 8601, decimals → text."""
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    if isinstance(value, (datetime.datetime, datetime.date, datetime.time)):
        return value.isoformat()
    if isinstance(value, (decimal.Decimal, datetime.timedelta)):
        return str(value)
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        if value and isinstance(value[0], tuple) and len(value[0]) == 2:  # a map column: (key, value) pairs
            return {str(k): jsonable(v) for k, v in value}
        return [jsonable(v) for v in value]
    return value


class RowConverter:
    """Parquet row dict → Sample under the file's description and the build's class list (picklable)."""

    def __init__(self, opts, info: dict, label_index: dict | int | None, rel: str):
        """`label_index`: class name → index for string labels, or the number of classes for integer ones."""
        self.opts, self.info, self.label_index, self.rel = opts, info, label_index, rel

    def _bad_type(self, what: str, kind: str, flag: str, expected: str) -> RejectedInput:
        return RejectedInput(f"wrong type: column {what!r} holds {kind[4:]}, expected {expected} (choose the "
                             f"column with {flag})")

    def _image(self, value) -> tuple[bytes, list | None]:
        """(image bytes, the linked file [path in SRC, size, mtime_ns] when the row names a file)."""
        name, kind = self.opts.image_field, self.info["image"]
        if kind.startswith("bad:"):
            raise self._bad_type(name, kind, "--image-field", "binary or a struct {bytes, path}")
        if kind == "struct" and value is not None:
            data, path = value.get("bytes"), value.get("path")
            if data is None and path:
                return self._image_file(path)
            value = data
        if value is None:
            raise RejectedInput(f"null image: column {name!r} is null in this row")
        return value, None

    def _image_file(self, path: str) -> tuple[bytes, list]:
        """An HF image stored by path only: read relative to the Parquet file, inside SRC only. The file
        is an input of its shard beside the Parquet file: its stats go into the shard's rerun check
        (a missing one too, as size -1, so that it appearing later rebuilds the shard)."""
        if is_url(self.opts.root):
            return self._remote_image_file(path)
        root = os.path.realpath(self.opts.root)
        full = os.path.realpath(os.path.join(root, os.path.dirname(self.rel), path))
        if os.path.commonpath([root, full]) != root:
            raise RejectedInput(f"image path outside the source folder: {path!r} (the row has no image bytes)")
        link = [os.path.relpath(full, root).replace(os.sep, "/"), -1, -1]
        try:
            with open(full, "rb") as f:
                st = os.fstat(f.fileno())
                link[1:] = [st.st_size, st.st_mtime_ns]
                return f.read(), link
        except OSError as e:
            error = RejectedInput(f"unreadable image path {path!r}: {e.strerror or e}")
            error.linked = link
            raise error from None

    def _remote_image_file(self, path: str) -> tuple[bytes, list]:
        """_image_file for SRC on a store: the path is resolved by name (a store has no links)."""
        from shardkit.store.remote import RemoteError
        from shardkit.store import join, read_source, stat_source

        rel = posixpath.normpath(posixpath.join(posixpath.dirname(self.rel), path))
        if rel.startswith("../") or rel == ".." or posixpath.isabs(rel):
            raise RejectedInput(f"image path outside the source folder: {path!r} (the row has no image bytes)")
        link, url = [rel, -1, -1], join(self.opts.root, rel)
        try:
            stat = stat_source(url, self.opts.policy)
            if stat is None:
                raise RejectedInput(f"unreadable image path {path!r}: no such file")
            link[1:] = list(stat)
            return read_source(url, policy=self.opts.policy), link
        except (RejectedInput, RemoteError) as e:
            if isinstance(e, RemoteError) and not e.not_found:
                raise
            error = RejectedInput(str(e) if isinstance(e, RejectedInput) else
                                  f"unreadable image path {path!r}: {e.detail}")
            error.linked = link
            raise error from None

    def _label(self, value) -> int:
        name, label = self.opts.label_field, self.info["label"]
        if label["type"].startswith("bad:"):
            raise self._bad_type(name, label["type"], "--label-field", "integers or strings")
        if value is None:
            raise RejectedInput(f"null label: column {name!r} is null in this row")
        if label["type"] == "string":
            return self.label_index[value]
        if value == -1:  # Hugging Face datasets mark rows without a label (e.g. a test split) with -1
            raise RejectedInput(f"no label: {value} in column {name!r} marks an unlabelled row (as test splits "
                                "have); build such a split without --label-field to keep its rows")
        if not 0 <= value < self.label_index:
            raise RejectedInput(f"label out of range: {value} in column {name!r}, expected 0..{self.label_index - 1} "
                                "(the class names recorded with the data)")
        return value

    def __call__(self, row: dict, key: str, source: str) -> Sample:
        info, opts, fields = self.info, self.opts, {}
        if not info["text"] and not info["image"]:
            raise RejectedInput(f"missing field: no column {opts.text_field!r} (--text-field) or "
                                f"{opts.image_field!r} (--image-field) in this file; its columns: "
                                f"{', '.join(info['columns'])}")
        if info["text"]:
            if info["text"].startswith("bad:"):
                raise self._bad_type(opts.text_field, info["text"], "--text-field", "a string")
            if row[opts.text_field] is None:
                raise RejectedInput(f"null text: column {opts.text_field!r} is null in this row")
            fields["txt"] = row[opts.text_field]
        link = None
        if info["image"]:
            fields["image"], link = self._image(row[opts.image_field])
        if opts.label_field:
            if info["label"] is None:
                raise RejectedInput(f"missing field: no label column {opts.label_field!r} (--label-field) in this "
                                    f"file; its columns: {', '.join(info['columns'])}")
            fields["cls"] = self._label(row[opts.label_field])
        if info["meta"]:
            fields["json"] = {name: jsonable(row[name]) for name in info["meta"]}
        meta = {"source": source, "source_path": self.rel, "source_row": int(source.rsplit(":", 1)[1]),
                "utf8_replaced": 0}
        if "image" in fields:
            meta["image_ext"] = image_ext(fields["image"])  # what `--encode keep` names the field
        if link:
            meta["linked"] = link
        return Sample(key, fields, meta)


@contextlib.contextmanager
def _opened(path: str, policy=None):
    """A ParquetFile of a local path (read by pyarrow itself) or of a URL (store.open_source, waiting as
    `policy`, the job's RemotePolicy)."""
    import pyarrow.parquet as pq

    from shardkit.store import open_source

    if not is_url(path):
        yield pq.ParquetFile(path)
        return
    with open_source(path, policy) as f:
        yield pq.ParquetFile(f)


@functools.lru_cache(maxsize=4)
def _row_group(path: str, version: int, group: int, opts):
    with _opened(path, opts.policy) as pf:
        return describe(pf, opts), pf.read_row_group(group)


def row_group_of(path: str, row: int, opts):
    """(description, row group table, its first row) holding `row`: rows read one by one in order
    cost one row group read per group (the last few are cached)."""
    from shardkit.store import stat_source

    with _opened(path, opts.policy) as pf:
        md, first = pf.metadata, 0
    for g in range(md.num_row_groups):
        n = md.row_group(g).num_rows
        if row < first + n:
            info, table = _row_group(path, (stat_source(path, opts.policy) or (0, 0))[1], g, opts)
            return info, table, first
        first += n
    raise RejectedInput(f"row {row} is past the end of the file ({md.num_rows} rows): it changed since it was listed")


def parquet_rows(opts, rf, count, start: int, stop: int, convert: RowConverter, keys=None):
    """RowRefs of rows [start, stop) of a Parquet file: the row groups that hold them are read once."""
    from shardkit.sources.index import RowRef, load_index, row_key
    from shardkit.store import join

    rows = load_index(count, opts.policy)[start:stop]
    if not len(rows):
        return
    groups = sorted(set(rows["offset"].tolist()))
    with _opened(join(opts.root, rf.rel), opts.policy) as pf:
        first_row = sum(pf.metadata.row_group(g).num_rows for g in range(groups[0]))
        table = pf.read_row_groups(groups)
    lo = int(rows["number"][0]) - first_row
    records = table.slice(lo, len(rows)).to_pylist()
    width = count.width
    for i, (number, record) in enumerate(zip(rows["number"].tolist(), records)):
        key = keys[i] if keys is not None else row_key(rf.stem_key, number, width)
        source = f"{rf.rel}:{number}"
        yield RowRef(source, lambda record=record, key=key, source=source: convert(record, key, source))
