"""shardkit/store/http_ranges.py, the http(s) client behind store.remote.read_range and read_bytes: keep-alive
connections per thread, redirects, statuses the classifier reads, a store that ignores Range."""

import multiprocessing
import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from throttled import Store

from shardkit.store.remote import RangeIgnored, RemoteError, RemotePolicy, read_bytes, read_range
import shardkit.store.http_ranges as http_ranges

NO_WAIT = RemotePolicy(retries=1, backoff=0.001)


@pytest.fixture
def store(tmp_path):
    (tmp_path / "f.bin").write_bytes(bytes(range(256)) * 64)  # 16 KiB
    s = Store(str(tmp_path), latency=0.0, rate=None)
    yield s
    s.close()


def test_ranges_and_whole_files_on_one_kept_alive_connection(store):
    url = f"{store.url}/f.bin"
    assert read_range(url, 10, 20, NO_WAIT) == bytes(range(10, 20))
    assert read_bytes(url, NO_WAIT, 16384) == bytes(range(256)) * 64
    assert store.gets["/f.bin"] == 2 and len([k for k in http_ranges._local.open if k[2] == store.port]) == 1


@pytest.mark.parametrize("status", [403, 500])
def test_an_error_status_is_named_and_retried_only_when_it_may_pass(status):
    calls = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            calls.append(1)
            self.send_error(status)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/x"
        with pytest.raises(RemoteError, match=f"HTTP {status} "):
            read_range(url, 0, 10, NO_WAIT)
        assert len(calls) == (2 if status == 500 else 1)
    finally:
        server.shutdown()
        server.server_close()


def test_a_redirect_is_followed(store):
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(302)
            self.send_header("Location", f"{store.url}/f.bin")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        assert read_range(f"http://127.0.0.1:{server.server_address[1]}/moved", 0, 4, NO_WAIT) == bytes(range(4))
    finally:
        server.shutdown()
        server.server_close()


def test_a_store_that_ignores_range_is_told_without_reading_its_body(tmp_path):
    (tmp_path / "big.bin").write_bytes(b"x" * (1 << 20))
    store = Store(str(tmp_path), latency=0.0, rate=1e6, ranges=False)
    try:
        with pytest.raises(RangeIgnored, match="the store sends the whole file"):
            read_range(f"{store.url}/big.bin", 100, 200, NO_WAIT)
        assert not [k for k in http_ranges._local.open if k[2] == store.port]  # dropped: its body is not read
    finally:
        store.close()


def test_a_connection_the_store_closed_while_idle_is_opened_again(store):
    url = f"{store.url}/f.bin"
    assert read_range(url, 0, 4, NO_WAIT) == bytes(range(4))
    conn = next(c for k, c in http_ranges._local.open.items() if k[2] == store.port)
    conn.sock.shutdown(2)  # as a store that times out idle connections
    assert read_range(url, 4, 8, NO_WAIT) == bytes(range(4, 8))
    assert store.gets["/f.bin"] == 2  # one GET each: the reconnect is not a retry


def _child(url, out):
    out.put(read_range(url, 8, 12, NO_WAIT))


def test_a_forked_process_opens_connections_of_its_own(store):
    if "fork" not in multiprocessing.get_all_start_methods():
        pytest.skip("no fork on this platform")
    url = f"{store.url}/f.bin"
    assert read_range(url, 0, 4, NO_WAIT) == bytes(range(4))  # this thread now holds a connection
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    child = ctx.Process(target=_child, args=(url, out))
    child.start()
    assert out.get(timeout=30) == bytes(range(8, 12))
    child.join()
    assert child.exitcode == 0 and os.getpid()
    assert read_range(url, 4, 8, NO_WAIT) == bytes(range(4, 8))  # the parent's connection still works


@pytest.fixture
def tls_store(tmp_path, monkeypatch):
    (tmp_path / "f.bin").write_bytes(bytes(range(256)) * 64)
    s = Store(str(tmp_path), latency=0.0, rate=None, tls=str(tmp_path / "tls"))
    monkeypatch.setenv("SSL_CERT_FILE", s.cert)  # the client trusts the store's own certificate
    yield s
    s.close()


def _tls_child(url, out):
    out.put((read_range(url, 8, 12, NO_WAIT), len(http_ranges._tls)))


