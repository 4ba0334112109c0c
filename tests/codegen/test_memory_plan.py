"""The wrapper's memory plan (codegen/memory/): events, reuse, frees after the last use, kept
buffers' offsets, the planned peak and the buffers live there, on small graphs worked out by
hand; the peak against an independent recount of the storages; the TRAINC_DEBUG_DIR dump."""
from __future__ import annotations

import glob
import os
import re

import pytest
import torch

import trainc
from trainc.codegen import wrapper as W
from trainc.codegen.memory import MemoryPlan
from trainc.codegen.memory.walk import Event
from trainc.config import make_config
from cpp_helpers import compile_cpp

ATEN_MM = make_config(cpp_gemm="aten", cpp_keep_buffers=True)


def _softmax_mm(x, w):
    return (torch.softmax(x, -1) @ w) * 2


def _relu_chain(x, w):
    return (torch.relu(torch.relu(x) @ w) @ w).sum()


def _plan(fn, *args) -> tuple[MemoryPlan, str]:
    c = compile_cpp(fn, *args, config=ATEN_MM)
    return c.extra["memory_plan"], c.source.split("# C++ kernels")[0]


def _made(plan: MemoryPlan, item: int) -> str:
    return next(e.buf for e in plan.item_events(item) if e.kind in ("alloc", "reuse"))


def test_events_peak_and_kept_offsets_of_a_softmax_then_mm():
    """kernel s = softmax(x) (16x32 f32: 2048 B); mm m = s @ w into a buffer it allocates
    (16x64: 4096 B); kernel out = m * 2 (4096 B, the output). s dies at the mm, m after out is
    written: the peak is m + out = 8192 B at out's allocation."""
    plan, src = _plan(_softmax_mm, torch.randn(16, 32), torch.randn(32, 64))
    assert plan.forms == ("kernel", "out", "kernel")
    s, m, out = (_made(plan, k) for k in range(3))
    assert [(e.item, e.kind) for e in plan.events] == [
        (0, "alloc"), (0, "free"), (1, "alloc"), (1, "free"), (1, "free"), (2, "alloc"),
        (2, "free")]
    assert [e.buf for e in plan.events if e.kind == "free" and e.delta] == [s, m]
    assert plan.live_bytes == (2048, 2048, 6144, 6144, 4096, 8192, 4096)
    assert (plan.peak_bytes, plan.peak_event) == (8192, 5)
    assert plan.at_peak == {m: 4096, out: 4096}
    assert plan.live_at(4) == {m: 4096}
    assert plan.fresh_bytes == 2048 + 4096 + 4096
    # kept: s and m (the output leaves); alive together, so m (larger) at 0 and s after it
    assert [(k.buf, k.offset, k.nbytes) for k in plan.kept] == [(s, 4096, 2048), (m, 0, 4096)]
    assert plan.arena_bytes == 6144
    assert f"{s} = KEPT[0]" in src and f"{m} = KEPT[1]" in src and f"{out} = empty(" in src
    assert "planned peak 0.008 MiB" in src


def test_a_dead_buffer_is_reused_by_the_next_allocation_of_its_size():
    """relu(x) -> mm -> relu -> mm -> sum, every buffer 16x32 f32: the first relu's buffer dies at
    the first mm, right before the second relu allocates the same size, so that relu takes it;
    the first mm's buffer serves the second mm. Two buffers' storage in all: peak 4096 B."""
    plan, src = _plan(_relu_chain, torch.randn(16, 32), torch.randn(32, 32))
    a, m1 = _made(plan, 0), _made(plan, 1)
    reuses = [(e.item, e.buf, e.src) for e in plan.events if e.kind == "reuse"]
    assert [(k, s) for k, _, s in reuses] == [(2, a), (3, m1)]
    pooled = [(e.item, e.buf) for e in plan.events if e.kind == "pool"]
    assert (1, a) in pooled and (2, m1) in pooled
    assert plan.peak_bytes == 4096 and set(plan.at_peak) == {a, m1}
    assert plan.fresh_bytes == 2048 + 2048 + 4  # the sum's 0-d result
    assert sorted(k.offset for k in plan.kept) == [0, 2048] and plan.arena_bytes == 4096
    for k, new, old in reuses:
        assert f"{new} = {old}.view([16, 32]); del {old}" in src


