"""pad_matmuls: 16-bit matmuls with sizes off a multiple of 8 get zero-padded operands and a
sliced result (same values within the policy); aligned, small, float32 or CPU ones are left."""
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from policy import assert_policy
from trainc.passes.pad_matmuls import pad_matmuls

aten = torch.ops.aten


def _targets(gm):
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]


def _traced(fn, *args):
    return make_fx(fn, tracing_mode="fake")(*args)


def test_odd_mm_and_bmm_are_padded_and_match_float64():
    a = torch.randn(1000, 771, dtype=torch.bfloat16)
    b = torch.randn(771, 1001, dtype=torch.bfloat16)
    x, y = torch.randn(2, 500, 771, dtype=torch.bfloat16), torch.randn(2, 771, 1003,
                                                                      dtype=torch.bfloat16)
    fn = lambda a, b, x, y: (a @ b, torch.bmm(x, y))
    gm = pad_matmuls(_traced(fn, a, b, x, y), devices=("cpu",))
    ts = _targets(gm)
    assert ts.count(aten.constant_pad_nd.default) == 4 and aten.slice.Tensor in ts
    outs = gm(a, b, x, y)
    eager = fn(a, b, x, y)
    ref = fn(a.double(), b.double(), x.double(), y.double())
    for k, (o, e, r) in enumerate(zip(outs, eager, ref)):
        assert o.shape == e.shape
        assert_policy(f"product {k}", o, e, r)


def test_aligned_small_float32_and_other_devices_are_left_alone():
    cases = [(torch.randn(1024, 768, dtype=torch.bfloat16), torch.randn(768, 1024,
                                                                     dtype=torch.bfloat16)),
             (torch.randn(15, 17, dtype=torch.bfloat16), torch.randn(17, 19,
                                                                     dtype=torch.bfloat16)),
             (torch.randn(1000, 771), torch.randn(771, 1001))]
    for a, b in cases:
        assert aten.constant_pad_nd.default not in _targets(
            pad_matmuls(_traced(torch.mm, a, b), devices=("cpu",)))
    a, b = torch.randn(1000, 771, dtype=torch.bfloat16), torch.randn(771, 1001,
                                                                     dtype=torch.bfloat16)
    assert aten.constant_pad_nd.default not in _targets(pad_matmuls(_traced(torch.mm, a, b)))


def test_padded_lm_head_trains_through_each_backend(monkeypatch):
    """The padded graphs compile (pad, mm, sliced views) and their gradients pass the policy."""
    import sys
    import trainc
    module = sys.modules["trainc.passes.pad_matmuls"]
    monkeypatch.setattr(module, "DEVICES", ("cpu",))
    padded = []
    real_pad = module._pad
    monkeypatch.setattr(module, "_pad", lambda g, n, p: padded.append(n.name) or real_pad(g, n, p))
    torch.manual_seed(0)
    head = torch.nn.Linear(64, 50257 // 8, bias=False).to(torch.bfloat16)
    x = torch.randn(2048, 64, dtype=torch.bfloat16)
    y = torch.randint(0, 50257 // 8, (2048,))
    loss = lambda m, x: torch.nn.functional.cross_entropy(m(x).float(), y)
    ref_head = torch.nn.Linear(64, 50257 // 8, bias=False).double()
    ref_head.load_state_dict(head.state_dict())
    loss(ref_head, x.double()).backward()
    loss(head, x).backward()
    eager = head.weight.grad.clone()
    for backend in ("aten", "cpp"):
        head.weight.grad = None
        torch._dynamo.reset()
        loss(trainc.compile(head, backend=backend), x).backward()
        assert_policy(f"{backend} weight grad", head.weight.grad, eager, ref_head.weight.grad)
    assert len(padded) >= 4, padded  # forward, both backward products, for each backend


def test_a_transposed_operand_pads_the_tensor_it_transposes_once(monkeypatch):
    """GPT-2's LM-head backward: the logits gradient g [tokens, 50257] is read by g @ W and,
    transposed, by g.t() @ h. Both pad g's columns (one copy in g's own layout, no transposing
    copy); the transposed product reads that copy transposed."""
    g = torch.randn(64, 1001, dtype=torch.bfloat16)
    w, h = torch.randn(1001, 24, dtype=torch.bfloat16), torch.randn(64, 24, dtype=torch.bfloat16)
    fn = lambda g, w, h: (g @ w, g.t() @ h)
    gm = make_fx(fn, tracing_mode="fake")(g, w, h)
    import sys
    monkeypatch.setattr(sys.modules["trainc.passes.pad_matmuls"], "MIN_FLOPS", 0)
    gm = pad_matmuls(gm, devices=("cpu",))
    pads = [n for n in gm.graph.nodes if n.target is aten.constant_pad_nd.default]
    # g's columns once (shared), w's rows
    assert sorted(tuple(n.args[1]) for n in pads) == [(0, 0, 0, 7), (0, 7, 0, 0)], \
        [n.args for n in pads]
    assert {n.args[0].name for n in pads} == {"g_1", "w_1"}, [n.args[0] for n in pads]
    outs, eager = gm(g, w, h), fn(g, w, h)
    ref = fn(g.double(), w.double(), h.double())
    for k, (o, e, r) in enumerate(zip(outs, eager, ref)):
        assert o.shape == e.shape
        assert_policy(f"product {k}", o, e, r)
