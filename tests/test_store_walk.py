"""The walk of SRC on a store (sources.walk over store.listing.Keys) finds what the walk of the same
folder on a disk finds: the same samples, row files, rejections and notes, on obstore, on s3fs's
pages and on any other fsspec store, across page boundaries, with a failing page retried; what only
a store can hold (keys with an empty folder name, folder markers) is counted, never a crash."""

from __future__ import annotations

import pytest
from moto_store import BUCKET, answers, s3  # noqa: F401 — s3, answers: the fixtures

import shardkit.sources.walk as W
from shardkit.sources.walk import walk
from shardkit.store import objstore

CLIENTS = ["obstore", "fsspec"] if objstore.available() else ["fsspec"]
# fsspec-ls: s3fs without its private _call_s3 (store.listing.S3_CALL), so its public ls, folder by folder
WALKS = CLIENTS + ["fsspec-ls"]

# A folder's files interleave with its subfolders' keys (a.jpg < a/x.jpg < a0.jpg); stems that prefix
# each other; two shardkit datasets whose first keys come before what proves them datasets; OUT
# inside SRC; hidden files and folders; a folder named like a file.
TREE = {
    "a.jpg": b"1", "a.txt": b"12", "a.b.jpg": b"123", "a/x.jpg": b"1234", "a/y.jsonl": b"{}\n", "a0.jpg": b"1",
    "cat/1.jpg": b"1", "cat/1.txt": b"1", "cat/2.png": b"1", "cat/2.jpg": b"1", "cat/z.xyz": b"1",
    "cat/.hidden.jpg": b"1", "cat/.git/config": b"1", "cat/.git/objects/ab": b"1", "cat/sub.jpg/inner.jpg": b"1",
    "old/aaa.jpg": b"1", "old/deep/q.jsonl": b"1", "old/manifest.json": b"{}", "old/shards/000000.tar": b"1",
    "old/zzz.jpg": b"1", "ds2/!early.jpg": b"1", "ds2/!early/x.parquet": b"1", "ds2/.shardkit/state": b"1",
    "ds2/later.jpg": b"1", "out/manifest.json": b"{}", "out/shards/000000.tar": b"1",
    "docs/d.jsonl": b"{}\n", "docs/notes.md": b"hi", "space name/\u00fc.jpg": b"1", "z.parquet": b"1",
    "dog/manifest.json": b"{}", "dog/1.jpg": b"1",  # a manifest.json without shards/: a sample like any
}


def _write(root, files: dict) -> str:
    for rel, data in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return str(root)


def _seen(listing) -> dict:
    """What a walk found, without the stamps (an mtime on a disk, an ETag on a store)."""
    table = listing.files.drop_columns(["stamp"]).sort_by("key").to_pylist()
    return {"files": table, "row_files": [(rf.id, rf.rel, rf.kind, rf.size, rf.stem_key, rf.top)
                                          for rf in listing.row_files],
            "rejections": sorted((r.path, r.stage, r.reason) for r in listing.rejections), "notes": sorted(listing.notes), "tops": listing.tops,
            "images": (listing.images, listing.top_images, listing.image_exts)}


@pytest.mark.parametrize("client", WALKS)
@pytest.mark.parametrize("page", [1000, 2])
def test_a_store_walk_finds_what_the_disk_walk_finds(s3, tmp_path, monkeypatch, client, page):
    import shardkit.store.listing as listing_module

    monkeypatch.setenv("SHARDKIT_OBJECT_CLIENT", client.split("-")[0])
    if client == "fsspec-ls":
        monkeypatch.setattr(listing_module, "S3_CALL", "_call_s3_renamed")
    monkeypatch.setattr(listing_module, "PAGE", page)  # s3fs's pages of 2 keys: skips across pages
    monkeypatch.setattr(objstore, "LIST_CHUNK", page)
    monkeypatch.setattr(W, "FLUSH_ROWS", page)  # a dataset's samples taken back from flushed batches too
    src = _write(tmp_path / "src", TREE)
    local = walk(src, src + "/out")
    url = s3.upload(src, "src")
    if client == "obstore":  # s3fs is never made for the listing
        monkeypatch.setattr(listing_module, "filesystem", lambda *a: pytest.fail("s3fs made for a listing"))
    remote = walk(url, s3.url("src/out"))
    assert _seen(remote) == _seen(local)
    reasons = {r.path: r.reason for r in local.rejections}
    assert reasons["old/"].startswith("a shardkit dataset") and reasons["ds2/"].startswith("a shardkit dataset")
    assert reasons["out/"].startswith("the build's output folder") and reasons["cat/.git/"].startswith("hidden")
    skipped = ("old/", "ds2/", "out/", "cat/.git/")
    assert not [r for r in local.rejections if r.path.startswith(skipped) and r.path not in skipped]
    assert "old" not in local.tops and "ds2" not in local.tops and "dog" in local.tops
    assert [rf.rel for rf in local.row_files] == ["a/y.jsonl", "docs/d.jsonl", "z.parquet"]


