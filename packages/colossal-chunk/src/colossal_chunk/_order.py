"""Compute orders without a memory tracer: from module order, or traced with hooks.

The automatic policy consumes any ``colossal_contracts.MemStatsSource``. A memory tracer
(colossal-memtrace) supplies one with measured non-model peaks; ``OrderStats`` is the minimal one,
a known compute order with given (default zero) non-model peaks, so the policy works without it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from colossal_contracts import ConfigError, TierName

__all__ = ["OrderStats", "module_order", "trace_order"]


class OrderStats:
    """A ``MemStatsSource`` from a compute order (names per moment) and optional non-model peaks.

    Attributes:
        order: per moment, the parameter names it uses.
        non_model: per moment, the non-model peak on the accelerator in bytes (default zeros).
    """

    def __init__(self, order: Sequence[Sequence[str]], non_model: Sequence[int] | None = None):
        self.order = [tuple(m) for m in order]
        self.non_model = list(non_model) if non_model is not None else [0] * len(self.order)
        if len(self.non_model) != len(self.order):
            raise ConfigError(
                f"non_model has {len(self.non_model)} entries but the order has "
                f"{len(self.order)} moments; give one peak per moment"
            )

    def num_moments(self) -> int:
        return len(self.order)

    def non_model_peak(self, moment: int, tier: TierName | str) -> int:
        return self.non_model[moment] if TierName(tier) is TierName.ACCELERATOR else 0

    def compute_order(self) -> Sequence[tuple[str, ...]]:
        return self.order


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


def trace_order(model: torch.nn.Module, step: Callable[[], torch.Tensor]) -> list[tuple[str, ...]]:
    """Run ``step()`` (forward, returns the loss) and its backward once, and record the order:
    a moment each time a module owning parameters starts forward, and each time a module's
    parameters receive their gradients in backward. Leaves gradients in ``.grad``."""
    owners = _owners(model)
    order: list[tuple[str, ...]] = []
    handles = []
    name_of = {id(p): n for n, p in model.named_parameters()}
    for _, mod, names in owners:
        handles.append(mod.register_forward_pre_hook(lambda m, a, names=names: order.append(names)))
    owner_of = {n: names for _, _, names in owners for n in names}
    for p in model.parameters():
        if p.requires_grad:

            def on_grad(p: torch.Tensor) -> None:
                names = owner_of[name_of[id(p)]]
                if not order or order[-1] != names or not bwd_started[0]:
                    order.append(names)
                bwd_started[0] = True

            handles.append(p.register_post_accumulate_grad_hook(on_grad))
    bwd_started = [False]
    try:
        loss = step()
        loss.backward()
    finally:
        for h in handles:
            h.remove()
    return order
