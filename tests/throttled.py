"""A throttled object store on 127.0.0.1 for tests and bench/remote_bench.py: files of a folder over
HTTP (or HTTPS with a certificate of its own: `tls=`) with a delay before the first byte, a
bandwidth cap per connection, Range requests, counters of GETs and bytes sent, bodies cut short on
request (`cut`), and a kill switch (a store that disappears mid-transfer)."""

from __future__ import annotations

import os
import re
import socket
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

CHUNK = 64 << 10  # bytes per paced send


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    # Connections waiting to be accepted. socketserver's 5 dropped the SYNs of a burst of ranged
    # GETs (a batch's rows: 32 at once), which the client sent again only after 1 s.
    request_queue_size = 256

    tls = None  # an ssl.SSLContext: each connection is wrapped, its handshake done in its own thread

    def finish_request(self, request, client_address):
        if self.tls is not None:
            import ssl

            try:
                request = self.tls.wrap_socket(request, server_side=True)
            except (ssl.SSLError, OSError):  # a client that gave up on the handshake
                return
            with self.store._lock:
                self.store.connections += 1
        super().finish_request(request, client_address)

    def handle_error(self, request, client_address):
        import ssl
        import sys

        if not isinstance(sys.exc_info()[1], (ConnectionError, ssl.SSLError)):  # a client that went away: not news
            super().handle_error(request, client_address)