def _body(src: str) -> list[str]:
    return [l.strip() for l in src.splitlines() if l.startswith("    ")]


@pytest.mark.parametrize("fn,shapes", [(_softmax_mm, [(16, 32), (32, 64)]),
                                       (_relu_chain, [(16, 32), (32, 32)])])
def test_frees_come_after_the_last_use(fn, shapes):
    plan, src = _plan(fn, *[torch.randn(s) for s in shapes])
    lines = _body(src)
    for e in plan.events:
        if e.kind not in ("free", "drop"):
            continue
        at = lines.index(f"del {e.buf}")
        later = [l for l in lines[at + 1:] if re.search(rf"\b{e.buf}\b", l)]
        assert not later, f"{e.buf} used after its del: {later}"
        earlier = [l for l in lines[:at] if re.search(rf"\b{e.buf}\b", l)]
        assert earlier, f"{e.buf} freed but never used"


def _recount(plan: MemoryPlan, sizes: dict[str, int]) -> list[tuple[int, dict]]:
    """Independently of MemoryPlan's arithmetic: per event, the live storages (each with the
    names that hold it) and their bytes. A storage lives while any name holds it; inputs' and
    constants' storages are not the wrapper's (0 bytes)."""
    holder: dict[str, int] = {}  # name -> storage id
    nbytes: dict[int, int] = {}
    out = []
    for e in plan.events:
        if e.kind in ("alloc", "aten"):
            holder[e.buf] = len(nbytes)
            nbytes[len(nbytes)] = sizes[e.buf]
        elif e.kind in ("reuse", "inplace"):
            if e.src not in holder:  # an input's storage
                holder[e.src] = len(nbytes)
                nbytes[len(nbytes)] = 0
            holder[e.buf] = holder[e.src]
            if e.kind == "reuse":  # `del old` on the same line
                del holder[e.src]
        elif e.kind in ("free", "drop"):
            holder.pop(e.buf, None)
        live = {}
        for name, sid in holder.items():
            if nbytes[sid]:
                live.setdefault(sid, set()).add(name)
        out.append((sum(nbytes[s] for s in live), live))
    return out


def _mlp_step(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(24, 48), torch.nn.GELU(),
                                torch.nn.LayerNorm(48), torch.nn.Linear(48, 24))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x = torch.randn(8, 24)
    step = trainc.compile_step(model, lambda m, b: m(b).square().mean(), opt, backend="cpp",
                               debug_dir=str(tmp_path / "step"), cache_artifacts=False)
    step(x)
    f = trainc.compile(model, backend="cpp", debug_dir=str(tmp_path / "fb"),
                       cache_artifacts=False)
    f(x).sum().backward()


def _dumped_plans(tmp_path) -> dict[str, str]:
    return {os.path.relpath(p, tmp_path): open(p).read()
            for p in glob.glob(str(tmp_path / "**" / "43_*memory.txt"), recursive=True)}


