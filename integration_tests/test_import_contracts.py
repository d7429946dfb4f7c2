"""The package arrows of DESIGN.md hold (``lint-imports``, as the lint session runs it), and the
check fails when a package imports one its row does not list."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / ".importlinter"


def _lint(env_path: str | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    if env_path is not None:
        env["PYTHONPATH"] = env_path + os.pathsep + env.get("PYTHONPATH", "")
    code = "import sys; from importlinter.cli import lint_imports_command as c; sys.exit(c())"
    return subprocess.run(
        [sys.executable, "-c", code, "--config", str(CONFIG), "--no-cache"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=ROOT,
    )


def test_the_package_arrows_hold():
    pytest.importorskip("importlinter")
    proc = _lint()
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "0 broken" in proc.stdout


def test_a_forbidden_import_breaks_the_lint(tmp_path):
    pytest.importorskip("importlinter")
    shadow = tmp_path / "colossal_chunk"
    shutil.copytree(ROOT / "packages" / "colossal-chunk" / "src" / "colossal_chunk", shadow)
    # chunk must never import memtrace (DESIGN.md: they meet only through the contract)
    (shadow / "_sneaky.py").write_text("import colossal_memtrace  # noqa: F401\n")
    proc = _lint(str(tmp_path))
    assert proc.returncode != 0
    assert "colossal-chunk imports only colossal-contracts BROKEN" in proc.stdout
    assert "colossal_chunk._sneaky -> colossal_memtrace" in proc.stdout
