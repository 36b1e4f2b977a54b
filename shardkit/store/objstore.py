"""The lean client for s3://, az:// and gs:// (its reads) on the hot paths: obstore (Rust's object_store),
when installed.

s3fs spends ~5 ms of client CPU on a 40 KB GET (botocore's request building and parsing); this client
~0.6 ms (bench/store_client_bench.py). `client(url, timeout)` gives an object with the few
fsspec methods the store's calls use (cat_file, pipe_file, put_file, get_file, info, rm_file); any
other method (ls, open, rm, ...) is the fsspec filesystem's, so fsspec stays the long tail and the
fallback: without the `obstore` extra, or with SHARDKIT_OBJECT_CLIENT=fsspec, nothing changes.
`list_pages` and `is_object` serve the walk of SRC (store.listing.Keys).

One obstore store (its connection pool, kept alive) per process and (bucket, endpoint, region,
credentials). A whole object or a range of up to SMALL, and a PUT of up to WHOLE, is a sync call in
the caller's thread on a store that bounds each request as a whole; the rest runs on one event loop
thread per process, every wait bounded the way RemotePolicy says (at most `timeout` for an answer
and between two chunks of a body). Many small GETs go out concurrently (`fetch_many`), each a sync
call in a thread of the process's pool: the loop's hand-offs cost more CPU than the request.
obstore's runtime does not survive a fork once it has made a request (a child's first request
hangs): a process forked after that (a DataLoader worker) uses fsspec; one forked before (or
spawned) makes its own loop and stores (a pid check). obstore's own retries are off: fs.with_retries is the one loop, and errors are mapped onto what its classifier
reads (FileNotFoundError, PermissionError, an HTTP status, TimeoutError, ConnectionError).
A HEAD and a DELETE are sync calls too. At the process's exit the exit waits (up to QUIET_WAIT) until
no thread has been in obstore's runtime, or handing a result from it to the loop, for QUIET_FOR: a Rust
thread that takes the GIL back while the interpreter finalizes aborts the process (_quiet); from then
on only the main thread's calls start (_enter).
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import contextvars
import hashlib
import os
import re
import threading
import time

from shardkit.identity import worker_info
from shardkit.store.answers import store_code

S3, AZURE, GCS = frozenset({"s3", "s3a"}), frozenset({"az", "abfs", "abfss"}), frozenset({"gs", "gcs"})
PROTOCOLS = S3 | AZURE | GCS
# Protocols whose writes (PUTs, uploads, deletes) obstore carries. gs:// is read here and written
# through gcsfs: the GCS emulator this project tests against (fake-gcs-server) refuses object_store's
# XML-API PUT and answers its bulk delete without deleting, so obstore's GCS writes go untested.
WRITES = S3 | AZURE
WHOLE = 8 << 20  # bytes: a body up to this is taken in one piece; a larger one chunk by chunk
MIN_RATE = 1 << 20  # bytes/s, as store.calls.MIN_RATE: a slower transfer is taken for a stalled store
UPLOAD_PART, UPLOAD_CONCURRENCY = 16 << 20, 4  # as store.UPLOAD_PART / UPLOAD_CONCURRENCY
SMALL = 1 << 20  # bytes: a range up to this is read in the caller's thread (a larger one costs less CPU
#                 on the loop: 4.5 against 7.6 ms per 4 MB, bench/store_client_bench.py)
WINDOW = 32  # requests of a batch in flight at once
LIST_CHUNK = 1000  # keys per page of a listing (S3 answers 1,000 a request)
QUIET_WAIT = 5.0  # seconds: the longest the process's exit waits for calls into the runtime to end
QUIET_FOR = 0.02  # seconds without a call in flight that the exit takes as quiet
_STATE: dict = {"pid": None, "loop": None, "stores": {}, "ran_in": None, "reading": None, "busy": 0, "closing": None,
                "pool": None, "making": {}, "asking": {}}
# bucket -> its region as AWS named it (x-amz-bucket-region), where none is configured: asked once per
# process and kept across a fork (a worker forked after the main process asked does not ask again).
_REGIONS: dict[str, str] = {}
_LOCK = threading.Lock()
_LATE = contextvars.ContextVar("shardkit_objstore_late", default=False)  # see _late


def serves(url: str, forks: bool = False) -> bool:
    """Whether `url`'s calls go through obstore: its protocol is one it carries, obstore is installed,
    and SHARDKIT_OBJECT_CLIENT does not say `fsspec`. `forks`: a reader's call, which starts no
    runtime in a process that may still fork DataLoader workers (see reading_here)."""
    protocol, _, rest = url.partition("://")
    if protocol not in PROTOCOLS or os.environ.get("SHARDKIT_OBJECT_CLIENT", "") == "fsspec":
        return False
    if protocol in AZURE and "@" in rest.split("/", 1)[0]:
        return False  # abfs://container@account.dfs.core.windows.net/...: the account in the URL, adlfs's form
    if _STATE["ran_in"] not in (None, os.getpid()):
        return False  # forked after a request here: obstore's runtime did not come along (it would hang)
    if forks and _STATE["ran_in"] is None and _STATE["reading"] != os.getpid() and worker_info() is None:
        return False  # a training script's main process: its workers, forked later, keep obstore
    return available()


def writes(url: str) -> bool:
    """Whether obstore also carries the writes on `url` (a URL it serves: see WRITES)."""
    return url.partition("://")[0] in WRITES


def reading_here() -> None:
    """This process reads an epoch itself (a DataLoader worker, or a loader without workers): a
    reader's calls may start obstore's runtime in it from now on. Until then a reader's calls in a
    process that is not a DataLoader worker (the manifest, the first batches' indexes fetched while
    the workers start) go through fsspec, so that the workers it forks can start obstore's
    runtime themselves: forked after it had started, they would read through s3fs (~5 ms of CPU per
    GET against ~0.6)."""
    _STATE["reading"] = os.getpid()


def available() -> bool:
    try:
        import obstore  # noqa: F401
    except ImportError:
        return False
    return True


def _fresh() -> None:
    """Forget the loop, pool and stores of the parent after a fork (their threads are not in this process)."""
    if _STATE["pid"] != os.getpid():
        _STATE.update(pid=os.getpid(), loop=None, stores={}, busy=0, closing=None, pool=None, making={}, asking={})


def _enter(admit: str | None) -> None:
    """Count a call in (see _busy). Once the exit has begun (_quiet), a new call never starts but
    the main thread's own (later exit handlers), which go on: `admit="call"`, a call in the caller's
    thread, which then waits there for the process to end (a daemon thread: the others have been
    joined); `admit="loop"`, a request the loop is about to start for a caller, or a batch's GET a
    thread of the pool is about to make (fetch_many), which raises unless that caller was the main
    thread after the exit began (_LATE); None: counted whatever (a loop step already counted, a
    runtime thread's hand-off)."""
    with _LOCK:
        _fresh()
        closing = _STATE["closing"] == os.getpid()
        refused = closing and (admit == "call" and threading.current_thread() is not threading.main_thread()
                               or admit == "loop" and not _LATE.get())
        if not refused:
            _STATE["busy"] += 1
    if refused and admit == "loop":
        raise ConnectionError("not started: the process is exiting")
    if refused:
        threading.Event().wait()


def _leave() -> None:
    with _LOCK:
        _STATE["busy"] -= 1


@contextlib.contextmanager
def _busy(admit: str | None = "call"):
    """A thread is in obstore's runtime (a call, or a runtime thread handing a result to the loop),
    or on its way back from it: the process's exit waits for it (see _quiet; `admit`: see _enter)."""
    _enter(admit)
    try:
        yield
    finally:
        _leave()


class _Loop(asyncio.SelectorEventLoop):
    """The loop the runtime's threads hand results to. A runtime thread calls call_soon_threadsafe
    holding the GIL, which the loop's wake-up write lets go of: were the interpreter to finalize
    meanwhile, that thread would be ended as it takes the GIL back, and a Rust thread cannot be
    (the process aborts). So the exit waits until no runtime thread is in here."""

    def call_soon_threadsafe(self, callback, *args, context=None):
        with _busy(admit=None):
            return super().call_soon_threadsafe(callback, *args, context=context)


@atexit.register
def _quiet() -> None:
    """At the process's exit, before the interpreter finalizes: no new call starts (but the main
    thread's), and the exit waits for the calls in flight and the runtime's threads inside Python to
    leave. A thread still in obstore's runtime when the interpreter finalizes is ended as it takes
    the GIL back, which aborts the process (SIGABRT after the job's last line)."""
    if _STATE["ran_in"] != os.getpid():
        return
    with _LOCK:
        _STATE["closing"] = os.getpid()
    _settle()


def _settle() -> None:
    """Wait (up to QUIET_WAIT, the GIL let go) until no call has been counted in (_busy) for
    QUIET_FOR: a thread that has just left the count is back in its own frames by then, and so is
    a runtime thread that looks at a call cancelled on a timeout (it takes the GIL, uncounted)."""
    deadline, quiet_since = time.monotonic() + QUIET_WAIT, None
    while (now := time.monotonic()) < deadline:
        if _STATE["busy"]:
            quiet_since = None
        elif quiet_since is None:
            quiet_since = now
        elif now - quiet_since >= QUIET_FOR:
            return
        time.sleep(0.002)


def _loop() -> asyncio.AbstractEventLoop:
    with _LOCK:
        _fresh()
        if _STATE["loop"] is None:
            _STATE["ran_in"] = os.getpid()  # obstore's runtime starts with the first request
            loop = _Loop()
            threading.Thread(target=loop.run_forever, name="shardkit-objstore", daemon=True).start()
            _STATE["loop"] = loop
        return _STATE["loop"]


def run(coro, admit: str = "call"):
    """The coroutine's result, run on this process's loop (its waits bounded inside; counted for the
    exit as _submit counts it; `admit`: see _enter)."""
    future = _submit(lambda: coro, admit)
    try:
        got = future.result()
    except BaseException:  # an interrupt too: the request does not go on behind the caller's back
        future.cancel()
        raise
    if _STATE["closing"] == os.getpid():  # a later exit handler's call: its hand-off ends before the exit
        _settle()
    return got


def _late() -> None:
    """A call the main thread makes after the exit began: its requests on the loop may start (the
    loop's task copies this context)."""
    if _STATE["closing"] == os.getpid():
        _LATE.set(True)


def _s3_settings(bucket: str, timeout: float) -> tuple[dict, object]:
    """(config, credential provider) from the usual places: AWS_* variables (keys, region, endpoint),
    else boto3's chain (profile, SSO, instance role) when boto3 is there, else obstore's own."""
    env = os.environ
    config = {}
    endpoint = env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL")
    if endpoint:
        config["endpoint"] = endpoint
    region = env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION")
    if region:
        config["region"] = region
    if env.get("AWS_ACCESS_KEY_ID"):
        config.update(access_key_id=env["AWS_ACCESS_KEY_ID"], secret_access_key=env.get("AWS_SECRET_ACCESS_KEY", ""))
        if env.get("AWS_SESSION_TOKEN"):
            config["session_token"] = env["AWS_SESSION_TOKEN"]
        return _with_region(config, bucket, timeout), None
    try:
        import boto3
        from obstore.auth.boto3 import Boto3CredentialProvider
    except ImportError:
        return config, None
    session = boto3.Session()
    if session.get_credentials() is None:  # as s3fs says it (fs.remote_hint adds how to give them)
        from botocore.exceptions import NoCredentialsError

        raise NoCredentialsError()
    if "region" not in config and session.region_name:
        config["region"] = session.region_name
    return _with_region(config, bucket, timeout), Boto3CredentialProvider(session)


def _with_region(config: dict, bucket: str, timeout: float) -> dict:
    """The bucket's region when none is given, as s3fs finds it: AWS names it in the
    x-amz-bucket-region header of any answer about the bucket (even a 403); us-east-1 otherwise."""
    if "region" in config or "endpoint" in config:
        return config
    if bucket not in _REGIONS:  # asked once per process and bucket, however many stores are made for it
        _once("asking", bucket, lambda: _asked(bucket, timeout))
    return {**config, "region": _REGIONS.get(bucket) or "us-east-1"}


def _asked(bucket: str, timeout: float) -> None:
    """The bucket's region asked of AWS into _REGIONS; an answer without one (unreachable) is not
    kept: the threads that waited for it take the default, a store made later asks again."""
    if bucket not in _REGIONS:
        region = _ask_region(bucket, timeout)
        if region:
            _REGIONS[bucket] = region


def _ask_region(bucket: str, timeout: float) -> str | None:
    """The region AWS names in the x-amz-bucket-region header of a HEAD of the bucket (even a 403)."""
    import urllib.error
    import urllib.request

    request = urllib.request.Request(f"https://{bucket}.s3.amazonaws.com/", method="HEAD")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            return answer.headers.get("x-amz-bucket-region")
    except urllib.error.HTTPError as e:
        return e.headers.get("x-amz-bucket-region")
    except OSError:  # unreachable: the request itself will then say so, with its URL
        return None


def _azure_settings() -> dict:
    """The config of an Azure container's store from AZURE_STORAGE_CONNECTION_STRING, read as adlfs
    (Azure's SDK) reads it: its keys in any case; AccountName, AccountKey, SharedAccessSignature and
    BlobEndpoint (or DefaultEndpointsProtocol + EndpointSuffix); a SAS-only string's account taken
    from its BlobEndpoint (`https://ACCOUNT.blob...`, or the emulator's `http://HOST:PORT/ACCOUNT`);
    UseDevelopmentStorage=true for the local emulator. obstore reads the other AZURE_* variables
    itself (account name and key, SAS token, service principal, workload and managed identity,
    AZURE_STORAGE_ENDPOINT)."""
    import urllib.parse

    found = {name.strip().lower(): value.strip() for name, _, value in
             (part.partition("=") for part in os.environ.get("AZURE_STORAGE_CONNECTION_STRING", "").split(";"))
             if value.strip()}
    if found.get("usedevelopmentstorage", "").lower() == "true":
        return {"use_emulator": "true"}
    config = {}
    for name, key in (("accountname", "account_name"), ("accountkey", "account_key"),
                      ("sharedaccesssignature", "sas_key"), ("blobendpoint", "endpoint")):
        if found.get(name):
            config[key] = found[name]
    if "endpoint" not in config and found.get("accountname") and found.get("endpointsuffix"):
        protocol = found.get("defaultendpointsprotocol", "https")
        config["endpoint"] = f"{protocol}://{found['accountname']}.blob.{found['endpointsuffix']}"
    if "endpoint" in config and "account_name" not in config:
        parts = urllib.parse.urlsplit(config["endpoint"])
        host, path = parts.hostname or "", parts.path.strip("/")
        account = host.split(".", 1)[0] if ".blob." in host else path.split("/", 1)[0]
        if account:
            config["account_name"] = account
    return config


ENV = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_DEFAULT_PROFILE",
       "AWS_REGION", "AWS_DEFAULT_REGION", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_CONFIG_FILE",
       "AWS_SHARED_CREDENTIALS_FILE")


