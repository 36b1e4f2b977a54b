"""`shardkit verify`: the checks of shardkit.jobs.verify.verify_dataset, one line per problem, exit 1 on any."""

from __future__ import annotations

import sys

import click

from shardkit.cli.options import retries_option, timeout_option


@click.command()
@click.argument("dataset")
@timeout_option
@retries_option
def verify(dataset, timeout, retries):
    """Re-hash every shard (and index) and attribute table against the manifest and count each shard's
    samples; exit 1 naming each bad or missing file. DATASET: a local folder or a URL (s3://, gs://, ...).

    \b
    Examples:
      shardkit verify out/ && echo ok
      shardkit verify s3://bucket/shards --timeout 60 --retries 5
    """
    from shardkit.jobs.verify import verify_dataset
    from shardkit.store.urls import flag_policy

    policy = flag_policy(timeout, retries, fix="shardkit verify --timeout/--retries")  # not build's flags
    report = verify_dataset(dataset, policy)  # the manifest's own checks first: counts add up, paths stay inside
    for p in report.problems:
        click.echo(p)
    if not report.ok:
        click.secho(f"{len(report.problems)} problems in {report.checked} files; rebuild with `shardkit build`",
                    fg="red", err=True)
        sys.exit(1)
    click.echo(f"ok: {report.checked} files match the manifest ({report.samples} samples)")
