"""A local Azure Blob server for tests: Azurite (Microsoft's emulator, a Node.js program that `make
install` puts under .venv/azurite with npm), one process per test module on 127.0.0.1, a container
of its own per test. The account's connection string is set the way adlfs and shardkit read it
(AZURE_STORAGE_CONNECTION_STRING); the host's AZURE_* variables are hidden. Subprocesses (the CLI,
Dask's workers) inherit the environment.

Without Node.js the tests that use it skip, saying how to install it, unless SHARDKIT_REQUIRE_AZURITE=1
(set by .ci/run): there a missing emulator fails them."""

from __future__ import annotations

import itertools
import os
import re
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# The emulator's well-known development account: its key is public (Microsoft's documentation).
ACCOUNT = "devstoreaccount1"
KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
_NAMES = itertools.count()


def azurite_binary() -> str | None:
    found = os.environ.get("SHARDKIT_AZURITE") or str(ROOT / ".venv" / "azurite" / "node_modules" / ".bin" / "azurite-blob")
    return found if os.path.exists(found) and shutil.which("node") else None


@dataclass
class Azure:
    endpoint: str  # http://127.0.0.1:PORT/devstoreaccount1
    container: str
    process: subprocess.Popen

    @property
    def connection_string(self) -> str:
        return (f"DefaultEndpointsProtocol=http;AccountName={ACCOUNT};AccountKey={KEY};"
                f"BlobEndpoint={self.endpoint};")

    def url(self, path: str) -> str:
        return f"az://{self.container}/{path.strip('/')}"

    def fs(self):
        """An adlfs filesystem of the test's own (no instance cache)."""
        import adlfs

        return adlfs.AzureBlobFileSystem(connection_string=self.connection_string, skip_instance_cache=True)

    def upload(self, local: str, path: str) -> str:
        """A local folder copied to az://CONTAINER/path; its URL."""
        fs = self.fs()
        for file in sorted(Path(local).rglob("*")):
            if file.is_file():
                fs.pipe_file(f"{self.container}/{path.strip('/')}/{file.relative_to(local).as_posix()}", file.read_bytes())
        return self.url(path)

    def download(self, path: str, local: str) -> str:
        """Every object below az://CONTAINER/path written under the folder `local`; `local`."""
        fs, prefix = self.fs(), f"{self.container}/{path.strip('/')}/"
        for name in fs.find(prefix):
            target = Path(local) / name[len(prefix):]
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(fs.cat_file(name))
        return local

    def objects(self, path: str) -> dict[str, str]:
        """{key relative to path: ETag} of every object below az://CONTAINER/path."""
        fs, prefix = self.fs(), f"{self.container}/{path.strip('/')}/"
        return {name[len(prefix):]: info["etag"] for name, info in fs.find(prefix, detail=True).items()}


def start_azurite() -> subprocess.Popen:
    binary = azurite_binary()
    if binary is None:
        why = ("Azurite (the Azure Blob emulator) is not installed: `make install` installs it with npm "
               "into .venv/azurite when Node.js is there")
        if os.environ.get("SHARDKIT_REQUIRE_AZURITE") == "1":
            pytest.fail(why)
        pytest.skip(why)
    process = subprocess.Popen([binary, "--inMemoryPersistence", "--blobHost", "127.0.0.1", "--blobPort", "0",
                                "--skipApiVersionCheck", "--disableTelemetry", "--silent", "--loose"],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tempfile.gettempdir())
    deadline = time.monotonic() + 60
    for line in process.stdout:  # it prints where it listens, then nothing more (--silent)
        found = re.search(r"listens on (http://127\.0\.0\.1:\d+)", line)
        if found:
            process.endpoint = f"{found.group(1)}/{ACCOUNT}"
            return process
        if time.monotonic() > deadline:
            break
    process.kill()
    pytest.fail(f"Azurite did not start (exit {process.wait()})")


def stop_azurite(process: subprocess.Popen) -> None:
    from emulators import stop_process

    stop_process(process)
    process.stdout.close()


@pytest.fixture(scope="module")
def azurite():
    process = start_azurite()
    try:
        yield process
    finally:
        stop_azurite(process)


@pytest.fixture
def azure(azurite, monkeypatch):
    """A fresh container on the module's Azurite, its connection string in the environment."""
    from shardkit.store.remote import forget_filesystems

    for name in [n for n in os.environ if n.startswith("AZURE_")]:
        monkeypatch.delenv(name)
    server = Azure(azurite.endpoint, f"test{os.getpid()}x{next(_NAMES)}", azurite)
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", server.connection_string)
    forget_filesystems()
    server.fs().mkdir(server.container)
    try:
        yield server
    finally:
        forget_filesystems()


@pytest.fixture
def faults(azure, monkeypatch):
    """`azure` reached through a FaultProxy (the connection string names the proxy; the SharedKey
    signature does not cover the host)."""
    from shardkit.store.remote import forget_filesystems

    from emulators import FaultProxy

    proxy = FaultProxy(azure.endpoint)
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", azure.connection_string.replace(azure.endpoint, proxy.endpoint))
    forget_filesystems()
    try:
        yield proxy
    finally:
        proxy.close()
        forget_filesystems()
