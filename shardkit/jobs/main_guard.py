"""The one line a script needs before it starts worker processes.

A worker process of an embedded cluster starts by importing the user's script again (the spawn and
fork-server start methods do, on every platform). A call to build_map at the script's top level
then runs once more in every worker: each finds OUT locked, the workers fail to start, and the user
reads two screens of tracebacks. check_main_guard says what to add instead, before any worker starts.
"""
from __future__ import annotations

import ast
import inspect
import multiprocessing
import sys

from shardkit.errors import ConfigError


def check_main_guard(what: str) -> None:
    """ConfigError, naming the fix, where `what` (e.g. "build_map") starting worker processes would
    make each of them run the calling script's top level again: the call is not under
    `if __name__ == "__main__":`, or this is a worker importing such a script."""
    if getattr(multiprocessing.current_process(), "_inheriting", False):
        raise ConfigError(_message(what, "a worker process that was starting"))
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if not path or not path.endswith(".py"):
        return  # python -c, a notebook, an interpreter: nothing is imported again
    name = getattr(getattr(main, "__spec__", None), "name", None) or ""
    if name == "__main__" or name.endswith(".__main__"):
        return  # python -m package: multiprocessing does not import a package's __main__ again
    frame = inspect.currentframe()
    while frame is not None and not (frame.f_globals is main.__dict__ and frame.f_code.co_name == "<module>"):
        frame = frame.f_back
    if frame is None:
        return
    try:
        with open(path, encoding="utf-8") as f:
            source = f.read()
    except OSError:
        return
    if not guarded(source, frame.f_lineno):
        raise ConfigError(_message(what, f"{path}, line {frame.f_lineno}"))


def guarded(source: str, line: int) -> bool:
    """Whether the top-level statement of `source` holding `line` sits under
    `if __name__ == "__main__":` (either operand order); True where the source does not parse or
    holds no statement there (nothing to say)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return True
    for node in tree.body:
        if node.lineno <= line <= (node.end_lineno or node.lineno):
            return isinstance(node, ast.If) and _is_main_test(node.test) and line > node.test.end_lineno
    return True


def _is_main_test(test) -> bool:
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq)):
        return False
    sides = [test.left, test.comparators[0]]
    names = [s for s in sides if isinstance(s, ast.Name) and s.id == "__name__"]
    mains = [s for s in sides if isinstance(s, ast.Constant) and s.value == "__main__"]
    return len(names) == 1 and len(mains) == 1


def _message(what: str, where: str) -> str:
    return (f"{what} was called at the top level of a script ({where}) and would start worker processes, "
            f"each of which imports the script again and runs that call too: put the call under "
            f"`if __name__ == \"__main__\":`, or pass workers=0 (run here) or worker_pool=\"threads\"")
