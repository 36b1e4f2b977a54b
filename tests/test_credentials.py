"""A URL's credentials are never printed nor stored: userinfo (`http://user:pw@host`, `s3://KEY:SECRET@bucket`)
and signed query values (`X-Amz-Signature=...`, `sig=`, `token=`) become *** in every message, log line
(--debug too), errors.jsonl row and manifest field (shardkit.errors), over stores on 127.0.0.1."""

from __future__ import annotations

import json
import os
import threading
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

import pytest
from click.testing import CliRunner

from shardkit.cli import main
from shardkit.errors import ShardError
from shardkit.errors import redact
from moto_store import s3  # noqa: F401 — the s3 fixture

SECRETS = ("hunter2", "SIGSECRET", "CREDSECRET", "TOKSECRET", "AKIASECRETKEY", "S3SECRET")


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def shown(result) -> str:
    """All a user sees of a command: its output, and with --debug (re-raised) the traceback."""
    import traceback

    text = result.output + result.stderr
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        text += "".join(traceback.format_exception(result.exception))
    return text


def leaks(*texts) -> list[str]:
    return [s for s in SECRETS for t in texts if s in (t or "")]


class Server:
    """A folder over HTTP on 127.0.0.1; paths with `fail` in them answer 500, `gone` 404."""

    def __init__(self, root):
        class Handler(SimpleHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                if "fail" in self.path:
                    self.send_error(500)
                    return
                super().do_GET()

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), partial(Handler, directory=str(root)))
        self.httpd.daemon_threads = True
        self.host = f"127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join()


@pytest.fixture
def http(tmp_path):
    from factory import make_dataset

    make_dataset(tmp_path / "site" / "ds", 8, shards=2, fields=("raw", "cls", "txt"))
    server = Server(tmp_path / "site")
    yield server
    server.close()


def test_the_redaction():
    assert redact("cannot read http://user:hunter2@h:1/ds/x: HTTP 500") == "cannot read http://***@h:1/ds/x: HTTP 500"
    assert redact("s3://AKIASECRETKEY:S3SECRET@bucket/a@b") == "s3://***@bucket/a@b"
    url = "https://h/x.tar?X-Amz-Algorithm=AWS4&X-Amz-Credential=CREDSECRET&x-amz-signature=SIGSECRET&Sig=a&TOKEN=b"
    assert redact(url) == "https://h/x.tar?X-Amz-Algorithm=AWS4&X-Amz-Credential=***&x-amz-signature=***&Sig=***&TOKEN=***"
    assert redact("a key=value and a path /x@y") == "a key=value and a path /x@y"  # no URL: left alone


HTTP_CASES = {
    "userinfo, not found": "http://user:hunter2@{host}/nothing",
    "userinfo, a server error": "http://user:hunter2@{host}/fail",
    "presigned, not found": "http://{host}/nothing?X-Amz-Credential=CREDSECRET&X-Amz-Signature=SIGSECRET",
    "tokens, a server error": "http://{host}/fail?sig=SIGSECRET&token=TOKSECRET",
}


@pytest.mark.parametrize("case", sorted(HTTP_CASES))
def test_http_credentials_never_printed(http, tmp_path, case):
    url = HTTP_CASES[case].format(host=http.host)
    for command in (["inspect", url], ["verify", url], ["show", url, "#0", "--cache-dir", tmp_path / "c"],
                    ["build", url, tmp_path / "out", "--workers", "0", "--no-progress"]):
        for debug in ([], ["--debug"]):
            result = run(*debug, *command)
            assert result.exit_code != 0, (command, result.output)
            text = shown(result)
            assert not leaks(text), (command, debug, text)
            assert "***" in text, (command, text)


def test_a_signed_dataset_url_fails_the_loader_without_its_secret(http, tmp_path):
    from shardkit.reader.dataset import StreamingDataset

    os.remove(tmp_path / "site" / "ds" / "shards" / "data-00001.tar")  # its fetch fails: HTTP 404
    ds = StreamingDataset(f"http://user:hunter2@{http.host}/ds", cache_dir=str(tmp_path / "c"), retries=0)
    with pytest.raises(ShardError) as e:
        [ds[i] for i in range(len(ds))]
    assert not leaks(str(e.value)) and "http://***@" in str(e.value)


def test_an_http_src_with_userinfo_builds_and_stores_no_credential(http, tmp_path):
    """A source file whose read fails fails the build in one line without the credential; once it
    reads, errors.jsonl, the manifest and the output (with --debug's log lines) hold none either."""
    raw = tmp_path / "site" / "raw"
    raw.mkdir(parents=True)
    (raw / "docs.jsonl").write_text("".join(json.dumps({"text": f"doc {i}"}) + "\n" for i in range(4)) + "{bad\n")
    (raw / "fail.jsonl").write_text(json.dumps({"text": "never read"}) + "\n")
    src, out = f"http://user:hunter2@{http.host}/raw", tmp_path / "out"
    result = run("build", src, out, "--workers", "0", "--no-progress")
    assert result.exit_code == 1 and "cannot read http://***@" in result.stderr and not leaks(shown(result))
    os.remove(raw / "fail.jsonl")
    result = run("--debug", "build", src, out, "--workers", "0", "--no-progress")
    assert result.exit_code == 0, shown(result)
    written = "".join(p.read_text(errors="replace") for p in out.rglob("*") if p.is_file() and p.suffix in
                      (".json", ".jsonl"))
    assert (out / "manifest.json").exists() and "invalid JSON" in (out / "errors.jsonl").read_text()
    assert not leaks(shown(result), written), shown(result)


S3_URL = "s3://AKIASECRETKEY:S3SECRET@shardkit-test/raw"


def test_s3_credentials_in_the_url_are_refused_without_printing_them(s3, tmp_path):
    for command in (["build", S3_URL, tmp_path / "out", "--workers", "0", "--no-progress"],
                    ["build", tmp_path, S3_URL, "--workers", "0", "--no-progress"], ["inspect", S3_URL],
                    ["verify", S3_URL], ["show", S3_URL, "#0"]):
        for debug in ([], ["--debug"]):
            result = run(*debug, *command)
            assert not leaks(shown(result)), (command, shown(result))
            assert "s3://***@shardkit-test/raw" in shown(result)
            if not debug:
                assert result.exit_code == 2 and result.stderr.count("\n") == 1, (command, result.stderr)
    assert not (tmp_path / "out").exists()
