"""The memory-efficient attention kernel's bias (codegen/graph.py _aligned_bias): strides in
multiples of 16 bytes, or the kernel raises "attn_bias is not correctly aligned" (HF Swin's
49 x 49 window bias). Lowered on fake CUDA tensors here; run natively in the gpu test."""
import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx

import trainc
from trainc.codegen import is_extern
from trainc.codegen.graph import BIAS_ALIGN, CallNode, lower
from trainc.codegen.lowerings import LOWERINGS

aten = torch.ops.aten


def _bias_arg(tokens: int, backward: bool = False):
    """The bias argument the lowered call passes (the forward's, or the backward's)."""
    def f(q, k, v, rel, mask):
        bias = rel + mask
        out, lse, seed, offset = aten._scaled_dot_product_efficient_attention(q, k, v, bias, True)
        if not backward:
            return out
        return aten._scaled_dot_product_efficient_attention_backward(
            out, q, k, v, bias, out, lse, seed, offset, 0.0, [True, True, True, False])[0]
    with FakeTensorMode():
        q = torch.randn(4, 3, tokens, 32, device="cuda", dtype=torch.bfloat16)
        rel = torch.randn(1, 3, tokens, tokens, device="cuda", dtype=torch.bfloat16)
        mask = torch.randn(4, 1, tokens, tokens, device="cuda", dtype=torch.bfloat16)
        gm = make_fx(f)(q, q, q, rel, mask)
    g = lower(gm, LOWERINGS, is_extern, False)
    call = [s for s in g.steps if isinstance(s, CallNode)][-1]
    return call.args[4 if backward else 3], g


@pytest.mark.parametrize("backward", [False, True])
def test_a_misaligned_bias_is_passed_as_a_view_of_a_padded_buffer(backward):
    arg, g = _bias_arg(49, backward)
    assert arg.shape == (4, 3, 49, 49) and arg.stride[-1] == 1, arg
    assert all(s % BIAS_ALIGN == 0 for s in arg.stride[:-1]), arg
    assert g.buffers[arg.buf].shape == (4, 3, 49, 64)


def test_an_aligned_bias_is_passed_contiguous():
    arg, g = _bias_arg(64)
    assert arg.whole and arg.stride == (3 * 64 * 64, 64 * 64, 64, 1), arg


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_window_attention_with_a_49_token_bias_matches_eager():
    torch._dynamo.reset()
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(8, 3, 49, 32, device="cuda", dtype=torch.bfloat16, generator=g)
               .requires_grad_() for _ in range(3))
    rel = torch.randn(1, 3, 49, 49, device="cuda", dtype=torch.bfloat16, generator=g) \
        .requires_grad_()  # a learned relative-position bias, as Swin's: its gradient too
    mask = torch.randn(8, 1, 49, 49, device="cuda", dtype=torch.bfloat16, generator=g)

    def f(q, k, v, rel):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=rel + mask).float().square().sum()
    want = f(q, k, v, rel)
    want_grads = torch.autograd.grad(want, (q, k, v, rel))
    got = trainc.compile(f)(q, k, v, rel)
    got_grads = torch.autograd.grad(got, (q, k, v, rel))
    torch.testing.assert_close(got, want, rtol=2e-2, atol=1e-2)
    for a, b in zip(got_grads, want_grads):
        torch.testing.assert_close(a, b, rtol=2e-2, atol=2e-2)
