"""A long listing of S3 goes on as one stream per folder, several at once (store.listing PARALLEL),
merged back in key order: the keys, sizes and versions the one stream gives, in its order, on
both clients, across page boundaries, with folder markers, keys obstore cannot name, a folder
whose name cannot be a prefix, a level of one folder gone down into, failing pages, and a
listing stopped early."""

from __future__ import annotations

import threading
import time

import pytest
from moto_store import BUCKET, answers, s3  # noqa: F401 — the fixtures

import shardkit.store.listing as L
from shardkit.store import objstore

CLIENTS = ["obstore", "fsspec"] if objstore.available() else ["fsspec"]

# Files between folders (a.jpg < a/ < a-b/ ... in S3's order: '-' < '/' < '0'), markers at every
# level, a folder obstore cannot name inside (odd//e.jpg), nested folders, a folder of one file.
TREE = ["src/", "src/a.jpg", "src/a/", "src/a/x.jpg", "src/a/y/", "src/a/y/1.jpg", "src/a-b/z.jpg", "src/a0.jpg",
        "src/b/.gitkeep", "src/b/c.jpg", "src/cat-dog/1.jpg", "src/cat.jpg", "src/cat/", "src/cat/3.jpg",
        "src/odd//e.jpg", "src/odd/./f.jpg", "src/odd/g.jpg", "src/train/", "src/train/00/", "src/train/00/1.jpg",
        "src/train/00/2.jpg", "src/train/01/1.jpg", "src/train/02/1.jpg", "src/train/02/x/1.jpg",
        "src/space name/\u00fc.jpg", "src/z.jpg", "src/zz/1.jpg", "src/zz/2.jpg", "src/zz/3.jpg", "src/zz/4.jpg"]


def _put(s3, keys) -> None:
    for key in keys:
        s3.client.put_object(Bucket=BUCKET, Key=key, Body=b"" if key.endswith("/") else key.encode())


@pytest.fixture
def streams(monkeypatch):
    """The folders given a stream of their own, with the key each was listed on from (None: its start)."""
    made, real = [], L._Stream.__init__

    def init(self, parallel, folder, after):
        made.append((folder, after))
        real(self, parallel, folder, after)

    monkeypatch.setattr(L._Stream, "__init__", init)
    return made


def _small(monkeypatch, client: str, page: int, switch: int) -> None:
    monkeypatch.setenv("SHARDKIT_OBJECT_CLIENT", client)
    monkeypatch.setattr(L, "PAGE", page)
    monkeypatch.setattr(objstore, "LIST_CHUNK", page)
    monkeypatch.setattr(L, "SWITCH", switch)
    monkeypatch.setattr(L, "PARALLEL", 3)


@pytest.mark.parametrize("client", CLIENTS)
@pytest.mark.parametrize("page,switch", [(2, 1), (3, 1), (2, 4), (5, 2)])
def test_a_parallel_listing_gives_the_one_stream_s_keys_in_its_order(s3, monkeypatch, streams, client, page, switch):
    _small(monkeypatch, client, page, switch)
    _put(s3, TREE)
    one = list(L.Keys(s3.url("src")))
    assert not streams
    parallel = list(L.Keys(s3.url("src"), parallel=True))
    assert parallel == one
    assert "a/" in [k for k, _, _ in one] and "train/00/" in [k for k, _, _ in one]  # markers among them
    folders = [f for f, _ in streams]
    assert {"cat/", "odd/", "zz/"} <= set(folders) and len(folders) >= 5  # listed as folders of their own
    assert folders == sorted(folders)


