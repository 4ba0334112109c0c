"""Public API: options validation, explain's report, the Dynamo entry point, debug output."""
import os
import subprocess
import sys

import pytest
import torch
import torch.nn as nn

import trainc


def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4))


def test_bad_options_give_clear_errors():
    with pytest.raises(ValueError, match="backend must be one of"):
        trainc.compile(_mlp(), backend="cuda-magic")
    with pytest.raises(TypeError, match="unknown option"):
        trainc.compile(_mlp(), fast=True)
    with pytest.raises(ValueError, match="fraction"):
        trainc.compile(_mlp(), memory_budget=1.5)
    with pytest.raises(TypeError, match="nn.Module or a function"):
        trainc.compile(42)


def test_explain_reports_graphs_saved_bytes_and_fallbacks():
    m = _mlp()
    x = torch.randn(5, 8)
    w_before = m[0].weight.detach().clone()
    e = trainc.explain(m, x, backend="aten")
    assert len(e.graphs) == 1 and e.graphs[0].training
    # Saved activations: at least the GELU input (5x16 fp32); parameters are not counted.
    assert e.saved_bytes >= 5 * 16 * 4
    assert all(not d.is_input for d in e.saved_tensors)
    assert e.saved_bytes == sum(d.nbytes for d in e.saved_tensors)
    assert e.kernels == []
    # The default min-cut recomputes GELU in the backward; save_all recomputes nothing.
    assert any(d.action == "recomputed" for g in e.graphs for d in g.decisions)
    assert e.recompute_flops > 0
    e_all = trainc.explain(m, x, backend="aten", partitioner="save_all")
    assert e_all.recompute_flops == 0 and e_all.saved_bytes > e.saved_bytes
    assert "aten.gelu.default" in e.fallback_ops and "aten.addmm.default" not in e.fallback_ops
    assert e.compile_seconds > 0
    text = str(e)
    assert "graph_" in text and "saved MiB" in text and "fallback ops" in text
    assert "partition decisions" in e.table(per_value=True)
    assert torch.equal(m[0].weight, w_before)


def test_explain_restores_buffers_and_rng():
    m = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.Dropout(0.2))
    x = torch.randn(6, 4)
    state = torch.get_rng_state()
    trainc.explain(m, x, backend="aten")
    assert m[1].num_batches_tracked.item() == 0
    assert torch.equal(torch.get_rng_state(), state)


def test_explain_that_compiles_nothing_is_a_clear_error():
    # Dynamo compiles one code object at most recompile_limit times; the explain after that
    # ran eagerly and used to return an empty report.
    torch._dynamo.reset()
    x = torch.randn(5, 8)
    limit = torch._dynamo.config.recompile_limit
    for k in range(limit):
        trainc.explain(_mlp(), x, backend="aten", partition_objective=("bytes", "balanced")[k % 2])
    with pytest.raises(RuntimeError, match="nothing was compiled.*torch._dynamo.reset"):
        trainc.explain(_mlp(), x, backend="aten")
    torch._dynamo.reset()
    assert trainc.explain(_mlp(), x, backend="aten").graphs


def test_torch_compile_backend_name_with_options():
    torch._dynamo.reset()
    m = _mlp()
    x = torch.randn(3, 8)
    c = torch.compile(m, backend="trainc", options={"backend": "aten"})
    torch.testing.assert_close(c(x), m(x))
    with pytest.raises(Exception, match="unknown option"):
        torch._dynamo.reset()
        torch.compile(_mlp(), backend="trainc", options={"nope": 1})(x)


def test_budget_without_min_cut_is_a_clear_error_or_works():
    torch._dynamo.reset()
    m = _mlp()
    try:
        out = trainc.compile(m, backend="aten", memory_budget=0.5)(torch.randn(2, 8))
    except Exception as e:  # until the min-cut partitioner lands
        assert "memory_budget" in str(e)
    else:
        assert out.shape == (2, 4)


def test_debug_dir_dumps_runnable_stages(tmp_path):
    script = (
        "import torch, trainc\n"
        "m = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Dropout(0.1))\n"
        "trainc.compile(m, backend='aten')(torch.randn(2, 4)).sum().backward()\n")
    env = {**os.environ, "TRAINC_DEBUG": "1", "TRAINC_DEBUG_DIR": str(tmp_path)}
    r = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    assert "trainc: graph_0 train" in r.stderr
    d = tmp_path / "graph_0"
    for name in ("00_joint.py", "20_partition.txt", "30_fwd.py", "31_bwd.py"):
        assert (d / name).exists(), name
    assert any(p.name.startswith("10_") for p in d.iterdir())
    for name in ("00_joint.py", "30_fwd.py", "31_bwd.py"):
        run = subprocess.run([sys.executable, str(d / name)], capture_output=True, text=True,
                             timeout=300)
        assert run.returncode == 0, (name, run.stderr[-2000:])


def test_package_does_not_import_forbidden_compilers():
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    bad = ("torch._inductor", "_functorch.aot_autograd", "_functorch.partitioners")
    for pkg in ("trainc", "partition", "passes", "codegen"):
        for dirpath, _, files in os.walk(os.path.join(root, pkg)):
            for f in files:
                if f.endswith(".py"):
                    text = open(os.path.join(dirpath, f)).read()
                    assert not any(b in text for b in bad), os.path.join(dirpath, f)


def test_explain_lists_graph_breaks_at_the_users_line():
    import inspect

    def broken(x):
        y = x.sin()
        torch._dynamo.graph_break()
        return y.cos()

    line = inspect.getsourcelines(broken)[1] + 2
    e = trainc.explain(broken, torch.randn(4, requires_grad=True), backend="aten")
    assert len(e.graphs) == 2
    assert [(b.filename, b.lineno) for b in e.graph_breaks] == [(__file__, line)]
    assert "graph_break()" in e.graph_breaks[0].reason and f":{line}:" in str(e)
    whole = trainc.explain(lambda x: x.sin().cos(), torch.randn(4, requires_grad=True),
                           backend="aten")
    assert whole.graph_breaks == ()
