"""What a store's error says, read the same way by both clients (fsspec's and obstore's): the chain
of errors behind it and the store's own name for the fault. Imports nothing of the package, so
store.remote and store.objstore can both use it without importing each other."""

from __future__ import annotations

import re


def chain(error: BaseException | None):
    """The error, its cause, their causes (a few levels)."""
    for _ in range(8):
        if error is None:
            return
        yield error
        error = error.__cause__ or error.__context__


_CODE = re.compile(r"<Code>\s*([A-Za-z]+)\s*</Code>|ErrorCode:\s*([A-Za-z]+)")


def store_code(error: BaseException) -> str:
    """The store's own name for what went wrong (S3's and Azure's <Code>, e.g. ContainerNotFound), if
    it said one."""
    for e in chain(error):
        code = getattr(e, "error_code", None)  # Azure's SDK: a str enum
        code = getattr(code, "value", code)
        if isinstance(code, str) and code:
            return code
        found = _CODE.search(str(e))
        if found:
            return found.group(1) or found.group(2)
    return ""
