"""``pytest`` runs from the repository root: test folders are not packages, so two test or helper
modules with one file name (``test_long_seq.py`` in two packages, say) shadow each other at
collection. Every such module name must be unique across the repository."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _test_folders() -> list[Path]:
    folders = [ROOT / "integration_tests"]
    folders += sorted(p / "tests" for p in (ROOT / "packages").iterdir() if (p / "tests").is_dir())
    return folders


def test_test_module_names_are_unique_across_the_repository():
    seen: dict[str, list[str]] = defaultdict(list)
    for folder in _test_folders():
        for path in folder.rglob("*.py"):
            if path.name != "conftest.py" and "__pycache__" not in path.parts:
                seen[path.name].append(str(path.relative_to(ROOT)))
    clashes = {name: paths for name, paths in seen.items() if len(paths) > 1}
    assert not clashes, f"rename so each test/helper module name is unique: {clashes}"
