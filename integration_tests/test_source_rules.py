"""The source rules the packages keep (CONVENTIONS' "ours"), checked so they do not drift: every
module under ``packages/*/src`` is under 400 lines, an error raised on purpose is a typed one
(``colossal_contracts.ColossalError`` and its subclasses, not a bare ``RuntimeError``), and a
``type: ignore`` names its error code."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_LINES = 400


def _sources() -> list[Path]:
    return sorted(
        p for p in (ROOT / "packages").glob("*/src/**/*.py") if "__pycache__" not in p.parts
    )


def test_every_source_module_is_under_400_lines():
    long = {}
    for path in _sources():
        n = len(path.read_text(encoding="utf-8").splitlines())
        if n >= MAX_LINES:
            long[str(path.relative_to(ROOT))] = n
    assert not long, f"split these modules (one concept each, under {MAX_LINES} lines): {long}"


def _lines_matching(pattern: str) -> list[str]:
    """``path:line`` of every source line that ``pattern`` matches."""
    return [
        f"{path.relative_to(ROOT)}:{i}"
        for path in _sources()
        for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if re.search(pattern, line)
    ]


def test_no_bare_runtime_error_is_raised():
    bare = _lines_matching(r"\braise RuntimeError\(")
    assert not bare, f"raise a colossal_contracts error (ConfigError, InternalError ...): {bare}"


def test_every_type_ignore_names_its_code():
    loose = _lines_matching(r"type:\s*ignore(?!\[)")
    assert not loose, f"write the code (# type: ignore[attr-defined]) and why: {loose}"
