"""`shardkit inspect`: a dataset's manifest in one screen (or JSON)."""

from __future__ import annotations

import json

import click

from shardkit.cli.options import human_bytes


def _jpeg_kinds(manifest, dataset: str):
    """The share of progressive JPEGs in a bounded sample of headers, or None (no JPEG field, or
    the shards cannot be read here: inspect still summarises the manifest)."""
    from shardkit.manifest.jpeg_kinds import progressive_share

    try:
        return progressive_share(manifest, dataset)
    except (OSError, ValueError, KeyError, IndexError) as e:
        return {"error": f"{type(e).__name__}: {e}"}


@click.command()
@click.argument("dataset")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
def inspect(dataset, as_json):
    """Summarise a dataset: samples, fields, classes, shards, sizes.

    \b
    Example:
      shardkit inspect out/
    """
    from shardkit.manifest import load_manifest

    m = load_manifest(dataset)
    info = {
        "samples": m.samples,
        "fields": m.fields,
        "classes": m.classes,
        "formats": m.formats,
        "shards": {fmt: len(m.shards_of(fmt)) for fmt in m.formats},
        "bytes": {fmt: sum(s.bytes for s in m.shards_of(fmt)) for fmt in m.formats},
        "errors": m.errors,
        "build": m.build,
        "attributes": m.extra.get("attributes"),
        "jpeg": _jpeg_kinds(m, dataset),
    }
    if as_json:
        click.echo(json.dumps(info, indent=1, sort_keys=True))
        return
    _print_summary(m, dataset, info["jpeg"])


def _print_summary(m, dataset, jpeg: dict | None) -> None:
    """Prints inspect's text form of manifest m (jpeg: what _jpeg_kinds found)."""
    click.echo(f"dataset {dataset}  ({m.created_by})")
    click.echo(f"  samples  {m.samples}")
    for name, spec in sorted(m.fields.items()):
        click.echo(f"  field    {name:<6} {' '.join(f'{k}={v}' for k, v in sorted(spec.items()))}")
    if m.classes:
        shown = ", ".join(m.classes[:12]) + (" …" if len(m.classes) > 12 else "")
        click.echo(f"  classes  {len(m.classes)}: {shown}")
    for fmt in m.formats:
        shards = m.shards_of(fmt)
        sizes = [s.bytes for s in shards]
        click.echo(f"  {fmt:<8} {len(shards)} shards, {human_bytes(sum(sizes))} "
                   f"(min {human_bytes(min(sizes))}, max {human_bytes(max(sizes))})")
    click.echo(f"  rejected {m.errors.get('count', 0)} inputs at build time {m.errors.get('by_reason', {})}")
    if jpeg and jpeg.get("progressive"):
        click.echo(f"  jpeg     {jpeg['share']:.0%} of {jpeg['sampled']} sampled {jpeg['field']} images are "
                   "progressive JPEG: GPUs' hardware decoders take baseline only (decode='nvjpeg' falls back to slower "
                   "backends for them); rebuild with `shardkit build` (it writes baseline 4:2:0)")
    for name, spec in (m.extra.get("attributes") or {}).get("columns", {}).items():  # what where= can use
        click.echo(f"  attr     {name:<20} {spec['type']:<8} ({spec['scorer']})")