@pytest.mark.parametrize("client", CLIENTS)
def test_a_level_of_one_folder_is_gone_down_into(s3, monkeypatch, streams, client):
    """SRC holding one folder (`train/`) is listed by that folder's subfolders, the first from the
    key the one stream had reached."""
    _small(monkeypatch, client, 3, 1)
    _put(s3, ["src/readme.txt", "src/train/"] + [f"src/train/{i:02d}/{j}.jpg" for i in range(6) for j in range(3)]
         + ["src/train/zz.txt"])
    one = list(L.Keys(s3.url("src")))
    assert list(L.Keys(s3.url("src"), parallel=True)) == one
    assert streams == [("train/00/", "train/00/0.jpg")] + [(f"train/{i:02d}/", None) for i in range(1, 6)]


@pytest.mark.parametrize("client", CLIENTS)
def test_a_folder_whose_name_cannot_be_a_prefix_turns_the_rest_into_one_stream(s3, monkeypatch, streams, client):
    """`src//top.jpg`: a folder with an empty name, between `-d/` and `a/`. The folders before it
    were listed in parallel, the rest as one stream again (obstore's, with s3fs's page where it
    cannot name a key)."""
    _small(monkeypatch, client, 2, 1)
    _put(s3, [f"src/-{c}/1.jpg" for c in "abcd"] + ["src//top.jpg", "src//top2.jpg"] + TREE[1:])
    one = list(L.Keys(s3.url("src")))
    assert list(L.Keys(s3.url("src"), parallel=True)) == one
    assert "/top.jpg" in [k for k, _, _ in one]
    assert [f for f, _ in streams][:3] == ["-b/", "-c/", "-d/"]


@pytest.mark.parametrize("client", CLIENTS)
def test_a_failing_page_of_a_folder_s_stream_is_retried_and_one_that_keeps_failing_names_the_url(
        s3, answers, monkeypatch, streams, client):
    from shardkit.store.remote import RemoteError, RemotePolicy

    _small(monkeypatch, client, 2, 1)
    _put(s3, TREE)
    one = list(L.Keys(s3.url("src")))
    policy = RemotePolicy(retries=2, backoff=0.01, fix="shardkit build --timeout/--retries")
    answers[f"/{BUCKET}"] = [None, None, 503, None, 503, None, 500]  # the discovery's and the streams' pages
    assert list(L.Keys(s3.url("src"), policy, parallel=True)) == one
    assert not answers[f"/{BUCKET}"]
    answers[f"/{BUCKET}"] = [None, None] + [503] * 200
    with pytest.raises(RemoteError, match=r"s3://shardkit-test/src.*tried 3 time"):
        list(L.Keys(s3.url("src"), policy, parallel=True))
    answers[f"/{BUCKET}"] = []


@pytest.mark.parametrize("client", CLIENTS)
def test_a_listing_stopped_early_ends_its_folders_streams(s3, monkeypatch, client):
    _small(monkeypatch, client, 2, 1)
    monkeypatch.setattr(L, "QUEUE", 1)
    _put(s3, [f"src/f{i:02d}/{j}.jpg" for i in range(12) for j in range(6)])
    keys = iter(L.Keys(s3.url("src"), parallel=True))
    assert [next(keys)[0] for _ in range(8)] == [f"f{i:02d}/{j}.jpg" for i in range(2) for j in range(6)][:8]
    assert any(t.name == "shardkit-list" for t in threading.enumerate())  # streams listing ahead
    keys.close()
    deadline = time.monotonic() + 10
    while any(t.name == "shardkit-list" for t in threading.enumerate()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(t.name == "shardkit-list" for t in threading.enumerate())


def test_a_store_other_than_s3_stays_one_stream(tmp_path, monkeypatch, streams):
    """Only S3 pages a listing with a delimiter; another store's walk is list_folder's, as before."""
    import fsspec

    fs = fsspec.filesystem("memory")
    for i in range(4):
        fs.pipe(f"/par/f{i}/x.jpg", b"1")
    monkeypatch.setattr(L, "SWITCH", 1)
    try:
        assert [k for k, _, _ in L.Keys("memory://par", parallel=True)] == [f"f{i}/x.jpg" for i in range(4)]
    finally:
        fs.rm("/par", recursive=True)
    assert not streams