def _gcs_settings() -> dict:
    """The config of a GCS bucket's store. obstore reads GOOGLE_SERVICE_ACCOUNT(_KEY),
    GOOGLE_APPLICATION_CREDENTIALS, gcloud's application-default credentials and the metadata
    server itself; STORAGE_EMULATOR_HOST (the variable Google's clients and gcsfs read for a local
    emulator) is given to it as the endpoint, without OAuth."""
    import json

    emulator = _gcs_emulator()
    if not emulator:
        return {}
    return {"service_account_key": json.dumps({"gcs_base_url": emulator, "disable_oauth": True,
                                               "client_email": "", "private_key": "", "private_key_id": ""})}


def _gcs_emulator() -> str:
    """STORAGE_EMULATOR_HOST as a URL ('' when unset); a bare host:port is http, as gcsfs takes it."""
    host = os.environ.get("STORAGE_EMULATOR_HOST", "").strip().rstrip("/")
    if host in ("", "default"):  # gcsfs takes "default" as unset: Google's own endpoint
        return ""
    return host if "://" in host else f"http://{host}"


def _family(protocol: str) -> str:
    return "s3" if protocol in S3 else "gcs" if protocol in GCS else "azure"


def _settings_digest(protocol: str) -> str:
    """The settings a store of `protocol` is made from, as a digest: no secret is kept in a key."""
    env = os.environ
    family = _family(protocol)
    names = (ENV if family == "s3" else sorted(n for n in env if n.startswith("AZURE_")) if family == "azure"
             else sorted(n for n in env if n.startswith("GOOGLE_")) + ["STORAGE_EMULATOR_HOST"])
    return hashlib.sha256(repr([(n, env.get(n)) for n in names]).encode()).hexdigest()


