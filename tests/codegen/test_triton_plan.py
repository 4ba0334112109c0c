"""Triton kernel plans (codegen/triton/plan.py): how each kernel is tiled (1-D, transposing
tile, persistent / looped / column rows, split, scatter), its int64 index math, barriers and
launch configs, decided before printing as frozen data; the printer spells a plan, so printing
a hand-modified plan changes the code (and what the launcher runs) accordingly."""
import dataclasses
import os

import pytest
import torch
from torch import nn
from torch.fx.experimental.proxy_tensor import make_fx

pytest.importorskip("triton", reason="triton is not installed")

import trainc  # noqa: E402
from trainc import decomps  # noqa: E402
from trainc.codegen import is_extern  # noqa: E402
from trainc.codegen.graph import lower  # noqa: E402
from trainc.codegen.lowerings import LOWERINGS  # noqa: E402
from trainc.codegen.memory.inplace import plan_storage  # noqa: E402
from trainc.codegen.scheduler import Kernel, schedule  # noqa: E402
from trainc.codegen.split_reductions import split_reductions  # noqa: E402
from trainc.codegen.triton.configs import LaunchConfig, candidates, heuristic  # noqa: E402
from trainc.codegen.triton.launch import Launcher, load_module  # noqa: E402
from trainc.codegen.triton.plan import (GPU, KernelPlan, LoopPlan, TritonTarget,  # noqa: E402
                                        plan_kernel)
from trainc.codegen.triton.prelude import PRELUDE  # noqa: E402
from trainc.codegen.triton.printer import kernel_source, print_kernel  # noqa: E402
from trainc.config import make_config  # noqa: E402

GOLDEN = os.path.join(os.path.dirname(__file__), "golden")


def _schedule(fn, *args, target=GPU):
    gm = make_fx(lambda *a: tuple(fn(*a)), decomposition_table=decomps.TABLE,
                 tracing_mode="fake")(*args)
    lowered = lower(gm, LOWERINGS, is_extern, False, store_scalars=True)
    sched = schedule(split_reductions(lowered), register_row=target.persistent_limit)
    plan_storage(sched)
    return sched


def _plans(fn, *args, target=GPU):
    """[(kernel, plan)] of fn's graph, and the lowered graph."""
    sched = _schedule(fn, *args, target=target)
    kernels = [k for k in sched.items if isinstance(k, Kernel)]
    return [(k, plan_kernel(k, sched.graph, target)) for k in kernels], sched.graph


def _only(fn, *args, **kw):
    plans, g = _plans(fn, *args, **kw)
    assert len(plans) == 1, [str(p) for _, p in plans]
    return plans[0][0], plans[0][1], g


def test_rows_plan_persistent_looped_or_column():
    _, row, _ = _only(lambda x: (x.sum(1),), torch.randn(64, 48))
    assert row.mode == "persistent" and row.kind == "2d" and row.rblock == 64
    assert row.loops[0].width == 64 and (row.xnumel, row.rnumel) == (64, 48)
    _, long, _ = _only(lambda x: (x.sum(1),), torch.randn(4, 5000))
    assert long.mode == "looped" and long.rblock == 0 and long.loops[0].width == 0
    _, col, _ = _only(lambda x: (x.sum(0),), torch.randn(64, 48))  # loads run along x
    assert col.mode == "column" and col.kind == "2d"
    _, narrow, _ = _only(lambda x: (x.sum(1),), torch.randn(4, 5000),
                         target=TritonTarget(persistent_limit=8192))
    assert narrow.mode == "persistent" and narrow.rblock == 8192


def test_transposing_pointwise_kernels_plan_a_tile():
    _, plan, _ = _only(lambda x: (x.t().contiguous() * 2,), torch.randn(256, 256))
    assert plan.mode == "tile" and plan.kind == "1d" and plan.tile == (1, 0)
    assert "stores along dim 1, loads along dim 0" in str(plan)
    _, flat, _ = _only(lambda x: (x.t().contiguous() * 2,), torch.randn(256, 256),
                       target=TritonTarget(transpose_min=1 << 20))
    assert flat.mode == "1d" and flat.tile is None
    _, small, _ = _only(lambda x: (x * 2,), torch.randn(256, 256))
    assert small.mode == "1d" and small.tile is None


