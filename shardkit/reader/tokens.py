"""Token datasets on the read side: batches built from the stored ids, training fields per batch.

A batch of packed rows leaves the shard as stored (uint16/uint32, gathered with one copy) and is
widened once, straight into the tensors the training step takes (in the workers, or with pinned
memory in the main process: see StreamingDataset._cross_stored): `input_ids` and `labels` (shifted,
IGNORE_INDEX at padding) by default; `position_ids` (restarting at each document and at the row
start) and `document_ids` (the document's number in the dataset, -1 on padding) for document-masked
attention when asked for with fields=. Each int64 field costs as much memory traffic as the whole
memmap-gather ceiling moves, hence the opt-in. `tokens="rows"` gives the stored rows instead,
padding included.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from shardkit.errors import ConfigError
from shardkit.stages.tokenize import DOCUMENTS, PACKED, TOKENS_FIELD

IGNORE_INDEX = -100  # torch.nn.CrossEntropyLoss's default ignore_index
TRAIN_FIELDS = ("input_ids", "labels", "position_ids", "document_ids")
DEFAULT_FIELDS = ("input_ids", "labels")
# A packed batch as it crosses from a worker: the rows as stored and their document layout.
STORED, DOCS, STARTS = "__ids__", "__docs__", "__starts__"


def _np_empty(shape) -> np.ndarray:
    return np.empty(shape, np.uint8)


@dataclass(frozen=True)
class TokenOptions:
    """What a token batch holds: the mode, the training fields, their dtype, boundary masking."""

    mode: str = "train"
    outputs: tuple[str, ...] = DEFAULT_FIELDS
    dtype: str = "int64"
    mask_boundaries: bool = False
    eos_id: int = 0


def token_spec(fields: dict) -> dict | None:
    """The dataset's tokens field spec when it has a layout this module builds batches for."""
    spec = fields.get(TOKENS_FIELD)
    return spec if spec is not None and spec.get("layout") in (PACKED, DOCUMENTS) else None


def resolve(fields: dict, config, requested) -> tuple[TokenOptions | None, list[str] | None]:
    """TokenOptions for this dataset and StreamConfig (None: not a token dataset, or stored rows of an
    older layout), plus the manifest fields to read once training-field names are taken out of
    `requested` (None: all)."""
    spec = token_spec(fields)
    names = [f for f in requested if f not in TRAIN_FIELDS] if requested is not None else None
    asked = [f for f in requested or () if f in TRAIN_FIELDS]
    if spec is None:
        if config.tokens == "train" or asked:
            what = "no tokens field" if TOKENS_FIELD not in fields else "tokens in an older layout"
            raise ConfigError(f"training fields ({', '.join(TRAIN_FIELDS)}) need a tokenized dataset built by this "
                              f"shardkit; this one has {what}: rebuild it (shardkit build ... --tokenizer), or read "
                              "its stored fields (tokens='rows', and split_rows for inputs/targets)")
        if config.dtype in ("int32", "int64"):
            raise ConfigError(f"dtype={config.dtype!r} applies to token ids of datasets built by this shardkit; "
                              "this one has none: leave dtype unset, or pass a float dtype for float arrays")
        return None, names
    mode = config.tokens or "train"
    if asked and mode != "train":
        raise ConfigError(f"fields={list(requested)!r} names training fields, but tokens={mode!r} gives the stored "
                          "rows (field 'tokens'): drop tokens='rows' or ask for fields='tokens'")
    dtype = config.dtype if config.dtype in ("int32", "int64") else "int64"
    options = TokenOptions(mode, tuple(f for f in TRAIN_FIELDS if f in asked) or DEFAULT_FIELDS, dtype,
                           bool(config.mask_boundaries), int(spec["eos_id"]))
    if names is not None and asked and TOKENS_FIELD not in names:
        names.append(TOKENS_FIELD)
    return options, names


def documents_of(offsets: np.ndarray, rows: np.ndarray, width: int):
    """Per stored row of a packed shard: (document holding column 0, where the real ids end, and the
    (row, column) of every other document start in it), from the shard's document offsets. Row r
    holds stream positions r * (width - 1) ... r * (width - 1) + width - 1 (rows overlap by one id)."""
    r0 = rows.astype(np.int64) * (width - 1)
    first = np.searchsorted(offsets, r0, side="right") - 1
    last = np.searchsorted(offsets[:-1], r0 + width, side="left")  # documents starting before the row's end
    counts = last - first - 1
    real_end = np.minimum(offsets[-1] - r0, width)
    rr = np.repeat(np.arange(len(rows)), counts)
    idx = np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts - first - 1, counts)
    return first, real_end, rr, offsets[idx] - r0[rr]


