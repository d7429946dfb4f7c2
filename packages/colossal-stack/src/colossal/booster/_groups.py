"""Parameter groups across sharding: plugins that shard a model in place (tensor parallelism,
pipeline stages) replace its parameters, so the user's optimizer is rebuilt on the new ones;
each new parameter joins the group its unsharded original was in, by name, with that group's
hyperparameters (weight decay on matrices and none on biases and norms, for instance)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from colossal_contracts import ConfigError

__all__ = ["GroupMap", "group_of_names", "rebuilt"]

HYPER = ("lr", "betas", "eps", "weight_decay", "amsgrad", "maximize")


class GroupMap:
    """Which optimizer group each parameter name of the unsharded model belongs to, and the
    groups' hyperparameters; taken before the model is sharded."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        index = {id(p): i for i, g in enumerate(optimizer.param_groups) for p in g["params"]}
        self.by_name = {n: index[id(p)] for n, p in model.named_parameters() if id(p) in index}
        self.hyper = [{k: v for k, v in g.items() if k in HYPER} for g in optimizer.param_groups]

    def groups(
        self, named: Iterable[tuple[str, nn.Parameter]], *, keep: tuple[str, ...] = HYPER
    ) -> list[dict[str, Any]]:
        """Groups over the sharded model's ``(original name, parameter)`` pairs (trainable
        ones), each with its original group's hyperparameters named in ``keep``; groups that
        get no parameter on this rank are kept empty, so every rank has the same groups."""
        out = [{"params": [], **{k: v for k, v in h.items() if k in keep}} for h in self.hyper]
        for name, p in named:
            if not p.requires_grad:
                continue
            if name not in self.by_name:
                raise ConfigError(
                    f"parameter {name!r} of the sharded model has no optimizer group: build "
                    "the optimizer on every parameter of the model before boosting it"
                )
            out[self.by_name[name]]["params"].append(p)
        return out


def rebuilt(
    optimizer: torch.optim.Optimizer, groups: list[dict[str, Any]]
) -> torch.optim.Optimizer:
    """``optimizer``'s class with its defaults (those in ``HYPER``) over new param ``groups``."""
    return type(optimizer)(groups, **{k: v for k, v in optimizer.defaults.items() if k in HYPER})


def group_of_names(model: nn.Module, optimizer: torch.optim.Optimizer) -> GroupMap:
    """``GroupMap`` of ``model`` and ``optimizer``, taken before sharding."""
    return GroupMap(model, optimizer)