def _bound(timeout: float, nbytes: int) -> float:
    """Seconds a call moving `nbytes` may take as a whole: two waits and the bytes at MIN_RATE (as
    store.calls.bound gives fsspec's calls)."""
    return 2 * timeout + nbytes / MIN_RATE


def _store(url: str, timeout: float, *, bounded: bool = False):
    """(obstore store, key) of an s3://, gs:// or az:// URL: one store per process, bucket (container) and
    settings, kept alive.
    `bounded`: the store for calls made in the caller's thread (sync: no hand-off to the loop, half
    the CPU of a small GET), each request bounded as a whole to 2 x timeout + WHOLE at MIN_RATE;
    they move WHOLE bytes at most."""
    protocol, _, rest = url.partition("://")
    bucket, _, key = rest.partition("/")
    ident = (_family(protocol), bucket, _settings_digest(protocol), timeout, bounded)
    with _LOCK:
        _fresh()
        store = _STATE["stores"].get(ident)
    if store is None:
        # Made once: the threads that ask meanwhile (a first batch's index and row GETs, the parts)
        # wait for it rather than each making one (a credential chain, and a region asked of AWS),
        # and share its failure rather than each trying again in turn.
        store = _once("making", ident, lambda: _made(ident, protocol, bucket, timeout, bounded))
    return store, key


