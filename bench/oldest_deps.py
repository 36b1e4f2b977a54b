"""Check the oldest supported dependency set: install every lower bound of pyproject.toml, in a
fresh virtual environment, and run the test suite there.

A bound X.Y is installed as X.Y.* (the oldest supported release series, its latest patch: patches
add no API, and early patches often lack wheels for newer Pythons). Runtime dependencies and the
http/s3 extras are pinned that way; the test tools of the dev extra are installed as they resolve.

    python bench/oldest_deps.py                    # every minimum, torch included
    python bench/oldest_deps.py --torch 2.13.0     # where the oldest torch CPU wheel cannot be had
    python bench/oldest_deps.py --keep /tmp/oldest --pytest-args "-x -q tests/test_reader.py"

Not part of the test suite (CI skips it: it installs packages and runs the suite again, minutes).
torch comes from --torch-index (PyTorch's CPU wheels) unless a local wheel of that version is
found on pip's find-links; PyPI's Linux torch wheels pull multi-GB CUDA libraries. Prints the
versions installed and the suite's summary line; exits with the suite's status.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys
import tempfile
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXTRAS = ("http", "s3")  # optional sets whose minimums are pinned too
CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def minimums(pyproject: Path) -> dict[str, str]:
    """'name[extra]' -> its lower bound, for every `>=` requirement of the project and EXTRAS."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        raise SystemExit("bench/oldest_deps.py reads pyproject.toml with tomllib: run it with Python >= 3.11")
    project = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]
    reqs = list(project["dependencies"])
    for extra in EXTRAS:
        reqs += project.get("optional-dependencies", {}).get(extra, [])
    out = {}
    for req in reqs:
        m = re.fullmatch(r"\s*([A-Za-z0-9_.\-]+(?:\[[^\]]+\])?)\s*>=\s*([0-9][^,;\s]*)\s*", req)
        if m is None:
            raise SystemExit(f"{req!r} in {pyproject}: expected NAME>=VERSION (every dependency needs a lower bound)")
        out[m.group(1)] = m.group(2)
    return out


def run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    print("$", " ".join(shlex.quote(str(c)) for c in cmd), flush=True)
    return subprocess.run(cmd, **kw)


def test_tools(pyproject: Path, pins: dict[str, str]) -> list[str]:
    """The dev extra's requirements that are not pinned already (pytest, moto, ...), as written."""
    import tomllib

    dev = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]["optional-dependencies"]["dev"]
    return [req for req in dev if re.split(r"\s*>=", req)[0] not in pins]


def install(python: Path, pins: dict[str, str], torch: str, torch_index: str | None) -> None:
    pip = [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    run(pip + ["--upgrade", "pip"], check=True)
    # torch first and alone, so that the resolver never swaps in another (CUDA) build.
    run(pip + [f"torch=={torch}"] + (["--extra-index-url", torch_index] if torch_index else []), check=True)
    specs = [f"{name}=={version}.*" for name, version in pins.items() if name != "torch"]
    run(pip + specs + test_tools(ROOT / "pyproject.toml", pins) + [f"torch=={torch}"], check=True)
    # setuptools' note on editable installs of a flat layout is information, not a problem
    env = {**os.environ, "PYTHONWARNINGS": "ignore:Editable installation"}
    run(pip + ["--no-deps", "-e", str(ROOT)], check=True, env=env)


def installed(python: Path, names) -> list[str]:
    code = ("import importlib.metadata as m, sys\n"
            "for n in sys.argv[1:]:\n"
            "    print(f'{n}=={m.version(n)}')\n")
    bare = [re.sub(r"\[.*\]", "", n) for n in names] + ["scipy", "distributed", "botocore", "aiobotocore"]
    out = subprocess.run([str(python), "-c", code, *dict.fromkeys(bare)], capture_output=True, text=True)
    return out.stdout.split()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--torch", help="torch version to install [default: the lower bound in pyproject.toml]")
    ap.add_argument("--torch-index", default=CPU_INDEX, help="extra index for the torch CPU wheel ('' for none)")
    ap.add_argument("--keep", help="build the environment here and keep it [default: a temp folder, removed]")
    ap.add_argument("--pytest-args", default="-q -p no:cacheprovider", help="arguments for pytest")
    args = ap.parse_args(argv)
    pins = minimums(ROOT / "pyproject.toml")
    torch = args.torch or pins["torch"] + ".*"
    with tempfile.TemporaryDirectory(prefix="shardkit-oldest-") as tmp:
        env_dir = Path(args.keep or tmp)
        venv.create(env_dir, with_pip=True, clear=True)
        python = env_dir / "bin" / "python"
        install(python, pins, torch, args.torch_index or None)
        print("\ninstalled:", " ".join(installed(python, ["torch", *pins])), flush=True)
        if not torch.startswith(pins["torch"]):
            print(f"NOTE: torch {torch}, not the lower bound {pins['torch']} (--torch)", flush=True)
        result = run([str(python), "-m", "pytest", *shlex.split(args.pytest_args)], cwd=ROOT)
    return result.returncode


if __name__ == "__main__":
    sys.exit(main())
