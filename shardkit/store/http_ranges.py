"""GETs of http(s) files and byte ranges on plain keep-alive connections, one per thread and host
(http.client): how shardkit.store.remote reads http(s) bytes (read_range, read_bytes).

Why not fsspec's client here: it runs every GET of a process on one event-loop thread, and the
reader's GETs come in bursts from many threads (a batch's rows read by range, 4 MiB parts of
whole shards). Measured against the throttled store (bench/RESULTS.md, "Remote streaming, step 2"):
per GET 2.3x the CPU (~440 us against ~190 us), 2.5 ms against 1.2 ms of CPU per MB, and a burst
of 64 ranged GETs on 32 threads took 0.28-0.45 s against 0.13 s (two round trips of 50 ms).
fsspec still reads what this does not: s3://, whole files streamed from a store that ignores Range.
"""

from __future__ import annotations

import http.client
import os
import ssl
import threading
import time
import urllib.parse


MAX_REDIRECTS = 5
REDIRECTS = frozenset({301, 302, 303, 307, 308})
# The slowest a body may come for longer than the timeout: a store that trickles (a byte a second
# keeps every read within the timeout) fails as a stall instead of holding the reader for ever. A
# body of n bytes has timeout + n / FLOOR_RATE seconds, counted from its response's headers.
FLOOR_RATE = 64 << 10  # bytes/s
READ = 1 << 20  # bytes asked of the socket at most per read of a body held in memory


class Stalled(TimeoutError):  # a TimeoutError: retried as one
    """A body that came slower than FLOOR_RATE for longer than the timeout (a trickling store)."""


class RangeIgnored(ValueError):  # a ValueError: never retried
    """The store answered a Range request with other bytes than asked (it ignores Range)."""


class HTTPStatusError(OSError):
    """The store answered with an error status (`status`: fs's classifier reads it)."""

    def __init__(self, status: int, url: str):
        super().__init__(f"HTTP {status} for {url}")
        self.status = status


class _Connections(threading.local):
    """This thread's open connections, by (scheme, host, port)."""

    def __init__(self):
        self.open: dict = {}


_local = _Connections()


_tls: dict = {}  # (SSL_CERT_FILE, SSL_CERT_DIR) -> (the bundle's version, this process's ssl.SSLContext)
_tls_lock = threading.Lock()


def _forget_all() -> None:  # a forked child must not share its parent's sockets (nor its TLS state)
    global _local, _tls_lock
    _local = _Connections()
    _tls.clear()
    _tls_lock = threading.Lock()


def _tls_context() -> ssl.SSLContext:
    """The SSLContext the https connections of this process are opened with, made once: making one
    loads the system's CA bundle, ~16 ms of CPU (OpenSSL 3, Debian's ~150 roots), which a context per
    connection paid for each of a first batch's row GETs (one fresh connection per thread). Made
    again when the variables OpenSSL reads the bundle's place from change, or the bundle file is
    rewritten (its size, mtime and inode: one stat per connection opened)."""
    key = (os.environ.get("SSL_CERT_FILE"), os.environ.get("SSL_CERT_DIR"))
    version = _bundle_version(key[0])
    made = _tls.get(key)
    if made is None or made[0] != version:
        with _tls_lock:
            made = _tls.get(key)
            if made is None or made[0] != version:
                made = _tls[key] = (version, ssl.create_default_context())
    return made[1]


def _bundle_version(cafile: str | None):
    """(inode, size, mtime) of the CA bundle a new context loads (SSL_CERT_FILE, else OpenSSL's
    default file), None where there is none."""
    try:
        st = os.stat(cafile or ssl.get_default_verify_paths().cafile or "")
    except OSError:
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns


os.register_at_fork(after_in_child=_forget_all)


def get(url: str, start: int = 0, end: int | None = None, timeout: float = 15.0, into=None):
    """Bytes [start, end) of `url` (end None: all of it from `start`), following redirects; the
    socket waits at most `timeout` to connect and between reads. `into`: a writable buffer of
    end - start bytes to read the body into (returned as far as it was filled; no bytes object:
    a 4 MiB part read so cost ~40% less CPU than as bytes then written, against the throttled store).
    A 404 is FileNotFoundError, another error status HTTPStatusError; a store that answers a range
    with the whole file is RangeIgnored (its body is not read); a body cut short is
    http.client.IncompleteRead (or, read into `into`, comes back short)."""
    headers = {"Range": f"bytes={start}-{'' if end is None else end - 1}"} if start or end is not None else {}
    for _ in range(MAX_REDIRECTS + 1):
        response, conn = _request(url, headers, timeout)
        if response.status in REDIRECTS and response.getheader("Location"):
            response.read()
            url = urllib.parse.urljoin(url, response.getheader("Location"))
            continue
        try:
            return _body(response, url, start, end, into, _Deadline(response, conn, timeout))
        except BaseException:
            _drop(conn)
            raise
    raise HTTPStatusError(310, url)  # too many redirects