def _made(ident: tuple, protocol: str, bucket: str, timeout: float, bounded: bool):
    with _LOCK:
        store = _STATE["stores"].get(ident)  # made meanwhile, by a thread that came just before
    if store is not None:
        return store
    _STATE["ran_in"] = os.getpid()  # obstore's runtime starts with the first request
    try:  # settings it cannot use (no account, an endpoint that is no URL): not a fault that may pass
        store = _new_store(protocol, bucket, timeout, f"{_bound(timeout, WHOLE):g}s" if bounded else "24h")
    except Exception as e:  # noqa: BLE001 — obstore's errors, and the credential chain's
        if not type(e).__module__.startswith("obstore"):
            raise
        raise ValueError(str(translate(e))) from None
    with _LOCK:
        return _STATE["stores"].setdefault(ident, store)


class _Attempt:
    """One thread's making of something other threads asked for at the same time (see _once)."""

    def __init__(self):
        self.done, self.result, self.error = threading.Event(), None, None


def _once(table: str, key, make):
    """make(), run by one thread for all the threads that ask for `key` of _STATE[table] meanwhile:
    they wait for it and get its result, or its failure (a copy of it raised in each), and do not
    try again in turn. A thread that comes after it ended tries afresh. Its tables are dropped in a
    forked child (_fresh): an attempt in the parent's thread is not the child's."""
    with _LOCK:
        _fresh()
        attempts = _STATE[table]
        attempt = attempts.get(key)
        mine = attempt is None
        if mine:
            attempt = attempts[key] = _Attempt()
    if mine:
        try:
            attempt.result = make()
            return attempt.result
        except BaseException as e:
            attempt.error = e
            raise
        finally:
            with _LOCK:
                if attempts.get(key) is attempt:
                    del attempts[key]
            attempt.done.set()
    attempt.done.wait()
    if attempt.error is not None:
        raise _copied(attempt.error)
    return attempt.result