def test_scalar_reductions_split_into_chunks_the_target_sets():
    _, plan, _ = _only(lambda x: (x.sum(),), torch.randn(300000))
    assert plan.mode == "split" and plan.loops[0].chunks == 37  # 8192 elements a program
    assert "37 chunks" in str(plan)
    _, fewer, _ = _only(lambda x: (x.sum(),), torch.randn(300000),
                        target=TritonTarget(chunk_target=1 << 16))
    assert fewer.loops[0].chunks == 5
    _, whole, _ = _only(lambda x: (x.sum(),), torch.randn(300000),
                        target=TritonTarget(split_limit=1 << 20))
    assert whole.mode == "looped" and whole.xnumel == 1


def test_16_bit_scatter_adds_accumulate_in_float32():
    def f(x, idx, v):
        return (x.index_add(0, idx, v),)
    idx = torch.randint(0, 16, (12,))
    for dtype, acc in ((torch.float32, False), (torch.bfloat16, True)):
        plans, _ = _plans(f, torch.randn(16, 8, dtype=dtype), idx, torch.randn(12, 8,
                                                                                dtype=dtype))
        (plan,) = [p for _, p in plans if p.mode == "scatter"]
        assert plan.accumulate32 == acc and plan.configs == (plan.configs[0],)
        assert (plan.xnumel, plan.rnumel) == (128, 96)


def test_int64_indices_only_past_int32():
    k, plan, g = _only(lambda x: (x.expand(65536, 32768) + 1,), torch.randn(1, 32768))
    assert plan.index64 and "int64 indices" in str(plan)
    assert "tl.program_id(0).to(tl.int64)" in print_kernel(k, plan, g).source
    narrow = print_kernel(k, dataclasses.replace(plan, index64=False), g).source
    assert "int64" not in narrow
    _, small, _ = _only(lambda x: (x + 1,), torch.randn(8, 8))
    assert not small.index64


def _residual_norm(x, y):
    h = x + y
    return h, torch.nn.functional.layer_norm(h, (96,))


def test_a_loop_reading_rows_an_earlier_loop_stored_waits_for_them():
    k, plan, g = _only(_residual_norm, torch.randn(8, 96), torch.randn(8, 96))
    assert [lp.barrier for lp in plan.loops] == [False, True, True]  # both read h's rows
    assert "barrier before" in str(plan)
    assert print_kernel(k, plan, g).source.count("tl.debug_barrier()") == 2
    loops = tuple(dataclasses.replace(lp, barrier=False) for lp in plan.loops)
    free = print_kernel(k, dataclasses.replace(plan, loops=loops), g).source
    assert "tl.debug_barrier()" not in free
    _, norm, _ = _only(lambda x: (torch.nn.functional.layer_norm(x, (96,)),), torch.randn(8, 96))
    assert not any(lp.barrier for lp in norm.loops)  # reads only its input


def test_configs_are_the_heuristic_then_the_candidates():
    for fn, x in ((lambda x: (x.sum(1),), torch.randn(64, 48)),
                  (lambda x: (x.sum(0),), torch.randn(64, 48)),
                  (lambda x: (x.sum(1),), torch.randn(4, 5000)),
                  (lambda x: (x.exp(),), torch.randn(3000))):
        k, plan, g = _only(fn, x)
        args = (plan.kind, plan.xnumel, plan.rnumel, plan.rblock, plan.mode == "column")
        assert plan.configs[0] == heuristic(*args) and plan.configs == candidates(*args)
        assert len(set(plan.configs)) == len(plan.configs)
        assert print_kernel(k, plan, g).configs == plan.configs
    assert str(LaunchConfig(16, 128, 4, 2)) == "X16 R128 w4 s2"


def test_plans_are_frozen():
    _, plan, _ = _only(lambda x: (x.sum(1),), torch.randn(64, 48))
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.mode = "looped"
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.loops[0].width = 8
    assert isinstance(plan, KernelPlan) and isinstance(plan.loops[0], LoopPlan)


