"""Evoformer shapes, parameter counts, chunked inference and input errors (one process)."""

from __future__ import annotations

import pytest
import torch

from colossal_contracts import ConfigError
from colossal_models import EVOFORMER_PRESETS, Evoformer, EvoformerConfig


def _count(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def test_alphafold2_parameter_count_from_the_supplement():
    # Derived by hand from the AlphaFold 2 supplement (section 1.6: c_m=256, c_z=128, 48 blocks;
    # Algorithms 7-15 for the layers; "Linear" has a bias, "LinearNoBias" not; LayerNorm has
    # scale and offset). The paper states no per-stack count, so this is the arithmetic of its
    # listings, written independently of EvoformerConfig.block_params.
    cm, cz = 256, 128
    row = 2 * cm + 2 * cz + cz * 8 + 3 * cm * 256 + (cm * 256 + 256) + (256 * cm + cm)  # Alg 7
    col = 2 * cm + 3 * cm * 256 + (cm * 256 + 256) + (256 * cm + cm)  # Alg 8: 8 heads x 32
    msa_tr = 2 * cm + (cm * 1024 + 1024) + (1024 * cm + cm)  # Alg 9, n=4
    opm = 2 * cm + 2 * (cm * 32 + 32) + (32 * 32 * cz + cz)  # Alg 10, c=32
    tri_mul = 2 * cz + 4 * (cz * 128 + 128) + (cz * cz + cz) + 2 * 128 + (128 * cz + cz)  # Alg 11
    tri_att = 2 * cz + cz * 4 + 3 * cz * 128 + (cz * 128 + 128) + (128 * cz + cz)  # Alg 13: 4x32
    pair_tr = 2 * cz + (cz * 512 + 512) + (512 * cz + cz)  # Alg 15, n=4
    block = row + col + msa_tr + opm + 2 * tri_mul + 2 * tri_att + pair_tr
    assert block == 1_829_952
    single = cm * 384 + 384  # Algorithm 2, line 17: s_i = Linear(m_1i), c_s = 384
    want = 48 * block + single
    assert want == 87_936_384  # ~88M of AlphaFold 2's ~93M parameters
    cfg = EvoformerConfig.preset("alphafold2")
    assert cfg.num_params() == want
    with torch.device("meta"):
        assert _count(Evoformer(cfg)) == want


@pytest.mark.parametrize("name", ["tiny", "small"])
def test_presets_count_exactly(name):
    cfg = EVOFORMER_PRESETS[name]
    with torch.device("meta"):
        assert _count(Evoformer(cfg)) == cfg.num_params()
    assert _count(Evoformer(EvoformerConfig.preset(name, c_s=0))) == cfg.num_params() - (
        cfg.c_m * cfg.c_s + cfg.c_s
    )


def _data(n_seq: int, n_res: int, cfg: EvoformerConfig) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return torch.randn(2, n_seq, n_res, cfg.c_m, generator=g), torch.randn(
        2, n_res, n_res, cfg.c_z, generator=g
    )


@pytest.mark.parametrize("chunk", [1, 3, 5, 64])
def test_chunked_inference_equals_unchunked(chunk):
    cfg = EvoformerConfig.preset("tiny")
    torch.manual_seed(0)
    model = Evoformer(cfg).eval()
    m, z = _data(6, 10, cfg)
    with torch.no_grad():
        want = model(m, z)
        got = model(m, z, chunk_size=chunk)
    for a, b in zip(got, want, strict=True):
        assert a.shape == b.shape
        assert float((a - b).abs().max()) <= 1e-6


def test_chunked_training_gradients_equal_unchunked():
    cfg = EvoformerConfig.preset("tiny")
    grads = []
    for chunk in (None, 3):
        torch.manual_seed(0)
        model = Evoformer(cfg)
        m, z = _data(4, 7, cfg)
        om, oz, s = model(m, z, chunk_size=chunk)
        (om.square().mean() + oz.square().mean() + s.square().mean()).backward()
        grads.append([p.grad for p in model.parameters()])
    for a, b in zip(*grads, strict=True):
        assert float((a - b).abs().max()) <= 1e-6


@pytest.mark.parametrize("chunk", [0, -4, 2.5, True])
def test_bad_chunk_size_is_one_line_config_error(chunk):
    cfg = EvoformerConfig.preset("tiny")
    m, z = _data(2, 4, cfg)
    with pytest.raises(ConfigError, match="chunk_size must be a positive int") as e:
        Evoformer(cfg)(m, z, chunk_size=chunk)
    assert "\n" not in str(e.value)


def test_bad_inputs_and_config():
    cfg = EvoformerConfig.preset("tiny")
    m, z = _data(2, 4, cfg)
    with pytest.raises(ConfigError, match="disagree"):
        Evoformer(cfg)(m, z[:, :3, :3])
    with pytest.raises(ConfigError, match="takes m"):
        Evoformer(cfg)(m[0], z)
    with pytest.raises(ConfigError, match="c_m must be a positive int"):
        EvoformerConfig(c_m=0)
    with pytest.raises(ConfigError, match="unknown Evoformer preset"):
        EvoformerConfig.preset("alphafold3")


def test_chunk_size_for_budget_is_the_largest_that_fits():
    from colossal_models.evoformer import chunk_bytes_per_row, chunk_size_for_budget

    cfg = EvoformerConfig.preset("alphafold2")
    shape = dict(batch=1, num_seq=128, num_res=384)
    per_row = max(chunk_bytes_per_row(cfg, **shape).values())
    assert per_row == 2 * 8 * 384 * 384 * 4  # MSA row attention logits and softmax, 8 heads
    for budget in (per_row, 5 * per_row + 7, 100 * per_row):
        c = chunk_size_for_budget(cfg, budget, **shape)
        assert c * per_row <= budget < (c + 1) * per_row
    assert chunk_size_for_budget(cfg, 10**12, **shape) is None  # everything fits unchunked
    with pytest.raises(ConfigError, match=f"give at least {per_row} bytes") as e:
        chunk_size_for_budget(cfg, per_row - 1, **shape)
    assert "\n" not in str(e.value)
