"""Where a job reads or writes: a local path or an fsspec URL, checked before anything is written.

A string that looks like a URL but is not one (`s3:/bucket`, `s3//bucket`), a protocol fsspec does
not know, or a backend whose package is missing is a BadURL naming the fix: never a local folder
named `s3:` that the user takes for the bucket.
"""

from __future__ import annotations

import os
import re

from shardkit.errors import BadURL
from shardkit.store.local import is_url  # noqa: F401 — where check_location's callers look for it
from shardkit.store.calls import lean
from shardkit.store.remote import OWN_CLIENT, missing_backend, unusable

READ_ONLY = frozenset({"http", "https"})  # fsspec's http backend cannot write
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*$")


def _known() -> set[str]:
    from fsspec.registry import known_implementations, registry

    return set(known_implementations) | set(registry)


def _did_you_mean(protocol: str, rest: str) -> str:
    return f"{protocol}://{rest.lstrip('/:')}"


def _looks_like_url(value: str, what: str) -> None:
    """A plain path whose first part is `name:` or a protocol followed by `//` was meant as a URL."""
    first, _, rest = value.partition("/")
    if ":" in first:
        protocol, _, tail = first.partition(":")
        fix = _did_you_mean(protocol, f"{tail}/{rest}" if tail else rest)
        raise BadURL(f"{what} {value!r} is not a URL shardkit can use: a URL is PROTOCOL://BUCKET/PATH (did you mean "
                     f"{fix!r}?); a local folder with ':' in its name is written ./{value}")
    if first.lower() in _PROTOCOL_WORDS and value[len(first):].startswith("//"):
        raise BadURL(f"{what} {value!r} is not a URL shardkit can use: a URL is PROTOCOL://BUCKET/PATH (did you mean "
                     f"{_did_you_mean(first, rest)!r}?); a local folder of that name is written ./{value}")


# Names that, followed by '//', can only be a URL missing its ':' (a folder 'gs' holding 'bucket'
# is written gs/bucket).
_PROTOCOL_WORDS = frozenset({"s3", "s3a", "gs", "gcs", "az", "abfs", "adl", "hf", "http", "https", "file", "hdfs",
                             "webhdfs", "sftp", "ftp", "oss", "memory"})


def remote_policy(cfg):
    """The waits of a job's calls to a store, cfg's --timeout and --retries (a shardkit.store.remote.RemotePolicy
    whose errors name those flags)."""
    return flag_policy(cfg.timeout, cfg.retries)


def flag_policy(timeout, retries, fix: str | None = None):
    """A RemotePolicy from a command's --timeout and --retries, checked as flags; its errors name
    `fix` (default: a job's, store.remote.JOB_FIX)."""
    from shardkit.errors import ConfigError
    from shardkit.store.remote import JOB_FIX, RemotePolicy

    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
        raise ConfigError(f"timeout={timeout!r}: expected seconds > 0 (--timeout)")
    if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
        raise ConfigError(f"retries={retries!r}: expected an integer >= 0 (--retries)")
    return RemotePolicy(timeout=timeout, retries=retries, fix=fix or JOB_FIX)


def check_location(value, what: str, *, write: bool = False) -> str:
    """`value` (SRC, OUT, a dataset) as shardkit will use it: a local path unchanged (file://x -> x), a
    URL without a trailing '/'. BadURL, naming the fix, for anything else: before anything is
    written, so a mistyped URL never becomes a local folder."""
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if not isinstance(value, str) or not value:
        raise BadURL(f"{what} {value!r}: expected a local folder or a URL such as s3://bucket/path")
    if "://" not in value:
        _looks_like_url(value, what)
        return value
    protocol, _, rest = value.partition("://")
    if not _SCHEME.match(protocol):
        raise BadURL(f"{what} {value!r} is not a URL shardkit can use: expected PROTOCOL://BUCKET/PATH, "
                     "e.g. s3://bucket/data")
    protocol = protocol.lower()
    if protocol in ("file", "local"):
        if not rest.startswith("/"):
            raise BadURL(f"{what} {value!r}: a file:// URL takes an absolute path (file:///data/raw); or give the "
                         "path itself")
        return rest
    if protocol not in _known():
        raise BadURL(f"{what} {value!r}: unknown protocol {protocol + '://'!r}; expected a local folder or a URL of a "
                     "store fsspec knows (s3://, gs://, az://, hf://, http(s)://, file://)")
    if not rest.strip("/") or rest.startswith("/"):
        raise BadURL(f"{what} {value!r} names no bucket: expected {protocol}://BUCKET/PATH")
    if write and protocol in READ_ONLY:
        raise BadURL(f"{what} {value!r}: {protocol}:// is read-only; write to a local folder or an object store "
                     "(s3://, gs://, az://)")
    if protocol in ("s3", "s3a"):
        _check_bucket(protocol, rest, what, value)
    try:
        if lean(f"{protocol}://{rest}"):  # obstore carries its calls: fsspec's backend, the fallback, is only looked for
            _find_backend(protocol)
        elif protocol not in OWN_CLIENT or what != "dataset":  # a dataset on http(s) is read by shardkit's own client
            _import_backend(protocol)
            _check_backend(protocol, what, value)
    except ImportError as e:
        raise missing_backend(protocol, e, what, value) from None
    return f"{protocol}://{rest.rstrip('/')}"


