"""2-D convolutions run channels-last (graph.py `to_channels_last`, `_preferred_layout`): the
values around them follow, the backward takes the saved values in the forward's layouts (no
copies at the boundary), results match eager, and `conv_channels_last=False` keeps NCHW."""
import re

import pytest
import torch
import torch.nn as nn

import trainc
from trainc.testing import assert_grads_match

BACKENDS = ["cpp", pytest.param("triton", marks=pytest.mark.skipif(
    pytest.importorskip("importlib").util.find_spec("triton") is None,
    reason="triton is not installed"))]


def _net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU(),
                         nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                         nn.MaxPool2d(2), nn.Conv2d(8, 4, 1), nn.Flatten(), nn.Linear(64, 5))


def _sources(m, x, tmp_path, **options) -> dict[str, str]:
    """The dumped wrappers of one forward and backward (TRAINC_DEBUG_DIR's files)."""
    out = trainc.compile(m, debug_dir=str(tmp_path), cache_artifacts=False, **options)(x)
    out.sum().backward()
    return {f.name: f.read_text() for f in tmp_path.rglob("*_wrapper.py")}


# [N, C, H, W] in NHWC: a view for the call, or a kept buffer made so (its allocation's comment)
CL_ARG = re.compile(r"\[2, 8, 8, 8\](, | strides )\[512, 1, 64, 8\]")


@pytest.mark.parametrize("backend", BACKENDS)
def test_convolutions_take_channels_last_and_the_backward_copies_nothing(backend, tmp_path):
    x = torch.randn(2, 3, 8, 8)
    src = _sources(_net(), x, tmp_path, backend=backend, conv_channels_last=True)
    fwd, bwd = src["30_fwd_wrapper.py"], src["31_bwd_wrapper.py"]
    assert CL_ARG.search(fwd) and CL_ARG.search(bwd)
    # saved 4-D values arrive in the layout the forward returned them in: no restride copies
    checks = "\n".join(l for l in bwd.splitlines() if re.search(r"if arg\d+\.stride\(\) != ", l))
    assert not re.search(r"restride\(arg\d+, \(512, 64, 8, 1\)\)", checks)
    assert "512, 1, 64, 8" in checks  # the backward's inputs are declared channels-last
    assert_grads_match(_net(), [x], backend=backend, conv_channels_last=True)


def test_default_is_channels_last_for_cpp_and_16_bit_triton(tmp_path):
    x = torch.randn(2, 3, 8, 8)
    assert CL_ARG.search(_sources(_net(), x, tmp_path / "cpp", backend="cpp")["30_fwd_wrapper.py"])
    pytest.importorskip("triton")
    assert not CL_ARG.search(_sources(_net(), x, tmp_path / "triton",
                                      backend="triton")["30_fwd_wrapper.py"])
    src = _sources(_net().to(torch.bfloat16), x.to(torch.bfloat16), tmp_path / "bf16",
                   backend="triton")
    assert CL_ARG.search(src["30_fwd_wrapper.py"]) and CL_ARG.search(src["31_bwd_wrapper.py"])


@pytest.mark.parametrize("backend", BACKENDS)
def test_option_off_keeps_nchw(backend, tmp_path):
    x = torch.randn(2, 3, 8, 8)
    src = _sources(_net(), x, tmp_path, backend=backend, conv_channels_last=False)
    assert not any(CL_ARG.search(s) for s in src.values())
    assert_grads_match(_net(), [x], backend=backend, conv_channels_last=False)


@pytest.mark.parametrize("partitioner", ["mincut", "save_all"])
def test_saved_activations_are_channels_last(partitioner, tmp_path):
    """Values computed in place of a convolution's result (x - mean of a batch norm) follow
    its layout too: the backward's 4-D activation inputs are all channels-last."""
    x = torch.randn(2, 3, 8, 8)
    bwd = _sources(_net(), x, tmp_path, backend="cpp", partitioner=partitioner)[
        "31_bwd_wrapper.py"]
    declared = re.findall(r"if arg\d+\.stride\(\) != \((\d+), (\d+), (\d+), (\d+)\)", bwd)
    nchw = [s for s in declared if s[1] != "1" and s[0] not in ("27", "72", "8", "192")]
    assert declared and not nchw, declared


def test_a_rule_decides_per_convolution(monkeypatch, tmp_path):
    """The triton backend's rule (`low_precision_conv`, then the TF32 probe) decides per node,
    forward and backward: here only convolutions with >= 8 input channels go channels-last;
    the 3-channel first one keeps its NCHW input, and the results match eager."""
    pytest.importorskip("triton")
    import trainc.codegen.triton as T
    from trainc.codegen.graph import conv_weight
    monkeypatch.setattr(T, "low_precision_conv", lambda node: conv_weight(node).shape[1] >= 8)
    x = torch.randn(2, 3, 8, 8)
    src = _sources(_net(), x, tmp_path, backend="triton")
    fwd, bwd = src["30_fwd_wrapper.py"], src["31_bwd_wrapper.py"]
    assert CL_ARG.search(fwd) and CL_ARG.search(bwd)  # the 8 -> 8 convolution
    first_nhwc = re.compile(r"as_strided\(\[2, 3, 8, 8\], \[192, 1, 24, 3\]")
    assert not first_nhwc.search(fwd) and not first_nhwc.search(bwd)
    assert_grads_match(_net(), [x], backend="triton")


