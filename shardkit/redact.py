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
    that a traceback printed from them (--debug) holds no credential either; returns `error`."""
    seen: set[int] = set()
    todo = [error]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        try:
            e.args = tuple(redact(a) for a in e.args)
            for name in ("filename", "filename2", "url", "detail", "msg", "message", "reason"):
                value = getattr(e, name, None)
                if isinstance(value, str):
                    setattr(e, name, redact(value))
            if getattr(e, "__notes__", None):
                e.__notes__ = [redact(n) for n in e.__notes__]
        except (AttributeError, TypeError):  # a read-only attribute: its message is left as it is
            pass
        todo += [e.__cause__, e.__context__]
    return error


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