def _copied(error: BaseException) -> BaseException:
    """A copy of `error` for another thread to raise (its traceback is its own); the error itself
    where it cannot be copied."""
    import copy

    try:
        return copy.copy(error).with_traceback(None)
    except Exception:  # noqa: BLE001 — an exception type that does not copy
        return error


def _new_store(protocol: str, bucket: str, timeout: float, total: str):
    from obstore.store import AzureStore, GCSStore, S3Store

    if protocol in S3:
        config, provider = _s3_settings(bucket, timeout)
    else:
        config, provider = _azure_settings() if protocol in AZURE else _gcs_settings(), None
    endpoint = (config.get("endpoint") or os.environ.get("AZURE_STORAGE_ENDPOINT" if protocol in AZURE else "", "")
                or (_gcs_emulator() if protocol in GCS else ""))
    emulator = protocol in AZURE and (config.get("use_emulator") or os.environ.get("AZURE_STORAGE_USE_EMULATOR", "")
                                      ).lower() in ("true", "1")
    options = {"connect_timeout": f"{timeout:g}s", "timeout": total,  # else bounded per chunk here
               "allow_http": str(endpoint).startswith("http://") or emulator, "pool_max_idle_per_host": "64"}
    if protocol in S3:
        return S3Store(bucket, config=config, client_options=options, retry_config={"max_retries": 0},
                       credential_provider=provider)
    if protocol in GCS:
        return GCSStore(bucket, config=config, client_options=options, retry_config={"max_retries": 0})
    return AzureStore(bucket, config=config, client_options=options, retry_config={"max_retries": 0})


class StoreStatus(OSError):
    """An HTTP status the store answered with (fs.retryable reads `.status`)."""

    def __init__(self, status: int, text: str):
        super().__init__(text)
        self.status = status


_STATUS = re.compile(r"(?:status(?: code)?|Status)[:=]?\s*(\d{3})\b|\b([45]\d\d) [A-Z][a-z]")


def translate(error: BaseException) -> BaseException:
    """An obstore error as the exception fsspec would have raised for the same answer."""
    import obstore.exceptions as ox

    text = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    code = store_code(error)  # the store's name for it (S3's and Azure's <Code>), kept past the XML cut
    text = text.split("<?xml", 1)[0].rstrip(" :") + (f" ({code})" if code else "")
    if isinstance(error, (ox.NotFoundError, FileNotFoundError)):
        return _with_status(FileNotFoundError(text), 404)
    if isinstance(error, (ox.PermissionDeniedError, ox.UnauthenticatedError)):
        return _with_status(PermissionError(text), 403 if "403" in str(error) else None)
    if isinstance(error, (ox.AlreadyExistsError, ox.PreconditionError)):  # a conditional PUT's condition failed
        return FileExistsError(text)
    if "ETag Header missing" in str(error):  # object_store needs one; a retry cannot bring it
        return ValueError(f"{text}: this store answers without an ETag, which the lean client needs; set "
                          "SHARDKIT_OBJECT_CLIENT=fsspec to use s3fs with it")
    found = _STATUS.search(str(error))
    if found:
        status = int(found.group(1) or found.group(2))
        if status == 404:
            return _with_status(FileNotFoundError(text), 404)
        if status == 403:
            return _with_status(PermissionError(text), 403)
        return StoreStatus(status, text)
    if isinstance(error, (asyncio.TimeoutError, TimeoutError)) or "timed out" in str(error).lower():
        return TimeoutError(text)
    if isinstance(error, (ox.InvalidPathError, ox.UnknownConfigurationKeyError, ox.NotSupportedError)):
        return ValueError(text)
    return ConnectionError(text)


def _with_status(error: OSError, status: int | None) -> OSError:
    """`error` with the HTTP status the store answered (remote._reason names it, and the store's code)."""
    if status is not None:
        error.status = status
    return error


@contextlib.contextmanager
def _translated():
    """obstore's errors in the block raised as the builtin errors fsspec would raise (translate);
    any other error as it is."""
    try:
        yield
    except Exception as e:  # noqa: BLE001 — re-raised as the matching builtin error
        if type(e).__module__.startswith("obstore") or (isinstance(e, FileNotFoundError) and "Debug source" in str(e)):
            raise translate(e) from None  # obstore raises a 404 as the builtin, its text many lines long
        raise


@contextlib.contextmanager
def _sync(admit: str = "call"):
    """A call into obstore in the caller's thread: counted for the exit (_busy), its errors translated."""
    with _busy(admit), _translated():
        yield


