"""A local S3 server for tests (moto's server mode on 127.0.0.1, started and stopped here): the endpoint
and credentials set the way every AWS SDK reads them, the host's ~/.aws hidden, shardkit's cached
filesystems dropped around it. Subprocesses (the CLI, `dask worker`) inherit the environment."""

from __future__ import annotations

import logging
import os
from collections import Counter
from dataclasses import dataclass

import pytest

AWS_VARIABLES = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE",
                 "AWS_DEFAULT_PROFILE", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_REGION")
BUCKET = "shardkit-test"


@dataclass
class S3:
    endpoint: str
    fs: object  # an s3fs.S3FileSystem of the test's own
    client: object  # a boto3 S3 client
    server: object

    def url(self, path: str) -> str:
        return f"s3://{BUCKET}/{path.strip('/')}"

    def upload(self, local: str, path: str) -> str:
        """A local folder copied to s3://BUCKET/path; its URL."""
        self.fs.put(local.rstrip("/") + "/", f"{BUCKET}/{path.strip('/')}/", recursive=True)
        self.fs.invalidate_cache()
        return self.url(path)

    def download(self, path: str, local: str) -> str:
        self.fs.invalidate_cache()
        self.fs.get(f"{BUCKET}/{path.strip('/')}/", local.rstrip("/") + "/", recursive=True)
        return local

    def keys(self, prefix: str) -> list[str]:
        """Every object below s3://BUCKET/prefix, relative to it."""
        prefix = prefix.strip("/") + "/"
        out, args = [], {"Bucket": BUCKET, "Prefix": prefix}
        while True:
            page = self.client.list_objects_v2(**args)
            out += [c["Key"][len(prefix):] for c in page.get("Contents", [])]
            if not page.get("IsTruncated"):
                return sorted(out)
            args["ContinuationToken"] = page["NextContinuationToken"]

    def versions(self, prefix: str) -> Counter:
        """How many times each object below the prefix was written (the bucket keeps versions)."""
        prefix = prefix.strip("/") + "/"
        found, args = Counter(), {"Bucket": BUCKET, "Prefix": prefix}
        while True:
            page = self.client.list_object_versions(**args)
            found.update(v["Key"][len(prefix):] for v in page.get("Versions", []))
            if not page.get("IsTruncated"):
                return found
            args.update(KeyMarker=page["NextKeyMarker"], VersionIdMarker=page["NextVersionIdMarker"])


def hide_host_aws(tmp_path, monkeypatch) -> None:
    """The host's AWS_* variables and ~/.aws files hidden (nothing leaks in or out), region us-east-1,
    and the server's request log quiet."""
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    for name in AWS_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "aws-credentials"))
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")


def start_s3(tmp_path, monkeypatch) -> S3:
    import boto3
    import s3fs
    from moto.server import ThreadedMotoServer

    from shardkit.store.remote import forget_filesystems

    hide_host_aws(tmp_path, monkeypatch)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "tester")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "tester-secret")
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    s3fs.S3FileSystem.clear_instance_cache()
    forget_filesystems()
    client = boto3.client("s3", endpoint_url=endpoint)
    client.create_bucket(Bucket=BUCKET)
    client.put_bucket_versioning(Bucket=BUCKET, VersioningConfiguration={"Status": "Enabled"})
    return S3(endpoint, s3fs.S3FileSystem(skip_instance_cache=True), client, server)


def stop_s3(s3: S3) -> None:
    import s3fs
    from moto.backends import get_backend

    from shardkit.store.remote import forget_filesystems

    s3fs.S3FileSystem.clear_instance_cache()
    forget_filesystems()
    s3.server.stop()
    get_backend("s3").reset()  # the server keeps its buckets in this process


@pytest.fixture
def s3(tmp_path, monkeypatch):
    server = start_s3(tmp_path, monkeypatch)
    try:
        yield server
    finally:
        stop_s3(server)


@pytest.fixture
def answers(monkeypatch):
    """The store answers the next GETs of a path with the statuses in `answers[path]` (a list);
    "stall": no answer until the test ends; None: the usual answer."""
    import threading

    from moto.server import DomainDispatcherApplication

    real, planned, release = DomainDispatcherApplication.__call__, {}, threading.Event()

    def answer(self, environ, start_response):
        queue = planned.get(environ.get("PATH_INFO", ""))
        if environ["REQUEST_METHOD"] == "GET" and queue:
            status = queue.pop(0)
            if status is None:  # this one answered as usual
                return real(self, environ, start_response)
            if status == "stall":
                release.wait(60)
                return real(self, environ, start_response)
            start_response(f"{status} Oops", [("Content-Type", "text/plain"), ("Content-Length", "4")])
            return [b"oops"]
        return real(self, environ, start_response)

    monkeypatch.setattr(DomainDispatcherApplication, "__call__", answer)
    yield planned
    release.set()


def tree(root) -> list[str]:
    """Every path below a local folder (to show that nothing was written)."""
    return sorted(os.path.relpath(os.path.join(d, n), root) for d, dirs, files in os.walk(root)
                  for n in dirs + files)


def same_files(a: str, b: str) -> list[str]:
    """Relative paths whose bytes differ between two local folders (or exist in one only); .shardkit/
    (build state, not the dataset) is left out."""
    def files(root):
        return {os.path.relpath(os.path.join(d, n), root) for d, _, names in os.walk(root) for n in names
                if ".shardkit" not in os.path.relpath(d, root).split(os.sep)}

    fa, fb = files(a), files(b)
    differ = sorted(fa ^ fb)
    for rel in sorted(fa & fb):
        with open(os.path.join(a, rel), "rb") as x, open(os.path.join(b, rel), "rb") as y:
            if x.read() != y.read():
                differ.append(rel)
    return differ


@pytest.fixture
def raw(tmp_path):
    """The demo's raw folder (images, a jsonl of documents, some bad files) that the S3 tests upload."""
    from shardkit.demo.datagen import raw_folder

    root = tmp_path / "raw"
    raw_folder(str(root), images_per_class=5, documents=3, bad=True)
    return str(root)


def plant_duplicates(raw: str) -> None:
    """Exact duplicates in the raw folder: a copy of an image and of a document under other names."""
    import shutil

    shutil.copy(os.path.join(raw, "cat", "000001.jpg"), os.path.join(raw, "cat", "000101.jpg"))
    shutil.copy(os.path.join(raw, "doc_000.txt"), os.path.join(raw, "doc_100.txt"))
