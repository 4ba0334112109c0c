"""C++ kernel plans (codegen/cpp/plan.py): what the printer will do to each kernel, decided
before printing (lanes, hoists, reuse, thread splits, unrolls, tiles), as frozen data; the
printer spells a plan, so printing a hand-modified plan changes the code accordingly."""
import dataclasses
import os
import re

import pytest
import torch
from torch import nn
from torch.fx.experimental.proxy_tensor import make_fx

import trainc
from trainc import decomps
from trainc.codegen import is_extern
from trainc.codegen.cpp.plan import (MIN_INNER, SCRATCH_BYTES, CppTarget, KernelPlan, LoopPlan,
                                     plan_kernel)
from trainc.codegen.cpp.printer import kernel_source, print_kernel
from trainc.codegen.graph import lower
from trainc.codegen.lowerings import LOWERINGS
from trainc.codegen.scheduler import Kernel, schedule
from trainc.codegen.memory.inplace import plan_storage

GOLDEN = os.path.join(os.path.dirname(__file__), "golden")


def _schedule(fn, *args):
    gm = make_fx(lambda *a: tuple(fn(*a)), decomposition_table=decomps.TABLE,
                 tracing_mode="fake")(*args)
    sched = schedule(lower(gm, LOWERINGS, is_extern), scratch_bytes=SCRATCH_BYTES,
                     min_inner=MIN_INNER)
    plan_storage(sched)
    return sched


def _plans(fn, *args, target=None):
    """[(kernel, plan)] of fn's graph, and the lowered graph."""
    sched = _schedule(fn, *args)
    kernels = [k for k in sched.items if isinstance(k, Kernel)]
    extra = {} if target is None else {"target": target}
    return [(k, plan_kernel(k, sched.graph, **extra)) for k in kernels], sched.graph


def _only(fn, *args, **kw):
    plans, g = _plans(fn, *args, **kw)
    assert len(plans) == 1, [str(p) for _, p in plans]
    return plans[0][0], plans[0][1], g


def test_column_reduction_plans_lanes_row_reduction_the_inner_loop():
    _, col, _ = _only(lambda x: (x.sum(0),), torch.randn(64, 48))
    assert col.mode == "lanes" and col.lanes == 16  # 48 columns: the widest lane divisor
    assert col.loops[0].vector == (col.osyms[-1], 48)
    _, row, _ = _only(lambda x: (x.sum(1),), torch.randn(64, 48))
    assert row.mode == "inner" and row.lanes is None
    assert row.loops[0].vector[0] == row.loops[0].syms[-1]


def test_the_target_picks_the_lane_widths():
    _, plan, _ = _only(lambda x: (x.sum(0),), torch.randn(64, 48),
                       target=CppTarget(lane_widths=(8,)))
    assert plan.lanes == 8
    _, plan, _ = _only(lambda x: (x.sum(0),), torch.randn(64, 48),
                       target=CppTarget(lane_widths=(64, 32)))
    assert plan.mode == "inner" and plan.lanes is None  # no width divides 48


def _channel_norm(x, mean, var, w):
    y = (x - mean / 8) * torch.rsqrt(var / 8 + 1e-5) * w
    return (y.relu(),)


def test_per_channel_values_are_hoisted():
    _, plan, _ = _only(_channel_norm, torch.randn(4, 6, 16), torch.randn(16), torch.rand(16),
                       torch.randn(16))
    names = {h.name for h in plan.hoists}
    assert names and all(h.extent == 16 for h in plan.hoists)
    assert "rsqrt" in str(plan) and "hoist hv0 = " in str(plan)


def test_softmax_reuses_its_exp():
    _, plan, _ = _only(lambda x: (torch.softmax(x, -1),), torch.randn(8, 100))
    assert plan.mode == "inner" and plan.reuse
    r = plan.reuse[0]
    assert "exp" in str(plan) and r.first < min(r.later)


def _channel_stats(a):
    return (*torch.var_mean(a, dim=(0, 1)), a.amax(dim=(0, 1)))


def test_one_lane_block_splits_over_threads():
    _, plan, _ = _only(_channel_stats, torch.randn(7, 300, 16))
    assert plan.split and plan.threads == CppTarget().max_threads and not plan.parallel
    assert "split over <= 64 threads" in str(plan)
    _, small, _ = _only(_channel_stats, torch.randn(2, 3, 16))  # too little work to split
    assert not small.split and small.threads == 0


def test_narrow_lane_reductions_unroll():
    _, plan, _ = _only(lambda a: (a.sum(0),), torch.randn(32, 16))
    assert plan.lanes == 16 and plan.loops[0].unroll == 4  # 64 lanes in flight
    assert plan.loops[0].unroll_sym is not None and "unroll 4" in str(plan)
    _, plan, _ = _only(lambda a: (a.sum(0),), torch.randn(32, 64))
    assert plan.loops[0].unroll == 1 and plan.loops[0].unroll_sym is None