def train_fields(ids: np.ndarray, first_doc: np.ndarray, real_end: np.ndarray, starts: tuple, opts: TokenOptions,
                 alloc=_np_empty, shared: bool = False) -> dict:
    """Rows of ids (B, L+1) -> the selected training fields, each a (B, L) array of opts.dtype in memory from
    `alloc`. real_end[b]: where row b's padding begins; starts: (rows, columns) of document starts after
    column 0; first_doc[b]: the document holding row b's column 0.

    `shared`: where nothing differs between a row's inputs and its targets (no padding in the batch, no
    boundary masking), `input_ids` and `labels` are the two shifted views of one widened (B, L+1) array:
    each id is widened once, half the bytes written (see `widened_once`)."""
    n, width = ids.shape
    length, dtype = width - 1, np.dtype(opts.dtype)
    rr, cc = starts

    def new() -> np.ndarray:
        return alloc((n, length * dtype.itemsize)).view(dtype)

    out = {}
    padded = np.nonzero(real_end < width)[0].tolist()
    if shared and widened_once(opts, padded):
        wide = alloc((n, width * dtype.itemsize)).view(dtype)
        np.copyto(wide, ids, casting="unsafe")  # the one widening pass
        out["input_ids"], out["labels"] = wide[:, :-1], wide[:, 1:]
    if "input_ids" in opts.outputs and "input_ids" not in out:
        out["input_ids"] = x = new()
        np.copyto(x, ids[:, :-1], casting="unsafe")  # the one widening pass
        for r in padded:  # padding as input: any valid id; its label is ignored and it comes last
            x[r, real_end[r]:] = opts.eos_id
    if "labels" in opts.outputs and "labels" not in out:
        out["labels"] = y = new()
        np.copyto(y, ids[:, 1:], casting="unsafe")
        for r in padded:
            y[r, max(int(real_end[r]) - 1, 0):] = IGNORE_INDEX
        if opts.mask_boundaries and len(cc):  # the first id of a document, predicted from the last one's EOS
            y[rr, cc - 1] = IGNORE_INDEX
    pos = new() if "position_ids" in opts.outputs else None
    doc = new() if "document_ids" in opts.outputs else None
    if pos is not None or doc is not None:
        _segments(pos, doc, first_doc, real_end, starts, length)
        out.update({k: v for k, v in (("position_ids", pos), ("document_ids", doc)) if v is not None})
    return out


def widened_once(opts: TokenOptions, padded: list) -> bool:
    """Whether a batch's `input_ids` and `labels` can be views of one widened array: both asked for, and
    no id where they must differ (padding: EOS as input, ignored as target; with mask_boundaries, a
    document's first id is ignored as a target only)."""
    return "input_ids" in opts.outputs and "labels" in opts.outputs and not padded and not opts.mask_boundaries


def _segments(pos, doc, first_doc, real_end, starts: tuple, length: int) -> None:
    """Fill position_ids / document_ids (either may be None): 0..L-1 and the row's first document, then
    from each document start (or where padding begins) to the next, positions restart and the
    document number moves on (-1: padding). Rows hold a few starts each: a loop over the starts
    writes each segment once, where whole-batch index arrays would cost several passes."""
    base = np.arange(length)
    if pos is not None:
        pos[:] = base
    if doc is not None:
        doc[:] = first_doc[:, None]
    rr, cc = starts
    inside = cc < length  # a start at column L only moves a label
    pr = np.nonzero(real_end < length)[0]
    b_row = np.concatenate([rr[inside], pr])
    b_col = np.concatenate([cc[inside], real_end[pr]])
    order = np.lexsort((b_col, b_row))
    b_row, b_col = b_row[order].tolist(), b_col[order].tolist()
    pad_at = dict(zip(pr.tolist(), real_end[pr].tolist()))
    for i, (r, c) in enumerate(zip(b_row, b_col)):
        end = b_col[i + 1] if i + 1 < len(b_row) and b_row[i + 1] == r else length
        if pos is not None:
            pos[r, c:end] = base[:end - c]
        if doc is not None:
            doc[r, c:end] = -1 if pad_at.get(r) == c else doc[r, c - 1] + 1


