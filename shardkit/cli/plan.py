"""`shardkit plan`: predict, before a run, whether the loader feeds the model here, and the cheapest fix."""

from __future__ import annotations

import sys

import click


def _names(ctx, param, value):
    return tuple(v.strip() for v in value.split(",") if v.strip()) if value else None


@click.command()
@click.argument("dataset")
@click.option("--rate", type=float, default=None, help="Samples/s the model takes (or --step-ms with --batch).")
@click.option("--step-ms", type=float, default=None, help="The training step in ms; with --batch gives the rate.")
@click.option("--batch", type=int, default=64, show_default=True, help="Batch size.")
@click.option("--workers", type=int, default=None, help="DataLoader workers you plan to use [default: make_loader's].")
@click.option("--fields", default=None, callback=_names, help="Comma-separated fields the step reads [default: all].")
@click.option("--image-size", type=int, default=None, help="A raw folder: the size its images would be resized to.")
@click.option("--out", default="plan", show_default=True, type=click.Path(file_okay=False),
              help="Where plan.json and plan.png go.")
def plan(dataset, rate, step_ms, batch, workers, fields, image_size, out):
    """Probe DATASET (<= 30 s) and predict the loader's samples/s on this machine.

    \b
    Measures each field's read and decode cost, the store (local, or a URL's round trip and
    rate) and the cores; predicts samples/s per worker count for each decode placement; says
    whether the loader feeds --rate (or --batch per --step-ms) and the cheapest change that would.

    \b
    Examples:
      shardkit plan data/out --step-ms 40 --batch 64
      shardkit plan http://host/data --rate 3000 --workers 4
    """
    from shardkit.errors import ShardkitError
    from shardkit.plan import PlanConfig, make_plan, text

    try:
        result = make_plan(PlanConfig(dataset=dataset, rate=rate, step_ms=step_ms, batch=batch, workers=workers,
                                      fields=fields, image_size=image_size, out=out))
    except ShardkitError as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(2)
    click.echo(text(result))
    click.echo("wrote " + ", ".join(result["outputs"]))
