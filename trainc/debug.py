"""Debug output: one summary line per compile (TRAINC_DEBUG) and per-stage dumps (TRAINC_DEBUG_DIR).

Graph dumps are runnable Python: `python 30_fwd.py` rebuilds random inputs and runs the graph.
"""
from __future__ import annotations

import itertools
import os
import re
import sys
import time
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
        self.graph_id, self.print_stages = graph_id, config.debug
        self.stages: list[tuple[str, float]] = []  # (stage, compile seconds), see lap()
        self._t = time.perf_counter()
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

    def lap(self, stage: str) -> None:
        """`stage` ended now: its seconds are the time since the previous lap (or the start)."""
        now = time.perf_counter()
        self.stages.append((stage, now - self._t))
        self._t = now

    def finish(self) -> None:
        """50_stages.txt (seconds per stage) and, with TRAINC_DEBUG, the same on one line."""
        line = ", ".join(f"{s} {t:.3f}" for s, t in self.stages)
        self.text("50_stages.txt", "".join(f"{s:<24} {t:8.3f} s\n" for s, t in self.stages))
        if self.print_stages:
            summary(f"graph_{self.graph_id} stage seconds: {line}")

    def kernels(self, **graphs) -> None:
        """44_kernel_bytes.txt: one line per generated kernel of each compiled graph (the nodes it
        computes, the bytes it reads and writes) and each graph's codegen seconds."""
        lines = []
        for name, g in graphs.items():
            if g is None:
                continue
            secs = g.extra.get("seconds")
            lines.append(f"# {name}: {len(g.kernels)} kernels" +
                         (f", codegen {secs:.3f} s" if secs is not None else "") +
                         (f", fallbacks {', '.join(g.fallback_ops)}" if g.fallback_ops else ""))
            lines += [f"{k.name:<12} read {k.bytes_read:>10} B  written {k.bytes_written:>10} B"
                      f"  nodes {', '.join(k.nodes)}" for k in g.kernels]
        if lines:
            self.text("44_kernel_bytes.txt", "\n".join(lines) + "\n")

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