# S3's bucket naming rules (docs.aws.amazon.com/AmazonS3/latest/userguide/bucketnamingrules.html):
# 3-63 characters of lowercase letters, digits, dots and hyphens, starting and ending with a letter or digit.
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
_IP = re.compile(r"^\d{1,3}(\.\d{1,3}){3}$")
_RESERVED = (("xn--", "sthree-", "amzn-s3-demo-"), ("-s3alias", "--ol-s3", ".mrap", "--x-s3", "--table-s3"))


def _check_bucket(protocol: str, rest: str, what: str, value: str) -> None:
    """A bucket name S3 would refuse, refused here in one line (botocore's own check is a multi-line
    regex dump, and it comes only after the retries)."""
    from shardkit.errors import redact

    bucket = rest.split("/", 1)[0]
    shown = redact(value)
    if "@" in bucket:
        raise BadURL(f"{what} {shown!r}: credentials in an {protocol}:// URL are not used (and would be printed); "
                     "give them the usual way: AWS_ACCESS_KEY_ID + AWS_SECRET_ACCESS_KEY, or AWS_PROFILE naming a "
                     "profile in ~/.aws/credentials, and write the URL as s3://BUCKET/PATH")
    why = None
    if not 3 <= len(bucket) <= 63:
        why = f"it has {len(bucket)} characters, S3 allows 3 to 63"
    elif bad := sorted(set(re.sub(r"[a-z0-9.-]", "", bucket))):
        why = f"it holds {''.join(bad)!r}: S3 allows lowercase letters, digits, dots and hyphens"
    elif not _BUCKET.match(bucket):
        why = "it must start and end with a lowercase letter or a digit"
    elif ".." in bucket or ".-" in bucket or "-." in bucket:
        why = "it has two dots, or a dot beside a hyphen, in a row"
    elif _IP.match(bucket):
        why = "it is written as an IP address"
    elif bucket.startswith(_RESERVED[0]) or bucket.endswith(_RESERVED[1]):
        why = "it starts or ends with a part S3 reserves (xn--, sthree-, -s3alias, --ol-s3, ...)"
    if why:
        raise BadURL(f"{what} {shown!r}: {bucket!r} is not a valid S3 bucket name ({why}); check the URL, "
                     f"written {protocol}://BUCKET/PATH")


def _check_backend(protocol: str, what: str, value: str) -> None:
    """A backend shardkit cannot make from a URL alone (fsspec's ftp and sftp want the host as an
    argument of their own): a BadURL now, not a TypeError from its constructor (whose half-made
    object then prints tracebacks from its destructor)."""
    import inspect

    from fsspec.registry import get_filesystem_class

    cls = get_filesystem_class(protocol)
    try:
        params = list(inspect.signature(cls.__init__).parameters.values())[1:]
    except (TypeError, ValueError):  # no signature to read: the backend is tried as it is
        return
    needed = [p.name for p in params if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if needed:
        raise BadURL(unusable(protocol, what, value, f"its fsspec backend {cls.__name__} needs "
                                                     f"{', '.join(needed)} given apart from the URL"))



# The package each common backend needs (fsspec's registry keeps a class once imported, so asking it
# again would not notice a package that went missing).
PACKAGES = {"s3": "s3fs", "s3a": "s3fs", "http": "aiohttp", "https": "aiohttp", "gs": "gcsfs", "gcs": "gcsfs",
            "az": "adlfs", "abfs": "adlfs", "adl": "adlfs", "hf": "huggingface_hub"}


def _find_backend(protocol: str) -> None:
    """ImportError when the backend's package is not installed, without importing it (s3fs and
    botocore: ~0.4 CPU-s of a process that may never call them)."""
    import importlib.util

    if protocol in PACKAGES and importlib.util.find_spec(PACKAGES[protocol]) is None:
        raise ImportError(f"No module named {PACKAGES[protocol]!r}", name=PACKAGES[protocol])


def _import_backend(protocol: str) -> None:
    import importlib

    from fsspec.registry import get_filesystem_class

    if protocol in PACKAGES:
        importlib.import_module(PACKAGES[protocol])
    get_filesystem_class(protocol)
