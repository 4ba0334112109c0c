"""Schedule -> the Python wrapper: allocates buffers, calls kernels and ATen, frees after last use.

Memory planning: a buffer dies after its last reader; a dead buffer the wrapper allocated is
reused for the next allocation of the same element count and dtype (never graph outputs).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from trainc.codegen.graph import Buffer, CallNode, TensorArg
from trainc.codegen.scheduler import Kernel, Schedule

aten = torch.ops.aten
OUT_VARIANTS = {aten.mm.default: aten.mm.out, aten.addmm.default: aten.addmm.out,
                aten.bmm.default: aten.bmm.out}


@dataclass(frozen=True)
class Wrapper:
    source: str
    namespace: dict

    def build(self, kernels: Any) -> Callable[[list], list]:
        ns = dict(self.namespace, K=kernels)
        exec(compile(self.source, "<trainc wrapper>", "exec"), ns)
        return ns["run"]


def restride(t: torch.Tensor, stride) -> torch.Tensor:
    """A copy of t laid out with `stride` (inputs and ATen results the kernels index by stride)."""
    return torch.empty_strided(t.shape, stride, dtype=t.dtype, device=t.device).copy_(t)


class _Writer:
    def __init__(self, sched: Schedule, params: dict[str, list[str]]):
        self.s, self.g, self.params = sched, sched.graph, params
        self.lines: list[str] = []
        self.ns: dict = {"torch": torch, "restride": restride, "device": torch.device,
                         "inf": float("inf"), "nan": float("nan")}
        self.pool: dict[tuple, list[str]] = {}
        self.ours: set[str] = set()  # buffers the wrapper allocated (safe to reuse)
        self.last = self._last_uses()
        self.keep = {a.buf for a in self.g.outputs if isinstance(a, TensorArg)}
        # A fallback op may return a view of its input: such buffers are never reused.
        self.keep |= {b for it in sched.items if isinstance(it, CallNode) and
                      it.kind == "fallback" for b in self._reads(it)}

    def emit(self, line: str) -> None:
        self.lines.append("    " + line)

    def _last_uses(self) -> dict[str, int]:
        last: dict[str, int] = {}
        for k, item in enumerate(self.s.items):
            for b in self._reads(item):
                last[b] = k
        return last

    def _reads(self, item) -> list[str]:
        if isinstance(item, Kernel):
            return list(self.params[item.name])
        from trainc.codegen.scheduler import _call_buffers
        return _call_buffers(item)

    def alloc(self, name: str) -> None:
        b: Buffer = self.g.buffers[name]
        key = (b.nbytes, b.dtype, b.stride == _contig(b.shape))
        if key[2] and self.pool.get(key):
            old = self.pool[key].pop()
            self.emit(f"{name} = {old}.view({list(b.shape)}); del {old}")
        else:
            self.emit(f"{name} = torch.empty_strided({list(b.shape)}, {list(b.stride)}, "
                      f"dtype={b.dtype})")
        self.ours.add(name)

    def free(self, k: int, item) -> None:
        dead = sorted({b for b in self._reads(item) if self.last.get(b) == k} - self.keep
                      - set(self.g.inputs) - set(self.g.consts))
        for b in dead:
            buf = self.g.buffers[b]
            if b in self.ours:
                self.pool.setdefault((buf.nbytes, buf.dtype, buf.stride == _contig(buf.shape)),
                                     []).append(b)
            else:
                self.emit(f"del {b}")

    def write(self) -> str:
        g = self.g
        self.emit(f"{', '.join(g.inputs) + ',' if g.inputs else '_'} = args")
        for name in g.inputs:
            b = g.buffers[name]
            self.emit(f"if {name}.stride() != {b.stride} and {name}.numel() > 1: "
                      f"{name} = restride({name}, {b.stride})")
        for name, t in g.consts.items():
            self.ns[name] = t
        for k, item in enumerate(self.s.items):
            if isinstance(item, Kernel):
                self._kernel(item)
            else:
                self._call(item)
            self.free(k, item)
        outs = ", ".join(self._arg(a) for a in g.outputs)
        self.emit(f"return [{outs}]")
        return "def run(args):\n" + "\n".join(self.lines) + "\n"

    def _kernel(self, k: Kernel) -> None:
        for n in k.nodes:
            if n.name not in k.local:
                self.alloc(n.name)
        ptrs = ", ".join(f"{b}.data_ptr()" for b in self.params[k.name])
        self.emit(f"K.{k.name}({ptrs})")

    def _call(self, c: CallNode) -> None:
        op = f"op_{len([x for x in self.ns if x.startswith('op_')])}"
        args = ", ".join(self._arg(a) for a in c.args)
        kwargs = "".join(f", {k}={self._arg(v)}" for k, v in c.kwargs.items())
        out_variant = OUT_VARIANTS.get(c.target)
        if out_variant is not None and not c.kwargs:
            self.ns[op] = out_variant
            self.alloc(c.outputs[0])
            self.emit(f"{op}({args}, out={c.outputs[0]})  # {c.origin}")
            return
        self.ns[op] = c.target
        names = [o or "_" for o in c.outputs]
        single = not isinstance(_result_kind(c), tuple)
        lhs = names[0] if single else ", ".join(names) + ","
        self.emit(f"{lhs} = {op}({args}{kwargs})  # {c.kind} {c.origin}")
        for o in c.outputs:
            if o is not None:
                b = self.g.buffers[o]
                self.emit(f"if {o}.stride() != {b.stride} and {o}.numel() > 1: "
                          f"{o} = restride({o}, {b.stride})")

    def _arg(self, a) -> str:
        if isinstance(a, TensorArg):
            if a.whole:
                return a.buf
            return (f"{a.buf}.as_strided({list(a.shape)}, {list(a.stride)}, "
                    f"{a.buf}.storage_offset() + {a.offset})")
        if isinstance(a, (list, tuple)):
            inner = ", ".join(self._arg(x) for x in a)
            return f"[{inner}]" if isinstance(a, list) else f"({inner}{',' if len(a) == 1 else ''})"
        if isinstance(a, torch.dtype):
            return str(a)
        if isinstance(a, (torch.device, torch.memory_format, torch.layout)):
            return f"torch.{a}" if not isinstance(a, torch.device) else repr(a)
        return repr(a)


def _result_kind(c: CallNode):
    return tuple(c.outputs) if len(c.outputs) != 1 or _returns_tuple(c.target) else c.outputs[0]


def _returns_tuple(target) -> bool:
    schema = getattr(target, "_schema", None)
    return schema is not None and len(schema.returns) > 1 or (
        schema is not None and len(schema.returns) == 1 and
        str(schema.returns[0].type).startswith(("Tensor[]", "List")))


def _contig(shape) -> tuple:
    from trainc.codegen.ir import contiguous_strides
    return contiguous_strides(shape)


def write_wrapper(sched: Schedule, params: dict[str, list[str]]) -> Wrapper:
    """`params`: per kernel name, the buffers its C++ function takes, in order."""
    w = _Writer(sched, params)
    return Wrapper(w.write(), w.ns)
