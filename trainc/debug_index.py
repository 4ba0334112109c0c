"""`python -m trainc debug DIR`: a TRAINC_DEBUG_DIR dump -> a printed index, one block per graph.

Reads only the files trainc/debug.py writes; a file that is missing is left out of the index.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

_NODE = re.compile(r"^\s+\w+: \"[^\"]*\" = ", re.M)  # one graph node in a graph dump


@dataclass
class GraphIndex:
    name: str
    stages: list[tuple[str, int]] = field(default_factory=list)  # (file, nodes)
    seconds: list[str] = field(default_factory=list)  # lines of 50_stages.txt
    partition: str = ""
    kernels: list[str] = field(default_factory=list)  # lines of 44_kernel_bytes.txt
    memory: list[tuple[str, str]] = field(default_factory=list)  # (file, its first line)
    wrappers: list[tuple[str, int]] = field(default_factory=list)  # (file, bytes)
    other: list[str] = field(default_factory=list)  # the other files (42_kernels.txt: plans)

    def __str__(self) -> str:
        out = [f"{self.name}"]
        out.append("  stages (graph dumps, runnable: python FILE):")
        out += [f"    {f:<44} {n:>5} nodes" for f, n in self.stages]
        if self.seconds:
            out.append("  compile seconds:")
            out += [f"    {s}" for s in self.seconds]
        if self.partition:
            out.append(f"  partition (20_partition.txt): {self.partition}")
        if self.kernels:
            out.append("  kernels (44_kernel_bytes.txt):")
            out += [f"    {k}" for k in self.kernels]
        out += [f"  wrapper {f}: {n} bytes" for f, n in self.wrappers]
        if self.memory:
            out.append("  memory plans:")
            out += [f"    {f}: {line}" for f, line in self.memory]
        if self.other:
            out.append(f"  also: {', '.join(self.other)}")
        return "\n".join(out)


def index(directory: str) -> str:
    """The index of every graph_<id> directory under `directory`, in id order."""
    if not os.path.isdir(directory):
        raise SystemExit(f"trainc debug: {directory!r} is not a directory (a TRAINC_DEBUG_DIR "
                         "dump: run with TRAINC_DEBUG_DIR=DIR first)")
    graphs = sorted((d for d in os.listdir(directory) if re.fullmatch(r"graph_\d+", d)),
                    key=lambda d: int(d.split("_")[1]))
    if not graphs:
        raise SystemExit(f"trainc debug: no graph_<id> directories in {directory!r}: not a "
                         "TRAINC_DEBUG_DIR dump, or nothing was compiled")
    blocks = [str(graph_index(os.path.join(directory, g))) for g in graphs]
    return f"{directory}: {len(graphs)} graphs\n\n" + "\n\n".join(blocks)


def graph_index(path: str) -> GraphIndex:
    g = GraphIndex(os.path.basename(path))
    files = sorted(os.listdir(path), key=_stage_order)
    for f in files:
        full = os.path.join(path, f)
        if f.endswith("_wrapper.py"):
            g.wrappers.append((f, os.path.getsize(full)))
        elif f.endswith(".py"):
            g.stages.append((f, len(_NODE.findall(_read(full)))))
        elif f == "50_stages.txt":
            g.seconds = [line.rstrip() for line in _read(full).splitlines() if line.strip()]
        elif f == "20_partition.txt":
            g.partition = _partition_summary(_read(full))
        elif f == "44_kernel_bytes.txt":
            g.kernels = [line.rstrip() for line in _read(full).splitlines() if line.strip()]
        elif f.startswith("43_") and f.endswith("_memory.txt"):
            g.memory.append((f, _read(full).splitlines()[0] if _read(full) else "(empty)"))
        else:
            g.other.append(f)
    return g


def _stage_order(name: str) -> tuple:
    """00_joint, 10_0_..., 10_10_... in pass order, then 20_, 30_, ..."""
    parts = re.findall(r"\d+", name)
    return tuple(int(p) for p in parts[:2]), name


def _partition_summary(text: str) -> str:
    """'N saved (B bytes), M recomputed, K graph inputs' from the decision table."""
    saved = recomputed = inputs = nbytes = 0
    for line in text.splitlines()[2:]:
        cols = re.split(r"\s{2,}", line.strip())
        if len(cols) < 6:
            continue
        action = cols[1]
        if action.startswith("saved (input"):
            inputs += 1
        elif action.startswith("saved"):
            saved += 1
            nbytes += int(cols[5]) if cols[5].isdigit() else 0
        elif action.startswith("recomputed"):
            recomputed += 1
    return (f"{saved} saved ({nbytes} bytes), {recomputed} recomputed, {inputs} graph inputs "
            f"used by the backward")


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()
