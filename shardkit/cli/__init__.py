"""The `shardkit` command: parse flags → a config dataclass → one library call → a summary."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys

import click

from shardkit._version import __version__
from shardkit.config import ENCODINGS, FORMATS, RESAMPLE_FILTERS, RESIZE_MODES, TAIL_CHOICES, WORKER_POOLS
from shardkit.cli.curation import curation_lines, curation_options
from shardkit.cli.options import (THRESHOLD_HELP, VERIFY_HELP, image_distance_option, image_field_option,
                                  on_error_option, progress_option, retries_option, scheduler_option,
                                  text_field_option, timeout_option)
from shardkit.errors import ShardkitError, Terminated


def human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


# Exit statuses (README "When something fails"); click itself exits 2 on a bad flag or argument.
EXIT_FAILED, EXIT_USAGE, EXIT_LOCKED, EXIT_SYSTEM, EXIT_BUG, EXIT_INTERRUPTED = 1, 2, 3, 4, 70, 130
EXIT_PIPE = 141  # 128 + SIGPIPE, as a shell reports a command whose reader went away
EXIT_TERMINATED = 143  # 128 + SIGTERM, what a shell reports for a process SIGTERM ended, now after a clean stop


_COMMAND = {"over": False}  # set once the command's work has ended: the process only reports and exits


def _on_sigterm(signum, frame):
    """The first SIGTERM stops the command as Ctrl-C does (tasks cancelled, cluster closed, lock
    released); a second one during that clean-up leaves at once. After the work, nothing to stop."""
    import signal

    if _COMMAND["over"]:
        return
    signal.signal(signum, lambda *_: os._exit(EXIT_TERMINATED))
    # The cluster may live in another thread (started in the background): its teardown is not this
    # exception's, so Dask's records are dropped from the moment the stop begins.
    cluster = sys.modules.get("shardkit.jobs.cluster")
    if cluster is not None:
        cluster.silence_for_stop()
    raise Terminated(signum)


@contextlib.contextmanager
def stop_on_sigterm(after_ignore: bool = False):
    """SIGTERM (what spot/preemptible machines, Kubernetes and `kill` send) raises Terminated in the
    main thread for the duration. Independent of SIGINT, so a job a shell started in the background
    (SIGINT ignored) still stops cleanly on SIGTERM; a SIGTERM the parent ignored stays ignored.

    After the block the previous handler comes back, or, with `after_ignore` (the shardkit program
    itself), SIGTERM is ignored: the command is done and the process only exits, with its status,
    where a SIGTERM would turn a finished build into a killed one (exit -15) without a word."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():  # only the main thread gets signals
        yield
        return
    previous = signal.getsignal(signal.SIGTERM)
    if previous is signal.SIG_IGN:
        yield
        return
    _COMMAND["over"] = False
    signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN if after_ignore else previous)


def describe(error: BaseException) -> tuple[int, str]:
    """(exit status, one line) for a failure: what went wrong and how to fix it."""
    import errno

    from shardkit.errors import BadURL, FolderLocked

    if isinstance(error, FolderLocked):
        return EXIT_LOCKED, str(error)
    if isinstance(error, BadURL):  # a location that is no folder and no usable URL: bad usage, nothing written
        return EXIT_USAGE, str(error)
    if isinstance(error, ShardkitError):
        return EXIT_FAILED, str(error)
    if isinstance(error, OSError) and error.errno is not None:
        where = f" ({error.filename})" if error.filename else ""
        fix = {errno.ENOSPC: "free space on that disk, or write OUT elsewhere",
               errno.EDQUOT: "free space within your quota, or write OUT elsewhere",
               errno.EACCES: "give this user write access there, or write OUT elsewhere",
               errno.EPERM: "give this user write access there, or write OUT elsewhere",
               errno.EROFS: "that file system is read-only: write OUT elsewhere"}.get(error.errno, "")
        return EXIT_SYSTEM, f"{error.strerror or error}{where}" + (f": {fix}" if fix else "")
    if type(error).__name__ == "KilledWorker":  # distributed's: the same task took down workers again and again
        return EXIT_FAILED, (f"Dask workers died running a task ({error}): most often out of memory; lower "
                             "--workers or --shard-size, or give the workers more memory")
    return EXIT_BUG, (f"internal error: {type(error).__name__}: {error} (run `shardkit --debug ...` for the "
                      "traceback, and please report it)")


