"""PyTorch interop and torch.nn.functional.scaled_dot_product_attention checks.

Skipped as a whole (with the reason printed under `pytest -rs`) when torch is
not installed; run_tests.sh installs the CPU-capable PyPI wheel unless
RINGATTN_PYTHON_TORCH=0.
"""

import numpy as np
import pytest

from ringattn import _tensors, reference

from conftest import random_qkv

torch = pytest.importorskip(
    "torch", reason="torch is not installed (run_tests.sh installs it unless "
    "RINGATTN_PYTHON_TORCH=0): SDPA comparisons and torch interop skipped")
F = torch.nn.functional


def sdpa(q, k, v, causal=False, scale=None):
    """SDPA on [B, N, H, D] numpy inputs (GQA by repeating K/V heads).

    Causal is bottom-right aligned, as ringattn's is (SDPA's is_causal is
    top-left aligned, so an explicit mask is used when Nq != Nk).
    """
    q, k, v = (torch.from_numpy(np.ascontiguousarray(t)).to(torch.float64)
               .transpose(1, 2) for t in (q, k, v))
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    mask = None
    if causal:
        nq, nk = q.shape[2], k.shape[2]
        mask = torch.ones(nq, nk, dtype=torch.bool).tril(diagonal=nk - nq)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    return out.transpose(1, 2).numpy()


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("nq, nk, hq, hkv", [
    (64, 64, 4, 4), (97, 97, 4, 2), (13, 101, 4, 1), (2, 2, 2, 2)])
def test_matches_sdpa(client, rng, causal, nq, nk, hq, hkv):
    q, k, v = random_qkv(rng, 2, nq, hq, 32, nk=nk, hkv=hkv)
    o = client.attend(q, k, v, causal=causal)
    np.testing.assert_allclose(o, sdpa(q, k, v, causal=causal), atol=2e-5,
                               rtol=1e-4)
    # And the reference agrees with SDPA to float64 accuracy.
    np.testing.assert_allclose(reference.attention(q, k, v, causal=causal)[0],
                               sdpa(q, k, v, causal=causal), atol=1e-6)


def test_custom_scale_matches_sdpa(client, rng):
    q, k, v = random_qkv(rng, 1, 40, 2, 16)
    o = client.attend(q, k, v, causal=True, scale=0.25)
    np.testing.assert_allclose(o, sdpa(q, k, v, causal=True, scale=0.25),
                               atol=2e-5, rtol=1e-4)


def test_torch_in_torch_out(client, rng):
    q, k, v = (torch.from_numpy(t) for t in random_qkv(rng, 1, 30, 2, 8))
    o, l = client.attend(q, k, v, causal=True, return_lse=True)
    assert isinstance(o, torch.Tensor) and isinstance(l, torch.Tensor)
    assert o.dtype == torch.float32 and l.dtype == torch.float32
    assert o.shape == q.shape and l.shape == (1, 2, 30)
    expected = F.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
        is_causal=True).transpose(1, 2)
    torch.testing.assert_close(o, expected, atol=2e-5, rtol=1e-4)
    o3 = client.attend(q[0], k[0], v[0])
    assert isinstance(o3, torch.Tensor) and o3.shape == (30, 2, 8)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_low_precision_torch_inputs(client, rng, dtype):
    dtype = getattr(torch, dtype)
    q, k, v = (torch.from_numpy(t).to(dtype)
               for t in random_qkv(rng, 2, 45, 4, 16, hkv=2))
    o, l = client.attend(q, k, v, causal=True, return_lse=True)
    assert o.dtype == dtype and l.dtype == torch.float32
    wire = "fp16" if dtype == torch.float16 else "bf16"
    assert client.last_summary.bytes_in == 2 * (q.numel() + 2 * k.numel())
    ro, rl = reference.attention(q, k, v, causal=True)
    tolerance = 2e-3 if dtype == torch.float16 else 1.6e-2  # output rounding
    np.testing.assert_allclose(o.to(torch.float64).numpy(), ro,
                               atol=tolerance, rtol=tolerance)
    np.testing.assert_allclose(l.numpy(), rl, atol=1e-4, rtol=1e-5)
    # fp32 output of the same wire bytes: fp32-accurate against the reference.
    o32 = client.attend(q.float(), k.float(), v.float(), causal=True,
                        wire_dtype=wire)
    np.testing.assert_allclose(o32.numpy(), ro, atol=2e-5, rtol=1e-4)


def test_numpy_bf16_conversion_matches_torch():
    values = torch.randn(10000, dtype=torch.float32) * 1e3
    values[:4] = torch.tensor([1.0 + 2**-8, 1.0 + 3 * 2**-8, 1e-40, -0.0])
    ours = _tensors.float32_to_bf16_bits(values.numpy())
    theirs = values.to(torch.bfloat16).view(torch.int16).numpy().view(
        np.uint16)
    np.testing.assert_array_equal(ours, theirs)
