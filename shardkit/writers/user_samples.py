"""User samples -> shardkit Samples: a field's kind from its value's type, checked against the fields.

What ShardWriter and build_map share: `WriterConfig` (format, shard cuts, image encoding), `infer_spec`
/ `infer_fields` (the manifest's field specs from a first sample) and `to_sample` (a user's dict
checked and turned into stored values, or BadSample naming the key and the field).
"""

from __future__ import annotations


from shardkit.errors import ShardkitError
from shardkit.sample import Sample, check_key
from shardkit.config.writer import WriterConfig

# Bytes under one of these names are an encoded image, kept as it is (spec encoding "keep", as
# `shardkit build --encode keep` stores them); bytes under any other name are plain bytes.
IMAGE_EXTENSIONS = ("jpg", "jpeg", "png", "webp", "bmp", "gif", "tif", "tiff")
ARRAY_DTYPE_KINDS = "biufc"  # numpy dtype kinds an array field may have: what a torch tensor can hold


class BadSample(ShardkitError, ValueError):
    """A sample that does not fit the writer's fields (or has a bad or repeated key)."""


def _kind(value) -> str:
    """The kind a value's type gives it (bool is refused: it would silently become an int)."""
    import numpy as np

    if isinstance(value, bool):
        return "bool"
    if isinstance(value, (int, np.integer)):
        return "int"
    if isinstance(value, str):
        return "text"
    if isinstance(value, (bytes, bytearray, memoryview)):
        return "bytes"
    if isinstance(value, dict):
        return "json"
    if isinstance(value, np.ndarray):
        return "array"
    if _is_pil(value):
        return "pil"
    return type(value).__name__


def _is_pil(value) -> bool:
    import sys

    image = sys.modules.get("PIL.Image")  # a PIL image means PIL is imported already
    return image is not None and isinstance(value, image.Image)


KIND_HELP = ("bytes (under an extension such as 'jpg', 'wav'), a PIL image, a numpy array, an int, a str "
             "or a dict (json)")


def infer_spec(name: str, value, cfg: WriterConfig) -> dict:
    """The field spec a first value gives field `name` (the manifest's `fields[name]`)."""
    kind = _kind(value)
    if kind == "bytes":
        return {"kind": "image", "encoding": "keep"} if name.lower() in IMAGE_EXTENSIONS else {"kind": "bytes"}
    if kind == "pil":
        spec = {"kind": "image", "encoding": cfg.encode}
        if cfg.encode == "raw":
            spec.update(dtype="uint8", shape=[value.height, value.width, 3])
        return spec
    if kind == "array":
        return {"kind": "array", "dtype": value.dtype.newbyteorder("<").name, "shape": list(value.shape)}
    if kind == "int":
        return {"kind": "int", "dtype": "int64"}
    if kind in ("text", "json"):
        return {"kind": kind}
    raise BadSample(f"field {name!r} holds a {kind}; a field value is {KIND_HELP}")


def infer_fields(sample: dict, cfg: WriterConfig) -> dict:
    """Field specs from a first sample (every field but `__key__`; None values are left out)."""
    key = _check_dict(sample)
    try:
        return {name: infer_spec(name, value, cfg) for name, value in sorted(sample.items())
                if name != "__key__" and value is not None}
    except BadSample as e:
        raise BadSample(f"sample {key!r}, {e}") from None


def _check_dict(sample) -> str:
    if not isinstance(sample, dict):
        raise BadSample(f"a sample is a dict with '__key__' and fields, not a {type(sample).__name__}")
    if "__key__" not in sample:
        raise BadSample(f"sample with fields {sorted(sample)} has no '__key__': give each sample a unique key, "
                        "e.g. {'__key__': f'{i:08d}', ...}")
    key = sample["__key__"]
    if not isinstance(key, str):
        raise BadSample(f"'__key__' is {key!r} ({type(key).__name__}); a key is a str, e.g. f'{{i:08d}}'")
    try:
        return check_key(key)
    except ValueError as e:
        raise BadSample(str(e)) from None


def _int_value(value, kind: str, bad) -> int:
    """The stored form of an int field's value, or the BadSample `bad` makes when it is no int64."""
    if kind != "int":
        raise bad(f"expected an int, got a {kind}")
    value = int(value)
    if not -2**63 <= value < 2**63:
        raise bad(f"{value} does not fit in int64", mismatch=False)
    return value


