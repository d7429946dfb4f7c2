"""The seam between colossal-zero and colossal-chunk's ``ChunkManager`` stays narrow: colossal-zero
reads at most 15 distinct members of a manager (17 before Gemini kept its own chunk index and
read the chunk sizes off the chunks: ``chunk_of`` and ``config`` went).

The count is made on the source with ``ast``. A manager is an expression named ``manager`` or
ending in ``.manager`` (``self.manager``, ``rt.manager``), a parameter annotated ``ChunkManager``,
or a local name bound to one of these (``m = self.rt.manager``, ``rt, m = x, x.manager``). Every
attribute read on a manager counts (``manager.books.stats()`` counts ``books``), and so does the
name given to ``getattr``/``hasattr``/``setattr`` on one.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import torch
from torch import nn

import colossal_zero
from colossal_chunk import ChunkConfig, ChunkManager
from colossal_zero.gemini._chunk_index import ChunkIndex
from colossal_zero.gemini._setup import chunk_numels

MAX_MEMBERS = 15
SRC = Path(colossal_zero.__file__).parent


def _is_manager_annotation(node: ast.expr | None) -> bool:
    return node is not None and "ChunkManager" in ast.unparse(node)


class _ManagerUses(ast.NodeVisitor):
    """Member name -> ``file:line`` of each read on a manager, over one module."""

    def __init__(self, where: str):
        self.where = where
        self.scopes: list[set[str]] = [set()]  # names bound to a manager, per function
        self.uses: dict[str, list[str]] = defaultdict(list)

    def _is_manager(self, node: ast.expr) -> bool:
        if isinstance(node, ast.Name):
            return node.id == "manager" or any(node.id in s for s in self.scopes)
        return isinstance(node, ast.Attribute) and node.attr == "manager"

    def _bind(self, target: ast.expr, value: ast.expr) -> None:
        if isinstance(target, ast.Name) and self._is_manager(value):
            self.scopes[-1].add(target.id)
        elif isinstance(target, ast.Tuple) and isinstance(value, ast.Tuple):
            for t, v in zip(target.elts, value.elts, strict=False):
                self._bind(t, v)

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        a = node.args
        self.scopes.append(
            {
                p.arg
                for p in (*a.posonlyargs, *a.args, *a.kwonlyargs)
                if p.arg == "manager" or _is_manager_annotation(p.annotation)
            }
        )
        self.generic_visit(node)
        self.scopes.pop()

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Assign(self, node: ast.Assign) -> None:
        for target in node.targets:
            self._bind(target, node.value)
        self.generic_visit(node)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        if isinstance(node.target, ast.Name) and _is_manager_annotation(node.annotation):
            self.scopes[-1].add(node.target.id)
        if node.value is not None:
            self._bind(node.target, node.value)
        self.generic_visit(node)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if self._is_manager(node.value):
            self.uses[node.attr].append(f"{self.where}:{node.lineno}")
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        f, args = node.func, node.args
        if (
            isinstance(f, ast.Name)
            and f.id in ("getattr", "hasattr", "setattr")
            and len(args) >= 2
            and self._is_manager(args[0])
        ):
            name = args[1].value if isinstance(args[1], ast.Constant) else "<computed>"
            self.uses[str(name)].append(f"{self.where}:{node.lineno}")
        self.generic_visit(node)


def manager_members(sources: dict[str, str]) -> dict[str, list[str]]:
    """Every member read on a manager in ``sources`` (module name -> its text), with where."""
    uses: dict[str, list[str]] = defaultdict(list)
    for where, text in sources.items():
        visitor = _ManagerUses(where)
        visitor.visit(ast.parse(text))
        for name, sites in visitor.uses.items():
            uses[name] += sites
    return dict(uses)


def _zero_sources() -> dict[str, str]:
    return {
        str(p.relative_to(SRC)): p.read_text(encoding="utf-8")
        for p in sorted(SRC.rglob("*.py"))
        if "__pycache__" not in p.parts
    }


def test_the_count_follows_aliases_parameters_and_getattr():
    code = """
def f(rt, mgr: ChunkManager):
    rt.manager.books.stats()
    m = rt.manager
    m.access([])
    rt2, m2 = rt, rt.manager
    m2.release([])
    mgr.settle()
    getattr(m, "move")(0, "host")
    return [m.chunk_of(n) for n in "ab"]

def g(manager):
    manager.close()

def h(m):
    m.not_a_manager  # a parameter named m is not a manager by its name alone
"""
    found = manager_members({"x.py": code})
    assert set(found) == {"books", "access", "release", "settle", "move", "chunk_of", "close"}
    assert found["books"] == ["x.py:3"]


def test_colossal_zero_reads_at_most_15_manager_members():
    found = manager_members(_zero_sources())
    assert found, "the count found no manager at all: has the seam moved?"
    where = {name: sites[:3] for name, sites in sorted(found.items())}
    assert len(found) <= MAX_MEMBERS, (
        f"colossal-zero reads {len(found)} manager members (at most {MAX_MEMBERS}): {where}. "
        "Give the runtime what it needs once (an index, a size it chose) instead of asking again"
    )


def test_every_member_counted_is_the_managers():
    cfg = ChunkConfig(256, host_bytes=None, device="cpu", disk_bytes=0, home="host")
    with ChunkManager(cfg) as m:
        m.register([("p", nn.Parameter(torch.zeros(256)))])
        strangers = [n for n in manager_members(_zero_sources()) if not hasattr(m, n)]
    assert not strangers, f"counted as manager members but not a ChunkManager's: {strangers}"


def _two_kinds() -> ChunkManager:
    """Trainable and frozen parameters in chunks of 128 and 512 elements, several of each."""
    cfg = ChunkConfig(128, frozen_chunk_numel=512, host_bytes=None, device="cpu", disk_bytes=0)
    m = ChunkManager(cfg)
    sizes = [100, 60, 90, 300, 250, 40, 500]
    params = [(f"p{i}", nn.Parameter(torch.randn(n))) for i, n in enumerate(sizes)]
    m.register(params, frozen=[n for n, p in params if p.numel() >= 250])
    return m


def test_the_runtimes_index_and_chunk_sizes_answer_as_the_manager_does():
    """What zero reads instead of ``chunk_of`` and ``config`` gives the same answers, also after
    a re-pack with new sizes (the runtime rebuilds its index then)."""
    with _two_kinds() as m:
        for sizes in ({}, {"chunk_numel": 256, "frozen_chunk_numel": 768}):
            if sizes:
                m.repack(sorted(m.registry.views.params, reverse=True), **sizes)
            index = ChunkIndex(m.groups)
            assert len(index.ids) == 7
            for name in index.ids:
                assert index.chunk(name) is m.chunk_of(name)
            names = ("p6", "p0", "p1", "p6")
            want = tuple(dict.fromkeys(m.chunk_of(n).chunk_id for n in names))
            assert index.chunk_ids(names) == want
            cfg = m.config
            assert chunk_numels(m.groups) == (
                cfg.chunk_numel_for(1),
                cfg.chunk_numel_for(1, frozen=True),
            )