def test_print_kernel_spells_the_plan_and_kernel_source_plans_it():
    fn, x = (lambda x: (torch.softmax(x, -1),)), torch.randn(8, 100)
    k, plan, g = _only(fn, x)
    src = print_kernel(k, plan, g)
    sched = _schedule(fn, x)
    (k2,) = [i for i in sched.items if isinstance(i, Kernel)]
    again = kernel_source(k2, sched.graph, precise_div=False)
    assert again.source == src.source and again.params == src.params
    assert "tl.div_rn" not in src.source
    precise = kernel_source(_kernels(fn, x)[0], _schedule(fn, x).graph)
    assert plan.precise_div is False and precise.source != src.source  # IEEE division


def _kernels(fn, *args):
    return [i for i in _schedule(fn, *args).items if isinstance(i, Kernel)]


def test_a_hand_modified_plan_changes_the_code_and_still_computes_the_kernel():
    x = torch.randn(64, 48)
    k, plan, g = _only(lambda x: (x.sum(1),), x)
    persistent = print_kernel(k, plan, g)
    assert "RBLOCK" not in persistent.source and "tl.arange(0, 64)" in persistent.source
    looped_plan = dataclasses.replace(
        plan, mode="looped", rblock=0, loops=(dataclasses.replace(plan.loops[0], width=0),),
        configs=(LaunchConfig(8, 16, 4, 1),))
    looped = print_kernel(k, looped_plan, g)
    assert "for r0 in range(0, 48, RBLOCK):" in looped.source and looped.rblock == 0
    mod, _ = load_module(PRELUDE + "\n\n" + looped.source + "\n", make_config())
    out = torch.empty(64)
    args = [x if p == g.inputs[0] else out for p in looped.params]
    Launcher(looped, mod, make_config(), interpret=True)(*args)
    torch.testing.assert_close(out, x.sum(1))


def test_dropping_the_tile_from_a_plan_prints_a_plain_1d_kernel():
    k, plan, g = _only(lambda x: (x.t().contiguous() * 2,), torch.randn(256, 256))
    tiled = print_kernel(k, plan, g).source
    plain = print_kernel(k, dataclasses.replace(plan, mode="1d", tile=None), g).source
    assert "tile = " in tiled and "tile = " not in plain and "xmask = xindex < 65536" in plain


def test_a_plan_of_another_kernel_is_refused():
    plans, g = _plans(lambda x: (x.sum(0), x.sum(1, keepdim=True).exp() * x),
                      torch.randn(64, 48))
    assert len(plans) >= 2
    (k0, _), (k1, p1) = plans[0], plans[1]
    with pytest.raises(ValueError, match="plan of"):
        print_kernel(k0, p1, g)
    with pytest.raises(ValueError, match="loops, the kernel"):
        print_kernel(k1, dataclasses.replace(p1, loops=p1.loops + p1.loops), g)


class _Net(nn.Module):
    """Embedding (a scatter in the backward), layer norm, GELU, softmax."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.emb = nn.Embedding(20, 16)
        self.body = nn.Sequential(nn.Linear(16, 32), nn.LayerNorm(32), nn.GELU(),
                                  nn.Linear(32, 8), nn.Softmax(-1))

    def forward(self, ids):
        return self.body(self.emb(ids))


def test_kernel_plans_dump_matches_golden(tmp_path):
    """42_kernels.txt of a small net's forward and backward on triton (TRAINC_DEBUG_DIR, under
    the interpreter): pinned, so a change to what the Triton backend plans shows here.
    Regenerate with TRAINC_UPDATE_GOLDEN=1."""
    ids = torch.tensor([3, 7, 3, 19])
    out = trainc.compile(_Net(), backend="triton", debug_dir=str(tmp_path),
                         cache_artifacts=False)(ids)
    out.sum().backward()
    (dump,) = tmp_path.rglob("42_kernels.txt")
    text = dump.read_text()
    assert "# forward" in text and "# backward" in text and "triton target:" in text
    assert ": scatter," in text and ": persistent," in text
    path = os.path.join(GOLDEN, "triton_net_42_kernels.txt")
    if os.environ.get("TRAINC_UPDATE_GOLDEN") == "1":
        os.makedirs(GOLDEN, exist_ok=True)
        with open(path, "w") as f:
            f.write(text)
    with open(path) as f:
        assert text == f.read(), f"42_kernels.txt changed; if intended: TRAINC_UPDATE_GOLDEN=1 " \
                                 f"pytest {__file__}"
