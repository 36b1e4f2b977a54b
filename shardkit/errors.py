"""Error family and the one policy for bad samples: skip-and-record, or fail fast."""

from __future__ import annotations

import json
import logging
import re
from collections import Counter
from dataclasses import asdict, dataclass


# The one redaction of credentials in text that may hold a URL (messages, log lines, errors.jsonl
# rows, manifest fields): a URL's userinfo and the values of query parameters that carry signatures or
# tokens become ***; the rest of the URL stays, so a message still says which file failed.
MASK = "***"

# Query parameters whose value is a secret or a signature (names compared case-insensitively):
# AWS SigV2/SigV4 presigned URLs, GCS signed URLs, Azure SAS and connection strings, OAuth, and the
# usual API-key names.
SECRET_PARAMS = ("x-amz-signature", "x-amz-credential", "x-amz-security-token", "awsaccesskeyid", "signature",
                 "x-goog-signature", "x-goog-credential", "googleaccessid", "sig", "token", "key", "access_token",
                 "refresh_token", "id_token", "api_key", "apikey", "api-key", "access_key", "secret", "secret_key",
                 "client_secret", "password", "passwd", "pwd", "auth", "authorization", "credential", "credentials",
                 "session_token", "security_token", "sas", "accountkey", "sharedaccesssignature")

# scheme://userinfo@ : userinfo stops at the first '/', whitespace, quote or '@' (a path may hold '@').
_USERINFO = re.compile(r"(\b[A-Za-z][A-Za-z0-9+.-]*://)[^/\s@'\"<>]+@")
_PARAM = re.compile(r"([?&;](?:%s)=)[^&#\s'\"<>]*" % "|".join(re.escape(p) for p in SECRET_PARAMS), re.IGNORECASE)


def redact(text):
    """`text` with every URL's userinfo and secret query values replaced by ***; anything that is no
    str is given back as it is."""
    if not isinstance(text, str) or ("://" not in text and "=" not in text):
        return text
    return _PARAM.sub(lambda m: m.group(1) + MASK, _USERINFO.sub(lambda m: m.group(1) + MASK + "@", text))


def has_credentials(url: str) -> bool:
    """Whether a URL carries userinfo or a secret query parameter."""
    return redact(url) != url


def scrub(error: BaseException) -> BaseException:
    """`error` and the exceptions it chains (cause, context) with their messages redacted in place, so
    that a traceback printed from them (--debug) holds no credential either; a chained exception whose
    text comes from elsewhere than its args (aiohttp's names its request's URL) is replaced in the
    chain by a Redacted one, with its text redacted and its traceback. Returns `error`."""
    seen: set[int] = set()
    todo = [error]
    while todo:
        e = todo.pop()
        if id(e) in seen:
            continue
        seen.add(id(e))
        _scrub_one(e)
        suppress = e.__suppress_context__
        for link in ("__cause__", "__context__"):
            child = getattr(e, link)
            if child is None:
                continue
            _scrub_one(child)
            if _text(child) != redact(_text(child)):
                child = _stand_in(child)
                setattr(e, link, child)
            todo.append(child)
        e.__suppress_context__ = suppress  # setting __cause__ sets it
    return error


class Redacted(Exception):
    """Stands in a traceback for an exception whose text held a credential (see scrub)."""


def _text(e: BaseException) -> str:
    try:
        return str(e)
    except Exception:  # noqa: BLE001 — a broken __str__ is no text
        return ""


def _stand_in(e: BaseException) -> Redacted:
    new = Redacted(f"{type(e).__module__}.{type(e).__qualname__}: {redact(_text(e))}")
    new.__traceback__, new.__cause__, new.__context__ = e.__traceback__, e.__cause__, e.__context__
    new.__suppress_context__ = e.__suppress_context__
    return new


def _scrub_one(e: BaseException) -> None:
    try:
        e.args = tuple(redact(a) for a in e.args)
        for name in ("filename", "filename2", "url", "detail", "msg", "message", "reason"):
            value = getattr(e, name, None)
            if isinstance(value, str):
                setattr(e, name, redact(value))
        if getattr(e, "__notes__", None):
            e.__notes__ = [redact(n) for n in e.__notes__]
    except (AttributeError, TypeError):  # a read-only attribute: the text is checked after
        pass


class RedactFilter(logging.Filter):
    """A log filter that redacts each record's formatted message (and its traceback text)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        clean = redact(message)
        if clean != message:
            record.msg, record.args = clean, None
        if record.exc_info and record.exc_info[1] is not None:
            scrub(record.exc_info[1])
            record.exc_text = None
        return True


ON_ERROR_CHOICES = ("skip", "fail")


class Terminated(KeyboardInterrupt):
    """SIGTERM (or another stop signal) arrived: raised in the main thread by `stop_on_signals`.

    A KeyboardInterrupt, so that every clean-up path written for Ctrl-C (cancel tasks, close the
    cluster, release the lock) runs for a preempted machine's SIGTERM as well."""

    def __init__(self, signum: int):
        import signal

        self.signum = signum
        self.name = signal.Signals(signum).name
        super().__init__(f"stopped by {self.name}")


class ShardkitError(Exception):
    """Base of every error shardkit raises on purpose; the message says how to fix it (and never a
    credential: a URL's userinfo and signed query values are redacted, shardkit.errors)."""

    def __init__(self, *args):
        super().__init__(*(redact(a) for a in args))


class ConfigError(ShardkitError, ValueError):
    """A configuration value is invalid (names the value, what was expected, and the flag)."""


