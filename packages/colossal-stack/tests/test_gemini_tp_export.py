"""The streamed Gemini x tp export (``export_gemini`` with a mesh, [Note: streamed tp gather] in
colossal-models) against the whole gather it replaces, on a dp2 x tp2 (1d) and a tp4 (2d) mesh
of 4 ranks (checks in ``_checks_gemini_tp_export.py``).

Same names and bit-identical tensors: both only copy the chunks' fp32 values to their places.
Bytes held: at every write, the tensor bytes alive beyond those before the export stay within
one gathered chunk plus two full tensors (the tensor being assembled and one peer's shard) and
a 16 KiB allowance for small tensors, while the whole gather holds at least the model.
"""

from __future__ import annotations

import pytest
from _checks_gemini_tp_export import streamed_export_case

from colossal_zero import GeminiConfig

SLACK = 16 << 10
CASES = {
    "1d-dp2-tp2": {"tp_size": 2, "config": GeminiConfig(placement="static")},
    "2d-tp4": {"tp_size": 4, "tp_mode": "2d", "config": GeminiConfig(placement="static")},
}


@pytest.mark.parametrize("name", list(CASES))
def test_streamed_tp_export_equals_whole_gather_and_holds_one_tensor(world, tmp_path, name):
    out = world(4).run(streamed_export_case, CASES[name], str(tmp_path))
    first = next(r for r in out if r["rank"] == 0)
    assert first["names"] > 0 and first["same_names"] and first["reference_names"]
    assert first["bit_identical"]
    assert first["shards"] > 1  # 64 KiB shards: the bound splits the export
    bound = first["largest_chunk"] + 2 * first["largest_tensor"] + SLACK
    assert first["streamed_peak"] <= bound, first
    assert first["whole_held"] >= first["model_bytes"] > bound, first
