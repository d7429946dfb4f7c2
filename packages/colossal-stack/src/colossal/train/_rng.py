"""Random-number state of every rank, for exact resume with dropout on.

[Note: exact resume] A checkpoint's ``trainer.json`` holds, beside the step, the loader's data
position and, for every rank, the state of torch's CPU generator, of each CUDA device's (when
present), of Python's ``random`` and of NumPy's global generator. A resumed run builds its model
under the same seed, restores the weights, then its own rank's states, so the steps after the
checkpoint draw the same dropout masks as the uninterrupted run's. Saving leaves the states as it
found them, so a run that saves and one that does not draw alike.
"""

from __future__ import annotations

import base64
import random
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from colossal_contracts import CheckpointError

__all__ = ["capture_rng", "gather_rng", "restore_rng"]


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


def _tensor(text: str) -> torch.Tensor:
    return torch.frombuffer(bytearray(base64.b64decode(text)), dtype=torch.uint8).clone()


def capture_rng() -> dict[str, Any]:
    """This process's generator states as a JSON-able dict."""
    np_state = np.random.get_state(legacy=False)
    version, mt, gauss = random.getstate()
    state: dict[str, Any] = {
        "torch": _b64(torch.get_rng_state().numpy().tobytes()),
        "python": [version, _b64(np.asarray(mt, dtype=np.uint32).tobytes()), gauss],
        "numpy": {
            "key": _b64(np_state["state"]["key"].astype(np.uint32).tobytes()),
            "pos": int(np_state["state"]["pos"]),
            "has_gauss": int(np_state["has_gauss"]),
            "gauss": float(np_state["gauss"]),
        },
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = [_b64(s.numpy().tobytes()) for s in torch.cuda.get_rng_state_all()]
    return state


def gather_rng() -> list[dict[str, Any]]:
    """Every rank's ``capture_rng()``, in rank order (collective when distributed)."""
    mine = capture_rng()
    if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
        return [mine]
    every: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(every, mine)
    return every


def restore_rng(state: dict[str, Any]) -> None:
    """Set this process's generators to ``state`` (from ``capture_rng``)."""
    try:
        torch.set_rng_state(_tensor(state["torch"]))
        version, mt, gauss = state["python"]
        words = np.frombuffer(base64.b64decode(mt), dtype=np.uint32)
        random.setstate((version, tuple(int(w) for w in words), gauss))
        n = state["numpy"]
        key = np.frombuffer(base64.b64decode(n["key"]), dtype=np.uint32)
        np.random.set_state(("MT19937", key, n["pos"], n["has_gauss"], n["gauss"]))
        if "cuda" in state and torch.cuda.is_available():
            cuda = [_tensor(s) for s in state["cuda"]]
            if len(cuda) == torch.cuda.device_count():
                torch.cuda.set_rng_state_all(cuda)
    except (KeyError, TypeError, ValueError, RuntimeError) as err:
        raise CheckpointError(
            f"the checkpoint's RNG state is malformed ({type(err).__name__}: {err}); resume from "
            "another step-N"
        ) from err
