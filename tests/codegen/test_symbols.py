"""Index symbols belong to the graph: each range carries its extent, each kernel prints over its
own symbols, so equal kernels print identically (in other graphs, in a graph compiled again)
without any renaming of the printed source, and one graph's compile leaves another's alone."""
import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from trainc import decomps
from trainc.codegen import ir, is_extern
from trainc.codegen.cpp.printer import MIN_INNER, SCRATCH_BYTES, kernel_source
from trainc.codegen.graph import lower
from trainc.codegen.lowerings import LOWERINGS
from trainc.codegen.scheduler import Kernel, schedule
from trainc.codegen.memory.inplace import plan_storage
from trainc.codegen.symbols import Indirect, Range, Symbols, indirect


def _schedule(fn, *args):
    gm = make_fx(lambda *a: tuple(fn(*a)), decomposition_table=decomps.TABLE,
                 tracing_mode="fake")(*args)
    sched = schedule(lower(gm, LOWERINGS, is_extern), scratch_bytes=SCRATCH_BYTES,
                     min_inner=MIN_INNER)
    plan_storage(sched)
    return sched


def _kernels(sched) -> list[Kernel]:
    return [k for k in sched.items if isinstance(k, Kernel)]


def _cpp(sched) -> list[str]:
    return [kernel_source(k, sched.graph)[0] for k in _kernels(sched)]


def _norm_rows(x):
    return (torch.softmax(x * 2, -1) + x.sum(0),)


def _norm_rows_then_mm(x):
    return _norm_rows(x)[0], x.t() @ x  # the same kernel, in a graph with more in it


def test_extent_is_part_of_the_symbol():
    """Symbols of equal name in two scopes are equal only with equal extents: sympy caches
    results by equality across graphs, and x // 4 is 0 only when x < 4."""
    a, b = Symbols(tag="").range("o", 4), Symbols(tag="").range("o", 8)
    assert a.name == b.name and a != b
    assert ir.FloorDiv(a, 4) == 0
    assert ir.FloorDiv(b, 4) != 0
    assert ir.bounds(3 * b + 1) == (1, 22)
    assert Symbols(tag="").range("o", 4) == a


def test_indirect_symbol_is_its_value():
    x = ir.Load("buf0", Symbols().range("i", 6), torch.int64)
    s = indirect(x, 10)
    assert isinstance(s, Indirect) and s.value == x and s.size == 10
    assert indirect(x, 10) == s and indirect(x, 11) != s
    assert ir.bounds(s) == (0, 9)
    assert ir.loads(ir.Load("arg1", 4 * s, torch.float32))[1] == x


def test_equal_kernels_in_other_graphs_print_identically():
    x = torch.randn(32, 48)
    first = _cpp(_schedule(_norm_rows, x))
    _schedule(lambda a: (a.cos().sum(1),), torch.randn(7, 5))  # another graph in between
    again = _cpp(_schedule(_norm_rows, x))
    other = _cpp(_schedule(_norm_rows_then_mm, x))
    assert again == first
    assert first[0] in other


def test_kernels_print_the_symbols_of_their_own_scope():
    sched = _schedule(_norm_rows, torch.randn(32, 48))
    src = _cpp(sched)[0]
    table = sched.graph.symbols
    own = table.kernels[_kernels(sched)[0].name].made
    assert all(s.name.startswith(("o", "i", "s", "v", "c")) for s in own)
    assert "o0" in src and "g" not in "".join(s.name for s in own)
    assert table.made and all("g" in s.name for s in table.made)  # analysis: the graph's own
    assert "kernel0: o0 < 32" in str(table)