class BadOption(ConfigError):
    """A flag's value that cannot be read or is out of range (`--filter-option fineweb.line_punct_thr=nan`),
    or names something unusable (a model file missing, of the wrong kind, without the label asked for):
    bad usage (exit status 2), found in the client before anything is written or any worker starts."""


class BadURL(ConfigError):
    """A location (SRC, OUT, a dataset) that is neither a local path nor a URL shardkit can use: a
    malformed URL, an unknown protocol, or a backend whose package is not installed. Bad usage (exit
    status 2), found before anything is written."""


class ManifestError(ShardkitError):
    """manifest.json is missing, unreadable, of an unknown version, or unsafe."""


class BadDatasetURL(BadURL, ManifestError):
    """A dataset's location is no folder and no usable URL (a BadURL that readers, who catch
    ManifestError, see as one)."""


class FolderLocked(ShardkitError):
    """Another build or dedup is writing the same output folder right now."""


class EmptyInput(ShardkitError):
    """The input holds no sample (and an empty dataset was not asked for)."""


class ShardError(ShardkitError):
    """A shard is missing, truncated, corrupt, or fails its checksum (names the shard)."""


class ChecksumMismatch(ShardError):
    """Stored values whose bytes differ from the checksums recorded at build time.

    `rows` are the failing rows of the shard, so a reader under on_error='skip' can leave out
    just those samples.
    """

    def __init__(self, message: str, rows):
        super().__init__(message)
        self.rows = rows


class SampleNotFound(ShardkitError, KeyError):
    """ds.get(key) for a key the dataset does not hold (the message names the key and the dataset)."""

    def __str__(self) -> str:  # KeyError would quote the whole message
        return str(self.args[0]) if self.args else ""


class IndexOutOfRange(ShardkitError, IndexError):
    """ds[i] for an index outside the dataset (the message gives the valid range)."""


class RejectedInput(ShardkitError):
    """Raised inside a stage for one bad sample; the policy records it or fails the job."""

    linked = None  # a file outside the sample's own inputs that the sample named (see jobs/build/tasks.reusable)

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = redact(reason)


@dataclass(frozen=True, slots=True)
class Rejection:
    """One rejected input: where it came from, which stage rejected it, and why."""

    path: str
    stage: str
    reason: str

    def to_json(self) -> str:
        return json.dumps({k: redact(v) for k, v in asdict(self).items()}, ensure_ascii=False, sort_keys=True)

    @property
    def kind(self) -> str:
        """The reason without its details, for counting (text before the first ':')."""
        return self.reason.split(":", 1)[0]


class FailFast(ShardkitError):
    """The first rejection under --on-error fail."""

    def __init__(self, rejection: Rejection):
        super().__init__(
            f"rejected {rejection.path!r} in stage {rejection.stage!r}: {rejection.reason} "
            "(run with --on-error skip to record bad inputs in errors.jsonl and continue)"
        )
        self.rejection = rejection


class RejectionLog:
    """Collects rejections under one policy; 'fail' raises FailFast on the first one."""

    def __init__(self, policy: str = "skip"):
        if policy not in ON_ERROR_CHOICES:
            raise ConfigError(f"on_error={policy!r}; expected one of {ON_ERROR_CHOICES}")
        self.policy = policy
        self.items: list[Rejection] = []

    def reject(self, path: str, stage: str, reason: str) -> None:
        rejection = Rejection(redact(path), stage, redact(reason))
        self.items.append(rejection)
        if self.policy == "fail":
            raise FailFast(rejection)

    def counts(self) -> dict[str, int]:
        return dict(sorted(Counter(r.kind for r in self.items).items()))

    def __len__(self) -> int:
        return len(self.items)


def count_by_reason(rejections) -> dict[str, int]:
    """Rejections counted by the kind of reason, sorted for stable output."""
    return dict(sorted(Counter(r.kind for r in rejections).items()))


_WORKER = re.compile(r"^Caught (\w+) in DataLoader worker process (\d+)\.")


def from_worker(error: BaseException) -> ShardkitError | None:
    """A shardkit error raised in a DataLoader worker, as the worker raised it; None for anything else.

    torch re-raises a worker's exception in the main process with a message that starts "Caught ...
    in DataLoader worker process N", then the worker's whole traceback, and shardkit's one line last
    (as a RuntimeError when the class needs more than a message, like ChecksumMismatch). This gives
    back the same class with the one line as its message; the worker's traceback is kept as
    `worker_traceback` and named in a note."""
    import importlib

    text = str(error)
    match = _WORKER.match(text)
    if match is None:
        return None
    name, worker = match.groups()
    # The traceback's last line is "module.Class: message" (the worker's final exception).
    found = re.findall(rf"^((?:shardkit\.[\w.]+\.)?{name}): ", text, re.MULTILINE)
    if not found or "." not in found[-1]:
        return None
    module, _, qualname = found[-1].rpartition(".")
    try:
        cls = getattr(importlib.import_module(module), qualname)
    except (ImportError, AttributeError):
        return None
    if not (isinstance(cls, type) and issubclass(cls, ShardkitError)):
        return None
    message = text[text.rindex(f"\n{found[-1]}: ") + len(found[-1]) + 3:].strip()
    clean = cls.__new__(cls)
    Exception.__init__(clean, message)
    if isinstance(clean, ChecksumMismatch):
        clean.rows = None  # the worker acted on them already (on_error="skip")
    if isinstance(clean, RejectedInput):
        clean.reason = message
    clean.worker_traceback = text
    clean.add_note(f"(raised in DataLoader worker process {worker}; its traceback is the exception's "
                   "worker_traceback)")
    return clean
