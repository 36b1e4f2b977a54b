"""s3:// for real: a dataset in a bucket of a local S3 server (moto's server mode on 127.0.0.1, started
and stopped here) streamed and cached through s3fs, with credentials found where AWS tools look."""

from __future__ import annotations

import time

import pytest
import torch
from factory import make_dataset, read_epoch, same_batches
from moto.server import ThreadedMotoServer
from moto_store import hide_host_aws

from shardkit.errors import ManifestError, ShardError
from shardkit.loader import make_loader
from shardkit.reader.dataset import StreamingDataset
from shardkit.store.remote import forget_filesystems

BUCKET = "training-data"


@pytest.fixture
def s3_delay():
    """Seconds the server waits before each answer (a test parametrizes it to play a far store)."""
    return 0.0


@pytest.fixture
def s3(tmp_path, monkeypatch, s3_delay):
    """(local dataset root, s3:// URL of the same dataset, s3fs filesystem) on a fresh server.

    The endpoint and credentials are set the way every AWS SDK reads them (AWS_ENDPOINT_URL,
    AWS_ACCESS_KEY_ID/...); the host's own ~/.aws files are hidden so nothing leaks in or out.
    """
    import s3fs
    from moto.server import DomainDispatcherApplication

    if s3_delay:
        answer = DomainDispatcherApplication.__call__

        def delayed(self, environ, start_response):
            time.sleep(s3_delay)
            return answer(self, environ, start_response)

        monkeypatch.setattr(DomainDispatcherApplication, "__call__", delayed)

    hide_host_aws(tmp_path, monkeypatch)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://{host}:{port}")
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", "uploader")
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "uploader-secret")
        s3fs.S3FileSystem.clear_instance_cache()  # an instance keeps the credentials it was made with
        forget_filesystems()  # shardkit's own, one per process and protocol
        fs = s3fs.S3FileSystem()
        root, _ = make_dataset(tmp_path / "data", 36, shards=4, fields=("raw", "cls", "txt"))
        fs.mkdir(BUCKET)
        fs.put(root + "/", f"{BUCKET}/sets/demo/", recursive=True)
        yield root, f"s3://{BUCKET}/sets/demo", fs
    finally:
        s3fs.S3FileSystem.clear_instance_cache()
        forget_filesystems()  # shardkit's own, one per process and protocol
        server.stop()
        from moto.backends import get_backend  # the server keeps its buckets in this process

        get_backend("s3").reset()


def read(src, cache_dir, workers=2, **options):
    return read_epoch(src, cache_dir, workers=workers, shuffle_buffer=8, **options)[1]


same = same_batches


def test_s3_streams_the_same_samples_as_local_and_caches_them(s3, tmp_path):
    root, url, fs = s3
    local = read(root, tmp_path / "unused")
    same(read(url, tmp_path / "cache"), local)
    cached = sorted(p.name for p in (tmp_path / "cache").rglob("data-*") if not p.name.endswith(".lock"))
    assert len(cached) == 8  # 4 shards + their indexes, fetched by two workers into one cache
    fs.rm(f"{BUCKET}/sets/demo/shards", recursive=True)  # only the manifest is left in the bucket
    same(read(url, tmp_path / "cache", workers=0), local)  # the shards come from the verified cache


def test_one_sample_from_s3_by_range(s3, tmp_path):
    """ds[i] and ds.get on s3:// read the sample's range and its shard's index, never the shard."""
    root, url, _ = s3
    local = StreamingDataset(root, shuffle=False)
    ds = StreamingDataset(url, cache_dir=str(tmp_path / "cache"))
    for i in (0, 17, 35):
        got, want = ds.get(local[i]["__key__"]), local[i]
        assert got["__key__"] == want["__key__"] and torch.equal(got["raw"], want["raw"]) and got["txt"] == want["txt"]
    assert not list((tmp_path / "cache").rglob("*.tar"))  # no shard fetched whole
    assert 0 < ds.io_stats()["bytes_fetched"] < sum(s.bytes for s in ds.shards) / 4


def test_a_changed_object_fails_its_checksum(s3, tmp_path):
    """A value changed on the store: a checked read names its shard and key; an unchecked read
    (whole-file sha256 as it is fetched) names the remote copy corrupt and keeps nothing."""
    import io
    import tarfile

    from shardkit.errors import ChecksumMismatch

    _, url, fs = s3
    key = f"{BUCKET}/sets/demo/shards/data-00002.tar"
    data = bytearray(fs.cat(key))
    with tarfile.open(fileobj=io.BytesIO(bytes(data))) as tar:
        member = next(m for m in tar.getmembers() if m.name.endswith(".raw"))
    data[member.offset_data + 3] ^= 0xFF  # same size, one byte flipped inside a value
    fs.pipe(key, bytes(data))
    with pytest.raises(ChecksumMismatch, match=f"shard {url}/shards/data-00002.tar .*{member.name.split('.')[0]!r}"):
        read(url, tmp_path / "cache", workers=0, shuffle=False)
    with pytest.raises(ShardError, match=f"checksum mismatch for shard {url}/shards/data-00002.tar"):
        read(url, tmp_path / "unchecked", workers=0, shuffle=False, checksums=False)
    assert not list((tmp_path / "unchecked").rglob("data-00002.tar"))  # nothing unverified kept