def test_tiny_innermost_dim_is_unrolled():
    _, plan, _ = _only(lambda x: (x.permute(0, 2, 3, 1).exp().contiguous(),),
                       torch.randn(2, 3, 10, 9))
    (lp,) = plan.loops
    assert lp.tiny == 3 and lp.vector[1] == lp.extents[-2]


def test_scatter_kernels_plan_as_scatter():
    def f(x, idx, v):
        return (x.index_put((idx,), v, accumulate=True),)
    plans, _ = _plans(f, torch.randn(16, 8), torch.randint(0, 16, (12,)), torch.randn(12, 8))
    modes = [p.mode for _, p in plans]
    assert "scatter" in modes
    assert all(not p.loops and p.lanes is None for _, p in plans if p.mode == "scatter")


def test_plans_are_frozen():
    _, plan, _ = _only(lambda x: (x.sum(0),), torch.randn(64, 48))
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.lanes = 8
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.loops[0].unroll = 2
    with pytest.raises(TypeError):
        plan.exprs["x"] = None  # read-only mapping
    assert isinstance(plan, KernelPlan) and isinstance(plan.loops[0], LoopPlan)


def test_print_kernel_spells_the_plan_and_kernel_source_plans_it():
    (k, plan, g) = _only(_channel_norm, torch.randn(4, 6, 16), torch.randn(16), torch.rand(16),
                         torch.randn(16))
    src = print_kernel(k, plan, g)
    assert "hv0[" in src.code and src.params
    sched = _schedule(_channel_norm, torch.randn(4, 6, 16), torch.randn(16), torch.rand(16),
                      torch.randn(16))
    (k2,) = [x for x in sched.items if isinstance(x, Kernel)]
    assert kernel_source(k2, sched.graph) == (src.code, list(src.params))


def test_a_hand_modified_plan_changes_the_code():
    k, plan, g = _only(_channel_norm, torch.randn(64, 64, 16), torch.randn(16), torch.rand(16),
                       torch.randn(16))
    code = print_kernel(k, plan, g).code
    assert plan.parallel and "#pragma omp parallel for" in code
    assert code.count("std::sqrt(") == 1 and "hv0[" in code
    plain = print_kernel(k, dataclasses.replace(plan, hoists=()), g).code
    assert "hv0" not in plain and "std::sqrt(" in plain[plain.index("for (int64_t o"):]
    serial = print_kernel(k, dataclasses.replace(plan, parallel=False), g).code
    assert "#pragma omp parallel for" not in serial
    assert serial.replace("  #pragma omp parallel for\n", "") == code.replace(
        "  #pragma omp parallel for\n", "")


def test_dropping_the_unroll_from_a_plan_drops_the_accumulator_sets():
    k, plan, g = _only(lambda a: (a.sum(0),), torch.randn(32, 16))
    code = print_kernel(k, plan, g).code
    loop = dataclasses.replace(plan.loops[0], unroll=1, unroll_sym=None)
    once = print_kernel(k, dataclasses.replace(plan, loops=(loop,)), g).code
    assert re.search(r"\+= t\d+\[j\];", code) and not re.search(r"\+= t\d+\[j\];", once)


def test_a_plan_of_another_kernel_is_refused():
    plans, g = _plans(lambda x: (x.sum(0), x.sum(1, keepdim=True).exp() * x),
                      torch.randn(64, 48))
    assert len(plans) >= 2
    (k0, _), (_, p1) = plans[0], plans[1]
    with pytest.raises(ValueError, match="plan of"):
        print_kernel(k0, p1, g)
    p0 = plans[0][1]
    with pytest.raises(ValueError, match="1 loops, the kernel 3"):
        print_kernel(plans[1][0], dataclasses.replace(p1, loops=p1.loops[:1]), g)
    assert p0.name == k0.name


def _net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU(),
                         nn.Flatten(), nn.Linear(512, 32), nn.LayerNorm(32), nn.GELU(),
                         nn.Linear(32, 4), nn.Softmax(-1))


def test_kernel_plans_dump_matches_golden(tmp_path):
    """42_kernels.txt of a small net's forward and backward (TRAINC_DEBUG_DIR): pinned, so a
    change to what the C++ backend plans shows here. Regenerate with TRAINC_UPDATE_GOLDEN=1."""
    x = torch.randn(2, 3, 8, 8)
    out = trainc.compile(_net(), backend="cpp", debug_dir=str(tmp_path),
                         cache_artifacts=False, conv_channels_last=True)(x)
    out.sum().backward()
    (dump,) = tmp_path.rglob("42_kernels.txt")
    text = dump.read_text()
    assert "# forward" in text and "# backward" in text
    path = os.path.join(GOLDEN, "net_42_kernels.txt")
    if os.environ.get("TRAINC_UPDATE_GOLDEN") == "1":
        os.makedirs(GOLDEN, exist_ok=True)
        with open(path, "w") as f:
            f.write(text)
    with open(path) as f:
        assert text == f.read(), f"42_kernels.txt changed; if intended: TRAINC_UPDATE_GOLDEN=1 " \
                                 f"pytest {__file__}"