def test_symbol_table_is_per_graph():
    """Compiling graph B adds nothing to graph A's table and changes none of its kernels."""
    sched_a = _schedule(_norm_rows, torch.randn(32, 48))
    src_a = _cpp(sched_a)
    table = sched_a.graph.symbols
    made = list(table.made)
    kernel_syms = {k: [(s.name, s.extent) for s in t.made] for k, t in table.kernels.items()}
    sched_b = _schedule(_norm_rows_then_mm, torch.randn(16, 8))
    _cpp(sched_b)
    assert sched_b.graph.symbols is not table
    assert table.made == made
    assert {k: [(s.name, s.extent) for s in t.made] for k, t in table.kernels.items()} == \
        kernel_syms
    assert _cpp(sched_a) == src_a


def test_triton_equal_kernels_print_identically_and_layers_share_one():
    pytest.importorskip("triton")
    from trainc.codegen.triton import _module_body
    from trainc.codegen.triton.printer import kernel_source as triton_source

    def two_layers(x, w1, w2):
        h = torch.relu(x @ w1).sin()
        return (torch.relu(h @ w2).sin(),)
    x, w = torch.randn(8, 16), torch.randn(16, 16)
    sched = _schedule(two_layers, x, w, w)
    srcs = [triton_source(k, sched.graph) for k in _kernels(sched)]
    assert len(srcs) == 2 and srcs[0].funcs == srcs[1].funcs
    assert srcs[0].source != srcs[1].source  # their names
    assert "kernel1 = kernel0" in _module_body(srcs)
    again = _schedule(lambda a: (torch.relu(a).sin(),), torch.randn(8, 16))
    assert triton_source(_kernels(again)[0], again.graph).funcs == srcs[0].funcs


def test_range_pickles():
    import pickle
    s = Symbols(tag="").range("i", 5)
    t = pickle.loads(pickle.dumps(s))
    assert isinstance(t, Range) and t == s and t.extent == 5


def test_kernel_table_lists_its_indirect_values():
    sched = _schedule(lambda w, i: (torch.nn.functional.embedding(i, w) * 2,),
                      torch.randn(20, 8), torch.randint(0, 20, (3, 5)))
    src = _cpp(sched)[0]
    (name, table), = sched.graph.symbols.kernels.items()
    (s,) = table.indirects.values()
    assert s.size == 20 and f"const int64_t {s.name} =" in src
    assert f"{s.name} < 20" in str(sched.graph.symbols)


def test_shared_ranges_are_one_set_per_prefix_and_shape():
    syms = Symbols()
    a = syms.shared("t", (4, 8))
    assert a == syms.shared("t", (4, 8)) and len(set(a)) == 2
    assert [s.extent for s in a] == [4, 8]
    assert not set(a) & set(syms.shared("t", (4, 9)))  # another shape: other symbols
    assert not set(a) & set(syms.shared("c", (4, 8)))  # another role in one expression
    assert not set(a) & set(syms.ranges("t", (4, 8)))  # fresh ranges stay fresh


def _index_math_misses(blocks: int) -> int:
    """ir.linear's memo misses while scheduling `blocks` equal layers."""
    def layers(x, w):
        for _ in range(blocks):
            x = (x * w).exp().transpose(0, 1).reshape(16, 8).sum(-1, keepdim=True) + x
        return [x]
    ir._linear.cache_clear()
    _schedule(layers, torch.randn(16, 8), torch.randn(16, 8))
    return ir._linear.cache_info().misses


def test_index_math_of_repeated_layers_is_done_once():
    """Analysis evaluates values over shared ranges, so a layer equal to an earlier one asks
    ir.linear only what it already answered: the misses do not grow with depth."""
    assert _index_math_misses(4) == _index_math_misses(2)


def test_memoised_linear_is_the_plain_sum():
    i, j = Symbols().ranges("x", (3, 5))
    assert ir.linear([i, j], [5, 1], 2) == 5 * i + j + 2
    assert ir.linear([1, j], (5, 1)) == j + 5  # an int index, as a size-1 dim gives
    assert ir.linear((ir.ModIndex(i, 3), ir.FloorDiv(i, 3)), [1, 3]) == i  # divmod merged
