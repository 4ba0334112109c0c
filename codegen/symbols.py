"""Index symbols and the table of one lowered graph.

A symbol carries its meaning: a `Range` its extent, an `Indirect` the integer value it stands
for and the size that value wraps into. Equal symbols therefore mean the same thing in any
graph (sympy caches results across graphs by equality), and nothing needs a process-wide
table. Ranges are numbered per scope: the graph's own (lowering, scheduling and storage
analysis) and one per printed kernel, so a kernel's source depends on that kernel alone and
equal kernels print identically.
"""
from __future__ import annotations

import hashlib
from typing import Any, Sequence

import sympy


class Range(sympy.Symbol):
    """A loop variable over [0, extent). `key` (prefix + zero-padded number) orders it among
    other symbols: sympy sorts terms by it, so creation order fixes the printed source."""
    __slots__ = ("key", "extent")

    def __new__(cls, name: str, key: str, extent: int):
        s = sympy.Symbol.__xnew__(cls, name, integer=True, nonnegative=True)
        s.key, s.extent = key, int(extent)
        return s

    def __getnewargs_ex__(self):
        return (self.name, self.key, self.extent), {}

    def _hashable_content(self):
        return (self.key, self.extent) + self._assumptions0


class Indirect(sympy.Symbol):
    """A runtime index value (embedding, gather) wrapped into [0, size). It is its value: two
    made from equal values and sizes are one symbol, named by a digest of the value."""
    __slots__ = ("value", "size")

    def __new__(cls, value: Any, size: int):
        name = "ind" + hashlib.sha1(f"{value!r}/{int(size)}".encode()).hexdigest()[:10]
        s = sympy.Symbol.__xnew__(cls, name, integer=True)
        s.value, s.size = value, int(size)
        return s

    def __getnewargs_ex__(self):
        return (self.value, self.size), {}

    def _hashable_content(self):
        return (self.name, self.size, self.value) + self._assumptions0


# sympy orders terms by class name first: these sort among other terms as plain Symbols do
Range.__name__ = Indirect.__name__ = "Symbol"


class Symbols:
    """The range symbols of one scope, numbered per prefix in creation order. A graph's table
    (LoweredGraph.symbols) makes a fresh scope for each kernel it prints (`kernel`)."""

    def __init__(self, tag: str = "g"):
        self.tag = tag  # in every name: graph-scope symbols never look like a kernel's own
        self.made: list[Range] = []
        self.indirects: dict[str, Indirect] = {}  # defined by the kernel printed here
        self._counts: dict[str, int] = {}
        self.kernels: dict[str, Symbols] = {}
        self._shared: dict[tuple, tuple[Range, ...]] = {}  # (prefix, shape) -> ranges, shared()

    def range(self, prefix: str, extent: int) -> Range:
        n = self._counts.get(prefix, 0)
        self._counts[prefix] = n + 1
        s = Range(f"{prefix}{self.tag}{n}", f"{prefix}{self.tag}{n:08d}", extent)
        self.made.append(s)
        return s

    def ranges(self, prefix: str, shape: Sequence[int]) -> list[Range]:
        return [self.range(prefix, int(e)) for e in shape]

    def shared(self, prefix: str, shape: Sequence[int]) -> list[Range]:
        """Ranges for evaluating a value only to inspect it (its loads, cost, index
        arithmetic), one set per (prefix, shape): equal values of repeated layers then give
        equal expressions, and memoised index math (ir.linear) serves every layer after the
        first. Two sets in one expression need two prefixes (a reduction's shape and rshape)."""
        key = (prefix, tuple(int(e) for e in shape))
        got = self._shared.get(key)
        if got is None:
            got = self._shared[key] = tuple(self.ranges(prefix, shape))
        return list(got)

    def define(self, s: Indirect) -> None:
        """Note that the kernel defines `s` by its name: no other value may have that name."""
        if self.indirects.setdefault(s.name, s) != s:
            raise RuntimeError(f"trainc: two index values named {s.name} in one kernel")

    def kernel(self, name: str) -> "Symbols":
        """A fresh scope for printing kernel `name` (kept: the graph's table lists it)."""
        self.kernels[name] = Symbols(tag="")
        return self.kernels[name]

    def __str__(self) -> str:
        lines = [f"{len(self.made)} analysis symbols"]
        for name, k in self.kernels.items():
            syms = [f"{s.name} < {s.extent}" for s in k.made]
            syms += [f"{s.name} < {s.size}" for s in k.indirects.values()]
            lines.append(f"{name}: " + ", ".join(syms))
        return "\n".join(lines)


def indirect(value: Any, size: int) -> Indirect:
    """The symbol standing for integer `value` used as an index into a dim of `size`."""
    return Indirect(value, size)