def test_eager_tf32_probe_runs_each_convolution_twice_on_its_arguments(monkeypatch):
    """conv_channels_last="eager_tf32" (codegen/triton/tf32_probe.py): a float32 convolution
    goes channels-last where eager's NCHW call differs with TF32 allowed. Off CUDA nothing is
    probed (no TF32): the layouts are the default ones. The probe itself runs the forward and
    a backward with its mask on arguments shaped as the node's."""
    pytest.importorskip("triton")
    from trainc.codegen.triton import tf32_probe
    aten = torch.ops.aten
    x, w = torch.randn(2, 3, 8, 8), torch.randn(4, 3, 3, 3)
    g = torch.randn(2, 4, 8, 8)
    conv = [x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1]
    back = [g, x, w, [4], [1, 1], [1, 1], [1, 1], False, [0, 0], 1, [False, True, True]]
    assert not tf32_probe._differs_with_tf32(aten.convolution.default, conv, x.device)
    assert not tf32_probe._differs_with_tf32(aten.convolution_backward.default, back, x.device)
    calls = []
    monkeypatch.setattr(tf32_probe, "_differs_with_tf32", lambda *a: calls.append(a) or True)
    m, x = _net(), torch.randn(2, 3, 8, 8)
    out = trainc.compile(m, backend="triton", conv_channels_last="eager_tf32")(x)
    out.sum().backward()
    assert not calls  # CPU tensors: not probed
    with pytest.raises(ValueError, match="conv_channels_last"):
        trainc.compile(_net(), conv_channels_last="nhwc")


def test_eager_tf32_probe_needs_tf32_in_every_product_the_node_computes():
    """A convolution backward goes channels-last only when its input gradient and its weight
    gradient both differ at TF32's scale (H200, scale "cpu": cuDNN computed the input gradient
    exactly and the weight gradient in TF32; channels-last ran both in TF32 and an earlier
    batch norm's weight gradient had 1800x eager's error). The bias gradient (a sum) and
    float32-sized differences (another exact algorithm) do not count."""
    pytest.importorskip("triton")
    from trainc.codegen.triton import tf32_probe
    x = torch.randn(4, 4)

    def fake(moved, amount=3e-4, bias=True):
        def target(t):
            nudge = amount if torch.backends.cudnn.allow_tf32 else 0.0
            outs = [t * (1 + nudge * (k in moved)) for k in range(2)]
            return (*outs, t.sum(0) if bias else None)
        return target

    def probe(target):
        return tf32_probe._differs_with_tf32(target, [x], x.device)

    assert probe(fake({0, 1}))
    assert probe(fake({0, 1}, bias=False))
    assert not probe(fake({1}))  # exact input gradient: NCHW
    assert not probe(fake({0}))
    assert not probe(fake({0, 1}, amount=1e-6))  # float32-sized: another exact algorithm
    assert not probe(lambda t: t * 1)  # a forward with equal results


def test_eager_tf32_probe_that_cannot_run_keeps_nchw(monkeypatch):
    """A probe that fails (out of GPU memory at compile time: it allocates the convolution's
    arguments) leaves that convolution NCHW instead of failing the compile."""
    pytest.importorskip("triton")
    from trainc.codegen.triton import tf32_probe

    def oom(*args):
        raise torch.OutOfMemoryError("CUDA out of memory")
    monkeypatch.setattr(tf32_probe, "_differs_with_tf32", oom)
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", True)
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():  # a CUDA tensor's metadata, as a traced node has, without a GPU
        x = torch.empty(2, 3, 8, 8, device="cuda")
    g = torch.fx.Graph()
    arg = g.placeholder("x")
    arg.meta["val"] = x
    node = g.call_function(torch.ops.aten.convolution.default, (arg,))
    assert tf32_probe.eager_runs_tf32(node) is False


def _bn_chain(xs, ps):
    """Residual BN+add+ReLU outputs over channels-last inputs, with no convolution in the graph
    (the regnet backward's recompute chain, cut out): each output is stored for the next."""
    def bn(x, p):
        return (p[0].view(1, -1, 1, 1) + p[1].view(1, -1, 1, 1) *
                (p[2].view(1, -1, 1, 1) * (x - p[3].view(1, -1, 1, 1)))).to(x.dtype)
    r = torch.relu(bn(xs[0], ps[0:4]) + bn(xs[1], ps[4:8]))
    s = torch.relu(bn(xs[2], ps[8:12]) + torch.relu(r + bn(xs[3], ps[12:16])))
    return r, s, torch.relu(s + bn(xs[4], ps[16:20]))


@pytest.mark.parametrize("backend", BACKENDS)
def test_stored_outputs_take_the_traced_layout(backend, tmp_path):
    """Outputs stored because later nodes read them come back channels-last as traced: stored
    NCHW they were written across the inputs' order and copied again on return."""
    torch.manual_seed(0)
    xs = [torch.randn(2, 8, 4, 4, dtype=torch.bfloat16).contiguous(memory_format=torch.channels_last)
          for _ in range(5)]
    ps = [torch.randn(8) for _ in range(20)]
    out = trainc.compile(_bn_chain, backend=backend, debug_dir=str(tmp_path),
                         cache_artifacts=False)(xs, ps)
    for o, e in zip(out, _bn_chain(xs, ps)):
        assert o.stride() == e.stride()
        torch.testing.assert_close(o.float(), e.float(), atol=0.1, rtol=0.02)
    fwd = next(tmp_path.rglob("30_fwd_wrapper.py")).read_text()
    assert str(xs[0].contiguous().stride()) not in fwd, "an output was stored NCHW"