def store(key: str, name: str, spec: dict, value, cfg: WriterConfig, copy: bool = True):
    """The stored form of one value (bytes, int, str or dict), or BadSample naming key and field.
    copy=False leaves an array as a C-contiguous ndarray, possibly the caller's own, to be copied
    before the caller gets control back (ShardCutter copies it into its shard buffer)."""
    kind, want = _kind(value), spec["kind"]

    def bad(detail: str, mismatch: bool = True) -> BadSample:
        why = (" (the fields are declared with fields=, or taken from the first sample: every sample's value of a "
               "field has one kind)") if mismatch else ""
        return BadSample(f"sample {key!r}, field {name!r}: {detail}{why}")

    if want == "image":
        if spec["encoding"] == "keep":
            if kind != "bytes":
                raise bad(f"expected encoded image bytes, got a {kind}")
            return bytes(value)
        if kind != "pil":
            raise bad(f"expected a PIL image (stored as {spec['encoding']}), got a {kind}")
        return _encode_image(value, spec, cfg, bad)
    if want == "bytes":
        if kind != "bytes":
            raise bad(f"expected bytes, got a {kind}")
        return bytes(value)
    if want == "array":
        return _array_value(value, spec, bad, kind, copy)
    if want == "int":
        return _int_value(value, kind, bad)
    if want == "text":
        if kind != "text":
            raise bad(f"expected a str, got a {kind}")
        return _utf8_checked(value, f"sample {key!r}, field {name!r}")
    if want == "json":
        if kind != "json":
            raise bad(f"expected a dict (json), got a {kind}")
        return _json_checked(value, bad, f"sample {key!r}, field {name!r}")
    raise bad(f"kind {want!r} cannot be written by ShardWriter")


def _encode_image(im, spec: dict, cfg: WriterConfig, bad):
    from shardkit.stages.image import encode

    if im.mode != "RGB":  # readers decode every image to RGB: store what they will give back
        im = im.convert("RGB")
    if spec.get("shape") is not None and [im.height, im.width, 3] != spec["shape"]:
        raise bad(f"image of {im.width}x{im.height}; raw images have one size, the first's "
                  f"{spec['shape'][1]}x{spec['shape'][0]} (resize first, or encode='png'/'jpeg' for mixed sizes)")
    return encode(im, spec["encoding"], cfg.quality)


def _array_value(value, spec: dict, bad, kind: str, copy: bool):
    import numpy as np

    if kind != "array":
        raise bad(f"expected a numpy array, got a {kind}")
    if value.dtype.kind not in ARRAY_DTYPE_KINDS:  # objects, strings, records, dates: torch has no such tensor
        raise bad(f"an array of dtype {value.dtype} cannot be stored: arrays hold bool, int, uint, float or complex "
                  "numbers; convert it (.astype(np.float32)), or store the values as a dict (json) or str",
                  mismatch=False)
    if value.size == 0:
        raise bad(f"an array of shape {list(value.shape)} has no values, and a stored array has at least one; "
                  "leave the field out of this sample (None) instead", mismatch=False)
    if list(value.shape) != spec["shape"]:
        raise bad(f"array of shape {list(value.shape)}; the field's arrays have shape {spec['shape']} "
                  "(pad or crop to one shape)")
    if value.dtype.newbyteorder("<") != np.dtype(spec["dtype"]):
        raise bad(f"array of dtype {value.dtype}; the field's arrays are {spec['dtype']} (cast with .astype)")
    arr = np.ascontiguousarray(value, dtype=np.dtype(spec["dtype"]))
    return arr.tobytes() if copy else arr


def _utf8_checked(text: str, where: str, what: str = "the text") -> str:
    """`text`, if UTF-8 can store it: a lone surrogate (half of a UTF-16 pair, or a byte that
    os.fsdecode or errors='surrogateescape' kept) cannot be, and would fail the shard's write later."""
    if not text.isascii():  # O(1) for ASCII text: only other text pays for the check
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as e:
            at = f" at character {e.start}" if what == "the text" else ""
            raise BadSample(f"{where}: {what} holds {text[e.start]!r}{at}, a lone surrogate that UTF-8 cannot "
                            "store; decode the source bytes with errors='replace', or store them as bytes") from None
    return text


def _json_checked(value: dict, bad, where: str) -> dict:
    import json

    try:
        text = json.dumps(value, allow_nan=False, ensure_ascii=False)  # as the writers dump it
    except (TypeError, ValueError) as e:
        raise bad(f"the dict is not JSON ({e})", mismatch=False) from None
    _utf8_checked(text, where, "a str in the dict")
    return value


def to_sample(sample: dict, fields: dict, cfg: WriterConfig, copy: bool = True) -> Sample:
    """A user's sample dict checked against `fields` and turned into a Sample of stored values
    (copy=False: arrays as ndarrays that may be the caller's, see `store`)."""
    key = _check_dict(sample)
    extra = sorted(set(sample) - set(fields) - {"__key__"})
    if extra:
        raise BadSample(f"sample {key!r} has field(s) {extra} that the dataset does not have (its fields: "
                        f"{sorted(fields)}); declare every field with fields= or give the first sample all of them")
    stored = {name: store(key, name, fields[name], sample[name], cfg, copy)
              for name in fields if sample.get(name) is not None}
    if not stored:
        raise BadSample(f"sample {key!r} has no field values: nothing to store")
    return Sample(key, stored, {})
