"""Safety check for graphs with mutation: simulate buffer versions in program order and prove
that every read sees the value the functional graph meant, and that graph inputs are only
written when the program itself mutated them (gm.meta[MUTABLE_INPUTS]). Raises MutationError.
"""
from __future__ import annotations

import torch.fx as fx

from trainc.passes._graph import alias_base, is_view, written_args
from trainc.passes.reinplace_ops import MUTABLE_INPUTS


class MutationError(AssertionError):
    """A mutation in a graph makes some reader see the wrong value."""


def check_mutations(gm: fx.GraphModule) -> fx.GraphModule:
    problems = find_mutation_problems(gm)
    if problems:
        raise MutationError("trainc: unsafe mutation in graph:\n  " + "\n  ".join(problems))
    return gm


def find_mutation_problems(gm: fx.GraphModule) -> list[str]:
    mutable = dict(gm.meta.get(MUTABLE_INPUTS, {}))
    root: dict[fx.Node, fx.Node] = {}
    stamp: dict[fx.Node, int] = {}  # the buffer version a node's value is
    version: dict[fx.Node, int] = {}  # the current version of each buffer (root)
    writer: dict[fx.Node, fx.Node] = {}  # the last node that wrote each buffer
    problems: list[str] = []
    for n in gm.graph.nodes:
        if not is_view(n):
            for a in n.all_input_nodes:
                if stamp[a] != version[root[a]]:
                    problems.append(f"{n.name} reads {a.name}, whose buffer {root[a].name} was "
                                    f"overwritten by {writer[root[a]].name} before")
        writes = written_args(n)
        for w in writes:
            problems += _write_problems(n, w, root, mutable)
            version[root[w]] += 1
            writer[root[w]] = n
        base = alias_base(n)
        if base is None:
            root[n], stamp[n], version[n] = n, 0, 0
        else:
            root[n] = root[base]
            stamp[n] = version[root[n]] if writes else stamp[base]
    written = {r for r, v in version.items() if v > 0}
    return problems + _output_problems(gm, root, written, mutable)


def _write_problems(n: fx.Node, w: fx.Node, root: dict, mutable: dict) -> list[str]:
    r = root[w]
    out = []
    if r.op == "placeholder" and r.name not in mutable:
        out.append(f"{n.name} writes graph input {r.name}, which the program does not mutate")
    elif r.op not in ("placeholder", "call_function"):
        out.append(f"{n.name} writes {r.name}, which is not a buffer the graph owns")
    for a in n.all_input_nodes:
        if a is not w and root.get(a) is r:
            out.append(f"{n.name} writes {w.name} while reading {a.name}, another view of it")
    return out


def _output_problems(gm: fx.GraphModule, root: dict, written: set, mutable: dict) -> list[str]:
    """An output slot may hold a program-mutated input's buffer only as its write-back slot."""
    outs = gm.graph.output_node().args[0]
    problems = []
    for k, o in enumerate(outs if isinstance(outs, (list, tuple)) else [outs]):
        r = root.get(o) if isinstance(o, fx.Node) else None
        if r is not None and r in written and r.op == "placeholder" and mutable.get(r.name) != k:
            problems.append(f"output {k} ({o.name}) shares the buffer of mutated input {r.name}")
    return problems
