"""In-place ops from post-grad reinplacing stay in place in generated code (codegen/memory/inplace.py):
results match eager, the plan takes safe hints and refuses kernel-level hazards, and
compile_step allocates no second copy of parameters or optimizer state."""
from __future__ import annotations

import copy
import re

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

import trainc
from trainc import decomps
from trainc.codegen import get_backend
from trainc.codegen.graph import lower
from trainc.codegen.lowerings import LOWERINGS
from trainc.codegen.scheduler import Kernel, Schedule, schedule
from trainc.codegen.memory.inplace import plan_storage
from trainc.codegen import is_extern
from trainc.passes import POST_GRAD_PASSES, run_passes
from policy import assert_same

BACKENDS = ["cpp", pytest.param("triton", marks=pytest.mark.skipif(
    pytest.importorskip("triton", reason="no triton") is None, reason="no triton"))]


def _trace(fn, *args):
    gm = make_fx(lambda *a: tuple(fn(*a)), decomposition_table=decomps.TABLE,
                 tracing_mode="fake")(*args)
    return run_passes(gm, POST_GRAD_PASSES)


def _inplace_ops(gm) -> int:
    return sum(1 for n in gm.graph.nodes if n.op == "call_function" and
               getattr(n.target, "_schema", None) is not None and n.target._schema.is_mutable)


def _check(backend: str, fn, *args, fused: bool = False):
    """Compile fn after reinplacing; outputs match eager. Returns the compiled graph."""
    gm = _trace(fn, *args)
    assert _inplace_ops(gm) >= 1, "the test needs an in-place op to lower"
    c = get_backend(backend, torch.device("cpu")).compile(gm, list(args))
    outs = c.run(list(args))
    for k, (o, r) in enumerate(zip(outs, fn(*args))):
        assert_same(o, r, 1e-5, 1e-5, f"output {k}")
    if fused:
        assert len(c.kernels) == 1, "the reader and the writer must share one kernel"
    return c


def _mm_inputs(n=8):
    g = torch.Generator().manual_seed(0)
    return torch.randn(n, n, generator=g), torch.randn(n, n, generator=g)


@pytest.mark.parametrize("backend", BACKENDS)
def test_transposed_read_in_the_same_kernel_gets_a_fresh_buffer(backend):
    def f(x, w):
        a = x @ w
        # a * 3 could be reinplaced into a: both fuse into one kernel, which reads a transposed
        return (a.t() + 1).contiguous(), a * 3
    c = _check(backend, f, *_mm_inputs(), fused=True)
    assert c.extra["inplace"] == 0


@pytest.mark.parametrize("backend", BACKENDS)
def test_transposed_output_is_computed_in_memory_order_and_allows_in_place(backend):
    def f(x, w):
        a = x @ w
        # eager lays a.t() + 1 out as a is laid out: computed in that order, it reads each
        # element of a where a * 3 writes it
        return a.t() + 1, a * 3
    c = _check(backend, f, *_mm_inputs(), fused=True)
    assert c.extra["inplace"] == 1


@pytest.mark.parametrize("backend", BACKENDS)
def test_flipped_read_in_the_same_kernel_gets_a_fresh_buffer(backend):
    def f(x, w):
        a = x @ w
        return a.flip(1) * 2, a + 1
    c = _check(backend, f, *_mm_inputs(), fused=True)
    assert c.extra["inplace"] == 0


@pytest.mark.parametrize("backend", BACKENDS)
def test_row_reduction_then_write_in_place(backend):
    def f(x, w):
        a = x @ w
        return (a - a.amax(1, keepdim=True),)  # reads its own row before writing it
    c = _check(backend, f, *_mm_inputs(), fused=True)
    assert c.extra["inplace"] == 1


@pytest.mark.parametrize("backend", BACKENDS)
def test_column_reduction_then_write(backend):
    def f(x, w):
        a = x @ w
        return (a - a.sum(0, keepdim=True),)  # the sum needs every row: a kernel of its own
    _check(backend, f, *_mm_inputs(6))


@pytest.mark.parametrize("backend", BACKENDS)
def test_scatter_accumulates_in_place(backend):
    def f(x, w, v, idx):
        a = x @ w
        return (a.index_put((idx,), v, accumulate=True) * 1,)
    x, w = _mm_inputs(6)
    c = _check(backend, f, x, w, torch.randn(4, 6), torch.tensor([0, 2, 2, 5]))
    assert c.extra["inplace"] >= 1