async def _guard(make, seconds: float):
    """The result of the awaitable make() within `seconds`, an obstore error translated. make() is
    called here, on the loop: obstore's async calls bind to the running loop when made."""
    try:
        with _busy(admit="loop"), _translated():
            return await asyncio.wait_for(make(), seconds)
    except asyncio.TimeoutError:
        raise TimeoutError(f"no answer within {seconds:g} s") from None


async def _get(store, key: str, start, end, timeout: float, sink=None):
    """Bytes [start, end) of an object (end None: to its end); with `sink(chunk)`, streamed into it."""
    import obstore

    options = {}
    if end is not None:
        options["range"] = (start or 0, end)
    elif start:
        options["range"] = {"offset": start}
    result = await _guard(lambda: obstore.get_async(store, key, options=options), timeout)
    lo, hi = result.range
    if sink is None and hi - lo <= WHOLE:
        return bytes(await _guard(result.bytes_async, timeout + (hi - lo) / MIN_RATE))
    parts, stream = [], result.stream(min_chunk_size=1 << 20)
    while True:
        try:
            chunk = await _guard(stream.__anext__, timeout)
        except StopAsyncIteration:
            break
        parts.append(chunk) if sink is None else sink(chunk)
    return b"".join(bytes(p) for p in parts) if sink is None else None


def _small(url: str, timeout: float, start=None, end=None, admit: str = "call") -> bytes | None:
    """The bytes in the caller's thread (the bounded store), or None when the object turns out to
    be larger than WHOLE (then read on the loop, its body's waits bounded chunk by chunk). `admit`:
    see _enter."""
    import obstore

    store, key = _store(url, timeout, bounded=True)
    options = {}
    if end is not None:
        options["range"] = (start or 0, end)
    elif start:
        options["range"] = {"offset": start}
    with _sync(admit):
        result = obstore.get(store, key, options=options)
        lo, hi = result.range
        return bytes(result.bytes()) if hi - lo <= WHOLE else None


class Client:
    """The fsspec methods store calls use, on obstore; everything else is the fsspec filesystem's, and
    so are the writes on a protocol whose writes obstore does not carry (gs://: see WRITES)."""

    async_impl = False  # store.calls.bound: the waits are bounded here, not by fsspec keywords

    def __init__(self, url: str, timeout: float, fallback):
        self.protocol = url.split("://", 1)[0]
        self.timeout, self._fallback = timeout, fallback

    def __getattr__(self, name):
        return getattr(self._fallback(), name)

    def _strip_protocol(self, url: str) -> str:
        return url.split("://", 1)[1] if "://" in url else url

    def _whole(self, nbytes: int) -> float:
        """The bound of a fallback's call as a whole, as store.calls.bound gives it to fsspec's (gcsfs's
        sock_read does not cover sending a body: a store that stops reading one would hold it)."""
        return _bound(self.timeout, nbytes)

    def _store(self, path: str, bounded: bool = False):
        """`bounded`: the store for a call in the caller's thread, bounded as a whole (see _store)."""
        return _store(f"{self.protocol}://{self._strip_protocol(path)}", self.timeout, bounded=bounded)

    def cat_file(self, path: str, start=None, end=None, **_) -> bytes:
        if (start or 0) < 0 or (end is not None and end < 0):  # from the end: fsspec knows the size
            return self._fallback().cat_file(path, start=start, end=end)
        url = f"{self.protocol}://{self._strip_protocol(path)}"
        if end is None or end - (start or 0) <= SMALL:  # a whole object: most are small (source files)
            data = _small(url, self.timeout, start, end)
            if data is not None:
                return data
        store, key = self._store(path)
        return run(_get(store, key, start, end, self.timeout))

    def pipe_file(self, path: str, data: bytes, mode: str = "overwrite", IfMatch: str | None = None,  # noqa: N803
                  **_) -> dict | None:
        """`mode="create"` (If-None-Match: *) and `IfMatch=ETag` as s3fs takes them (the lease): a
        conditional PUT whose failed condition raises FileExistsError; it answers {"ETag": ...}."""
        conditional = mode == "create" or IfMatch is not None
        if self.protocol not in WRITES:  # gcsfs: mode="create" is ifGenerationMatch=0; it has no write that
            # matches a generation, so IfMatch is dropped: the lease's refresh and takeover on gs:// are
            # plain writes, as on gcsfs alone (whose info names no ETag to match)
            return self._fallback().pipe_file(path, data, mode=mode, timeout=self._whole(len(data)))
        if len(data) <= WHOLE or conditional:  # one PUT in the caller's thread, bounded as a whole
            import obstore

            store, key = self._store(path, bounded=True)
            with _sync():
                done = obstore.put(store, key, data, use_multipart=False,
                                   mode="create" if mode == "create" else {"e_tag": IfMatch} if conditional else None)
            return {"ETag": done.get("e_tag") or ""} if conditional else None  # a store may send none
        self._put(path, data, len(data))
        return None

    def put_file(self, source: str, path: str, chunksize: int = UPLOAD_PART,
                 max_concurrency: int = UPLOAD_CONCURRENCY, **_) -> None:
        """`source` uploaded to `path` in parts of `chunksize`, `max_concurrency` at once (s3fs's
        keywords, as store._upload passes them)."""
        from pathlib import Path

        if self.protocol not in WRITES:
            return self._fallback().put_file(source, path, chunksize=chunksize,
                                             timeout=self._whole(os.path.getsize(source)))
        self._put(path, Path(source), os.path.getsize(source), chunksize, max_concurrency)

    def _put(self, path: str, data, nbytes: int, part: int = UPLOAD_PART,
             concurrency: int = UPLOAD_CONCURRENCY) -> None:
        import obstore

        store, key = self._store(path)
        run(_guard(lambda: obstore.put_async(store, key, data, chunk_size=part, max_concurrency=concurrency),
                   _bound(self.timeout, nbytes)))

    def get_file(self, path: str, local: str, **_) -> None:
        store, key = self._store(path)
        with open(local, "wb") as f:
            run(_get(store, key, None, None, self.timeout, sink=f.write))

    def info(self, path: str, **_) -> dict:
        import obstore

        store, key = self._store(path, bounded=True)  # a HEAD: in the caller's thread, bounded as a whole
        if not key or key.endswith("/"):  # a bucket or a folder: no object to HEAD; fsspec tells what it is
            return self._fallback().info(path)
        with _sync():
            meta = obstore.head(store, key)
        return {"name": self._strip_protocol(path), "type": "file", "size": meta["size"], "ETag": meta["e_tag"],
                "LastModified": meta["last_modified"]}

    def rm_file(self, path: str, **_) -> None:
        if self.protocol not in WRITES:
            return self._fallback().rm_file(path, timeout=self._whole(0))
        store, key = self._store(path, bounded=True)  # a DELETE: in the caller's thread, bounded as a whole
        try:
            _deleted(store, key, self.protocol)
        except BulkRefused:
            self._fallback().rm_file(path)  # one DELETE of adlfs's


