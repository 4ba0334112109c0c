"""scatter(zeros, dim, index, value) with one index per row -> where(iota == index, value, 0).

Cross-entropy's backward builds its one-hot this way: as a scatter it is a full-size tensor
written and read back (an 8192 x 32000 float32 one at a 1B Llama's loss); as a pointwise
comparison with an iota, codegen computes it inside the kernels that read it.
An index out of range gives a row of zeros here, where eager's scatter raises: the indices
this matches come from autograd's formulas (nll_loss's, clamped by its ignore_index mask).
"""
from __future__ import annotations

import torch
import torch.fx as fx

from trainc.graph import val
from trainc.passes._graph import fake_mode, infer_val, recompiled

aten = torch.ops.aten


def one_hot_scatters(gm: fx.GraphModule) -> fx.GraphModule:
    mode = fake_mode(gm)
    changed = False
    for node in list(gm.graph.nodes):
        if _is_one_hot(node):
            node.replace_all_uses_with(_where_iota(gm, node, mode))
            gm.graph.erase_node(node)
            changed = True
    if changed:
        gm.graph.eliminate_dead_code()
        recompiled(gm)
    return gm


def _is_one_hot(node: fx.Node) -> bool:
    if node.op != "call_function" or node.target is not aten.scatter.value or node.kwargs:
        return False
    base, dim, index, value = node.args
    if not (_zeros(base) and isinstance(value, (int, float)) and isinstance(index, fx.Node)):
        return False
    out, idx = val(node), val(index)
    if not isinstance(out, torch.Tensor) or not isinstance(idx, torch.Tensor) or \
            out.dim() == 0 or not out.is_contiguous():  # where() gives a contiguous result
        return False
    dim = dim % out.dim()
    # one position per row, and a row for every output row (else scatter leaves rows alone)
    return idx.shape[dim] == 1 and all(idx.shape[d] == out.shape[d]
                                       for d in range(out.dim()) if d != dim)


def _zeros(n) -> bool:
    return isinstance(n, fx.Node) and (n.target is aten.zeros_like.default or (
        n.target is aten.full_like.default and n.args[1] == 0))


def _where_iota(gm: fx.GraphModule, node: fx.Node, mode) -> fx.Node:
    base, dim, index, value = node.args
    out = val(node)
    dim = dim % out.dim()
    shape = [1] * out.dim()
    shape[dim] = out.shape[dim]
    g = gm.graph
    with g.inserting_before(node):
        new = [g.call_function(aten.arange.default, (out.shape[dim],),
                               {"dtype": val(index).dtype, "device": out.device})]
        new.append(g.call_function(aten.view.default, (new[-1], shape)))
        new.append(g.call_function(aten.eq.Tensor, (index, new[-1])))
        fill = g.call_function(aten.scalar_tensor.default, (value,),
                               {"dtype": out.dtype, "device": out.device})
        zero = g.call_function(aten.scalar_tensor.default, (0,),
                               {"dtype": out.dtype, "device": out.device})
        new += [fill, zero, g.call_function(aten.where.self, (new[-1], fill, zero))]
    for n in new:
        infer_val(n, mode)
    return new[-1]