def test_any_other_fsspec_store_walks_as_the_disk(tmp_path):
    import fsspec

    src = _write(tmp_path / "src", TREE)
    fs = fsspec.filesystem("memory")
    fs.put(src + "/", "/walked/", recursive=True)
    try:
        assert _seen(walk("memory://walked", "memory://walked/out")) == _seen(walk(src, src + "/out"))
    finally:
        fs.rm("/walked", recursive=True)


@pytest.mark.parametrize("client", CLIENTS)
def test_keys_a_disk_cannot_name_and_folder_markers_are_counted_not_fatal(s3, monkeypatch, client):
    monkeypatch.setenv("SHARDKIT_OBJECT_CLIENT", client)
    for key, data in {"src/a.jpg": b"1", "src/odd//e.jpg": b"1", "src/odd/./f.jpg": b"1", "src/odd/g.jpg": b"1",
                      "src/empty/": b"", "src/cat/": b"", "src/cat/1.jpg": b"1", "src/z.jpg": b"1"}.items():
        s3.client.put_object(Bucket=BUCKET, Key=key, Body=data)
    listing = walk(s3.url("src"))
    assert sorted(listing.files.column("key").to_pylist()) == ["a", "cat/1", "odd/g", "z"]
    odd = {r.path: r.reason for r in listing.rejections}
    assert set(odd) == {"odd//e.jpg", "odd/./f.jpg"} and all("empty, '.' or '..' folder name" in r for r in odd.values())
    assert listing.notes == ["2 folder markers (empty objects without an extension) passed over"]


@pytest.mark.parametrize("client", CLIENTS)
def test_a_failing_listing_page_is_retried_from_the_key_after_the_last_one(s3, answers, tmp_path, monkeypatch,
                                                                           client):
    import shardkit.store.listing as listing_module
    from shardkit.store.remote import RemoteError, RemotePolicy

    monkeypatch.setenv("SHARDKIT_OBJECT_CLIENT", client)
    monkeypatch.setattr(listing_module, "PAGE", 2)
    src = s3.upload(_write(tmp_path / "src", {f"c{i}/{j}.jpg": b"1" for i in range(3) for j in range(3)}), "src")
    policy = RemotePolicy(retries=2, backoff=0.01, fix="shardkit build --timeout/--retries")
    answers[f"/{BUCKET}"] = [503] if client == "obstore" else [None, 503, None, 500]  # None: answered as usual
    assert sorted(walk(src, policy=policy).files.column("key").to_pylist()) == \
        [f"c{i}/{j}" for i in range(3) for j in range(3)]
    answers[f"/{BUCKET}"] = [503, 503, 503]
    with pytest.raises(RemoteError, match="tried 3 time"):
        walk(src, policy=policy)


@pytest.mark.skipif(not objstore.available(), reason="pip install 'shardkit[obstore]'")
def test_both_clients_give_the_same_stamps_so_a_rerun_on_the_other_rebuilds_nothing(s3, tmp_path, monkeypatch):
    src = s3.upload(_write(tmp_path / "src", TREE), "src")
    stamps = {}
    for client in ("obstore", "fsspec"):
        monkeypatch.setenv("SHARDKIT_OBJECT_CLIENT", client)
        listing = walk(src, s3.url("src/out"))
        stamps[client] = (listing.files.select(["key", "stamp"]).sort_by("key").to_pylist(),
                          [rf.stamp() for rf in listing.row_files])
    assert stamps["obstore"] == stamps["fsspec"]


@pytest.mark.parametrize("client", CLIENTS)
def test_the_walk_tells_its_progress_as_it_goes(s3, tmp_path, monkeypatch, client):
    monkeypatch.setenv("SHARDKIT_OBJECT_CLIENT", client)
    monkeypatch.setattr(W, "SEEN_EVERY", 7)
    src = _write(tmp_path / "src", {f"c{i % 3}/{i}.jpg": b"1" for i in range(30)})
    on_disk, on_store = [], []
    walk(src, seen=on_disk.append)
    walk(s3.upload(src, "src"), seen=on_store.append)
    assert sorted(on_disk) == [0, 10, 10, 10]  # a folder at a time (SRC itself holds no file)
    assert on_store == [7, 7, 7, 7, 2]  # SEEN_EVERY keys at a time, then the rest