class _StderrHandler(logging.StreamHandler):
    """A log handler that writes to sys.stderr as it is at each record, not as it was when the
    handler was made: a second command in one process (a test's CliRunner, a redirect) gets its lines."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value):  # StreamHandler.__init__ sets it; the property above always wins
        pass


def _show_logs():
    """--debug: shardkit's INFO lines (what a job decided and why, e.g. its worker pool) on stderr, and
    the Dask workers' warnings; returns the function that undoes it."""
    from shardkit.jobs import cluster

    logger, level, workers = logging.getLogger("shardkit"), logging.getLogger("shardkit").level, cluster.worker_log_level
    cluster.worker_log_level = logging.WARNING  # Dask workers report their failures too
    handler = _StderrHandler()
    handler.setFormatter(logging.Formatter("%(name)s: %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)

    def undo():
        logger.removeHandler(handler)
        logger.setLevel(level)
        cluster.worker_log_level = workers
    return undo


class _Group(click.Group):
    """Turns every failure into one line on stderr and a documented exit status; --debug (or
    SHARDKIT_DEBUG=1) shows the traceback instead."""

    def main(self, args=None, *rest, **options):
        # From the start, not just around the command: a SIGTERM while the arguments are read must
        # not end the process silently either. args=None: this process is the shardkit program (a
        # console script), not a caller's CliRunner, so SIGTERM stays handled until it exits.
        with stop_on_sigterm(after_ignore=args is None):
            return super().main(args, *rest, **options)

    def invoke(self, ctx):
        debug = ctx.params.get("debug") or os.environ.get("SHARDKIT_DEBUG")
        from shardkit.jobs import cluster

        shown = _show_logs() if debug else None
        cluster.quiet_on_stop = True  # a stop's Dask teardown noise stays hidden: the command says one line
        try:
            try:
                return super().invoke(ctx)
            finally:
                _COMMAND["over"] = True
                cluster.quiet_on_stop = False
                if shown is not None:  # --debug is this command's: a later command in this process shows no INFO
                    shown()
        except (click.exceptions.ClickException, click.exceptions.Exit, click.exceptions.Abort):
            raise
        except BrokenPipeError:  # the reader of our output went away (`shardkit show ... | head`): not an error
            # Left at once: a normal exit would flush stdout into the closed pipe, and tear down native
            # threads still running (pyarrow's), which aborts ("terminate called ...") now and then.
            sys.stderr.flush()
            os._exit(EXIT_PIPE)
        except KeyboardInterrupt as e:
            if isinstance(e, Terminated):
                if debug:
                    import traceback

                    traceback.print_exc()
                # One line, and the same status a shell shows for SIGTERM: schedulers read it as "stopped".
                click.secho(f"stopped by {e.name}: rerun the same command to continue", fg="red", err=True)
                sys.exit(EXIT_TERMINATED)
            if debug:
                raise
            click.secho("interrupted", fg="red", err=True)
            sys.exit(EXIT_INTERRUPTED)
        except Exception as e:
            if debug:
                raise
            status, message = describe(e)
            click.secho(f"error: {message}", fg="red", err=True)
            sys.exit(status)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="shardkit")
@click.option("--debug", is_flag=True, help="On failure, show the full traceback (also: SHARDKIT_DEBUG=1).")
def main(debug):
    """shardkit: preprocess once, stream compact shards, drop near-duplicates, and see when the GPU waits.

    \b
    Quick start:
      shardkit sample demo/raw                      # a generated raw folder to try things on
      shardkit build demo/raw demo/out --image-size 224 --resize-mode center-crop
      shardkit inspect demo/out
      shardkit verify demo/out

    \b
    Exit status: 0 done; 1 failed (the message says how to fix it); 2 bad usage;
    3 OUT is being written by another build or dedup; 4 system error (disk full,
    permission denied, missing file); 70 internal error (a bug: rerun with --debug);
    130 interrupted; 141 the output's reader went away (e.g. `| head`); 143 stopped
    by SIGTERM (a preempted machine, `kill`): rerun the same command to continue.
    """


def _parse_size(ctx, param, value):
    from shardkit.config import parse_bytes

    try:
        return parse_bytes(value)
    except ValueError as e:
        raise click.BadParameter(str(e)) from None


@main.command()
@click.argument("src")
@click.argument("out")
@click.option("--format", "format", type=click.Choice(FORMATS), default="tar", show_default=True,
              help="Shard format: WebDataset tar, Parquet, or both (same samples in each).")
@click.option("--shard-size", default="256MB", show_default=True, callback=_parse_size,
              help="Target bytes per shard (e.g. 64MB, 1GiB); cut from estimated output sizes.")
@click.option("--max-samples-per-shard", type=int, default=10_000, show_default=True)
@click.option("--image-size", type=int, default=None, help="Target size in pixels (see --resize-mode).")
@click.option("--resize-mode", type=click.Choice(RESIZE_MODES), default="shorter", show_default=True,
              help="shorter: shorter side → N; center-crop: then crop N×N; pad: longer side → N, pad to N×N.")
@click.option("--crop-size", type=int, default=None, metavar="C",
              help="Then keep the centre C×C (C <= N): --image-size 256 --crop-size 224 is the usual "
                   "'shorter side 256, center crop 224'.")
@click.option("--resample", type=click.Choice(RESAMPLE_FILTERS), default="bicubic", show_default=True,
              help="Resampling filter of the resize (PIL's).")
@click.option("--encode", type=click.Choice(ENCODINGS), default="jpeg", show_default=True,
              help="Image encoding; raw = uint8 H×W×3 arrays, no decode when training (needs a fixed size); "
                   "keep = each input's own bytes, field named by its extension (no resize).")
@click.option("--quality", type=int, default=90, show_default=True, help="JPEG/WebP quality 1-100.")
@click.option("--labels/--no-labels", default=None,
              help="Label each sample by its first-level subfolder (field cls, class list in the manifest) "
                   "[default: when SRC has class subfolders: two or more, or one holding all the images].")
@text_field_option
@image_field_option
@click.option("--label-field", default=None, metavar="COLUMN",
              help="Label .parquet rows by this column (integers, or strings → class list) instead of by folder.")
@click.option("--workers", type=int, default=None,
              help="Dask workers of the embedded cluster [default: one per core]; 0 runs in-process.")
@click.option("--worker-pool", type=click.Choice(WORKER_POOLS), default="auto", show_default=True,
              help="How embedded workers run: threads of this process (images: Pillow releases the GIL, and "
                   "nothing is copied between processes) or processes; auto: for a folder of images, threads "
                   "where a ~0.25 s probe finds their GIL cap above what the cores do, else processes "
                   "(`shardkit --debug build ...` says which and why).")
@scheduler_option
@timeout_option
@retries_option
@click.option("--unit-samples", type=int, default=None, metavar="N",
              help="Samples per work unit [default: chosen from the worker count so every worker stays busy]; "
                   "never changes the output.")
@on_error_option
@progress_option
@click.option("--dedup", is_flag=True, help="Remove near-duplicates (MinHash LSH for text, pHash for images) "
              "before writing; report in OUT/dedup/. Tune with --dedup-threshold/--dedup-verify/--image-distance.")
@click.option("--dedup-threshold", type=float, default=0.8, show_default=True, help=THRESHOLD_HELP)
@click.option("--dedup-verify", is_flag=True, help=VERIFY_HELP)
@image_distance_option
@click.option("--tokenizer", default=None, metavar="FILE|bpe:N",
              help="Tokenize text once at build time (field tokens replaces txt): a tokenizer.json file, or "
                   "bpe:N to train an N-token byte-level BPE on the corpus first. Saved as OUT/tokenizer.json; "
                   "never downloaded from a hub.")
@click.option("--eos-token", default=None, metavar="TOKEN",
              help="Id appended after each document [default: the tokenizer's <|endoftext|>, </s>, <eos> …].")
@click.option("--seq-len", type=int, default=None, metavar="N",
              help="Pack documents into rows of N+1 ids (consecutive rows share one id: inputs = row[:-1], "
                   "targets = row[1:]); document offsets stored with the rows (field doc_offsets). Without it: "
                   "one row per document.")
@click.option("--tail", type=click.Choice(TAIL_CHOICES), default="pad", show_default=True,
              help="Each shard's last partial packed row: pad it (pad id = dtype max) or drop it (counted in "
                   "the manifest's tokenizer stats).")
@click.option("--augment", type=int, default=0, show_default=True, metavar="K",
              help="Store K augmented variants per image (fields jpg, 1.jpg … K-1.jpg); the reader shows "
                   "variant (epoch + hash(key)) mod K, so each epoch sees another one.")
@click.option("--augment-ops", default="crop,flip,color", show_default=True,
              help="Comma list, applied in this order: crop = random resized crop (area 35-100%, aspect 3/4-4/3, "
                   "back to the same size); flip = horizontal, p=0.5; rotate = uniform ±15°; color = "
                   "brightness/contrast/saturation ×0.6-1.4; blur = Gaussian radius 0.1-2.0, p=0.5.")
@click.option("--augment-keep-original", is_flag=True, help="Variant 0 is the unaugmented image.")
@click.option("--augment-seed", type=int, default=0, show_default=True,
              help="Variant k of a sample is seeded by (seed, key, k): the same bytes on every build.")
@click.option("--half", is_flag=True, help="Store float .npy arrays (field array) as float16: half the bytes.")
@curation_options
@click.option("--allow-empty", is_flag=True, help="Write an empty dataset when SRC holds no sample (else an error).")
@click.option("--map", "map", default=None, metavar="MODULE:FUNCTION",
              help="Run your function on each sample after the built-in stages: it gets a sample dict "
                   "(__key__, encoded image bytes, cls, txt, json, numpy arrays) and returns one, a list, or None "
                   "to drop it; a sample whose function raises goes to errors.jsonl. Same bytes for any --workers.")
@click.option("--annotate", is_flag=True,
              help="Keep every sample and store the scores of --filter and --lang (and --dedup's clusters) in attribute "
                   "tables beside the shards; choose at training time: StreamingDataset(OUT, where=...).")
def build(src, out, **options):
    """Turn a raw folder SRC into shards + manifest in OUT (each a local folder or a URL: s3://, gs://, ...).

    \b
    SRC conventions: files sharing a stem are one sample (cats/001.jpg + cats/001.json);
    the first-level subfolder is the label; .txt/.md are text; each .jsonl line and each
    .parquet row is a sample; a WebDataset .tar is read as the folder it extracts to (its
    cls members are the labels). Rerunning skips shards whose inputs and options did not change.

    \b
    Examples:
      shardkit build raw/ out/ --image-size 256
      shardkit build raw/ out/ --image-size 256 --crop-size 224 --resample bilinear --encode raw
      shardkit build raw/ out/ --image-size 224 --resize-mode center-crop --encode raw --format both
      shardkit build raw/ out/ --scheduler tcp://scheduler:8786 --on-error fail
      shardkit build s3://bucket/raw s3://bucket/shards --scheduler tcp://scheduler:8786
      shardkit build corpus/ out/ --tokenizer bpe:32000 --seq-len 2048 --format parquet
      shardkit build hf_export/ out/ --image-field image --label-field label --image-size 224
      shardkit build laion_tars/ out/ --image-size 224 --dedup   (WebDataset: resized, deduplicated, re-sharded)
      shardkit build raw/ out/ --image-size 224 --resize-mode center-crop --augment 4 --augment-ops crop,flip,color
      shardkit build features/ out/ --half
      shardkit build raw/ out/ --image-size 256 --map my_pipeline:add_caption   (my_pipeline.py on PYTHONPATH)
      shardkit build corpus/ out/ --filter text-length --dedup --annotate   (then where="text_length and not duplicate")
      shardkit build crawl/ out/ --filter gopher-quality,gopher-repetition,c4,fineweb --lang en --dedup-exact
    """
    from shardkit.config import BuildConfig
    from shardkit.jobs.build import build as run_build

    # Every flag is named after its BuildConfig field: the mapping is one-to-one by construction.
    cfg = BuildConfig(src=src, out=out, **options)
    if cfg.map:  # the built-in stages into a staging dataset, then the function over its samples
        from shardkit.jobs.mapped_build import build_with_map, map_summary

        click.echo(map_summary(build_with_map(cfg)))
        return
    result = run_build(cfg)
    click.echo(build_summary(result))


def build_summary(r) -> str:
    """The one-screen summary of a build."""
    total_bytes = sum(s.bytes for s in r.shards)
    per_format = sorted({s.format for s in r.shards})
    n_shards = len({s.id for s in r.shards})
    lines = [
        f"built {r.out}",
        f"  inputs          {r.inputs}",
        f"  samples written {r.samples}",
        f"  rejected        {len(r.rejections)}" + (" (see errors.jsonl)" if r.rejections else ""),
    ]
    lines += [f"    {n:>5}  {reason}" for reason, n in r.rejected_by_reason.items()]
    lines += [f"  note            {note}" for note in r.notes]
    if r.duplicates:
        lines.append(f"  duplicates      {r.duplicates} removed (review dedup/clusters.parquet, dedup/summary.json)")
    marked = r.manifest.build.get("dedup", {}).get("marked") if r.manifest else None
    if marked:
        lines.append(f"  duplicates      {marked} marked, kept (attribute duplicate; review dedup/clusters.parquet)")
    attributes = r.manifest.extra.get("attributes") if r.manifest else None
    if attributes:
        lines.append(f"  attributes      {', '.join(attributes['columns'])} (train on a subset: "
                     "StreamingDataset(OUT, where=...))")
    if getattr(r, "exact_duplicates", 0):
        lines.append(f"  exact dups      {r.exact_duplicates} removed (review dedup/exact/clusters.parquet)")
    lines += curation_lines(getattr(r, "stats", {}))
    if r.utf8_replaced:
        lines.append(f"  text            {r.utf8_replaced} invalid UTF-8 characters replaced")
    tok = r.manifest.extra.get("tokenizer") if r.manifest else None
    if tok:
        st = tok.get("stats", {})
        lines.append(f"  tokens          {st.get('tokens', 0)} from {st.get('documents', 0)} documents in "
                     f"{st.get('rows', 0)} rows ({st.get('pad_tokens', 0)} padding, {st.get('dropped_tokens', 0)} "
                     f"dropped); tokenizer {tok['source']} → tokenizer.json")
    classes = r.manifest.classes if r.manifest else None
    column = r.manifest.build.get("config", {}).get("label_field") if classes else None
    if column:
        lines.append(f"  labels          {len(classes)} classes from column {column!r} (--label-field)")
    elif classes:
        lines.append(f"  labels          {len(classes)} classes from the subfolders (--no-labels to leave them out)")
    lines += [
        f"  shards          {n_shards} × {'+'.join(per_format) or '-'}"
        + (f" ({r.reused_shards} unchanged, reused)" if r.reused_shards else ""),
        f"  bytes           {human_bytes(total_bytes)}",
        f"  time            {r.seconds:.1f} s",
        _rate_line(r, tok),
    ]
    return "\n".join(line for line in lines if line)


def _rate_line(r, tok: dict | None) -> str:
    """The build's throughput in what it processed: images, else tokens, else samples."""
    if r.seconds <= 0:
        return ""
    if r.images:
        return f"  images/s        {r.images / r.seconds:,.0f}"
    if tok:
        st = tok.get("stats", {})
        return (f"  documents/s     {st.get('documents', 0) / r.seconds:,.0f} "
                f"({st.get('tokens', 0) / r.seconds:,.0f} tokens/s)")
    return f"  samples/s       {r.samples / r.seconds:,.0f}"


@main.command()
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
    }
    if as_json:
        click.echo(json.dumps(info, indent=1, sort_keys=True))
        return
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
    for name, spec in (m.extra.get("attributes") or {}).get("columns", {}).items():  # what where= can use
        click.echo(f"  attr     {name:<20} {spec['type']:<8} ({spec['scorer']})")


