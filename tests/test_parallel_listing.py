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


def _small(monkeypatch, client: str, page: int, switch: int, folder_keys: int = 0) -> None:
    """Pages of `page` keys, the parallel listing after `switch` of them, 3 streams at once, for
    folders of `folder_keys` keys or more on average (0: any folder)."""
    monkeypatch.setenv("SHARDKIT_OBJECT_CLIENT", client)
    monkeypatch.setattr(L, "PAGE", page)
    monkeypatch.setattr(objstore, "LIST_CHUNK", page)
    monkeypatch.setattr(L, "SWITCH", switch)
    monkeypatch.setattr(L, "PARALLEL", 3)
    monkeypatch.setattr(L, "FOLDER_KEYS", folder_keys)


@pytest.fixture
def listings(monkeypatch):
    """The store's listing requests: `listings["n"]` counts them; `listings["fail"] = True` answers
    each with a 503."""
    from moto.server import DomainDispatcherApplication

    real, state, lock = DomainDispatcherApplication.__call__, {"n": 0, "fail": False}, threading.Lock()

    def answer(self, environ, start_response):
        if environ["REQUEST_METHOD"] == "GET" and environ.get("PATH_INFO", "") == f"/{BUCKET}":
            with lock:
                state["n"] += 1
            if state["fail"]:
                start_response("503 Slow Down", [("Content-Type", "text/plain"), ("Content-Length", "4")])
                return [b"slow"]
        return real(self, environ, start_response)

    monkeypatch.setattr(DomainDispatcherApplication, "__call__", answer)
    return state


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


@pytest.mark.parametrize("client", CLIENTS)
def test_small_folders_and_a_flat_src_stay_one_stream(s3, monkeypatch, streams, client):
    """A stream per folder costs a request and a thread: for folders of a few keys (fewer than
    FOLDER_KEYS on average over the first pages) it would be slower than the one stream."""
    _small(monkeypatch, client, 2, 2, folder_keys=4)
    _put(s3, [f"src/tiny{i:02d}/{j}.jpg" for i in range(12) for j in range(3)] + [f"flat/{i:03d}.jpg" for i in range(30)])
    for src in ("src", "flat"):
        assert list(L.Keys(s3.url(src), parallel=True)) == list(L.Keys(s3.url(src)))
    assert not streams
    _put(s3, [f"big/f{i:02d}/{j}.jpg" for i in range(6) for j in range(5)])  # 5 keys a folder: worth it
    assert list(L.Keys(s3.url("big"), parallel=True)) == list(L.Keys(s3.url("big")))
    assert len(streams) >= 3


@pytest.mark.skipif(not objstore.available(), reason="pip install 'shardkit[obstore]'")
def test_obstore_beside_an_s3fs_without_its_private_call_stays_one_stream(s3, monkeypatch, streams):
    """The folders come from s3fs's ListObjectsV2 pages (its private `_call_s3`): without them,
    obstore's one stream goes on."""
    _small(monkeypatch, "obstore", 2, 1)
    monkeypatch.setattr(L, "S3_CALL", "_call_s3_renamed")
    _put(s3, [key for key in TREE if "odd/" not in key])  # (obstore reads those keys through s3fs's pages)
    assert list(L.Keys(s3.url("src"), parallel=True)) == list(L.Keys(s3.url("src")))
    assert not streams


@pytest.mark.parametrize("client", CLIENTS)
def test_a_folder_named_again_past_the_point_listed_from_is_listed_once(s3, monkeypatch, streams, client):
    """The folder of the last key given is listed on from that key, and the other folders from a
    listing that starts after it (`a/` + U+10FFFF). S3 names `a/` again there when a key of it sorts
    past that point (`a/\U0010ffffx`); moto does not, so its answer gets `a/` added here."""
    _small(monkeypatch, client, 3, 1)
    _put(s3, [f"src/a/{i}.jpg" for i in range(3)] + ["src/a/\U0010ffffx", "src/b/1.jpg", "src/c/1.jpg", "src/d/1.jpg"])
    real = L._Parallel._level

    def level(self, level, start):
        for units, more in real(self, level, start):
            if start is not None and start.endswith(L.LAST):
                units = sorted(units + [("folder", start[:-1], None)], key=lambda u: u[1])
            yield units, more

    monkeypatch.setattr(L._Parallel, "_level", level)
    one = list(L.Keys(s3.url("src")))
    assert list(L.Keys(s3.url("src"), parallel=True)) == one
    assert [f for f, _ in streams] == ["a/", "b/", "c/", "d/"]


@pytest.mark.parametrize("client", CLIENTS)
def test_a_folder_skipped_inside_a_folder_s_stream_is_not_listed_to_its_end(s3, monkeypatch, listings, client):
    _small(monkeypatch, client, 5, 1)
    _put(s3, [f"src/{c}/{i}.jpg" for c in "abcd" for i in range(5)] + [f"src/b/.git/{i:04d}" for i in range(200)])
    counts = {}
    for parallel in (False, True):
        listings["n"], got, keys = 0, [], L.Keys(s3.url("src"), parallel=parallel)
        for rel, _, _ in keys:
            got.append(rel)
            if rel.startswith("b/.git/"):
                keys.skip("b/.git/")
        counts[parallel] = listings["n"]
        assert got == [f"{c}/{i}.jpg" for c in "a" for i in range(5)] + ["b/.git/0000"] + \
            [f"{c}/{i}.jpg" for c in "bcd" for i in range(5)]
    assert counts[True] <= counts[False] + 8, counts  # 200 keys of b/.git/ would be 40 pages


@pytest.mark.parametrize("client", CLIENTS)
def test_a_closed_listing_asks_for_no_more_pages_even_while_its_streams_retry(s3, monkeypatch, listings, client):
    from shardkit.store.remote import RemotePolicy

    _small(monkeypatch, client, 2, 1)
    monkeypatch.setattr(L, "QUEUE", 1)
    _put(s3, [f"src/f{i:02d}/{j}.jpg" for i in range(6) for j in range(20)])
    policy = RemotePolicy(retries=6, backoff=0.3, timeout=5, fix="x")
    keys = iter(L.Keys(s3.url("src"), policy, parallel=True))
    assert next(keys)[0] == "f00/0.jpg" and next(keys)[0] == "f00/1.jpg" and next(keys)[0] == "f00/10.jpg"
    listings["fail"] = True  # every stream's next page fails from now on, and would be retried 6 times
    time.sleep(0.5)
    keys.close()
    closed = listings["n"]
    time.sleep(3)  # 6 retries of 0.3, 0.6, 1.2 ... s: most would come in this time
    assert listings["n"] - closed <= 3, "streams asked for pages after the listing was closed"
    deadline = time.monotonic() + 10
    while any(t.name == "shardkit-list" for t in threading.enumerate()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(t.name == "shardkit-list" for t in threading.enumerate())


@pytest.mark.parametrize("client", CLIENTS)
def test_a_folder_of_files_page_after_page_is_one_stream(s3, monkeypatch, streams, client):
    """SRC holding one folder of files only: its keys come one page after another whichever way, so
    it is listed as one stream (obstore's where it serves), not a page with a delimiter at a time."""
    _small(monkeypatch, client, 2, 2)
    _put(s3, [f"src/one/{i:03d}.jpg" for i in range(30)])
    assert list(L.Keys(s3.url("src"), parallel=True)) == list(L.Keys(s3.url("src")))
    assert streams == [("one/", "one/003.jpg")]
