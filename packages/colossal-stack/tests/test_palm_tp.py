"""PaLM with tensor parallelism through the Booster: its key/value projection is wrapped when
sharded (``GatheredKV``, the sharded name ``attn.k.linear.weight``), and each sharded parameter
still joins its optimizer group by its name before sharding (``original_names``). Before, boost
refused: "parameter 'blocks.0.attn.k.linear.weight' of the sharded model has no optimizer
group". Float64 against one process of AdamW, 2 ranks (one shared world)."""

from __future__ import annotations

import pytest
from _checks_palm_tp import palm_tp2_case

TOL = 1e-12


@pytest.mark.parametrize("plugin", ["hybrid", "gemini"])
@pytest.mark.parametrize("num_kv_heads", [1, 4], ids=["multi-query", "kv-split"])
def test_palm_tp2_equals_adamw_in_fp64(world, plugin, num_kv_heads):
    for err in world(2).run(palm_tp2_case, plugin, num_kv_heads):
        assert err <= TOL