@main.command()
@click.argument("dataset")
def verify(dataset):
    """Re-hash every shard (and index) and attribute table against the manifest and count each shard's
    samples; exit 1 naming each bad or missing file. DATASET: a local folder or a URL (s3://, gs://, ...).

    \b
    Examples:
      shardkit verify out/ && echo ok
      shardkit verify s3://bucket/shards
    """
    from shardkit.jobs.verify import verify_dataset

    report = verify_dataset(dataset)  # the manifest's own checks first: counts add up, paths stay inside
    for p in report.problems:
        click.echo(p)
    if not report.ok:
        click.secho(f"{len(report.problems)} problems in {report.checked} files; rebuild with `shardkit build`",
                    fg="red", err=True)
        sys.exit(1)
    click.echo(f"ok: {report.checked} files match the manifest ({report.samples} samples)")


@main.command()
@click.argument("out", type=click.Path(file_okay=False))
@click.option("--images-per-class", type=int, default=40, show_default=True)
@click.option("--documents", type=int, default=20, show_default=True)
@click.option("--bad/--no-bad", default=True, show_default=True, help="Add deliberately bad and unusual files.")
@click.option("--seed", type=int, default=0, show_default=True)
def sample(out, images_per_class, documents, bad, seed):
    """Generate a raw folder to try shardkit on: class folders of photo-like images with sidecars,
    text documents, a .jsonl corpus, and (by default) bad files that the build must reject.

    \b
    Example:
      shardkit sample demo/raw && shardkit build demo/raw demo/out
    """
    from shardkit.datagen import raw_folder

    info = raw_folder(out, images_per_class=images_per_class, documents=documents, bad=bad, seed=seed)
    click.echo(f"wrote {out}: {info['images']} images in {len(info['classes'])} classes, "
               f"{info['documents']} documents + a .jsonl corpus, {len(info['edge_cases'])} edge cases")
    for rel, what in info["edge_cases"].items():
        click.echo(f"  {rel:<28} {what}")


def _register_optional():
    """Commands that live in their own modules (kept out of this file's import time)."""
    import importlib

    for module, name in (("shardkit.cli.dedup", "dedup"), ("shardkit.cli.bench", "bench"),
                         ("shardkit.cli.show", "show"), ("shardkit.cli.annotate", "annotate")):
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as e:
            if e.name != module:
                raise
            continue
        main.add_command(getattr(mod, name))


_register_optional()

if __name__ == "__main__":
    main()