class UnnamedKey(ValueError):
    """A listing met a key object_store cannot name ('a//b', 'a/./b'), or was asked to start after
    one: the caller reads that stretch of keys through fsspec."""

    def __init__(self, after: str | None):
        super().__init__(f"a key after {after!r} is not a path object_store can name")


def is_object(url: str, timeout: float) -> bool:
    """Whether an object of exactly this key exists (a HEAD in the caller's thread)."""
    import obstore

    store, key = _store(url, timeout, bounded=True)
    try:
        with _sync():
            obstore.head(store, key)
    except FileNotFoundError:  # a 404, as obstore raises it or as translated
        return False
    return True


def list_pages(url: str, after: str | None, timeout: float):
    """Pages of (key, size, ETag) of every object below the folder `url`, in key order, after the
    key `after` (bucket-relative; None: from the start): obstore's streamed recursive listing, in the
    caller's thread, each request bounded as a whole. A key that ends in '/' (a folder marker)
    comes without it: object_store drops it. UnnamedKey where a key cannot be named."""
    import obstore
    import obstore.exceptions as ox

    store, prefix = _store(url.rstrip("/") + "/", timeout, bounded=True)
    try:
        with _busy():
            stream = obstore.list(store, prefix or None, offset=after, chunk_size=LIST_CHUNK)
    except (ox.InvalidPathError, ValueError):  # an offset it cannot name
        raise UnnamedKey(after) from None
    while True:
        with _sync():
            try:
                batch = next(stream)
            except StopIteration:
                return
            except ox.InvalidPathError:
                raise UnnamedKey(after) from None
        if batch:
            after = batch[-1]["path"]
            yield [(m["path"], m["size"], m["e_tag"] or "") for m in batch]


class BulkRefused(OSError):
    """Azure refused a Blob Batch (obstore deletes through it, even one key): Azurite does under a
    SAS, with a 500. The caller deletes through fsspec (adlfs), one DELETE a key."""


def _deleted(store, keys, protocol: str) -> None:
    import obstore

    try:
        with _sync():
            obstore.delete(store, keys)
    except StoreStatus as e:
        if protocol in AZURE and "bulk delete" in str(e):
            raise BulkRefused(str(e)) from None
        raise


def delete_many(folder: str, keys: list[str], timeout: float) -> None:
    """The objects `keys` (relative to the folder URL `folder`) deleted in bulk (S3's DeleteObjects,
    1,000 a request; Azure's Blob Batch, 256), in the caller's thread; BulkRefused where Azure
    refused the batch."""
    store, prefix = _store(folder.rstrip("/") + "/", timeout, bounded=True)
    _deleted(store, [prefix + key for key in keys], folder.split("://", 1)[0])


