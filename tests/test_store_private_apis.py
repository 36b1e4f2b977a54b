"""The store's private fsspec/s3fs names are fenced (DESIGN, "private APIs"): each taken away, the
same answer comes through the public way."""

from __future__ import annotations

from moto_store import s3  # noqa: F401 — s3: the fixture

from shardkit.store.listing import has_any, list_folder
from shardkit.store.remote import strip_protocol


def test_a_folder_lists_the_same_without_call_s3(s3, monkeypatch):  # noqa: F811
    import shardkit.store.listing as listing

    for name in ("a.txt", "b/c.txt", "b/d.txt", "e.bin"):
        s3.client.put_object(Bucket=s3.url("").split("/")[2], Key=f"set/{name}", Body=name.encode())
    paged = list(list_folder(s3.url("set")))
    assert has_any(s3.url("set/b")) and not has_any(s3.url("set/none"))
    monkeypatch.setattr(listing, "S3_CALL", "_call_s3_renamed")  # an s3fs without the name (its own calls keep theirs)
    assert [(e.name, e.is_dir, e.size) for e in list_folder(s3.url("set"))] == \
        [(e.name, e.is_dir, e.size) for e in paged] == [("a.txt", False, 5), ("b", True, 0), ("e.bin", False, 5)]
    assert has_any(s3.url("set/b")) and not has_any(s3.url("set/none"))


def test_strip_protocol_without_fsspecs_private_name():
    class Bare:  # a filesystem without _strip_protocol
        pass

    assert strip_protocol(Bare(), "s3://bucket/set/a.txt") == "bucket/set/a.txt"
    import fsspec

    assert strip_protocol(fsspec.filesystem("memory"), "memory://bucket/a") == "/bucket/a"