class TokenBatches:
    """How a token dataset's batches are built (picklable: one per StreamingDataset, used in workers)."""

    def __init__(self, spec: dict, shards: list, options: TokenOptions, keys: bool):
        self.spec, self.options, self.keys = spec, options, keys
        self.packed = spec["layout"] == PACKED
        self.width = int(spec["seq_len"]) + 1 if self.packed else None
        self.stored = np.dtype(spec["dtype"]).newbyteorder("<")
        self.shard_ids = [s.id for s in shards]
        self.doc_base = None
        if self.packed:
            missing = [s.path for s in shards if s.documents is None]
            if missing:
                raise ConfigError(f"the manifest does not count the documents of {missing[0]}; rebuild the dataset")
            self.doc_base = np.concatenate([[0], np.cumsum([s.documents for s in shards])]).astype(np.int64)
            if options.dtype == "int32" and self.doc_base[-1] > np.iinfo(np.int32).max:
                raise ConfigError(f"dtype='int32' cannot number {self.doc_base[-1]} documents; use dtype='int64'")
        self._scratch = None

    def slots(self) -> int:
        """Tensors per batch that the loader's shared slots should hold (packed rows crossing as stored
        take one)."""
        if self.options.mode == "rows":
            return 1 if self.packed else 0
        return len(self.options.outputs)

    def scratch(self, shape) -> np.ndarray:
        """Reused memory for rows widened in this process: gathering them costs no page faults."""
        if self._scratch is None or self._scratch.size < int(np.prod(shape)):
            self._scratch = np.empty(int(np.prod(shape)), np.uint8)
        return self._scratch[:int(np.prod(shape))].reshape(shape)

    def __getstate__(self):
        return dict(self.__dict__, _scratch=None)

    def open(self, path: str, shard, url: str, cache):
        from shardkit.reader.token_shards import open_rows

        return open_rows(path, shard, self.spec, url, cache)

    def packed_batch(self, groups: list, n: int, alloc=_np_empty, guard=None) -> dict:
        """The batch of packed rows `groups` [(shard index, reader, batch positions, rows)] of size n,
        as stored: `__ids__` (n, seq_len+1) in memory from `alloc`, and for training fields the
        document layout of each row, `__docs__` (n, 2: first document, where padding begins) and
        `__starts__` (S, 2: row, column of each other document start). `finish` makes the fields."""
        import torch

        ids = alloc((n, self.width * self.stored.itemsize)).view(self.stored.newbyteorder("="))
        docs, starts, keys = np.empty((n, 2), np.int64), [], [None] * n
        train = self.options.mode == "train"
        for s, reader, pos, rows in groups:
            if guard is None:
                reader.fill(rows, ids, pos)
            else:
                guard(s, lambda: reader.fill(rows, ids, pos))
            if train:
                first, end, rr, cc = documents_of(reader.offsets, rows, self.width)
                docs[pos, 0], docs[pos, 1] = self.doc_base[s] + first, end
                starts.append(np.stack([pos[rr], cc], axis=1))
            if self.keys:
                sid = self.shard_ids[s]
                for p, r in zip(pos.tolist(), rows.tolist()):
                    keys[p] = f"tokens-{sid:05d}-{r:07d}"
        batch = {"__key__": keys} if self.keys else {}
        batch[STORED] = torch.from_numpy(ids)
        if train:
            batch[DOCS] = torch.from_numpy(docs)
            batch[STARTS] = torch.from_numpy(np.concatenate(starts) if starts else np.zeros((0, 2), np.int64))
        return batch

    def finish(self, batch: dict, alloc=_np_empty, shared: bool = True) -> dict:
        """Stored rows -> the training fields (or tokens="rows": the rows) in the asked dtype, each
        widened once into memory from `alloc`. `shared`: `input_ids` and `labels` may be views of one
        array (train_fields); the main process widening into pinned memory passes False, since a
        strided view would be copied once more on its way to the device."""
        import torch

        ids = batch[STORED].numpy()
        out = {k: v for k, v in batch.items() if k not in (STORED, DOCS, STARTS)}
        dtype = np.dtype(self.options.dtype)
        if self.options.mode == "rows":
            rows = alloc((len(ids), ids.shape[1] * dtype.itemsize)).view(dtype)
            np.copyto(rows, ids, casting="unsafe")
            out[TOKENS_FIELD] = torch.from_numpy(rows)
            return out
        docs, starts = batch[DOCS].numpy(), batch[STARTS].numpy()
        fields = train_fields(ids, docs[:, 0], docs[:, 1], (starts[:, 0], starts[:, 1]), self.options, alloc, shared)
        out.update({k: torch.from_numpy(v) for k, v in fields.items()})
        return out

    @staticmethod
    def cut(batch: dict, sizes: list[int]):
        """A group of consecutive batches (stored form) -> each batch, as views of the group's memory."""
        starts, lo = batch.get(STARTS), 0
        for size in sizes:
            part = {k: v[lo:lo + size] for k, v in batch.items() if k != STARTS}
            if starts is not None:
                inside = (starts[:, 0] >= lo) & (starts[:, 0] < lo + size)
                part[STARTS] = starts[inside].clone()
                part[STARTS][:, 0] -= lo
            lo += size
            yield part

    def document_batch(self, batch: dict, sample_ids: np.ndarray, alloc=_np_empty) -> dict:
        """One document per sample: the padded `tokens` column -> training fields (document_ids: the
        sample's number in the dataset)."""
        import torch

        tokens = batch.pop(TOKENS_FIELD)
        ids = tokens.numpy() if tokens.shape[1] else np.full((len(tokens), 1), self.spec["pad_id"], np.int64)
        if self.options.mode == "rows":
            batch[TOKENS_FIELD] = tokens.to(getattr(torch, self.options.dtype))
            return batch
        real_end = (ids != self.spec["pad_id"]).sum(1)
        empty = np.zeros(0, np.int64)
        fields = train_fields(ids, np.asarray(sample_ids, np.int64), real_end, (empty, empty), self.options, alloc)
        batch.update({k: torch.from_numpy(v) for k, v in fields.items()})
        return batch


