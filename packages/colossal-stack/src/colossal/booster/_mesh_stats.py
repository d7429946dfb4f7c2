"""Counted communication bytes of a mesh, per axis, for the plugins' ``memory_stats``."""

from __future__ import annotations

from colossal_parallel import ProcessMesh

__all__ = ["axis_comm_bytes"]


def axis_comm_bytes(mesh: ProcessMesh) -> dict[str, int]:
    """``comm_<axis>_bytes_total`` for every axis of size > 1, counted by the mesh's collectives
    ([Note: counted bytes] in colossal-parallel); grid modes give each tp sub-axis and
    ``comm_tp_bytes_total``, their sum."""
    counter = mesh.comm.counter
    out: dict[str, int] = {}
    for axis in ("dp", "pp", "sp"):
        if mesh.size(axis) > 1:
            out[f"comm_{axis}_bytes_total"] = counter.bytes(axis)
    if mesh.size("tp") > 1:
        subs = mesh.config.tp_axes
        if len(subs) > 1:
            for axis in subs:
                if mesh.size(axis) > 1:
                    out[f"comm_{axis}_bytes_total"] = counter.bytes(axis)
        out["comm_tp_bytes_total"] = sum(counter.bytes(a) for a in {*subs, "tp"})
    return out
