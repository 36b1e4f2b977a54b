"""`shardkit show`: one sample of a dataset, by key or index, printed field by field (ds[i] / ds.get)."""

from __future__ import annotations

import json
import re

import click

INDEX = re.compile(r"#(-?\d+)")
TEXT_CHARS = 2000  # text printed before it is cut (--full prints all of it)
PREVIEW = 8  # array values shown


@click.command()
@click.argument("dataset")
@click.argument("key")
@click.option("--key", "literal", is_flag=True, help="Take KEY as a key even when it reads like #N.")
@click.option("--format", "format", type=click.Choice(["tar", "parquet"]), default=None,
              help="Shards to read when the dataset has both [default: tar].")
@click.option("--out", type=click.Path(dir_okay=False), default=None,
              help="Write the sample's image to this file (its folder is created): an encoded image (JPEG, PNG, ...) as its stored "
                   "bytes, a raw array through Pillow (format from the file's extension, PNG without one).")
@click.option("--field", default=None, help="The field --out writes [default: the sample's first image field].")
@click.option("--full", is_flag=True, help=f"Print whole texts (else cut at {TEXT_CHARS} characters).")
@click.option("--cache-dir", default=None, help="Where a remote dataset's shards are cached.")
def show(dataset, key, literal, format, out, field, full, cache_dir):
    """Print one sample of DATASET (a folder or URL): KEY is its key, or #N for its index N in the
    dataset's order (#-1: the last sample). Texts and numbers are printed, arrays as shape, dtype
    and their first values, bytes as their length.

    \b
    Examples:
      shardkit show out/ cat/000123
      shardkit show out/ '#0'                    # the first sample (quote the #: shells treat it as a comment)
      shardkit show out/ '#-1' --format parquet
      shardkit show out/ cat/000123 --out cat.png
      shardkit show https://host/data/ docs/000042/17 --full
    """
    from shardkit.reader.dataset import StreamingDataset

    ds = StreamingDataset(dataset, format=format, cache_dir=cache_dir, shuffle=False)
    match = None if literal else INDEX.fullmatch(key)
    index = ds.lookup.check_index(int(match.group(1))) if match else ds.lookup.index_of(key)
    if index is None:
        raise ds.lookup.not_found(key)
    sample = ds.lookup.sample(index)
    click.echo(f"sample #{index} of {dataset}")
    for name, value in sample.items():
        click.echo(f"  {name:<10} {describe(value, full)}")
    if out is not None:
        written = write_image(ds, index, sample, field, out)
        click.echo(f"wrote {out} ({written})")


def describe(value, full: bool = False) -> str:
    """One field's value as a line (or, for a text, its lines)."""
    import numpy as np
    import torch

    if isinstance(value, torch.Tensor):
        value = value.numpy()
    if isinstance(value, np.ndarray):
        if value.ndim == 0:
            return str(value.item())
        flat = value.reshape(-1)
        shown = ", ".join(f"{v:g}" if flat.dtype.kind == "f" else str(v) for v in flat[:PREVIEW].tolist())
        stats = f" min {flat.min():g} max {flat.max():g}" if flat.size and flat.dtype.kind in "uif" else ""
        more = ", …" if flat.size > PREVIEW else ""
        return f"array shape {tuple(value.shape)} {value.dtype}{stats} [{shown}{more}]"
    if isinstance(value, (bytes, bytearray, memoryview)):
        return f"{len(value)} bytes"
    if isinstance(value, str):
        if full or len(value) <= TEXT_CHARS:
            return value
        return f"{value[:TEXT_CHARS]}… ({len(value)} characters; --full prints all)"
    if isinstance(value, (dict, list)):
        return json.dumps(value, ensure_ascii=False)
    return str(value)


def write_image(ds, index: int, sample: dict, field: str | None, out: str) -> str:
    """Write an image field of sample `index` to `out` from its stored form; returns what was written, in words."""
    from shardkit.errors import ConfigError

    images = [n for n in ds.fields if ds.field_specs[n]["kind"] == "image" and n in sample]
    if field is None and not images:
        raise ConfigError(f"--out: sample #{index} has no image field (its fields: {sorted(sample)}); "
                          "leave out --out, or pick a sample with an image")
    field = field or images[0]
    if field not in images:
        raise ConfigError(f"--field {field!r}: not an image field of sample #{index}; its image fields: {images}")
    spec, data = ds.field_specs[field], ds.lookup.stored(index, field)
    import os

    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)  # a missing folder is made, as build makes OUT
    if spec.get("encoding") != "raw":  # encoded: the stored bytes are the file
        with open(out, "wb") as f:
            f.write(data)
        return f"{field}: {len(data)} bytes of {spec.get('encoding', 'encoded')} image, as stored"
    # the stored array (H, W, C), not the decoded tensor (channels first, maybe cast or transformed)
    import numpy as np

    return _write_array(np.frombuffer(data, spec.get("dtype", "uint8")).reshape(spec["shape"]), field, out)


def _write_array(arr, field: str, out: str) -> str:
    import os

    import numpy as np
    from PIL import Image

    from shardkit.errors import ConfigError

    if arr.dtype != np.uint8 or not (arr.ndim == 2 or (arr.ndim == 3 and arr.shape[-1] in (1, 3, 4))):
        raise ConfigError(f"--out: field {field!r} is an array of shape {arr.shape} {arr.dtype}; only uint8 "
                          "images of shape (H, W), (H, W, 1), (H, W, 3) or (H, W, 4) can be written")
    image = Image.fromarray(arr[..., 0] if arr.ndim == 3 and arr.shape[-1] == 1 else arr)
    fmt = None if os.path.splitext(out)[1] else "PNG"
    try:
        image.save(out, format=fmt)
    except (KeyError, ValueError) as e:  # Pillow: an extension it cannot write
        raise ConfigError(f"--out {out}: Pillow cannot write that file type ({e}); name it .png") from e
    return f"{field}: {arr.shape} uint8 array as {fmt or os.path.splitext(out)[1][1:].upper()}"
