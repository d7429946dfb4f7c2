"""Model-state bytes per parameter of each data-parallel method (Rajbhandari et al. 2020, ZeRO).

[Note: zero formula] Mixed-precision Adam keeps 2 bytes of 16-bit parameters, 2 of 16-bit
gradients and 12 of fp32 master, first and second moment per parameter: 16 in all under plain data
parallelism. Over ``dp`` ranks, stage 1 shards the 12 (``4 + 12/dp``), stage 2 also the gradients
(``2 + 14/dp``), stage 3 everything (``16/dp``). These are the figures
``LowLevelZeroOptimizer.model_state_bytes`` measures (up to bucket padding). Gemini writes each
16-bit gradient into its parameter's chunk slot once the parameter is no longer needed, so it holds
``14/dp`` (plus chunk padding). A frozen parameter (``requires_grad=False``) holds only its
16-bit value: 2 bytes (``2/dp`` sharded by stage 3), no gradient, master or moments.
"""

from __future__ import annotations

from colossal_contracts import ConfigError

__all__ = ["model_state_bytes_per_param", "zero3_device_bytes"]


def model_state_bytes_per_param(
    stage: int, dp: int, *, grads_in_param_slots: bool = False, frozen: bool = False
) -> tuple[float, float, float]:
    """``(params, grads, optimizer)`` bytes per parameter on one rank for ZeRO ``stage`` (0 is
    plain data parallelism) over ``dp`` ranks; ``grads_in_param_slots`` (stage 3, Gemini) counts
    no separate gradient storage; ``frozen``: a parameter that is not trained; see [Note: zero
    formula]."""
    if stage not in (0, 1, 2, 3) or dp < 1:
        raise ConfigError(f"ZeRO stage must be 0..3 and dp >= 1, got stage={stage}, dp={dp}")
    if frozen:
        return (2.0 / dp if stage >= 3 else 2.0, 0.0, 0.0)
    return (
        2.0 / dp if stage >= 3 else 2.0,
        0.0 if grads_in_param_slots and stage >= 3 else 2.0 / dp if stage >= 2 else 2.0,
        12.0 / dp if stage >= 1 else 12.0,
    )


def zero3_device_bytes(
    params: float,
    largest_layer_params: float,
    dp: int,
    *,
    offload: str = "none",
    grad_bytes: int = 2,
) -> float:
    """Model-state bytes one device holds under ZeRO-3 (Gemini) over ``dp`` ranks: the working
    set of the largest layer gathered (16-bit parameters and gradients, ``4`` bytes each), plus
    the shards left on the device. ``offload``: ``none`` keeps ``2 + grad_bytes + 12`` bytes per
    parameter there, ``optimizer`` only the 16-bit parameters, ``all`` nothing. Gemini writes 16-bit
    gradients into the parameters' chunk slots (``grad_bytes=0``); DeepSpeed's estimator counts
    fp32 gradients (``grad_bytes=4``, its 18 bytes per parameter)."""
    if offload not in ("none", "optimizer", "all"):
        raise ConfigError(f"offload must be none, optimizer or all, got {offload!r}")
    per = {"none": 2 + grad_bytes + 12, "optimizer": 2, "all": 0}[offload]
    return 4 * largest_layer_params + per * params / dp