def fetch_many(urls: list[str], timeout: float):
    """Whole objects fetched concurrently, WINDOW at a time for each batch, each a sync call in a
    thread of the process's pool (one larger than WHOLE then read on the loop): a concurrent Future
    of their bytes (or the error reading each raised), in order. Cancelled, it starts no more GETs.
    The sync calls cost 0.59 against 0.77 ms of CPU an object on S3, 0.22 against 0.37 on GCS, where
    the loop's async GETs spent it in the hand-offs between obstore's runtime and the loop
    (bench/batch_fetch_bench.py). A sync GET is bounded as a whole (2 x timeout + WHOLE at MIN_RATE),
    not per wait: a stalled object fails later than on the loop (store.source.Fetch waits for it)."""
    _enter("call")  # after the exit began, only the main thread's batch goes on (_late)
    try:
        _late()
        with _LOCK:
            _STATE["ran_in"] = os.getpid()  # obstore's runtime starts with these requests: the exit waits (_quiet)
            if _STATE["pool"] is None:
                _STATE["pool"] = _Pool()
            pool = _STATE["pool"]
        batch = _Batch(urls, timeout, pool, contextvars.copy_context())  # _LATE as the caller has it
    finally:
        _leave()
    return batch.start()


class _Batch:
    """One fetch_many: its GETs in the pool's threads, WINDOW at a time, the next one started as one
    ends, until all are done or the batch's future is cancelled."""

    def __init__(self, urls: list[str], timeout: float, pool, context):
        import concurrent.futures

        self.future: concurrent.futures.Future = concurrent.futures.Future()
        self.results: list = [None] * len(urls)
        self.queued, self.lock, self.left = iter(enumerate(urls)), threading.Lock(), len(urls)
        self.timeout, self.pool, self.context = timeout, pool, context

    def start(self):
        if not self.results:
            self.future.set_result([])
        for _ in range(min(WINDOW, len(self.results))):
            self._next()
        return self.future

    def _next(self) -> None:
        with self.lock:
            item = None if self.future.cancelled() else next(self.queued, None)
        if item is not None:
            self.pool.submit(self._fetch, *item)

    def _fetch(self, i: int, url: str) -> None:  # in a thread of the pool
        import concurrent.futures

        try:
            self.results[i] = self.context.copy().run(self._one, url)  # each GET in a copy of the caller's context
        except BaseException as e:  # noqa: BLE001 — the caller reads that one alone
            self.results[i] = e
        with self.lock:
            self.left -= 1
            last = not self.left
        if last:
            with contextlib.suppress(concurrent.futures.InvalidStateError):  # cancelled meanwhile
                self.future.set_result(self.results)
        else:
            self._next()

    def _one(self, url: str):
        """The object's bytes, or the error reading it raised (the caller reads that one alone, with
        retries). A GET not begun once the exit has begun is refused (admit="loop")."""
        try:
            data = _small(url, self.timeout, admit="loop")
            if data is None:
                store, key = _store(url, self.timeout)
                data = run(_get(store, key, None, None, self.timeout), admit="loop")
            return data
        except Exception as e:  # noqa: BLE001
            return e


class _Pool:
    """Daemon threads making the batches' sync calls (fetch_many): one more is started whenever a
    call finds none idle (up to MOST), so each batch has its window whatever else runs. Daemon: the
    exit does not join them; it waits (up to QUIET_WAIT) for the calls they have in flight (_quiet),
    and a call not begun by then is refused (_enter)."""

    MOST = 1024

    def __init__(self):
        import queue

        self.queue: queue.SimpleQueue = queue.SimpleQueue()
        self.idle = threading.Semaphore(0)
        self.threads = 0
        self.lock = threading.Lock()

    def submit(self, fn, *args) -> None:
        """fn(*args) in a thread of the pool; fn hands its own result over and raises nothing."""
        self.queue.put((fn, args))
        if not self.idle.acquire(blocking=False):
            with self.lock:
                start = self.threads < self.MOST
                self.threads += start
            if start:
                threading.Thread(target=self._work, name=f"shardkit-fetch-{self.threads}", daemon=True).start()

    def _work(self) -> None:
        while True:
            fn, args = self.queue.get()
            with contextlib.suppress(BaseException):  # fn says its own errors (fetch_many's fetch)
                fn(*args)
            self.idle.release()


def fetch_range(url: str, start: int, end: int, timeout: float):
    """Bytes [start, end) of an object fetched in the background on the loop: a concurrent Future
    (a read ahead; its waits bounded as run()'s)."""
    store, key = _store(url, timeout)
    return _submit(lambda: _get(store, key, start, end, timeout))


def _submit(make, admit: str = "call"):
    """The coroutine make() run on the loop: a concurrent Future, counted for the exit until it is
    done or cancelled (_busy; `admit`: see _enter)."""
    _enter(admit)
    _late()
    try:
        future = asyncio.run_coroutine_threadsafe(make(), _loop())
        future.add_done_callback(lambda _: _leave())
    except BaseException:
        _leave()
        raise
    return future


def forget() -> None:
    """Drop this process's stores (new credentials, another local server)."""
    with _LOCK:
        _STATE["stores"] = {}
