"""Every package declares what its sources import (install it alone and it works): each
third-party module imported under ``packages/<pkg>/src`` belongs to a distribution named in that
package's dependencies or one of its extras (an optional import names its extra)."""

from __future__ import annotations

import ast
import importlib.metadata as md
import re
import sys
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = sorted(p.name for p in (ROOT / "packages").iterdir() if (p / "pyproject.toml").exists())


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _declared(package: str) -> set[str]:
    meta = tomllib.loads((ROOT / "packages" / package / "pyproject.toml").read_text())["project"]
    reqs = list(meta.get("dependencies", []))
    for extra in meta.get("optional-dependencies", {}).values():
        reqs += extra
    return {_norm(re.split(r"[\s\[<>=!~;]", r, maxsplit=1)[0]) for r in reqs}


def _imported_top_levels(package: str) -> set[str]:
    names: set[str] = set()
    for path in (ROOT / "packages" / package / "src").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
    return names - set(sys.stdlib_module_names) - {"__future__"}


@pytest.mark.parametrize("package", PACKAGES)
def test_every_import_is_declared(package):
    own = {p.name for p in (ROOT / "packages" / package / "src").iterdir() if p.is_dir()}
    dists = md.packages_distributions()
    undeclared = []
    for module in sorted(_imported_top_levels(package) - own):
        owners = {_norm(d) for d in dists.get(module, [_norm(module)])}
        if not owners & _declared(package):
            undeclared.append(f"{module} (from {', '.join(sorted(owners))})")
    assert not undeclared, f"{package} imports undeclared: {undeclared}"
