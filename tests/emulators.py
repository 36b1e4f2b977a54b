"""What the tests' local store emulators (Azurite, fake-gcs-server) share: stopping one, and a
FaultProxy of the tests' own in front of one. The proxy passes every request through as it came, records (method, path, client) of each (the client told
apart by User-Agent: "obstore" for object_store's, "gcsfs", else the agent as sent), and answers the
next GETs or HEADs of a path with the statuses planned for it (`plan(path, [503, "reset"])`;
"reset": the connection closed without an answer). Paths are recorded and planned unquoted."""

from __future__ import annotations

import http.client
import http.server
import subprocess
import threading
import urllib.parse


def stop_process(process: subprocess.Popen) -> None:
    """An emulator stopped: SIGTERM, then SIGKILL after 10 s."""
    process.terminate()
    try:
        process.wait(10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def client_of(agent: str) -> str:
    return "obstore" if "object_store" in agent else "gcsfs" if "gcsfs" in agent else agent


class FaultProxy:
    def __init__(self, upstream: str):
        self.planned: dict[str, list] = {}
        self.seen: list[tuple[str, str, str]] = []
        target = urllib.parse.urlsplit(upstream)
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _any(self):
                path = urllib.parse.unquote(self.path.split("?", 1)[0])
                proxy.seen.append((self.command, path, client_of(self.headers.get("User-Agent", ""))))
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                queue = proxy.planned.get(path)
                if queue and self.command in ("GET", "HEAD"):
                    self._fault(queue.pop(0))
                    return
                conn = http.client.HTTPConnection(target.hostname, target.port, timeout=60)
                headers = {k: v for k, v in self.headers.items() if k.lower() != "host"}  # as signed (Azure's
                conn.request(self.command, self.path, body=body or None, headers=headers)  # key covers them)
                answer = conn.getresponse()
                data = answer.read()
                self.send_response(answer.status, answer.reason)
                for name, value in answer.getheaders():  # a HEAD's Content-Length is the object's size
                    if name.lower() not in ("transfer-encoding", "connection") and (
                            name.lower() != "content-length" or self.command == "HEAD"):
                        self.send_header(name, value)
                if self.command != "HEAD":
                    self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    try:
                        self.wfile.write(data)
                    except (BrokenPipeError, ConnectionResetError):  # the client stopped reading (a cut read)
                        self.close_connection = True
                conn.close()

            def _fault(self, status) -> None:
                if status == "reset":
                    self.close_connection = True
                    self.connection.shutdown(2)
                    return
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            do_GET = do_PUT = do_HEAD = do_DELETE = do_POST = do_PATCH = _any

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}{target.path}"

    def plan(self, path: str, answers: list) -> None:
        """`path` as the request names it, unquoted."""
        self.planned[path] = list(answers)

    def tries(self, path: str) -> int:
        """Requests seen for exactly `path`."""
        return len([m for m, p, _ in self.seen if p == path])

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
