"""Fp32Matmul ([Note: cpu matmul]): bf16/fp16 CPU matmuls computed in fp32, the same numbers as
an fp32-accumulated low-precision matmul, and nothing else touched."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode_stack

from colossal_contracts import ConfigError
from colossal_zero import MATMUL_ENV, Fp32Matmul, Precision, cpu_has_fast_matmul
from colossal_zero.optim import _cpu_matmul
from colossal_zero.optim._cpu_matmul import use_fp32_matmul

LOW = (torch.bfloat16, torch.float16)


class _Seen(TorchDispatchMode):
    """Records (op name, dtypes of its tensor arguments) of what reaches it."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, tuple[torch.dtype, ...]]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        dtypes = tuple(a.dtype for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor))
        self.calls.append((func.overloadpacket.__name__, dtypes))
        return func(*args, **kwargs)

    def dtypes_of(self, name: str) -> list[tuple[torch.dtype, ...]]:
        return [d for n, d in self.calls if n == name]


def _t(*shape: int, dtype: torch.dtype) -> torch.Tensor:
    return torch.randn(*shape, dtype=torch.float32).to(dtype)


# (op name, inputs as a function of the dtype, call)
CASES = [
    ("mm", lambda d: (_t(33, 70, dtype=d), _t(70, 21, dtype=d)), torch.mm),
    (
        "addmm",
        lambda d: (_t(21, dtype=d), _t(33, 70, dtype=d), _t(70, 21, dtype=d)),
        lambda c, a, b: torch.addmm(c, a, b, beta=0.5, alpha=2.0),
    ),
    ("bmm", lambda d: (_t(3, 17, 40, dtype=d), _t(3, 40, 9, dtype=d)), torch.bmm),
    (
        "baddbmm",
        lambda d: (_t(3, 17, 9, dtype=d), _t(3, 17, 40, dtype=d), _t(3, 40, 9, dtype=d)),
        lambda c, a, b: torch.baddbmm(c, a, b, beta=0.25),
    ),
    ("mv", lambda d: (_t(33, 70, dtype=d), _t(70, dtype=d)), torch.mv),
    (
        "addmv",
        lambda d: (_t(33, dtype=d), _t(33, 70, dtype=d), _t(70, dtype=d)),
        torch.addmv,
    ),
    ("dot", lambda d: (_t(300, dtype=d), _t(300, dtype=d)), torch.dot),
]


@pytest.mark.parametrize("dtype", LOW)
@pytest.mark.parametrize("name,make,op", CASES, ids=[c[0] for c in CASES])
def test_matmuls_run_in_fp32_and_equal_the_fp32_accumulated_reference(dtype, name, make, op):
    torch.manual_seed(0)
    inputs = make(dtype)
    seen = _Seen()
    with seen, Fp32Matmul():  # Fp32Matmul sees the op first, the recorder what it runs
        out = op(*inputs)
    assert out.dtype == dtype
    assert seen.dtypes_of(name) == [(torch.float32,) * len(inputs)]
    reference = op(*(x.float() for x in inputs)).to(dtype)  # fp32 accumulation, one rounding
    torch.testing.assert_close(out, reference, rtol=0, atol=0)
    exact = op(*(x.double() for x in inputs))  # within the low dtype's rounding of the truth
    tol = 2 ** -(8 if dtype == torch.bfloat16 else 11)
    torch.testing.assert_close(out.double(), exact, rtol=tol, atol=tol * exact.abs().max().item())


@pytest.mark.parametrize("dtype", (torch.float32, torch.float64))
def test_fp32_and_fp64_pass_through(dtype):
    a, b = _t(8, 16, dtype=dtype), _t(16, 4, dtype=dtype)
    seen = _Seen()
    with seen, Fp32Matmul():
        out = a @ b
    assert seen.dtypes_of("mm") == [(dtype, dtype)]
    torch.testing.assert_close(out, a @ b, rtol=0, atol=0)


def test_tensors_off_the_cpu_pass_through():
    a = torch.empty(8, 16, dtype=torch.bfloat16, device="meta")
    b = torch.empty(16, 4, dtype=torch.bfloat16, device="meta")
    seen = _Seen()
    with seen, Fp32Matmul():
        out = a @ b
    assert out.dtype == torch.bfloat16 and out.device.type == "meta"
    assert seen.dtypes_of("mm") == [(torch.bfloat16, torch.bfloat16)]


def test_only_the_chosen_dtypes_are_upcast():
    a, b = _t(8, 16, dtype=torch.float16), _t(16, 4, dtype=torch.float16)
    seen = _Seen()
    with seen, Fp32Matmul((torch.bfloat16,)):
        a @ b
    assert seen.dtypes_of("mm") == [(torch.float16, torch.float16)]
    with pytest.raises(ConfigError, match="bfloat16 and float16"):
        Fp32Matmul((torch.float32,))