def test_fallback_in_place_op_runs_in_place():
    def f(x, w):
        a = x @ w
        return (torch.lgamma(a.abs() + 1) * 1,)  # lgamma has no lowering: ATen lgamma_
    x, w = _mm_inputs()
    gm = _trace(f, x, w)
    c = get_backend("cpp", torch.device("cpu")).compile(gm, [x, w])
    assert "lgamma_" in c.source and "in place" in c.source, c.source
    assert_same(c.run([x, w])[0], f(x, w)[0], 1e-5, 1e-5, "lgamma")


def test_plan_refuses_a_reader_scheduled_after_the_writer():
    def f(x, w):
        a = x @ w
        return a.sum(0), a * 3
    x, w = torch.randn(8, 4), torch.randn(4, 6)  # not square: the sum gets its own kernel
    g = lower(_trace(f, x, w), LOWERINGS, is_extern)
    sched = schedule(g)
    assert plan_storage(sched), "in program order the write may take a's storage"
    kernels = [i for i in sched.items if isinstance(i, Kernel)]
    writer = next(k for k in kernels if any(n.name in g.reuse for n in k.nodes))
    rest = [i for i in sched.items if i is not writer]
    assert rest.index(next(k for k in kernels if k is not writer)) > 0
    late = Schedule(rest[:1] + [writer] + rest[1:], g)  # the sum now runs after the write
    assert plan_storage(late) == {}


def test_plan_never_writes_a_foreign_device_input(monkeypatch):
    """A CPU scalar input of a CUDA graph reaches kernels as a device copy, so an in-place
    `count += 1` into it would be lost (H200: AdamW wrong from step 2, when the step counts
    were bumped in the graph). The plan takes such inputs as targets unless named `foreign`
    (here BatchNorm's num_batches_tracked, a 0-d buffer bumped by the step)."""
    import trainc.codegen.driver as driver  # plans storage for every code-generating backend
    seen = []

    def spy(sched, foreign=frozenset()):
        g = sched.graph
        scalars = frozenset(b for b in g.inputs if g.buffers[b].shape == ())
        seen.append((set(plan_storage(sched).values()) & scalars,
                     set(plan_storage(sched, scalars).values()) & scalars))
        return plan_storage(sched, foreign)
    monkeypatch.setattr(driver, "plan_storage", spy)

    m = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8))
    opt = torch.optim.SGD(m.parameters(), lr=1e-2)
    torch._dynamo.reset()
    step = trainc.compile_step(m, lambda mod, x: mod(x).pow(2).mean(), opt, backend="cpp")
    step(torch.randn(3, 4))
    step(torch.randn(3, 4))
    assert m[1].num_batches_tracked.item() == 2
    assert any(same for same, _ in seen), "on one device the count is bumped in place"
    assert not any(other for _, other in seen)


def test_adam_step_counts_advance_on_the_host():
    """The whole-step graph reads Adam's CPU step counts and never writes them (a CUDA step
    would copy each back: a synchronization per parameter); the runtime advances them."""
    m = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 2))
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
    torch._dynamo.reset()
    step = trainc.compile_step(m, lambda mod, x: mod(x).pow(2).mean(), opt, backend="cpp")
    x = torch.randn(3, 4)
    for _ in range(3):
        step(x)
    assert [opt.state[p]["step"].item() for p in m.parameters()] == [3.0] * 4
    comp = list(step.cache.values())[-1]
    flat = step._flat_inputs(comp.layout, (x,))
    steps = {id(opt.state[p]["step"]) for p in m.parameters()}
    assert not any(id(flat[i]) in steps for i in comp.signature.mutated_inputs)
    assert all(opt.state[p]["step"].device.type == "cpu" for p in m.parameters())


def _bytes(ts) -> int:
    return sum(t.numel() * t.element_size() for t in ts)


@pytest.mark.parametrize("opt_name", ["sgd", "adamw"])
def test_compile_step_keeps_params_and_state_in_place(opt_name):
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(),
                                torch.nn.Linear(64, 8))
    ref = copy.deepcopy(model)
    make = (lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9)) if opt_name == "sgd" else \
        (lambda ps: torch.optim.AdamW(ps, lr=1e-2))
    opt, ref_opt = make(model.parameters()), make(ref.parameters())
    loss_fn = lambda m, x, y: torch.nn.functional.mse_loss(m(x), y)
    step = trainc.compile_step(model, loss_fn, opt, backend="cpp")
    x, y = torch.randn(4, 32), torch.randn(4, 8)  # small activations: grads dominate
    step(x, y)  # creates the optimizer state
    loss_fn(ref, x, y).backward()
    ref_opt.step()
    ref_opt.zero_grad(set_to_none=True)
    params = list(model.parameters())
    state = [t for s in opt.state.values() for t in s.values() if t.dim() > 0]
    ptrs = [t.data_ptr() for t in params + state]
    for _ in range(3):
        got = step(x, y)
        want = loss_fn(ref, x, y)
        want.backward()
        ref_opt.step()
        ref_opt.zero_grad(set_to_none=True)
        assert_same(got, want.detach(), 1e-4, 1e-5, "loss")
    assert [t.data_ptr() for t in params + state] == ptrs
    for p, r in zip(params, ref.parameters()):
        assert_same(p.detach(), r.detach(), 1e-4, 1e-5, "param")
    graph = list(step.cache.values())[-1].graph  # the graph of steps with state
    assert graph.extra["inplace"] >= len(params) + len(state)
    # one step allocates the gradients and activations, never new params or state
    assert graph.extra["fresh_bytes"] < _bytes(params + state), graph.extra["fresh_bytes"]


