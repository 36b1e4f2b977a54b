"""The package's metadata: the build backend warns about nothing, every dependency has a true lower bound."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_metadata_builds_without_a_setuptools_warning(tmp_path):
    code = ("import sys, warnings\n"
            "warnings.simplefilter('always')\n"
            "from setuptools import build_meta\n"
            "print(build_meta.prepare_metadata_for_build_wheel(sys.argv[1]))\n")
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path)], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Warning" not in proc.stderr and "deprecated" not in proc.stderr.lower(), proc.stderr[-3000:]
    metadata = next(tmp_path.glob("*.dist-info/METADATA")).read_text(encoding="utf-8")
    assert "License-Expression: Apache-2.0" in metadata
    requires = re.findall(r"^Requires-Dist: (.+)$", metadata, re.M)
    bounds = {re.split(r"[\[<>=; ]", r, 1)[0]: r for r in requires if "extra ==" not in r}
    assert "torch>=2.6" in bounds["torch"] and "numpy>=2.0" in bounds["numpy"]
    assert all(">=" in r for r in bounds.values()), bounds


def test_oldest_set_script_reads_every_bound():
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        from oldest_deps import minimums
    finally:
        sys.path.pop(0)
    pins = minimums(ROOT / "pyproject.toml")
    assert pins["torch"] == "2.6" and pins["numpy"] == "2.0" and pins["dask[distributed]"] == "2024.1"
    assert {"pillow", "pyarrow", "tokenizers", "s3fs", "aiohttp"} <= set(pins)
