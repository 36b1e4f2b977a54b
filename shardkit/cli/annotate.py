"""`shardkit annotate`: flags → AnnotateConfig → shardkit.jobs.annotate.annotate → a one-screen summary."""

from __future__ import annotations

import click

from shardkit.cli.options import progress_option, scheduler_option, workers_option
from shardkit.stages.filters import FILTERS


class _Folder(click.Path):
    """A local folder; a URL passes through to annotate(), which says that OUT must be local and how
    to get there (click would only say that no such folder exists)."""

    def convert(self, value, param, ctx):
        from shardkit.store.local import is_url

        return value if is_url(str(value)) else super().convert(value, param, ctx)


@click.command()
@click.argument("out", type=_Folder(exists=True, file_okay=False))
@click.option("--scorers", default=None, metavar="NAMES",
              help=f"Comma-separated scorers whose columns to add: {', '.join(sorted(FILTERS))}.")
@click.option("--scorer-option", "scorer_option", multiple=True, metavar="SCORER.OPTION=VALUE",
              help="A scorer's option, as --filter-option takes it (e.g. fasttext.model=q.bin,"
                   "fasttext.label=__label__hq or gopher-quality.min_doc_words=30; none turns a limit off); "
                   "repeat for more.")
@click.option("--select", "select", multiple=True, metavar="EXPR",
              help="Store the kept samples per shard of this where= expression (repeatable), so training "
                   "processes plan it without reading every shard's attributes.")
@workers_option()
@scheduler_option
@progress_option
def annotate(out, scorers, scorer_option, select, workers, scheduler, progress):
    """Score every sample of the dataset OUT and keep the scores beside its shards (attribute tables,
    one per shard, named in the manifest); the shards themselves are not rewritten.

    Train on a subset without rebuilding: StreamingDataset(OUT, where="text_length and lang == 'en'").
    A rerun scores only shards that are new, changed, or lack a scorer.

    \b
    Examples:
      shardkit annotate out/ --scorers text-length
      shardkit annotate out/ --select "text_length and text_chars < 20000"
      shardkit annotate out/ --scorers text-length --scheduler tcp://scheduler:8786
      shardkit annotate out/ --scorers gopher-quality,fasttext \\
          --scorer-option fasttext.model=quality.bin,fasttext.label=__label__hq
    """
    from shardkit.config import AnnotateConfig
    from shardkit.jobs.annotate import annotate as run_annotate

    result = run_annotate(AnnotateConfig(out=out, scorers=scorers, scorer_option=scorer_option, select=select,
                                         workers=workers, scheduler=scheduler, progress=progress))
    click.echo(annotate_summary(result))


def annotate_summary(r) -> str:
    """The one-screen summary of an annotate run."""
    lines = [f"annotated {r.out}",
             f"  shards          {r.shards} ({r.written} attribute tables written, {r.shards - r.written} unchanged)"]
    for name, spec in r.columns.items():
        lines.append(f"  column          {name:<20} {spec['type']:<8} ({spec['scorer']})")
    for scorer, n in sorted(r.failed.items()):
        lines.append(f"  unscored        {n} documents by {scorer} (their {scorer} columns are null; see the log)")
    for where, kept in r.selections.items():
        lines.append(f"  selection       {kept} samples: {where}")
    lines.append(f"  manifest        {'written' if r.manifest_written else 'unchanged'}")
    lines.append(f"  time            {r.seconds:.1f} s")
    return "\n".join(lines)
