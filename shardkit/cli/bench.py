"""`shardkit bench`: the loader benchmark users run on their own data and machine."""

from __future__ import annotations

import os
import sys

import click

from shardkit.loaderbench.settings import VARIANT_NAMES
from shardkit.cli.options import progress_option


def _int_list(ctx, param, value):
    if value is None:
        return None
    try:
        return tuple(int(v) for v in value.split(",") if v.strip())
    except ValueError:
        raise click.BadParameter(f"{value!r}: expected comma-separated worker counts, e.g. 0,1,2") from None


def _names(ctx, param, value):
    return tuple(v.strip() for v in value.split(",") if v.strip())


@click.command()
@click.argument("raw_folder", required=False, type=click.Path(exists=True, file_okay=False))
@click.option("--out", default="shardkit-bench", show_default=True, type=click.Path(file_okay=False),
              help="Where bench.json, bench.md and bench.png go.")
@click.option("--cache-dir", default=None, type=click.Path(file_okay=False),
              help="Built shards (and the generated folder), reused by the next run [default: ~/.cache/shardkit/bench].")
@click.option("--images", type=int, default=3000, show_default=True, help="Images in the generated folder (no RAW_FOLDER).")
@click.option("--classes", type=int, default=10, show_default=True, help="Class folders in the generated folder.")
@click.option("--image-size", type=int, default=224, show_default=True, help="Training image size (center crop N×N).")
@click.option("--workers", default=None, callback=_int_list,
              help="DataLoader worker counts to try, e.g. 0,2,4 [default: 0,1,… up to the core count].")
@click.option("--variants", default=",".join(VARIANT_NAMES), show_default=True, callback=_names,
              help="Comma-separated loaders to compare; add shardkit-mix for a two-source Mixture of the same "
                   "JPEG samples (its observed vs target proportions are reported).")
@click.option("--batch-size", type=int, default=64, show_default=True)
@click.option("--repeat", type=int, default=3, show_default=True, help="Interleaved repetitions of every run.")
@click.option("--warmup", type=int, default=5, show_default=True, help="Batches left out at the start of each run.")
@click.option("--min-batches", type=int, default=20, show_default=True,
              help="Batches measured per run at least: a small folder is read for as many epochs as that takes.")
@click.option("--step-ms", type=float, default=0.0, show_default=True,
              help="Simulated training step per batch; 0 measures pure loader speed, e.g. 20 shows starvation.")
@click.option("--gpu", is_flag=True, help="Run a small ResNet-like CNN step (bf16 autocast, CUDA) instead of --step-ms.")
@click.option("--build-workers", type=int, default=None,
              help="Dask workers for building the shard variants [default: one per core]; 0 builds in-process.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the generated folder.")
@click.option("--plot/--no-plot", default=True, show_default=True, help="Draw bench.png.")
@click.option("--plot-only", is_flag=True, help="Only redraw OUT/bench.png from OUT/bench.json.")
@click.option("--trace", default=None, type=click.Path(dir_okay=False),
              help="Write a pipeline trace (Perfetto / chrome://tracing) per variant and worker count: "
                   "PATH's stem + .<variant>.w<N>.trace.json; bench.json gets each run's stage shares.")
@progress_option
def bench(raw_folder, out, cache_dir, images, classes, image_size, workers, variants, batch_size, repeat,
          warmup, min_batches, step_ms, gpu, build_workers, seed, plot, plot_only, trace, progress):
    """Measure data loading on this machine: a raw-folder Dataset vs WebDataset vs shardkit.

    \b
    Builds JPEG (tar + Parquet) and raw uint8 shards of RAW_FOLDER (a generated photo-like
    folder when none is given) into the cache, then reads one epoch per variant × worker count,
    repeated in interleaved order, and reports samples/s, MB/s, starved %, time to first
    batch, peak RSS, ratios against the raw folder and WebDataset, and the best setting.

    \b
    Examples:
      shardkit bench                                  # generated folder, pure loader speed
      shardkit bench data/train --step-ms 20          # your images, a 20 ms training step
      shardkit bench --workers 0,4,8 --gpu            # a real model step on the GPU
    """
    if plot_only:
        return _replot(out)
    from shardkit.loaderbench import BenchConfig, run_bench
    from shardkit.loaderbench.summary import markdown

    cfg = BenchConfig(raw_folder=raw_folder, out=out, cache_dir=cache_dir, images=images, classes=classes,
                      image_size=image_size, workers=workers, variants=variants, batch_size=batch_size,
                      repeat=repeat, warmup=warmup, min_batches=min_batches, step_ms=step_ms, gpu=gpu, build_workers=build_workers,
                      seed=seed, plot=plot, progress=progress, trace=trace)
    report = run_bench(cfg)
    click.echo(markdown(report))
    click.echo("wrote " + ", ".join(report["outputs"].values()))
    if not report["checks"]["same_samples"]:
        click.secho("error: the variants did not read the same samples; the ratios above are not comparable",
                    fg="red", err=True)
        sys.exit(1)


def _replot(out: str) -> None:
    from shardkit.loaderbench.plot import plot_file

    path = os.path.join(out, "bench.json")
    if not os.path.isfile(path):
        raise click.UsageError(f"--plot-only reads {path}, which does not exist; run `shardkit bench --out {out}` first")
    click.echo("wrote " + plot_file(path, os.path.join(out, "bench.png")))
