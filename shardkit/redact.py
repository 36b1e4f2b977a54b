"""The one redaction of credentials in text that may hold a URL: messages, log lines, errors.jsonl
rows, manifest fields. A URL's userinfo (`http://user:pw@host`, `s3://KEY:SECRET@bucket`) and the
values of query parameters that carry signatures or tokens (`X-Amz-Signature`, `sig`, `token`, ...)
become `***`; the rest of the URL stays, so a message still says which file failed."""

from __future__ import annotations

import logging
import re

MASK = "***"

# Query parameters whose value is a secret or a signature (names compared case-insensitively):
# AWS SigV2/SigV4 presigned URLs, GCS signed URLs, Azure SAS, OAuth, and the usual API-key names.
SECRET_PARAMS = ("x-amz-signature", "x-amz-credential", "x-amz-security-token", "awsaccesskeyid", "signature",
                 "x-goog-signature", "x-goog-credential", "googleaccessid", "sig", "token", "key", "access_token",
                 "refresh_token", "id_token", "api_key", "apikey", "api-key", "access_key", "secret", "secret_key",
                 "client_secret", "password", "passwd", "pwd", "auth", "authorization", "credential", "credentials",
                 "session_token", "security_token", "sas")

# scheme://userinfo@ : userinfo stops at the first '/', whitespace, quote or '@' (a path may hold '@').
_USERINFO = re.compile(r"(\b[A-Za-z][A-Za-z0-9+.-]*://)[^/\s@'\"<>]+@")
_PARAM = re.compile(r"([?&;](?:%s)=)[^&#\s'\"<>]*" % "|".join(re.escape(p) for p in SECRET_PARAMS), re.IGNORECASE)


def redact(text):
    """`text` with every URL's userinfo and secret query values replaced by ***; anything that is no
    str is given back as it is."""
    if not isinstance(text, str) or ("://" not in text and "=" not in text):
        return text
    return _PARAM.sub(lambda m: m.group(1) + MASK, _USERINFO.sub(lambda m: m.group(1) + MASK + "@", text))


def has_credentials(url: str) -> bool:
    """Whether a URL carries userinfo or a secret query parameter."""
    return redact(url) != url


def scrub(error: BaseException) -> BaseException:
    """`error` and the exceptions it chains (cause, context) with their messages redacted in place, so
    that a traceback printed from them (--debug) holds no credential either; a chained exception whose
    text comes from elsewhere than its args (aiohttp's names its request's URL) is replaced in the
    chain by a Redacted one, with its text redacted and its traceback. Returns `error`."""
    seen: set[int] = set()
    todo = [error]
    while todo:
        e = todo.pop()
        if id(e) in seen:
            continue
        seen.add(id(e))
        _scrub_one(e)
        suppress = e.__suppress_context__
        for link in ("__cause__", "__context__"):
            child = getattr(e, link)
            if child is None:
                continue
            _scrub_one(child)
            if _text(child) != redact(_text(child)):
                child = _stand_in(child)
                setattr(e, link, child)
            todo.append(child)
        e.__suppress_context__ = suppress  # setting __cause__ sets it
    return error


class Redacted(Exception):
    """Stands in a traceback for an exception whose text held a credential (see scrub)."""


def _text(e: BaseException) -> str:
    try:
        return str(e)
    except Exception:  # noqa: BLE001 — a broken __str__ is no text
        return ""


def _stand_in(e: BaseException) -> Redacted:
    new = Redacted(f"{type(e).__module__}.{type(e).__qualname__}: {redact(_text(e))}")
    new.__traceback__, new.__cause__, new.__context__ = e.__traceback__, e.__cause__, e.__context__
    new.__suppress_context__ = e.__suppress_context__
    return new


def _scrub_one(e: BaseException) -> None:
    try:
        e.args = tuple(redact(a) for a in e.args)
        for name in ("filename", "filename2", "url", "detail", "msg", "message", "reason"):
            value = getattr(e, name, None)
            if isinstance(value, str):
                setattr(e, name, redact(value))
        if getattr(e, "__notes__", None):
            e.__notes__ = [redact(n) for n in e.__notes__]
    except (AttributeError, TypeError):  # a read-only attribute: the text is checked after
        pass


class RedactFilter(logging.Filter):
    """A log filter that redacts each record's formatted message (and its traceback text)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        clean = redact(message)
        if clean != message:
            record.msg, record.args = clean, None
        if record.exc_info and record.exc_info[1] is not None:
            scrub(record.exc_info[1])
            record.exc_text = None
        return True