def test_https_connections_of_a_process_share_one_tls_context(tls_store, monkeypatch):
    """Making an SSLContext loads the system's CA bundle (~16 ms of CPU with Debian's): one per
    process, not one per connection (a first batch's row GETs open one connection per thread)."""
    made = []
    real = http_ranges.ssl.create_default_context
    monkeypatch.setattr(http_ranges.ssl, "create_default_context", lambda *a, **k: made.append(1) or real(*a, **k))
    url = f"{tls_store.url}/f.bin"
    threads = [threading.Thread(target=lambda i=i: read_range(url, i, i + 100, NO_WAIT)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert read_range(url, 10, 20, NO_WAIT) == bytes(range(10, 20))
    assert tls_store.connections >= 8 and len(made) == 1  # 9 connections (8 threads and this one), one context
    if "fork" in multiprocessing.get_all_start_methods():  # a forked child makes its own, once
        ctx = multiprocessing.get_context("fork")
        out = ctx.Queue()
        child = ctx.Process(target=_tls_child, args=(url, out))
        child.start()
        assert out.get(timeout=30) == (bytes(range(8, 12)), 1)
        child.join()
        assert child.exitcode == 0


def test_a_connection_opened_ahead_carries_the_thread_s_next_get(tls_store):
    url = f"{tls_store.url}/f.bin"
    done = []

    def one():
        http_ranges.connect(url)
        time.sleep(1.0)
        done.append(read_range(url, 0, 4, NO_WAIT))

    t = threading.Thread(target=one)
    t.start()
    t.join()
    tls_store.quiet()  # the GET's span is recorded once its last byte is sent
    assert done == [bytes(range(4))] and tls_store.connections == 1  # no second handshake
    (received, path, _), = [(r, p, n) for r, _, p, n in tls_store.spans]
    assert received - tls_store.opened[(received, path)] > 0.5  # the GET went on the connection opened ahead
    http_ranges.connect("https://127.0.0.1:1/nothing")  # nothing listens there: not kept, no error
    assert ("https", "127.0.0.1", 1) not in http_ranges._local.open


def test_a_ca_bundle_rewritten_in_place_is_read_again(tls_store, monkeypatch, tmp_path):
    """The context is made once per process, but a bundle file rewritten under the same name (a
    rotated CA, a system update) is read again."""
    from shardkit.store.remote import RemoteError

    bundle = tmp_path / "bundle.pem"
    bundle.write_bytes(b"")
    monkeypatch.setenv("SSL_CERT_FILE", str(bundle))
    url = f"{tls_store.url}/f.bin"
    with pytest.raises(RemoteError, match="CERTIFICATE_VERIFY_FAILED"):
        read_range(url, 0, 4, NO_WAIT)
    bundle.write_bytes(open(tls_store.cert, "rb").read())  # the store's certificate, trusted now
    got = []
    t = threading.Thread(target=lambda: got.append(read_range(url, 0, 4, NO_WAIT)))  # a new connection
    t.start()
    t.join()
    assert got == [bytes(range(4))]


@pytest.mark.parametrize("tls", [True, False])
def test_a_kept_alive_connection_the_store_reset_while_idle_is_opened_again(tmp_path, monkeypatch, tls):
    """A connection (opened ahead, or used once) that the store resets while idle (an RST: over
    https the next read is an SSLEOFError) is opened again once, not counted as a try."""
    import socket
    import struct

    (tmp_path / "f.bin").write_bytes(bytes(range(256)) * 64)
    s = Store(str(tmp_path), latency=0.0, rate=None, tls=str(tmp_path / "tls") if tls else None)
    if tls:
        monkeypatch.setenv("SSL_CERT_FILE", s.cert)
    handler = s.server.RequestHandlerClass
    handler.timeout = 0.2  # the store closes a connection idle for 0.2 s ...
    finish = handler.finish

    def reset(self):  # ... with an RST
        finish(self)
        self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))

    monkeypatch.setattr(handler, "finish", reset)
    url, once = f"{s.url}/f.bin", RemotePolicy(retries=0, backoff=0.001)
    got = []

    def one():
        http_ranges.connect(url)
        time.sleep(0.5)
        got.append(read_range(url, 4, 8, once))
        time.sleep(0.5)
        got.append(read_range(url, 8, 12, once))

    try:
        t = threading.Thread(target=one)
        t.start()
        t.join()
        assert got == [bytes(range(4, 8)), bytes(range(8, 12))]
    finally:
        s.close()
