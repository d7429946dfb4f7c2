"""Compute orders without a memory tracer: from module order, or traced with hooks.

The automatic policy consumes any ``colossal_contracts.MemStatsSource``. A memory tracer
(colossal-memtrace) supplies one with measured non-model peaks; the contract's ``OrderStats``
(re-exported here) is the minimal one, a known compute order with given (default zero)
non-model peaks, so the policy works without it.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.overrides import TorchFunctionMode

from colossal_contracts import OrderStats

__all__ = ["OrderStats", "module_order", "trace_order"]


def _owners(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module, tuple[str, ...]]]:
    """Modules that own parameters directly, in registration order, with their full names."""
    seen: set[int] = set()
    out = []
    for mod_name, mod in model.named_modules():
        names = []
        for p_name, p in mod.named_parameters(recurse=False):
            if id(p) not in seen:
                seen.add(id(p))
                names.append(f"{mod_name}.{p_name}" if mod_name else p_name)
        if names:
            out.append((mod_name, mod, tuple(names)))
    return out


def module_order(model: torch.nn.Module) -> list[tuple[str, ...]]:
    """Forward in module registration order, then backward in reverse: one moment per module
    that owns parameters. A good guess when modules run in the order they are declared."""
    fwd = [names for _, _, names in _owners(model)]
    return fwd + fwd[::-1]


class _ParamUses(TorchFunctionMode):
    """Records, for every torch function called, the registered parameters among its arguments."""

    def __init__(self, owner_of: dict[int, tuple[str, str]]):
        super().__init__()
        self.owner_of = owner_of  # id(param) -> (owning module name, parameter name)
        self.moments: list[tuple[str, list[str]]] = []  # (owner, names used), merged by owner

    def __torch_function__(self, func, types, args=(), kwargs=None):
        used = [
            self.owner_of[id(a)]
            for a in (*args, *(kwargs or {}).values())
            if isinstance(a, torch.Tensor) and id(a) in self.owner_of
        ]
        for owner, name in used:
            if not self.moments or self.moments[-1][0] != owner:
                self.moments.append((owner, []))
            if name not in self.moments[-1][1]:
                self.moments[-1][1].append(name)
        return func(*args, **(kwargs or {}))


def trace_order(model: torch.nn.Module, forward: Callable[[], object]) -> list[tuple[str, ...]]:
    """Run ``forward()`` once and record which parameters each step touches: one moment per run of
    operations on the parameters of one module (a tied weight used again later gets a new moment),
    then the backward moments as the forward ones reversed. Works on the meta device."""
    owner_of = {}
    for mod_name, mod, names in _owners(model):
        for local, p in mod.named_parameters(recurse=False):
            full = f"{mod_name}.{local}" if mod_name else local
            if full in names:
                owner_of[id(p)] = (mod_name, full)
    with torch.no_grad(), _ParamUses(owner_of) as mode:
        forward()
    fwd = [tuple(names) for _, names in mode.moments]
    return fwd + fwd[::-1]
