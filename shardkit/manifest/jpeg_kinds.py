"""How many of a dataset's JPEGs are progressive, from a bounded sample of their headers (inspect):
GPUs' hardware JPEG engines take baseline JPEG only, the rest goes to slower backends."""

from __future__ import annotations

import io
import tarfile

SAMPLE = 256  # JPEG headers read at most, spread over at most SHARDS shards
SHARDS = 8
JPEG_EXTS = ("jpg", "jpeg")


def jpeg_kind(data: bytes) -> str | None:
    """"baseline", "progressive" or "other" (lossless, arithmetic) from a JPEG's frame header; None
    when the bytes are no JPEG."""
    if data[:2] != b"\xff\xd8":
        return None
    i, n = 2, len(data)
    while i + 4 <= n and data[i] == 0xFF:
        marker = data[i + 1]
        if marker == 0xFF:
            i += 1
            continue
        if marker in (0xC0, 0xC1):
            return "baseline"
        if marker == 0xC2:
            return "progressive"
        if 0xC3 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
            return "other"
        if marker in (0xDA, 0xD9):
            return None
        i += 2 + ((data[i + 2] << 8) | data[i + 3])
    return None


def _tar_values(url: str, field: str, limit: int):
    from shardkit.store.remote import open_url

    with open_url(url) as f, tarfile.open(fileobj=f, mode="r|") as tar:
        for member in tar:
            if limit <= 0:
                return
            if member.isfile() and member.name.rsplit(".", 1)[-1] == field:
                limit -= 1
                yield tar.extractfile(member).read()


def _parquet_values(url: str, field: str, limit: int):
    import pyarrow.parquet as pq

    from shardkit.store.remote import open_url

    with open_url(url) as f:
        pf = pq.ParquetFile(f)
        if pf.num_row_groups:
            yield from pf.read_row_group(0, columns=[field]).column(0).to_pylist()[:limit]


def progressive_share(manifest, root: str) -> dict | None:
    """{"field", "sampled", "progressive", "share"} over at most SAMPLE JPEGs of the first JPEG image
    field, from up to SHARDS shards spread over the dataset; None when it holds no JPEG field."""
    from shardkit.store.local import join

    field = next((n for n, spec in sorted(manifest.fields.items())
                  if spec.get("kind") == "image" and (n in JPEG_EXTS or spec.get("encoding") in JPEG_EXTS)), None)
    if field is None or not manifest.formats:
        return None
    fmt = "tar" if "tar" in manifest.formats else "parquet"
    shards = manifest.shards_of(fmt)
    picks = sorted({round(i * (len(shards) - 1) / max(1, SHARDS - 1)) for i in range(min(SHARDS, len(shards)))})
    per = -(-SAMPLE // len(picks))
    read = _tar_values if fmt == "tar" else _parquet_values
    kinds = []
    for i in picks:
        kinds += [jpeg_kind(bytes(v)) for v in read(join(root, shards[i].path), field, per) if v is not None]
    kinds = [k for k in kinds if k is not None]
    progressive = sum(k == "progressive" for k in kinds)
    return {"field": field, "sampled": len(kinds), "progressive": progressive,
            "share": progressive / len(kinds) if kinds else 0.0}
