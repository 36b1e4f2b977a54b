"""The `shardkit` command: the group, its exit statuses and stop handling. Each command lives in a
module of its own (build.py, dedup.py, inspect.py, verify.py, show.py, annotate.py, bench.py):
flags → a config dataclass → one library call → a summary."""

from __future__ import annotations

import contextlib
import logging
import os
import sys

import click

from shardkit._version import __version__
from shardkit.errors import ShardkitError, Terminated
from shardkit.errors import RedactFilter, redact, scrub


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

    from shardkit.errors import BadOption, BadURL, FolderLocked

    if isinstance(error, FolderLocked):
        return EXIT_LOCKED, str(error)
    if isinstance(error, (BadURL, BadOption)):  # no usable location, a flag value out of range, a file an option names unusable: bad usage
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
    handler.addFilter(RedactFilter())  # a URL a line names keeps no credential
    handler.setFormatter(logging.Formatter("%(name)s: %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)

    def undo():
        logger.removeHandler(handler)
        logger.setLevel(level)
        cluster.worker_log_level = workers
    return undo


def _stopped(e: Terminated, debug) -> None:
    """Ends the process after a SIGTERM: one line (the traceback first under --debug), exit EXIT_TERMINATED."""
    if debug:
        import traceback

        traceback.print_exception(scrub(e))
    # One line, and the same status a shell shows for SIGTERM: schedulers read it as "stopped".
    click.secho(f"stopped by {e.name}: rerun the same command to continue", fg="red", err=True)
    sys.exit(EXIT_TERMINATED)


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
                _stopped(e, debug)
            if debug:
                raise
            click.secho("interrupted", fg="red", err=True)
            sys.exit(EXIT_INTERRUPTED)
        except Exception as e:
            if debug:
                scrub(e)  # the traceback names no credential either
                raise
            status, message = describe(e)
            click.secho(f"error: {redact(message)}", fg="red", err=True)
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
    from shardkit.demo.datagen import raw_folder

    info = raw_folder(out, images_per_class=images_per_class, documents=documents, bad=bad, seed=seed)
    click.echo(f"wrote {out}: {info['images']} images in {len(info['classes'])} classes, "
               f"{info['documents']} documents + a .jsonl corpus, {len(info['edge_cases'])} edge cases")
    for rel, what in info["edge_cases"].items():
        click.echo(f"  {rel:<28} {what}")


def _register_optional():
    """Commands that live in their own modules (kept out of this file's import time)."""
    import importlib

    for module, name in (("shardkit.cli.build", "build"), ("shardkit.cli.inspect", "inspect"),
                         ("shardkit.cli.verify", "verify"), ("shardkit.cli.dedup", "dedup"),
                         ("shardkit.cli.bench", "bench"), ("shardkit.cli.show", "show"),
                         ("shardkit.cli.annotate", "annotate"), ("shardkit.cli.plan", "plan")):
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