class _Deadline:
    """The deadline of one body: before each read of the socket, the time left to it (timeout +
    bytes so far / FLOOR_RATE - time spent) bounds that read's wait, and none left is Stalled."""

    def __init__(self, response, conn, timeout: float):
        # The response's own socket: a connection that closes after it (HTTP/1.0) handed it over.
        sock = getattr(getattr(response.fp, "raw", None), "_sock", None) or conn.sock
        self.sock, self.timeout, self.start, self.got = sock, timeout, time.monotonic(), 0

    def left(self) -> float:
        left = self.timeout + self.got / FLOOR_RATE - (time.monotonic() - self.start)
        if left <= 0:
            raise Stalled(f"the body came at {self.got / (time.monotonic() - self.start):.0f} B/s, below the floor "
                          f"of {FLOOR_RATE >> 10} KiB/s, for longer than the {self.timeout:g} s timeout (a "
                          "stalled store)")
        return left

    def read(self, reader, arg):
        """reader(arg) (one read of the socket), its wait bounded by the time left to the body."""
        if self.sock is not None:
            self.sock.settimeout(min(self.timeout, self.left()))
        try:
            got = reader(arg)
        except TimeoutError as e:  # the wait ran out: a stall when the body's time did
            self.left()
            raise e
        self.got += got if isinstance(got, int) else len(got)
        return got

    def done(self) -> None:
        if self.sock is not None and self.sock.fileno() != -1:  # kept: its next request waits `timeout` again
            self.sock.settimeout(self.timeout)


class _OneRead:
    """A response's socket file whose readinto returns after at most one read of the socket (what
    BufferedReader.readinto1 does): so each read's wait is bounded by the body's deadline."""

    def __init__(self, fp):
        self._fp = fp

    def readinto(self, buffer) -> int:
        return self._fp.readinto1(buffer)

    def __getattr__(self, name):
        return getattr(self._fp, name)


def _body(response, url: str, start: int, end: int | None, into, deadline: _Deadline):
    if response.status == 404:
        response.read()
        raise FileNotFoundError(url)
    if response.status >= 400:
        response.read()
        raise HTTPStatusError(response.status, url)
    if response.status == 200 and (start or end is not None):  # Range ignored: the whole file comes
        length = response.getheader("Content-Length")
        if start or end is None or length is None or int(length) != end:
            raise RangeIgnored(f"asked bytes {start}-{'' if end is None else end - 1}, the store sends the "
                                  f"whole file ({length} bytes)")
    if into is None or response.length != len(into):
        parts = []
        while part := deadline.read(response.read1, READ):
            parts.append(part)
        if response.length:  # Content-Length said more: cut short
            raise http.client.IncompleteRead(b"".join(parts), response.length)
        response.read()  # b'': marks the response done, so the kept-alive connection serves the next GET
        deadline.done()
        return b"".join(parts)
    response.fp = _OneRead(response.fp)
    view, got = memoryview(into), 0
    while got < len(view):
        n = deadline.read(response.readinto, view[got:])
        if not n:  # cut short: the connection is done for
            raise http.client.IncompleteRead(bytes(view[:got]), len(view) - got)
        got += n
    deadline.done()
    return into


def connect(url: str, timeout: float = 15.0) -> None:
    """Open this thread's connection to `url`'s host now (TCP, and TLS for https), unless it has
    one: so that a GET this thread sends later does not wait for it. Best effort: a connection that
    fails is not kept (the GET opens its own, and reports what goes wrong)."""
    parts = urllib.parse.urlsplit(url)
    key = (parts.scheme, parts.hostname, parts.port)
    if key in _local.open:
        return
    conn = _connect(parts, timeout)
    try:
        conn.connect()
    except OSError:
        conn.close()
        return
    _local.open[key] = conn


def _request(url: str, headers: dict, timeout: float):
    """(response, connection) for a GET of `url`, on this thread's connection to its host: a kept-
    alive connection the store closed meanwhile is opened again once, at no try's expense."""
    parts = urllib.parse.urlsplit(url)
    target = parts.path + (f"?{parts.query}" if parts.query else "")
    key = (parts.scheme, parts.hostname, parts.port)
    for attempt in (0, 1):
        conn = _local.open.get(key)
        reused = conn is not None
        if conn is None:
            conn = _local.open[key] = _connect(parts, timeout)
        try:
            conn.request("GET", target or "/", headers=headers)
            return conn.getresponse(), conn
        except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError, ssl.SSLEOFError):
            _drop(conn)
            if not reused or attempt:
                raise
        except BaseException:
            _drop(conn)
            raise
    raise AssertionError("unreachable")


def _connect(parts, timeout: float) -> http.client.HTTPConnection:
    if parts.scheme == "https":
        return http.client.HTTPSConnection(parts.hostname, parts.port, timeout=timeout, context=_tls_context())
    return http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)


def _drop(conn) -> None:
    conn.close()
    for key, c in list(_local.open.items()):
        if c is conn:
            del _local.open[key]