class Store:
    """Serves `root` at `url` until close(): `latency` s before each answer, `rate` bytes/s per
    connection (None: unthrottled), Range requests answered with 206 unless `ranges=False`; over
    TLS when `tls` is a folder: a self-signed certificate for 127.0.0.1 is written there
    (`cert`, what a client trusts through SSL_CERT_FILE), `url` is https://, and `connections`
    counts the TLS connections the store accepted."""

    def __init__(self, root: str, latency: float = 0.05, rate: float | None = 25e6, ranges: bool = True,
                 port: int = 0, tls: str | None = None):
        self.root, self.latency, self.rate, self.ranges = str(root), latency, rate, ranges
        self.gets, self.range_gets, self.heads = Counter(), Counter(), Counter()
        self.sent = Counter()  # path -> bytes of it sent
        self.spans: list[tuple[float, float, str, int]] = []  # (received, answered, path, bytes) of each GET
        self.opened: dict[tuple[float, str], float] = {}  # (received, path) of a GET -> when its connection was opened
        self.dead = threading.Event()
        self._cuts: dict[str, list] = {}  # path -> [times left, Content-Length sent?]
        self.trickling = ""  # GETs of paths starting so send their body a byte a second (`trickle`)
        self.closed = threading.Event()
        self._lock = threading.Lock()
        self._answering = 0  # GETs being answered (their span is recorded after the last byte is sent)
        self._answered = threading.Condition(self._lock)
        self.server = _Server(("127.0.0.1", port), self._handler())
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.cert, self.connections = None, 0
        if tls is not None:
            self.cert = self_signed(tls)
            self.server.tls = _server_context(self.cert)
            self.server.store = self
            self.url = f"https://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def count(self, path: str, ranged: bool) -> None:
        with self._lock:
            self.gets[path] += 1
            self.range_gets[path] += ranged

    def count_sent(self, path: str, nbytes: int) -> None:
        with self._lock:
            self.sent[path] += nbytes

    def quiet(self, timeout: float = 10.0) -> None:
        """Wait until every GET begun is recorded in `spans`: a client may have a whole body before the
        store's thread records it, and a span recorded late would land in the next step's log."""
        with self._answered:
            self._answered.wait_for(lambda: not self._answering, timeout)

    def requests(self) -> int:
        """Requests answered so far (GETs with their bodies, and HEADs): the store's round trips."""
        return sum(self.gets.values()) + sum(self.heads.values())

    def most_at_once(self, suffix: str) -> int:
        """The most files ending in `suffix` that had a GET in flight at one time."""
        spans = [x for x in self.spans if x[2].endswith(suffix)]
        return max((len({p for s, e, p, _ in spans if s <= t < e}) for t, *_ in spans), default=0)

    def shard_bytes(self) -> int:
        """Bytes sent of files under /shards/ (shards and their index sidecars)."""
        return sum(n for p, n in self.sent.items() if p.startswith("/shards/"))

    def cut(self, path: str, times: float = 1, length: bool = True) -> None:
        """The next `times` GETs of `path` (all of them: float('inf')) send half the body asked for,
        then close the connection: with the full Content-Length (`length`), or without one, as a
        server that streams its answer and dies."""
        with self._lock:
            self._cuts[path] = [times, length]

    def _cutting(self, path: str):
        """(cut this answer?, send Content-Length?), counting the cut down."""
        with self._lock:
            plan = self._cuts.get(path)
            if not plan or plan[0] <= 0:
                return False, True
            plan[0] -= 1
            return True, plan[1]

    def trickle(self, prefix: str = "/shards/") -> None:
        """GETs of paths starting with `prefix` send their body one byte a second from now on (a store
        that never quite stalls: each read of the client gets a byte within any timeout)."""
        self.trickling = prefix

    def kill(self) -> None:
        """The store disappears: transfers in progress break off, new connections are refused."""
        self.dead.set()
        self.close()

    def close(self) -> None:
        self.closed.set()
        self.server.shutdown()
        self.server.server_close()
        self._thread.join()

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @classmethod
    def instant(cls, root: str) -> "Store":
        """A store that answers at once, at full speed (faults are planted by the test)."""
        return cls(root, latency=0.0, rate=None)

    def _handler(self):
        store = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as object stores do
            # Headers and body go out in two sends: with Nagle's algorithm on, a small body waited for
            # the client's delayed ACK (~40 ms a request on Linux), which no object store adds.
            disable_nagle_algorithm = True

            def log_message(self, *args):
                pass

            def do_HEAD(self):
                with store._lock:
                    store.heads[self.path] += 1
                self._answer(body=False)

            def setup(self):
                self.opened = time.monotonic()
                super().setup()

            def do_GET(self):
                with store._lock:
                    store._answering += 1
                try:
                    self._answer(body=True)
                finally:
                    with store._answered:
                        store._answering -= 1
                        store._answered.notify_all()

            def _answer(self, body: bool):
                received = time.monotonic()
                time.sleep(store.latency)
                path = os.path.join(store.root, self.path.split("?")[0].lstrip("/"))
                if store.dead.is_set():  # a kept-alive connection of a dead store: cut, no answer
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                if not os.path.isfile(path):
                    self.send_error(404)
                    return
                size = os.path.getsize(path)
                start, end = 0, size
                m = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range", "")) if store.ranges else None
                if m:
                    start, end = int(m[1]), min(size, int(m[2]) + 1 if m[2] else size)
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes {start}-{end - 1}/{size}")
                else:
                    self.send_response(200)
                cut, length = store._cutting(self.path) if body else (False, True)
                if length:
                    self.send_header("Content-Length", str(end - start))
                else:
                    self.send_header("Connection", "close")
                self.send_header("Accept-Ranges", "bytes" if store.ranges else "none")
                self.end_headers()
                if body:  # counted before the send: a client may have it all before the send returns
                    store.count(self.path, m is not None)
                    store.count_sent(self.path, end - start)
                    stop = start + (end - start) // 2 if cut else end
                    store.count_sent(self.path, self._send(path, start, stop) - (end - start))  # a cut send
                    with store._lock:
                        store.spans.append((received, time.monotonic(), self.path, end - start))
                        store.opened[(received, self.path)] = self.opened
                    if cut or not length:
                        self.close_connection = True
                        self.connection.shutdown(socket.SHUT_RDWR)

            def _send(self, path: str, start: int, end: int) -> int:
                began, sent = time.monotonic(), 0
                if store.trickling and self.path.startswith(store.trickling):
                    return self._trickle(path, start, end)
                with open(path, "rb") as f:
                    while start + sent < end:
                        if store.dead.is_set():  # break the connection mid-body
                            self.connection.shutdown(socket.SHUT_RDWR)
                            return sent
                        n = self._chunk(f, start + sent, min(CHUNK, end - start - sent))
                        if n == 0:
                            break
                        sent += n
                        # Paced before each next chunk, not after the last: the answer ends when its
                        # last byte is sent (spans of GETs that follow one another do not overlap).
                        if store.rate and start + sent < end:
                            ahead = sent / store.rate - (time.monotonic() - began)
                            if ahead > 0:
                                time.sleep(ahead)
                return sent

            def _chunk(self, f, offset: int, n: int) -> int:
                """Bytes sent of the n at `offset` of file f: sendfile, or through TLS when the
                connection has it (the kernel would send the file's bytes in the clear)."""
                if store.cert is None:
                    return os.sendfile(self.connection.fileno(), f.fileno(), offset, n)
                data = os.pread(f.fileno(), n, offset)
                self.connection.sendall(data)
                return len(data)

            def _trickle(self, path: str, start: int, end: int) -> int:
                with open(path, "rb") as f:
                    f.seek(start)
                    data = f.read(end - start)
                for i in range(len(data)):
                    if store.closed.wait(1.0):
                        self.connection.shutdown(socket.SHUT_RDWR)
                        return i
                    self.connection.sendall(data[i:i + 1])
                return len(data)

        return Handler


def self_signed(folder: str) -> str:
    """A self-signed certificate for 127.0.0.1 (cert.pem) and its key (key.pem beside it), written
    once to `folder`: the certificate's path."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    cert_path, key_path = os.path.join(folder, "cert.pem"), os.path.join(folder, "key.pem")
    if os.path.exists(cert_path):
        return cert_path
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=7))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
            .sign(key, hashes.SHA256()))
    os.makedirs(folder, exist_ok=True)
    with open(key_path, "wb") as f:
        f.write(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                  serialization.NoEncryption()))
    with open(cert_path + ".tmp", "wb") as f:  # the certificate last: its presence says both are whole
        f.write(cert.public_bytes(serialization.Encoding.PEM))
    os.replace(cert_path + ".tmp", cert_path)
    return cert_path


def _server_context(cert: str):
    import ssl

    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, os.path.join(os.path.dirname(cert), "key.pem"))
    return context
