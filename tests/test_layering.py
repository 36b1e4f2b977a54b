"""Imports flow one way, like the data: a module imports only modules to its left (DESIGN.md)."""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "shardkit"
BASE = {"sample", "config", "errors", "fs", "_version", "datagen", "contract", "identity"}
FLOW = ["sources", "stages", "writers", "manifest", "reader", "loader", "meter", "train"]
TOP = {"executor", "cli", "dedup_job", "dedup_engine", "demo", "bench", "tasks"}  # and cli_* modules


def _layer(module: str) -> str | None:
    """'shardkit.stages.image' → 'stages'; '' for the package root."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "shardkit" else ("" if module == "shardkit" else None)


def _imports(path: Path) -> set[str]:
    """shardkit modules imported by a file; relative imports are reported as such (use absolute ones)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            found.add(f"shardkit.<relative import of {node.module}>" if node.level else node.module or "")
    return {m for m in found if m.split(".")[0] == "shardkit"}


def _allowed(src: str, dst: str) -> bool:
    if dst.startswith("<relative"):
        return False
    if src in TOP or src.startswith("cli_"):
        return True
    if dst == "":  # the package root pulls in the whole public API
        return False
    if dst == src or dst in BASE:
        return src not in BASE or dst in BASE
    return src in FLOW and dst in FLOW and FLOW.index(dst) < FLOW.index(src)


def test_imports_flow_one_way():
    bad = []
    for path in sorted(PKG.rglob("*.py")):
        if path.name == "__init__.py" and path.parent == PKG:
            continue  # the package root re-exports the public API lazily
        src = _layer(".".join(path.relative_to(PKG.parent).with_suffix("").parts))
        for module in _imports(path):
            dst = _layer(module)
            if dst is not None and not _allowed(src, dst):
                bad.append(f"{path.relative_to(PKG.parent)} imports {module} ({src} → {dst})")
    assert not bad, "imports against the flow:\n" + "\n".join(bad)


def test_the_check_catches_a_backwards_import():
    assert not _allowed("writers", "reader")
    assert not _allowed("sources", "executor")
    assert _allowed("reader", "writers") and _allowed("cli", "executor") and _allowed("stages", "config")
