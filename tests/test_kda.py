"""KDA (models/kda.py): the recurrence against transformers' own reference functions, the
chunked form against the recurrence, the chunked form compiled by IREE for any length, and the
layer against transformers' KimiLinearDeltaAttention (state carried across calls)."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from day0.models.kda import kda_chunked, kda_recurrent

H, K, V = 2, 8, 6


def _inputs(T: int, seed: int, H: int = H, K: int = K, V: int = V):
    g = torch.Generator().manual_seed(seed)
    q = F.normalize(torch.randn(T, H, K, generator=g), dim=-1)
    k = F.normalize(torch.randn(T, H, K, generator=g), dim=-1)
    v = torch.randn(T, H, V, generator=g)
    gate = -F.softplus(torch.randn(T, H, K, generator=g))  # log decay <= 0
    beta = torch.sigmoid(torch.randn(T, H, generator=g))
    state = torch.randn(H, K, V, generator=g) * 0.1
    return q, k, v, gate, beta, state


def test_recurrence_matches_transformers():
    from transformers.models.kimi_linear.modeling_kimi_linear import recurrent_kimi_delta_attention

    q, k, v, gate, beta, state = _inputs(20, 0)
    want_o, want_s = recurrent_kimi_delta_attention(
        q[None], k[None], v[None], gate[None], beta[None], initial_state=state[None], output_final_state=True
    )
    got_o, got_s = kda_recurrent(q, k, v, gate, beta, state)
    torch.testing.assert_close(got_o, want_o[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got_s, want_s[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("T,chunk", [(16, 16), (37, 16), (150, 64), (5, 64)])
def test_chunked_equals_recurrence(T, chunk):
    q, k, v, gate, beta, state = _inputs(T, T)
    want_o, want_s = kda_recurrent(q, k, v, gate, beta, state)
    got_o, got_s = kda_chunked(q, k, v, gate, beta, state, chunk=chunk)
    torch.testing.assert_close(got_o, want_o, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(got_s, want_s, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("c", [16, 20, 48, 64])
def test_unit_lower_inverse(c):
    """The blocked solve == the inverse, for random A and for A = -1 below the diagonal (all keys
    equal, β = 1, no decay: the inverse is bidiagonal, the Neumann terms are huge binomials)."""
    from day0.models.kda import unit_lower_inverse

    g = torch.Generator().manual_seed(c)
    eye = torch.eye(c, dtype=torch.float64)
    for a in (torch.randn(H, c, c, generator=g).tril(-1) * 0.3, -torch.ones(H, c, c).tril(-1)):
        want = torch.linalg.inv(eye - a.double())
        torch.testing.assert_close(unit_lower_inverse(a).double(), want, rtol=1e-5, atol=1e-5)


def test_chunked_matches_transformers_chunk_form():
    from transformers.models.kimi_linear.modeling_kimi_linear import chunk_kimi_delta_attention

    q, k, v, gate, beta, state = _inputs(70, 3)
    want_o, want_s = chunk_kimi_delta_attention(
        q[None],
        k[None],
        v[None],
        gate[None],
        beta[None],
        chunk_size=16,
        initial_state=state[None],
        output_final_state=True,
    )
    got_o, got_s = kda_chunked(q, k, v, gate, beta, state, chunk=16)
    torch.testing.assert_close(got_o, want_o[0], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(got_s, want_s[0], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("shape", [(H, K, V, 16), (8, 32, 32, 64)], ids=["tiny", "h8-k32-chunk64"])
def test_chunked_compiles_with_a_dynamic_length(shape):
    """torch.export turns the chunk loop into a while_loop; IREE runs it for any length, whole
    chunks or not (the form appends one static chunk of zeros, so no guard on the length).
    Chunks are read and written as slices: at H=8, K=V=32, chunk 64 a scattered output tile
    (64 KB) would exceed IREE's CPU stack limit (32 KB) and fail to compile."""
    import iree.compiler as ireec
    import iree.runtime as rt
    from torch_mlir import fx

    h, k, v, chunk = shape

    class Chunked(torch.nn.Module):
        def forward(self, q, k, v, gate, beta, state):
            return kda_chunked(q, k, v, gate, beta, state, chunk=chunk)

    t = torch.export.Dim("t", min=2, max=256)
    dyn = ({0: t}, {0: t}, {0: t}, {0: t}, {0: t}, None)
    m = fx.export_and_import(Chunked(), *_inputs(37, 1, h, k, v), output_type="raw", dynamic_shapes=dyn)
    assert "index_put" not in str(m) and "scatter" not in str(m).replace("slice_scatter", "")
    vmfb = ireec.compile_str(
        str(m), input_type="torch", target_backends=["llvm-cpu"], extra_args=["--iree-llvmcpu-target-cpu=host"]
    )
    f = rt.load_vm_flatbuffer(vmfb, backend="llvm-cpu")["main"]
    for T in (2, 16, 37, 112):
        args = _inputs(T, T + 1, h, k, v)
        got_o, got_s = (np.asarray(x.to_host()) for x in f(*(a.numpy() for a in args)))
        want_o, want_s = kda_recurrent(*args)
        np.testing.assert_allclose(got_o, want_o.numpy(), rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(got_s, want_s.numpy(), rtol=1e-4, atol=1e-5)


def _tiny_layers(seed: int = 0):
    from transformers import KimiLinearConfig
    from transformers.models.kimi_linear.modeling_kimi_linear import KimiLinearDeltaAttention

    from day0.models.kda import KdaAttention, checkpoint_state_dict

    cfg = KimiLinearConfig(
        hidden_size=32,
        rms_norm_eps=1e-6,
        linear_attn_config={
            "head_dim": 8,
            "num_heads": 2,
            "short_conv_kernel_size": 4,
            "kda_layers": [1],
            "full_attn_layers": [2],
        },
        num_hidden_layers=2,
    )
    ref = KimiLinearDeltaAttention(cfg, layer_idx=0).float().eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in ref.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    ours = KdaAttention(32, 2, 8, 4, 1e-6, chunk=16)
    missing = ours.load_state_dict(checkpoint_state_dict(ref.state_dict()), strict=True)
    assert not missing.missing_keys and not missing.unexpected_keys
    return ref, ours


@pytest.mark.parametrize("chunked", [True, False])
def test_layer_matches_transformers(chunked):
    ref, ours = _tiny_layers()
    x = torch.randn(40, 32, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        want = ref(x[None])[0]
        conv, rec = (torch.zeros(s) for s in ours.state_shapes())
        got, _, _ = ours(x, conv, rec, chunked=chunked)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def test_layer_state_carries_across_calls():
    """prefill 25 (chunked) + 15 one token at a time (recurrent) == one pass over 40."""
    _, ours = _tiny_layers(1)
    x = torch.randn(40, 32, generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        zeros = [torch.zeros(s) for s in ours.state_shapes()]
        want, want_conv, want_rec = ours(x, *zeros, chunked=True)
        out, conv, rec = ours(x[:25], *zeros, chunked=True)
        outs = [out]
        for t in range(25, 40):
            out, conv, rec = ours(x[t : t + 1], conv, rec, chunked=False)
            outs.append(out)
    torch.testing.assert_close(torch.cat(outs), want, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(rec, want_rec, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(conv, want_conv)