@pytest.mark.parametrize("dtype", LOW)
def test_attention_and_linear_backward_equal_the_fp32_reference(dtype):
    torch.manual_seed(0)
    q, k, v = (_t(2, 3, 24, 16, dtype=dtype).requires_grad_() for _ in range(3))
    w = _t(16, 16, dtype=dtype).requires_grad_()

    def loss(q, k, v, w):
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return (F.linear(o, w) ** 2).sum()

    seen = _Seen()
    with seen, Fp32Matmul():
        loss(q, k, v, w).backward()
    assert (
        seen.dtypes_of("_scaled_dot_product_flash_attention_for_cpu")[0][:3] == (torch.float32,) * 3
    )
    assert seen.dtypes_of("_scaled_dot_product_flash_attention_for_cpu_backward")
    assert all(set(d) == {torch.float32} for d in seen.dtypes_of("mm"))
    ref = [x.detach().float().requires_grad_() for x in (q, k, v, w)]
    loss(*ref).backward()
    for x, r in zip((q, k, v, w), ref, strict=True):
        assert x.grad is not None and x.grad.dtype == dtype
        scale = r.grad.abs().max().item()
        torch.testing.assert_close(x.grad.float(), r.grad, rtol=0.05, atol=0.05 * scale)


def test_setting_chooses_and_the_environment_overrides(monkeypatch):
    monkeypatch.setenv(MATMUL_ENV, "fp32")
    assert use_fp32_matmul(torch.bfloat16, "cpu")
    assert not use_fp32_matmul(torch.float32, "cpu")  # fp32 runs are never touched
    assert not use_fp32_matmul(torch.bfloat16, "cuda")  # nor accelerator tensors
    monkeypatch.setenv(MATMUL_ENV, "native")
    assert not use_fp32_matmul(torch.bfloat16, "cpu")
    assert use_fp32_matmul(torch.bfloat16, "cpu", setting="fp32")  # the argument wins
    monkeypatch.setenv(MATMUL_ENV, "auto")
    assert use_fp32_matmul(torch.bfloat16, "cpu") == (not cpu_has_fast_matmul(torch.bfloat16))
    monkeypatch.setenv(MATMUL_ENV, "fast")
    with pytest.raises(ConfigError, match=r"COLOSSAL_CPU_MATMUL='fast'.*auto, fp32, native"):
        use_fp32_matmul(torch.bfloat16, "cpu")


def test_auto_follows_the_cpu_flags(monkeypatch):
    monkeypatch.setattr(_cpu_matmul, "_cpu_flags", lambda: {"avx512f", "avx512bw"})
    assert not cpu_has_fast_matmul(torch.bfloat16)
    assert use_fp32_matmul(torch.bfloat16, "cpu", setting="auto")
    assert cpu_has_fast_matmul(torch.float32)
    monkeypatch.setattr(_cpu_matmul, "_cpu_flags", lambda: {"avx512f", "avx512_bf16"})
    mkldnn = torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()
    assert cpu_has_fast_matmul(torch.bfloat16) == mkldnn


def test_precision_names_the_mode_and_gives_the_context(monkeypatch):
    monkeypatch.setenv(MATMUL_ENV, "fp32")
    bf16, fp32 = Precision.parse("bf16"), Precision.parse("fp32")
    assert bf16.matmul_mode("cpu") == "fp32"
    assert bf16.matmul_note("cpu") == "bf16 matmuls computed in fp32 on this CPU"
    assert isinstance(bf16.compute("cpu"), Fp32Matmul)
    assert fp32.matmul_mode("cpu") == "native" and fp32.matmul_note("cpu") is None
    assert bf16.matmul_mode("cuda") == "native" and bf16.matmul_note("cuda") is None
    assert not isinstance(bf16.compute("cpu", setting="native"), Fp32Matmul)


def test_a_mode_entered_inside_outlives_it():
    # [Note: modes entered inside]: Gemini's recorder is entered in a forward, popped later
    before = _get_current_dispatch_mode_stack()  # an earlier test's recorder may be there
    inner = _Seen()
    with Fp32Matmul() as outer:
        inner.__enter__()
    try:
        assert _get_current_dispatch_mode_stack() == [*before, inner]  # outer gone, inner kept
    finally:
        inner.__exit__(None, None, None)
    assert outer not in _get_current_dispatch_mode_stack()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_tensors_pass_through():
    a = torch.randn(64, 32, device="cuda").bfloat16()
    b = torch.randn(32, 16, device="cuda").bfloat16()
    seen = _Seen()
    with seen, Fp32Matmul():
        out = a @ b
    assert out.dtype == torch.bfloat16 and seen.dtypes_of("mm") == [(torch.bfloat16,) * 2]
    assert Precision.parse("bf16").matmul_mode(out.device, setting="fp32") == "native"
