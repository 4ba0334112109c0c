"""Debug output: one summary line per compile (TRAINC_DEBUG) and per-stage dumps (TRAINC_DEBUG_DIR).

Graph dumps are runnable Python: `python 30_fwd.py` rebuilds random inputs and runs the graph.
"""
from __future__ import annotations

import itertools
import os
import re
import sys
from typing import Optional

import torch
import torch.fx as fx

from trainc.config import Config

_ids = itertools.count()

_HEADER = """# trainc debug dump: {what}
# Runnable: `python {file}` builds random inputs and runs the graph once.
import torch
from torch import device, inf, nan
import trainc.rng  # registers torch.ops.trainc.*
aten = torch.ops.aten

"""

_FOOTER = """

def make_inputs():
    return [{inputs}]


if __name__ == "__main__":
    outs = GraphModule()(*make_inputs())
    print([tuple(o.shape) if isinstance(o, torch.Tensor) else o for o in outs])
"""


def next_graph_id() -> int:
    return next(_ids)


class Dumper:
    """Writes stage dumps under <debug_dir>/graph_<id>/ when a debug directory is configured."""

    def __init__(self, config: Config, graph_id: int):
        self.dir: Optional[str] = None
        if config.debug_dir:
            self.dir = os.path.join(config.debug_dir, f"graph_{graph_id}")
            os.makedirs(self.dir, exist_ok=True)

    def graph(self, name: str, gm: fx.GraphModule, what: str = "") -> None:
        if self.dir:
            self.text(name, graph_source(gm, what or name, name))

    def text(self, name: str, text: str) -> None:
        if self.dir:
            with open(os.path.join(self.dir, name), "w") as f:
                f.write(text)

    def compiled(self, number: str, stem: str, gm: Optional[fx.GraphModule], compiled,
                 what: str) -> None:
        """A graph given to the backend and what it made: <number>_<stem>.py (the graph),
        <number>_<stem>_wrapper.py, 43_<stem>_memory.txt; nothing for a graph that is None."""
        if gm is None or compiled is None:
            return
        self.graph(f"{number}_{stem}.py", gm, what)
        self.text(f"{number}_{stem}_wrapper.py", compiled.source)
        self.memory(f"43_{stem}_memory.txt", compiled)

    def codegen(self, **graphs) -> None:
        """The generated-code stages of each compiled graph, under the graph's name:
        40_lowered.txt (the lowered graph), 41_schedule.txt (its kernels and calls),
        42_kernels.txt (kernel plans); a file only where some graph's backend made its stage."""
        for file, key in (("40_lowered.txt", "lowered"), ("41_schedule.txt", "schedule"),
                          ("42_kernels.txt", "kernel_plans")):
            parts = [f"# {name}\n{g.extra[key]}\n" for name, g in graphs.items()
                     if g is not None and key in g.extra]
            if parts:
                self.text(file, "\n".join(parts))

    def memory(self, name: str, compiled) -> None:
        """A compiled graph's memory plan (codegen/memory/), where its backend made one."""
        plan = compiled.extra.get("memory_plan") if compiled is not None else None
        if self.dir and plan is not None:
            self.text(name, str(plan))

    def __call__(self, name: str, gm: fx.GraphModule) -> None:  # the pass manager's hook
        self.graph(name, gm, f"after pass {name}")


def graph_source(gm: fx.GraphModule, what: str, file: str) -> str:
    body = gm.print_readable(print_output=False, include_stride=True, include_device=True)
    body = re.sub(r"^class .*?\(torch\.nn\.Module\):", "class GraphModule(torch.nn.Module):",
                  body, count=1)
    inputs = ", ".join(_input_expr(n) for n in gm.graph.nodes if n.op == "placeholder")
    return _HEADER.format(what=what, file=file) + body + _FOOTER.format(inputs=inputs)


def _input_expr(node: fx.Node) -> str:
    v = node.meta.get("val")
    if not isinstance(v, torch.Tensor):
        return repr(v)
    args = f"{tuple(v.shape)}, dtype={v.dtype}, device={str(v.device)!r}"
    if v.dtype.is_floating_point:
        return f"torch.randn({args})"
    if v.dtype == torch.bool:
        return f"torch.zeros({args})"
    return f"torch.randint(0, 2, {tuple(v.shape)}, dtype={v.dtype}, device={str(v.device)!r})"


def summary(line: str) -> None:
    print(f"trainc: {line}", file=sys.stderr, flush=True)
