"""Array fields on the read side: stored float16 tensors, cast on request (one op per batch)."""

from __future__ import annotations

from shardkit.errors import ConfigError


def cast(dtype=None, fields: tuple[str, ...] = ("array",)):
    """A batch_transform casting `fields` to `dtype` (e.g. torch.float32) once per batch; float16
    datasets (built with --half) are otherwise returned as stored, as float16 tensors."""
    import torch

    if dtype is not None and not isinstance(dtype, torch.dtype):
        raise ConfigError(f"cast(dtype={dtype!r}): expected a torch dtype such as torch.float32")

    def transform(batch: dict) -> dict:
        for name in fields:
            value = batch.get(name)
            if isinstance(value, torch.Tensor):
                batch[name] = value.to(dtype)
            elif isinstance(value, list):
                batch[name] = [None if v is None else v.to(dtype) for v in value]
        return batch

    return transform
