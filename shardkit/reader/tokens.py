"""Tokenized datasets on the read side: stored ids -> LongTensors per batch, no per-token Python."""

from __future__ import annotations

import numpy as np

IGNORE_INDEX = -100  # torch.nn.CrossEntropyLoss's default ignore_index


def rows(flat: np.ndarray, present: np.ndarray, spec: dict, alloc):
    """Packed rows (B, seq_len+1 ids as bytes) -> one (B, seq_len+1) int64 tensor in memory from
    `alloc` (a reusable shared slot in a make_loader worker: the batch is 4x its stored size, and a
    fresh shared segment per batch cost more than reading it); a list with None where a sample has
    no row (mixed datasets)."""
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
    """Packed rows (B, N+1) -> (inputs, targets), each (B, N): targets are the rows shifted by one,
    padding becomes IGNORE_INDEX in the targets and 0 in the inputs (masked out by the targets)."""
    inputs, targets = tokens[:, :-1].clone(), tokens[:, 1:].clone()
    inputs[inputs == pad_id] = 0
    targets[targets == pad_id] = IGNORE_INDEX
    return inputs, targets


def segment_ids(doc_starts, row_len: int):
    """doc_starts (B, S) as read (-1 = padding) -> (B, row_len) int64 segment numbers: tokens attend only
    within their segment (a block-diagonal attention mask is `seg[:, :, None] == seg[:, None, :]`)."""
    import torch

    starts = doc_starts.long()
    marks = torch.zeros(len(starts), row_len + 1, dtype=torch.int64)
    # padding (-1) scatters into a spare last column that is cut off
    marks.scatter_add_(1, torch.where(starts < 0, row_len, starts), (starts >= 0).long())
    return marks[:, :row_len].cumsum(1) - 1
