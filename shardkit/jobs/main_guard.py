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
import threading
import tokenize

from shardkit.errors import ConfigError


def check_main_guard(what: str, main_thread: bool = False) -> None:
    """ConfigError, naming the fix, where `what` (e.g. "build_map") starting worker processes would
    make each of them run the calling script's top level again: the call is not under
    `if __name__ == "__main__":`, or this is a worker importing such a script. `main_thread`: the
    statement the main thread is running is the one to judge (the cluster starts in another thread)."""
    if getattr(multiprocessing.current_process(), "_inheriting", False):  # private: DESIGN, "private APIs"
        raise ConfigError(_message(what, "a worker process that was starting"))
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if not path:
        return  # python -c, a notebook, an interpreter: nothing is imported again
    name = getattr(getattr(main, "__spec__", None), "name", None) or ""
    if name == "__main__" or name.endswith(".__main__"):
        return  # python -m package: multiprocessing does not import a package's __main__ again
    frame = sys._current_frames().get(threading.main_thread().ident) if main_thread else inspect.currentframe()
    while frame is not None and not (frame.f_globals is main.__dict__ and frame.f_code.co_name == "<module>"):
        frame = frame.f_back
    if frame is None:
        return
    try:
        with tokenize.open(path) as f:  # the encoding the script declares (PEP 263), as Python reads it
            source = f.read()
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
        return
    if not guarded(source, frame.f_lineno):
        raise ConfigError(_message(what, f"{path}, line {frame.f_lineno}"))


def guarded(source: str, line: int) -> bool:
    """Whether the statement of `source` running at `line` (at the top level, or inside top-level
    try/with/for/while/if blocks) sits in the body of an `if __name__ == "__main__":` (either operand
    order, alone or and-ed with other tests); True where the source does not parse (nothing to say)."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return True
    return _inside_guard(tree.body, line)


def _inside_guard(statements, line: int) -> bool:
    for node in statements:
        if not node.lineno <= line <= (node.end_lineno or node.lineno):
            continue
        if isinstance(node, ast.If) and _is_main_test(node.test) and _holds(node.body, line):
            return True
        blocks = [getattr(node, name, None) or [] for name in ("body", "orelse", "finalbody")]
        blocks += [h.body for h in getattr(node, "handlers", None) or []]
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            return False  # a definition's body does not run at the top level
        return any(_inside_guard(block, line) for block in blocks)
    return False


def _holds(statements, line: int) -> bool:
    return any(node.lineno <= line <= (node.end_lineno or node.lineno) for node in statements)


def _is_main_test(test) -> bool:
    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And):
        return any(_is_main_test(value) for value in test.values)
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