def test_credentials_come_from_the_named_profile(s3, tmp_path, monkeypatch):
    import s3fs

    root, url, _ = s3
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    (tmp_path / "aws-credentials").write_text("[training]\naws_access_key_id = reader\n"
                                              "aws_secret_access_key = reader-secret\n")
    monkeypatch.setenv("AWS_PROFILE", "training")
    s3fs.S3FileSystem.clear_instance_cache()
    forget_filesystems()  # shardkit's own, one per process and protocol
    same(read(url, tmp_path / "cache", workers=0), read(root, tmp_path / "unused", workers=0))


def test_no_credentials_anywhere_says_so(s3, tmp_path, monkeypatch):
    import s3fs

    _, url, _ = s3
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")  # no instance-metadata lookup off this machine
    s3fs.S3FileSystem.clear_instance_cache()
    forget_filesystems()  # shardkit's own, one per process and protocol
    with pytest.raises(ManifestError) as e:
        read(url, tmp_path / "cache", workers=0)
    assert f"cannot fetch {url}/manifest.json: NoCredentialsError" in str(e.value)
    assert "AWS_ACCESS_KEY_ID + AWS_SECRET_ACCESS_KEY, or AWS_PROFILE" in str(e.value)


def test_a_missing_s3_backend_names_the_extra(tmp_path):
    """In a fresh process (fsspec remembers a backend once imported) where s3fs cannot be imported."""
    import subprocess
    import sys

    code = ("import sys; sys.modules['s3fs'] = None\n"
            "from shardkit.reader.dataset import StreamingDataset\n"
            f"StreamingDataset('s3://{BUCKET}/sets/demo', cache_dir={str(tmp_path)!r})")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "BadDatasetURL" in proc.stderr  # a ManifestError and a BadURL (exit 2)
    assert "pip install 'shardkit[s3]'" in proc.stderr, proc.stderr[-2000:]


@pytest.mark.filterwarnings("ignore:This DataLoader will create")
@pytest.mark.parametrize("s3_delay", [0.02])
def test_exactly_once_and_resume_at_another_world_size_from_s3_with_fetch_ahead(s3, tmp_path, monkeypatch):
    from factory import make_dataset
    from test_remote_fetch import exactly_once_and_resume

    root, url, _ = s3
    _, expected = make_dataset(tmp_path / "again", 36, shards=4, fields=("raw", "cls", "txt"))  # the same samples
    loaders = exactly_once_and_resume(url, tmp_path / "cache", monkeypatch, expected)
    stats = [loader.source.io_stats() for loader in loaders]
    assert sum(s["network_wait_s"] for s in stats) > 0
    assert sum(s["bytes_fetched"] for s in stats) == sum(s.bytes + s.index["bytes"] for s in loaders[0].source.shards)
    cached = [p for p in (tmp_path / "cache").rglob("data-*") if not p.name.endswith(".lock")]
    assert len(cached) == 8


@pytest.mark.filterwarnings("ignore:This DataLoader will create")
@pytest.mark.parametrize("s3_delay", [0.05])
def test_exactly_once_and_resume_from_s3_with_rows_read_by_range(s3, tmp_path, monkeypatch):
    from factory import make_dataset
    from test_remote_fetch import exactly_once_and_resume, read_rows_by_range_while_shards_download

    read_rows_by_range_while_shards_download(monkeypatch)
    root, url, _ = s3
    _, expected = make_dataset(tmp_path / "again", 36, shards=4, fields=("raw", "cls", "txt"))  # the same samples
    loaders = exactly_once_and_resume(url, tmp_path / "cache", monkeypatch, expected)
    fetched = sum(loader.source.io_stats()["bytes_fetched"] for loader in loaders)
    assert fetched > sum(s.bytes + s.index["bytes"] for s in loaders[0].source.shards)  # rows by range, then whole


@pytest.mark.parametrize("client", ["fsspec", "obstore"])
@pytest.mark.parametrize("s3_delay", [0.02])
def test_s3_shards_come_as_parallel_ranged_gets(s3, tmp_path, monkeypatch, client):
    import s3fs

    from shardkit.reader import download as download_module
    from shardkit.store import objstore

    if client == "obstore" and not objstore.available():
        pytest.skip("obstore is not installed (pip install 'shardkit[obstore]')")

    monkeypatch.setenv("SHARDKIT_OBJECT_CLIENT", client)
    root, url, _ = s3
    ranges, real = [], s3fs.S3FileSystem._cat_file

    async def counted(self, path, version_id=None, start=None, end=None):
        ranges.append((path, start, end))
        return await real(self, path, version_id=version_id, start=start, end=end)

    def counted_obstore(real_get):
        def get(store, key, options=None):
            ranges.append((key, *(options or {}).get("range", (None, None))))
            return real_get(store, key, options=options)
        return get

    monkeypatch.setattr(s3fs.S3FileSystem, "_cat_file", counted)
    if client == "obstore":
        import obstore

        for name in ("get", "get_async"):
            monkeypatch.setattr(obstore, name, counted_obstore(getattr(obstore, name)))
    monkeypatch.setattr(download_module, "PART", 8192)
    ds = StreamingDataset(url, cache_dir=str(tmp_path / "cache"), seed=7, shuffle_buffer=8)
    same(list(make_loader(ds, batch_size=5, num_workers=0)), read(root, tmp_path / "unused", workers=0))
    tar = [(start, end) for path, start, end in ranges if path.endswith("data-00001.tar")]
    assert len(tar) > 1 and all(end - start <= 8192 for start, end in tar)
    assert sorted(tar)[0][0] == 0 and sum(end - start for start, end in tar) == ds.shards[1].bytes
    assert ds.io_stats()["bytes_fetched"] == sum(s.bytes + s.index["bytes"] for s in ds.shards)