def test_the_plan_is_dumped_per_graph_and_agrees_with_its_wrapper(tmp_path):
    _mlp_step(tmp_path)
    dumps = _dumped_plans(tmp_path)
    names = sorted(os.path.basename(p) for p in dumps)
    assert names == ["43_bwd_memory.txt", "43_fwd_memory.txt", "43_step_memory.txt"], names
    for rel, text in dumps.items():
        wrapper = open(os.path.join(tmp_path, os.path.dirname(rel),
                                    {"43_bwd_memory.txt": "31_bwd_wrapper.py",
                                     "43_fwd_memory.txt": "30_fwd_wrapper.py",
                                     "43_step_memory.txt": "30_step_wrapper.py"}
                                    [os.path.basename(rel)])).read()
        peak = int(re.search(r"planned peak (\d+) B", text).group(1))
        mib = float(re.search(r"# planned peak ([\d.]+) MiB", wrapper).group(1))
        assert abs(peak / 2**20 - mib) < 1e-3, rel
        assert re.search(r"^\s+\d+\s+item\s+\d+\s+alloc ", text, re.M), rel


def test_the_peak_agrees_with_a_recount_of_the_storages(tmp_path):
    """The mlp's forward, backward and whole Adam step (in-place updates, reuse, kept
    buffers): every event's live bytes, the peak and the buffers live there, recounted."""
    plans = []
    real = W.plan_memory

    def spy(sched, *a, **k):
        plan = real(sched, *a, **k)
        plans.append((plan, {n: b.nbytes for n, b in sched.graph.buffers.items()}))
        return plan
    mp = pytest.MonkeyPatch()
    mp.setattr(W, "plan_memory", spy)
    try:
        _mlp_step(tmp_path)
    finally:
        mp.undo()
    assert len(plans) >= 3  # the step, the forward, the backward(s)
    assert any(e.kind == "inplace" for p, _ in plans for e in p.events), "no in-place result"
    for plan, sizes in plans:
        counts = _recount(plan, sizes)
        assert [b for b, _ in counts] == list(plan.live_bytes)
        assert plan.peak_bytes == max(b for b, _ in counts) > 0
        at = plan.peak_event
        assert counts[at][0] == plan.peak_bytes and all(b < plan.peak_bytes
                                                       for b, _ in counts[:at])
        live = counts[at][1]
        assert len(plan.at_peak) == len(live)
        assert all(any(n in names for names in live.values()) for n in plan.at_peak)
        assert sum(plan.at_peak.values()) == plan.peak_bytes
        _check_kept(plan)


def _check_kept(plan: MemoryPlan) -> None:
    """Kept buffers alive at the same time never share arena bytes; all fit in the arena."""
    ks = plan.kept
    for i, a in enumerate(ks):
        assert a.offset % 64 == 0 and a.offset + a.nbytes <= plan.arena_bytes
        for b in ks[:i]:
            together = a.span[0] <= b.span[1] and b.span[0] <= a.span[1]
            apart = a.offset + a.nbytes <= b.offset or b.offset + b.nbytes <= a.offset
            assert apart or not together or 0 in (a.nbytes, b.nbytes), (a, b)


def test_plan_prints_itself_and_rejects_an_event_it_does_not_have():
    plan = MemoryPlan((Event(0, "alloc", "buf0", 64), Event(0, "aten", "buf1", 32),
                       Event(1, "free", "buf0", -64)), ("kernel", "aten"), ())
    assert plan.live_bytes == (64, 96, 32)
    assert (plan.peak_bytes, plan.peak_event, plan.at_peak) == (96, 1, {"buf0": 64, "buf1": 32})
    text = str(plan)
    assert "planned peak 96 B" in text and "<- peak" in text and "buf1" in text
    with pytest.raises(IndexError, match="no event 3"):
        plan.live_at(3)
    empty = MemoryPlan((), (), ())
    assert (empty.peak_bytes, empty.peak_event, empty.at_peak) == (0, None, {})


def test_plan_memory_without_keep_keeps_nothing():
    c = compile_cpp(_softmax_mm, torch.randn(16, 32), torch.randn(32, 64),
                 config=make_config(cpp_gemm="aten", cpp_keep_buffers=False))
    plan = c.extra["memory_plan"]
    assert plan.kept == () and plan.arena_bytes == 0 and "KEPT" not in c.source
    assert plan.peak_bytes == c.extra["peak_bytes"] == 8192
