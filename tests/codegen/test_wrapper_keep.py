"""Buffers the C++ wrapper keeps across calls (codegen/wrapper.py `keep`): only those whose
storage never leaves the wrapper; results of one call survive the next; concurrent calls get
their own set."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from trainc.codegen.wrapper import Kept
from trainc.config import make_config
from cpp_helpers import assert_same, compile_cpp

KEEP = make_config(cpp_keep_buffers=True)  # opt-in: kept bytes are not in peak measurements


def _net(x, w1, w2):
    # softmax(x) feeds an extern (mm): a buffer no one outside sees; h is returned.
    h = torch.softmax(x, -1) @ w1
    return F.gelu(h) @ w2, h * 2


def _args(seed: int):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(16, 32, generator=g), torch.randn(32, 64, generator=g),
            torch.randn(64, 8, generator=g)]


def _storages(ts) -> set[int]:
    return {t.untyped_storage().data_ptr() for t in ts if isinstance(t, torch.Tensor)}


def test_kept_buffers_never_alias_results_and_results_survive_the_next_call():
    c = compile_cpp(_net, *_args(0), config=KEEP)
    assert c.extra["kept_bytes"] > 0 and "KEEP.acquire()" in c.source
    kept = c.run.__globals__["KEEP"]
    first = c.run(_args(0))
    saved = [t.clone() for t in first]
    second = c.run(_args(1))
    for k, (a, b) in enumerate(zip(first, saved)):  # call 2 wrote nothing of call 1's
        assert torch.equal(a, b), f"output {k} of the first call changed"
    for k, (o, r) in enumerate(zip(second, _net(*_args(1)))):
        assert_same(o, r, 1e-5, 1e-6, f"output {k}")
    assert len(kept.free) == 1, "one call at a time reuses one set"
    held = _storages(kept.free[0])
    assert held and not held & _storages(first + second), "a kept buffer was returned"


def test_kept_buffers_are_the_same_storage_across_calls():
    c = compile_cpp(_net, *_args(0), config=KEEP)
    kept = c.run.__globals__["KEEP"]
    c.run(_args(0))
    ptrs = [t.data_ptr() for t in kept.free[0]]
    c.run(_args(1))
    assert [t.data_ptr() for t in kept.free[0]] == ptrs


def test_concurrent_calls_get_their_own_buffers():
    k = Kept(64, [(0, (4, 4), (4, 1), torch.float32)])
    a = k.acquire()
    b = k.acquire()  # a call while another is in flight (re-entrant or another thread)
    assert a[0].data_ptr() != b[0].data_ptr()
    k.release(a)
    k.release(b)
    assert k.acquire()[0].data_ptr() in (a[0].data_ptr(), b[0].data_ptr())


def test_kept_arena_overlaps_only_buffers_that_are_never_alive_together():
    from trainc.codegen.memory.kept import pack as _pack
    sizes = [1000, 1000, 500, 64, 0]
    spans = [(0, 4), (5, 9), (3, 6), (0, 9), (2, 2)]
    offsets, total = _pack(sizes, spans)
    for i in range(len(sizes)):
        for j in range(i):
            together = spans[i][0] <= spans[j][1] and spans[j][0] <= spans[i][1]
            apart = offsets[i] + sizes[i] <= offsets[j] or offsets[j] + sizes[j] <= offsets[i]
            assert apart or not together, (i, j, offsets)
    assert offsets[0] == offsets[1]  # never alive together: one place
    assert total % 64 == 0 and total < sum(sizes)
    c = compile_cpp(_net, *_args(0), config=KEEP)
    kept = c.run.__globals__["KEEP"]
    assert c.extra["kept_bytes"] == kept.nbytes <= c.extra["peak_bytes"]


def test_keep_off_allocates_per_call():
    from torch.fx.experimental.proxy_tensor import make_fx
    from trainc import decomps
    from trainc.codegen.cpp import CppBackend
    from trainc.config import make_config
    args = _args(0)
    gm = make_fx(lambda *a: tuple(_net(*a)), decomposition_table=decomps.TABLE,
                 tracing_mode="fake")(*args)
    c = CppBackend(make_config(cpp_keep_buffers=False)).compile(gm, args)
    assert c.extra["kept_bytes"] == 0 and "KEEP" not in c.source
    for o, r in zip(c.run(list(args)), _net(*args)):
        assert_same(o, r, 1e-5, 1e-6)


def test_peak_bytes_counts_the_arena_a_run_holds():
    from trainc.report import peak_bytes
    c = compile_cpp(_net, *_args(0), config=KEEP)
    cpu = torch.device("cpu")
    first = peak_bytes(lambda: c.run(_args(0)), cpu)  # allocates the arena: an allocator event
    again = peak_bytes(lambda: c.run(_args(1)), cpu)  # reuses it: held from before
    twice = peak_bytes(lambda: (c.run(_args(0)), c.run(_args(1))), cpu)
    arena = c.run.__globals__["KEEP"].nbytes
    assert arena > 0 and again >= arena and abs(again - first) <= arena // 2
    # the first call's results stay alive through the second; one arena, counted once
    held = sum(t.nbytes for t in c.run(_args(0)))
    assert twice >= arena and twice < again + held + arena
