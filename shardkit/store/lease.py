"""One writer per OUT on a store: a lease object taken by a conditional create, refreshed while held.

A local OUT keeps its flock (store.locks.folder_lock). An object store has no locks, but it has conditional
writes: `PUT If-None-Match: *` (S3; GCS: ifGenerationMatch=0) creates OUT/.shardkit/lease only
where none exists, so of two jobs exactly one gets it. The lease records its holder (command, pid,
host, start) and when it was last refreshed; the running job rewrites it every REFRESH seconds
(S3, Azure: `If-Match` its own ETag, so a job that lost the lease cannot clobber the next holder's;
GCS through gcsfs, which has no write matching a generation: a plain write, the refresh and the
takeover unguarded, the create still exclusive). A
second job is refused (FolderLocked, exit 3) naming the holder. A lease that nobody refreshed for
TTL seconds, or whose holder ran on this host and is gone (kill -9), is taken over with one line. A
store that ignores conditional writes is detected (a second create succeeds) and gets one warning
line: there, concurrent jobs are not guarded. Clocks: the holder's clock writes `refreshed`, the
next job's reads it; TTL is far above the skew of NTP-synced hosts.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import threading
import time
import uuid

from shardkit.errors import FolderLocked
from shardkit.store.remote import RemoteError, RemotePolicy
from shardkit.store.locks import folder_lock, held
from shardkit.errors import redact
from shardkit.identity import pid_alive
from shardkit.store import bound, is_url, join, read, remove, retry
from shardkit.store.calls import client

log = logging.getLogger("shardkit.store")
LEASE = ".shardkit/lease"
TTL = 120.0  # seconds without a refresh after which a lease is taken over
REFRESH = 15.0  # seconds between refreshes by the holder


@contextlib.contextmanager
def out_lock(out: str, command: str, within: str | None = None, policy: RemotePolicy | None = None):
    """One writer per OUT for the block: the flock of a local folder, the lease of a store. Within one
    process too, a second writer is refused, except the one whose run is part of the holder's, named
    by `within` (`dedup RAW OUT` runs a build into the OUT it holds): store.locks.held, one rule for both."""
    if not is_url(out):
        with folder_lock(out, command, within=within):
            yield
        return
    lease = Lease(out, command, policy)
    with held(join(out, LEASE), out, command, within, lease.take, lease.release):
        yield


def _conflict(error: BaseException) -> bool:
    """Whether a conditional write failed its condition (HTTP 412, or S3's 409 for a racing one)."""
    for _ in range(8):
        if error is None:
            return False
        if isinstance(error, FileExistsError):
            return True
        response = getattr(error, "response", None)
        if isinstance(response, dict):
            code = response.get("Error", {}).get("Code")
            status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if code in ("PreconditionFailed", "ConditionalRequestConflict") or status in (409, 412):
                return True
        error = error.__cause__ or error.__context__
    return False


class Lease:
    """The lease of one OUT on a store (see the module's docstring)."""

    def __init__(self, out: str, command: str, policy: RemotePolicy | None = None):
        self.out, self.url, self.policy = out, join(out, LEASE), policy
        self.record = {"command": command, "pid": os.getpid(), "host": socket.gethostname(),
                       "since": time.strftime("%Y-%m-%d %H:%M:%S %z"), "token": uuid.uuid4().hex,
                       "refreshed": time.time(), "ttl": TTL}
        self.etag: str | None = None
        self.guarded = True
        self.lost: dict | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _put(self, **condition) -> str | None:
        """Write the record under `condition` (mode='create' or IfMatch=etag); its new ETag, or None
        when the condition failed."""
        fs, path = client(self.url, self.policy)
        data = json.dumps(self.record, sort_keys=True).encode()

        def attempt():
            try:
                return fs.pipe_file(path, data, **condition, **bound(fs, len(data), self.policy))
            except Exception as e:
                if _conflict(e):
                    return False  # not an error to retry: the answer is "someone else holds it"
                raise

        out = retry(self.url, attempt, write=True, policy=self.policy)
        if out is False:
            return None
        return (out or {}).get("ETag", "") if isinstance(out, dict) else ""

    def _read(self) -> tuple[dict | None, str]:
        """(the lease's record, its ETag); (None, '') when there is none, {} when it is unreadable."""
        fs, path = client(self.url, self.policy)
        try:
            refresh = {"refresh": True} if _s3(fs) else {}
            info = retry(self.url, lambda: fs.info(path, **bound(fs, 0, self.policy), **refresh), policy=self.policy)
            data = read(self.url, self.policy)
        except (FileNotFoundError, RemoteError) as e:
            if isinstance(e, FileNotFoundError) or e.not_found:
                return None, ""
            raise
        try:
            record = json.loads(data)
        except ValueError:
            record = {}
        return (record if isinstance(record, dict) else {}), str(info.get("ETag", ""))

    def take(self) -> None:
        """Create the lease, or take over a stale one; FolderLocked naming the holder otherwise."""
        for _ in range(3):  # a lease released or taken over between our two requests: look again
            etag = self._create()
            if etag is not None:
                self.etag = etag
                break
            held, held_etag = self._read()
            if held is None:
                continue
            why = _stale(held)
            if why is None:
                raise FolderLocked(self._refusal(held))
            self.record["refreshed"] = time.time()
            etag = self._put(IfMatch=held_etag) if held_etag and self.guarded else self._put()
            if etag is not None:
                log.warning("%s: took over the lease of %s (%s)", redact(self.out), _holder(held), why)
                self.etag = etag
                break
        else:
            held, _ = self._read()
            raise FolderLocked(self._refusal(held or {}))
        self._thread = threading.Thread(target=self._keep, name="shardkit-lease", daemon=True)
        self._thread.start()

    def _create(self) -> str | None:
        try:
            etag = self._put(mode="create")
        except (TypeError, NotImplementedError, RemoteError) as e:
            if isinstance(e, RemoteError) and "NotImplemented" not in e.detail and "501" not in e.detail:
                raise
            return self._unguarded(f"{type(e).__name__}: {e}")
        if etag is not None and self._put(mode="create") is not None:  # a second create must fail
            return self._unguarded("it accepted a second create of the same object")
        return etag

    def _unguarded(self, why: str) -> str:
        self.guarded = False
        log.warning("%s: this store does not support conditional writes (%s): a second job writing the same OUT "
                    "at the same time is not refused here; run one job per OUT", redact(self.out), redact(why))
        return self._put() or ""

    def _refusal(self, held: dict) -> str:
        return (f"{self.out} is being written by {_holder(held)}; wait for it to end or choose another output "
                f"folder (the lease, {self.url}, is released when that job ends, and taken over once its holder "
                f"has not refreshed it for {held.get('ttl', TTL):g} s)")

    def _keep(self) -> None:
        """Refresh the lease every REFRESH seconds until released; a lease lost to another job is said once."""
        while not self._stop.wait(REFRESH):
            self.record["refreshed"] = time.time()
            try:
                etag = self._put(IfMatch=self.etag) if self.guarded and self.etag else self._put()
            except Exception as e:  # noqa: BLE001 — a failed refresh is retried at the next one
                log.debug("lease refresh failed: %s", redact(str(e)))
                continue
            if etag is None:
                self.lost, _ = self._read()
                log.warning("%s: the lease was taken over by %s while this job ran", redact(self.out),
                            _holder(self.lost or {}))
                return
            self.etag = etag

    def release(self) -> None:
        """Stop refreshing and delete the lease, if it is still this job's."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self.lost is not None:
            return
        with contextlib.suppress(Exception):  # a lease left behind is taken over once stale
            held, _ = self._read()
            if held is not None and held.get("token") == self.record["token"]:
                remove(self.url, self.policy)


def _s3(fs) -> bool:
    return type(fs).__name__ == "S3FileSystem"


def _stale(held: dict) -> str | None:
    """Why a held lease may be taken over (None: it may not)."""
    try:
        refreshed, ttl = float(held["refreshed"]), float(held.get("ttl", TTL))
    except (KeyError, TypeError, ValueError):
        return "its record is unreadable"
    if held.get("host") == socket.gethostname() and isinstance(held.get("pid"), int) and not pid_alive(held["pid"]):
        return f"process {held['pid']} on this host has ended"
    age = time.time() - refreshed
    return f"not refreshed for {age:.0f} s" if age > ttl else None


def _holder(held: dict) -> str:
    try:
        return f"`{held['command']}` (pid {held['pid']} on host {held['host']}, since {held['since']})"
    except (KeyError, TypeError):
        return "another job (its lease names no holder)"