# Stored rows, as datasets built before the row layout read them (and tokens="rows" of unpacked ones).

def rows(flat: np.ndarray, present: np.ndarray, spec: dict, alloc):
    """Packed rows (B, seq_len+1 ids as bytes) -> one (B, seq_len+1) int64 tensor in memory from
    `alloc`; a list with None where a sample has no row (mixed datasets)."""
    import torch

    ids = flat.view(np.dtype(spec["dtype"]).newbyteorder("<")).reshape(len(flat), -1)
    if present.all():
        out = alloc((len(ids), ids.shape[1] * 8)).view(np.int64)
        np.copyto(out, ids, casting="safe")  # one vectorised widening per batch
        return torch.from_numpy(out)
    return [torch.from_numpy(r.astype(np.int64)) if p else None for r, p in zip(ids, present)]


def _padded(values: list, stored: np.dtype, fill: int) -> np.ndarray:
    """Variable-length 1-D arrays (bytes, None if absent) -> one (B, longest) int64 array padded with
    `fill`: a single array per batch, because DataLoader workers send each tensor of a list through
    its own shared-memory segment (~1 ms apiece), which would cost more than the reading."""
    blobs = [b"" if v is None else bytes(v) for v in values]
    lengths = np.array([len(b) // stored.itemsize for b in blobs], np.int64)
    out = np.full((len(blobs), int(lengths.max(initial=0))), fill, np.int64)
    out[np.arange(out.shape[1]) < lengths[:, None]] = np.frombuffer(b"".join(blobs), stored)
    return out


def sequences(values: list, spec: dict):
    """One document per sample (unpacked) -> a (B, longest) int64 tensor padded with spec["pad_id"]
    (never a real id: `tokens != pad_id` is the mask; `split_rows` turns it into inputs/targets)."""
    import torch

    return torch.from_numpy(_padded(values, np.dtype(spec["dtype"]).newbyteorder("<"), int(spec["pad_id"])))


def variable_arrays(values: list, spec: dict):
    """A variable-length 1-D integer field (e.g. doc_starts) -> a (B, longest) int64 tensor padded with -1."""
    import torch

    return torch.from_numpy(_padded(values, np.dtype(spec["dtype"]).newbyteorder("<"), -1))


def split_rows(tokens, pad_id: int):
    """Stored rows (B, N+1) -> (inputs, targets), each (B, N): targets are the rows shifted by one,
    padding becomes IGNORE_INDEX in the targets and 0 in the inputs (masked out by the targets)."""
    inputs, targets = tokens[:, :-1].clone(), tokens[:, 1:].clone()
    inputs[inputs == pad_id] = 0
    targets[targets == pad_id] = IGNORE_INDEX
    return inputs, targets


def segment_ids(doc_starts, row_len: int):
    """doc_starts (B, S) of the older row layout (-1 = padding) -> (B, row_len) int64 segment numbers: tokens
    attend only within their segment (a block-diagonal attention mask is `seg[:, :, None] == seg[:, None, :]`)."""
    import torch

    starts = doc_starts.long()
    marks = torch.zeros(len(starts), row_len + 1, dtype=torch.int64)
    # padding (-1) scatters into a spare last column that is cut off
    marks.scatter_add_(1, torch.where(starts < 0, row_len, starts), (starts >= 0).long())
    return marks[:, :row_len].cumsum(1) - 1
