"""Rank-side functions of test_grad_home: where reduced gradients land when the optimizer reads
them on the host."""

from __future__ import annotations

from _checks_zero import make, train

from colossal_contracts import TierName
from colossal_zero import GeminiConfig

ACC = TierName.ACCELERATOR
WARM = 3  # traced warmup, re-pack, state-placement measurement


def _run(config: GeminiConfig, steps: int, batch: int, *, hint: bool) -> dict:
    model, opt = make(config)
    rt = model.runtime
    if not hint:  # as before the optimizer said where it reads gradients
        rt.reads_on_host = lambda c: False  # type: ignore[method-assign]
    m = rt.manager
    pl = m._placement
    grad_moves: list[int] = []  # steps (after WARM) that brought a grad shard to the compute tier
    move, step = pl.move, [0]

    def counted(chunk, dst, **kw):  # type: ignore[no-untyped-def]
        if chunk.kind == "grad" and chunk.tier is not ACC and dst is ACC and step[0] >= WARM:
            grad_moves.append(step[0])
        move(chunk, dst, **kw)

    pl.move = counted
    losses = []
    for i in range(steps):
        step[0] = i
        losses += train(model, opt, 1, batch, start=i)
    states_acc = [
        m.registry.parallel_chunk("exp_avg", c).tier is ACC for c in m.registry.param_chunks()
    ]
    return {
        "losses": losses,
        "weights": model.full_state_dict(),
        "grad_moves": grad_moves,
        "states_on_acc": sum(states_acc),
        "moved": m.books.stats().bytes_moved,
    }


def grad_homes(config: GeminiConfig, steps: int, batch: int) -> tuple[dict, dict]:
    """The same training with the optimizer's host reader on and off (same seed and batches)."""
    return _run(config, steps, batch, hint=True), _run(config, steps, batch, hint=False)