def test_wrapper_reports_what_is_live_at_its_planned_peak():
    """The wrapper's planned peak and its largest live buffers (with the graph nodes that made
    them) are in the compiled graph's stats and atop the dumped wrapper source."""
    from cpp_helpers import compile_cpp

    def f(x, w):
        h = (x @ w).relu()  # [64, 512]: the biggest intermediate
        return (h @ w.T).sum(0)
    c = compile_cpp(f, torch.randn(64, 32), torch.randn(32, 512))
    live = c.extra["peak_live"]
    assert live and live[0][1] == (64, 512) and live[0][3] == 64 * 512 * 4
    assert c.extra["peak_bytes"] >= sum(row[3] for row in live)
    assert c.source.startswith("# planned peak ")


@pytest.mark.parametrize("backend", BACKENDS)
def test_16bit_adam_state_is_written_back_in_place(backend):
    """bfloat16 AdamW: exp_avg's lerp runs in float32 and is cast back (a `_to_copy`, which
    reinplacing cannot turn into an in-place op); the new value is still computed into the
    state's own storage (codegen/graph.py `_hint_written_back`), not copied back after the step."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(),
                                torch.nn.Linear(64, 8)).to(torch.bfloat16)
    ref = copy.deepcopy(model)
    opt, ref_opt = (torch.optim.AdamW(m.parameters(), lr=1e-2) for m in (model, ref))
    loss_fn = lambda m, x, y: torch.nn.functional.mse_loss(m(x), y)
    step = trainc.compile_step(model, loss_fn, opt, backend=backend)
    x, y = torch.randn(4, 32, dtype=torch.bfloat16), torch.randn(4, 8, dtype=torch.bfloat16)
    for _ in range(3):
        step(x, y)
        loss_fn(ref, x, y).backward()
        ref_opt.step()
        ref_opt.zero_grad(set_to_none=True)
    for p, r in zip(model.parameters(), ref.parameters()):
        assert_same(p.detach().float(), r.detach().float(), 2e-2, 1e-2, "param")
    params = list(model.parameters())
    state = [t for s in opt.state.values() for t in s.values() if t.dim() > 0]
    graph = list(step.cache.values())[-1].graph
    assert graph.extra["inplace"] >= len(params) + len(state), graph.extra["inplace"]


def test_batchnorm_running_stats_are_updated_in_place(tmp_path, monkeypatch):
    """running_mean, running_var and num_batches_tracked get their new values written into their
    own storage by the forward's kernels: no separate buffer and no copy back afterwards (the
    input's version counter still moves, as copy_ would move it)."""
    import trainc
    monkeypatch.setenv("TRAINC_DEBUG_DIR", str(tmp_path))
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8), torch.nn.ReLU())
    ref = copy.deepcopy(m)
    x = torch.randn(4, 3, 10, 10)
    bn = m[1]
    ptrs = [t.data_ptr() for t in (bn.running_mean, bn.running_var, bn.num_batches_tracked)]
    versions = [t._version for t in (bn.running_mean, bn.running_var, bn.num_batches_tracked)]
    f = trainc.compile(m, backend="cpp")
    for _ in range(2):
        f(x).sum().backward()
        ref(x).sum().backward()
    for name in ("running_mean", "running_var", "num_batches_tracked"):
        torch.testing.assert_close(getattr(bn, name), getattr(ref[1], name))
    after = (bn.running_mean, bn.running_var, bn.num_batches_tracked)
    assert [t.data_ptr() for t in after] == ptrs
    assert all(t._version > v for t, v in zip(after, versions))
    src = next(tmp_path.rglob("30_fwd_wrapper.py")).read_text()
    assert len(re.findall(r"= arg\d+  # in place", src)) == 3, src
