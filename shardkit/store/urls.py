"""Where a job reads or writes: a local path or an fsspec URL, checked before anything is written.

A string that looks like a URL but is not one (`s3:/bucket`, `s3//bucket`), a protocol fsspec does
not know, or a backend whose package is missing is a BadURL naming the fix: never a local folder
named `s3:` that the user takes for the bucket.
"""

from __future__ import annotations

import os
import re

from shardkit.errors import BadURL

# Protocol -> the shardkit extra that installs its backend (others: the package fsspec names).
EXTRAS = {"http": "http", "https": "http", "s3": "s3", "s3a": "s3"}
READ_ONLY = frozenset({"http", "https"})  # fsspec's http backend cannot write
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*$")


def is_url(location: str) -> bool:
    """Whether `location` names a remote store (file:// and plain paths are local)."""
    return "://" in str(location) and not str(location).startswith("file://")


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


def missing_backend(protocol: str, error: BaseException, what: str, value: str) -> BadURL:
    """The BadURL for a protocol whose fsspec backend does not import: the package to install."""
    from fsspec.registry import known_implementations

    extra = EXTRAS.get(protocol)
    if extra:
        how = f"pip install 'shardkit[{extra}]'"
    else:
        how = known_implementations.get(protocol, {}).get("err") or f"install the fsspec backend for {protocol}://"
    return BadURL(f"{what} {value!r}: {protocol}:// needs a package that is not installed ({error}); {how}")


def remote_policy(cfg):
    """The waits of a job's calls to a store, cfg's --timeout and --retries (a shardkit.fs.RemotePolicy)."""
    from shardkit.errors import ConfigError
    from shardkit.fs import RemotePolicy

    if isinstance(cfg.timeout, bool) or not isinstance(cfg.timeout, (int, float)) or cfg.timeout <= 0:
        raise ConfigError(f"timeout={cfg.timeout!r}: expected seconds > 0 (--timeout)")
    if isinstance(cfg.retries, bool) or not isinstance(cfg.retries, int) or cfg.retries < 0:
        raise ConfigError(f"retries={cfg.retries!r}: expected an integer >= 0 (--retries)")
    return RemotePolicy(timeout=cfg.timeout, retries=cfg.retries)


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
    try:
        if protocol not in OWN_CLIENT or what != "dataset":  # a build's SRC is listed through fsspec's client
            _import_backend(protocol)
    except ImportError as e:
        raise missing_backend(protocol, e, what, value) from None
    return f"{protocol}://{rest.rstrip('/')}"


# A dataset at such a URL is read on shardkit's own connections (shardkit/http_ranges.py): fsspec's
# client (aiohttp) is needed only for a large file from a server that ignores Range, and
# reader.download says so then. A build's SRC there is listed through fsspec's client: checked.
OWN_CLIENT = frozenset({"http", "https"})

# The package each common backend needs (fsspec's registry keeps a class once imported, so asking it
# again would not notice a package that went missing).
PACKAGES = {"s3": "s3fs", "s3a": "s3fs", "http": "aiohttp", "https": "aiohttp", "gs": "gcsfs", "gcs": "gcsfs",
            "az": "adlfs", "abfs": "adlfs", "adl": "adlfs", "hf": "huggingface_hub"}


def _import_backend(protocol: str) -> None:
    import importlib

    from fsspec.registry import get_filesystem_class

    if protocol in PACKAGES:
        importlib.import_module(PACKAGES[protocol])
    get_filesystem_class(protocol)
