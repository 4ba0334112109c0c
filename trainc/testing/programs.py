"""Hypothesis strategy `programs()`: random training programs that print as runnable Python.

A Program is its source: `repr(program)` is a module defining `program(...)` and `make_inputs()`,
so a shrunk failure pastes straight into a regression test. Every program runs in eager
PyTorch, forward and backward, before the strategy yields it.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import hypothesis.strategies as st
import torch
import torch.nn.functional as F
from hypothesis import assume

from trainc.testing import compositions, ops

DTYPES = (torch.float32, torch.bfloat16, torch.float64)
LAYOUTS = ("contiguous", "transposed", "strided", "expanded")
MAX_NUMEL = 2048
# Special input values: NaN/Inf; signed zeros; clamp/ReLU/hardtanh cutoffs; large and tiny
# magnitudes; "tie" (a copy of the next element) and "near" (within a few float32 ulps of it),
# where max/min/sort and their gradients must pick the side eager picks.
SPECIALS = ("nan", "inf", "-inf", "-0.0", "0.0", "0.5", "-0.5", "1.0", "-1.0", "6.0", "1.5",
            "1e30", "-1e30", "1e-30", "tie", "tie", "near")
SCALES = (1.0, 1e-4, 1e4, 1e-19, 1e19)  # the whole input times this: magnitude extremes


@dataclass(frozen=True)
class InputSpec:
    shape: tuple[int, ...]
    requires_grad: bool = True
    layout: str = "contiguous"  # one of LAYOUTS
    expand_dims: tuple[int, ...] = ()  # dims stored with size 1 (layout "expanded")
    special: tuple[tuple[int, str], ...] = ()  # (flat index into the base, one of SPECIALS)
    scale: float = 1.0

    def base_shape(self) -> tuple[int, ...]:
        s = list(self.shape)
        if self.layout == "transposed":
            s[-2], s[-1] = s[-1], s[-2]
        elif self.layout == "strided":
            s[-1] *= 2
        elif self.layout == "expanded":
            for d in self.expand_dims:
                s[d] = 1
        return tuple(s)

    def lines(self, name: str) -> list[str]:
        base = self.base_shape()
        out = [f"{name} = torch.randn({base}, generator=g, dtype=torch.float64)"]
        numel = 1
        for s in base:
            numel *= s
        if self.scale != 1.0:
            out.append(f"{name} = {name} * {self.scale!r}")
        for i, kind in self.special:
            if not numel:
                continue
            i, j = i % numel, (i + 1) % numel
            if kind == "tie":
                out.append(f"{name}.view(-1)[{i}] = {name}.view(-1)[{j}]")
            elif kind == "near":
                out.append(f"{name}.view(-1)[{i}] = {name}.view(-1)[{j}] * (1 + 2 ** -22)")
            else:
                out.append(f"{name}.view(-1)[{i}] = float({kind!r})")
        tail = {"contiguous": "", "transposed": ".transpose(-2, -1)", "strided": "[..., ::2]",
                "expanded": f".expand{self.shape}"}[self.layout]
        grad = ".requires_grad_()" if self.requires_grad else ""
        out.append(f"{name} = {name}.to(dtype){tail}{grad}")
        return out


@dataclass(frozen=True)
class Program:
    dtype: torch.dtype
    inputs: tuple[InputSpec, ...]
    body: tuple[str, ...]
    outputs: tuple[str, ...]
    n_dropout: int = 0  # the last n_dropout outputs are dropout results (replayed by `reference`)
    seed: int = 0

    def function_source(self) -> str:
        args = ", ".join(f"x{i}" for i in range(len(self.inputs)))
        lines = [f"def program({args}):"] + [f"    {line}" for line in self.body]
        return "\n".join(lines + [f"    return ({', '.join(self.outputs)},)"]) + "\n"

    def inputs_source(self) -> str:
        lines = [f"def make_inputs(dtype={self.dtype}):",
                 f"    g = torch.Generator().manual_seed({self.seed})"]
        for i, spec in enumerate(self.inputs):
            lines += [f"    {line}" for line in spec.lines(f"x{i}")]
        names = ", ".join(f"x{i}" for i in range(len(self.inputs)))
        return "\n".join(lines + [f"    return [{names}]"]) + "\n"

    @property
    def source(self) -> str:
        return ("import torch\nimport torch.nn.functional as F\n\n\n" + self.function_source()
                + "\n\n" + self.inputs_source())

    def __repr__(self) -> str:
        return "\n" + self.source

    def _repr_pretty_(self, p, cycle) -> None:  # hypothesis prints falsifying examples so
        p.text(repr(self))

    def fn(self, functional=F) -> Callable:
        """The program as a Python function (`functional` stands in for torch.nn.functional)."""
        ns = {"torch": torch, "F": functional}
        exec(compile(self.function_source(), "<trainc program>", "exec"), ns)
        return ns["program"]

    def make_inputs(self, dtype: Optional[torch.dtype] = None) -> list:
        ns = {"torch": torch}
        exec(compile(self.inputs_source(), "<trainc inputs>", "exec"), ns)
        return ns["make_inputs"](dtype or self.dtype)

    def reference(self, compiled_outputs: Sequence) -> Callable:
        """The program with each F.dropout replaying the mask the compiled run used."""
        if not self.n_dropout:
            return self.fn()
        recorded = list(compiled_outputs[-self.n_dropout:])

        def replay(*args):  # a fresh replayer per call: each run starts at the first mask
            functional = ReplayFunctional(recorded)
            out = self.fn(functional)(*args)
            functional.check_unmutated()
            return out
        return replay

    def check(self, **compile_options) -> list:
        """assert_grads_match on this program (see trainc.testing.assert_grads_match)."""
        from trainc.testing.check import assert_grads_match
        return assert_grads_match(self.fn(), self.make_inputs, reference=self.reference,
                                  source=self.source, **compile_options)


class UnreplayableDropout(Exception):
    """A dropout mask cannot be read back from the compiled output: the input was 0, NaN or
    +-Inf where the output is 0 or NaN, so kept and dropped look alike there while the
    gradient differs. The program cannot be checked against eager; draw another."""


class ReplayFunctional:
    """torch.nn.functional, except dropout(x, p) returns x * mask / (1 - p) with recorded masks.

    The mask of a recorded output y is (y != 0) (see replay_mask): exact wherever x is finite
    and nonzero. Elsewhere it is unknowable from y, and the gradient depends on it (it is
    t * mask / (1 - p) whatever x is): such programs raise UnreplayableDropout.
    """

    def __init__(self, recorded: list):
        self.recorded = recorded
        self.i = 0
        self.made: list[tuple[torch.Tensor, int]] = []  # replayed outputs, versions then

    def __getattr__(self, name: str):
        return getattr(F, name)

    def dropout(self, x, p=0.5, training=True, inplace=False):
        y = self.recorded[self.i]
        self.i += 1
        if not training or x.numel() == 0:  # F.dropout returns an empty input itself
            return x
        out = replay_dropout(x, y, p, f"dropout #{self.i}")
        self.made.append((out, out._version))
        return out

    def check_unmutated(self) -> None:
        """After the program: a dropout output written in place later (through a view, such
        as a 0-d value's flatten()) was recorded after that write, so its mask was read from
        the wrong values (nightly fuzz, session 18: a dropped 0-d value plus v9 read as kept)."""
        for k, (out, version) in enumerate(self.made):
            if out._version != version:
                raise UnreplayableDropout(f"dropout #{k + 1}: its output is written in place "
                                          "later, so the recorded value hides its mask")


def replay_dropout(x: torch.Tensor, y: torch.Tensor, p: float, what: str) -> torch.Tensor:
    """x * mask / (1 - p) with the mask of the recorded output y; UnreplayableDropout where x is
    0/NaN/Inf and y hides the mask there."""
    blind = ((x == 0) | ~torch.isfinite(x)) & ((y == 0) | torch.isnan(y))
    if bool(blind.any()) and 0 < p < 1:
        raise UnreplayableDropout(f"{what}: {int(blind.sum())} element(s) of the input are "
                                  "0/NaN/Inf where the output hides the mask")
    return x * replay_mask(y, x.dtype) / (1 - p)


def replay_mask(y: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The keep-mask behind a dropout output y. A NaN in y is a NaN input (any mask gives NaN)
    or a dropped +-Inf (Inf * 0): mask 0 reproduces both."""
    return ((y != 0) & ~torch.isnan(y)).to(dtype)


class _Builder:
    """Grows a program line by line, executing each line on example tensors to learn shapes."""

    def __init__(self, dtype: torch.dtype, inputs: list):
        self.dtype = dtype
        self.env = {f"x{i}": x.detach() for i, x in enumerate(inputs)}
        self.names = list(self.env)
        # Never mutated: inputs, dropout results (their masks are replayed from the returned
        # values) and views of either.
        self.frozen = set(self.names)
        self.lines: list[str] = []
        self.used: set[str] = set()
        self.dropouts: list[str] = []
        self.side: list[str] = []  # integer/bool results: returned, never operands

    def val(self, name: str) -> torch.Tensor:
        return self.env[name]

    def pick(self, draw, pred=None, mutable: bool = False) -> Optional[str]:
        """A value name; index 0 (what shrinking moves toward) is the most recent value."""
        cands = [n for n in reversed(self.names) if (pred is None or pred(self.env[n]))
                 and not (mutable and n in self.frozen)]
        if not cands:
            return None
        return cands[draw(st.integers(0, len(cands) - 1))]

    def add(self, line: ops.Line) -> None:
        name = f"v{len(self.names) - sum(n.startswith('x') for n in self.names)}"
        if line.kind == "side":
            name = f"s{len(self.side)}"
        text = line.text if line.kind == "inplace" else f"{name} = {line.text}"
        env = dict(self.env, torch=torch, F=F)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                exec(text, env)
        except (RuntimeError, IndexError, ValueError, TypeError):
            return
        if line.kind == "side":
            v = env[name]
            if not torch.is_tensor(v) or v.is_floating_point() or v.numel() > MAX_NUMEL:
                return
            self.side.append(name)
        elif line.kind != "inplace":
            v = env[name]
            if not torch.is_tensor(v) or v.dtype != self.dtype or v.numel() > MAX_NUMEL \
                    or v.dim() > 6:
                return
            self.env[name] = v
            self.names.append(name)
            # a view of a frozen value, or that value itself (flatten() of a 1-d tensor)
            if any(_same_storage(v, self.env[u]) for u in self.frozen):
                self.frozen.add(name)
            if line.kind == "dropout":
                self.dropouts.append(name)
                self.frozen.add(name)
        self.lines.append(text)
        self.used.update(line.uses)


def _same_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


@st.composite
def input_specs(draw, n: int) -> tuple[InputSpec, ...]:
    """1-3 inputs whose shapes are related (equal, broadcastable, matmul-compatible) or not."""
    dim = st.sampled_from((1, 2, 3, 4, 5, 0, 7, 9, 17))  # 0-d, size-1 and odd sizes too
    first = _capped(tuple(draw(st.lists(dim, min_size=0, max_size=4))))
    shapes = [first]
    for _ in range(n - 1):
        rel = draw(st.sampled_from(("same", "broadcast", "matmul", "free")))
        if rel == "same":
            shapes.append(first)
        elif rel == "broadcast":
            drop = draw(st.integers(0, len(first)))
            shapes.append(tuple(1 if draw(st.booleans()) else s for s in first[drop:]))
        elif rel == "matmul" and first:
            shapes.append((first[-1], draw(dim)))
        else:
            shapes.append(_capped(tuple(draw(st.lists(dim, min_size=0, max_size=3)))))
    return tuple(draw(_spec(s)) for s in shapes)


def _capped(shape: tuple[int, ...]) -> tuple[int, ...]:
    """Drop leading dims until the input has at most MAX_NUMEL elements."""
    while shape and _numel(shape) > MAX_NUMEL:
        shape = shape[1:]
    return shape


def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


@st.composite
def _spec(draw, shape: tuple[int, ...]) -> InputSpec:
    layouts = [lay for lay in LAYOUTS if lay == "contiguous" or (lay != "transposed" and shape)
               or len(shape) >= 2]
    layout = draw(st.sampled_from(layouts))
    expand = ()
    if layout == "expanded":
        expand = tuple(d for d in range(len(shape)) if draw(st.booleans()))
    special = ()
    if draw(st.integers(0, 9)) >= 7:  # three inputs in ten carry special values (not shrunk)
        special = tuple(draw(st.lists(st.tuples(st.integers(0, 1000), st.sampled_from(SPECIALS)),
                                      min_size=1, max_size=3)))
    scale = SCALES[0] if draw(st.integers(0, 9)) < 8 else draw(st.sampled_from(SCALES))
    return InputSpec(shape, draw(st.booleans()) or draw(st.booleans()), layout, expand, special,
                     scale)


@st.composite
def programs(draw, dtypes: Sequence[torch.dtype] = DTYPES, max_ops: int = 40,
             max_inputs: int = 3, dropout: bool = True,
             families: Optional[Sequence[Callable]] = None) -> Program:
    """Random differentiable programs: DAGs of 1..max_ops ops over 1..max_inputs inputs.
    `families`: draw only these op families (of ops.OPS and compositions.OPS)."""
    dtype = draw(st.sampled_from(tuple(dtypes)))
    specs = draw(input_specs(draw(st.integers(1, max_inputs))))
    seed = draw(st.integers(0, 2**16))
    proto = Program(dtype, specs, (), ("x0",), 0, seed)
    b = _Builder(dtype, proto.make_inputs())
    table = {**ops.OPS, **compositions.OPS}
    if families is not None:
        unknown = [f for f in families if f not in table]
        if unknown:
            raise ValueError(f"programs(families=...): not op families: {unknown}")
        table = {f: w for f, w in table.items() if f in families}
    families = [f for f, w in table.items() for _ in range(w) if dropout or f is not ops.dropout]
    n_ops = draw(st.integers(1, max_ops))
    for _ in range(n_ops):
        line = draw(st.sampled_from(families))(draw, b)
        if line is not None:
            b.add(line)
    if not b.lines:
        b.add(ops.Line("x0 * 2.0", ("x0",)))
    return _finish(b, proto)


def _finish(b: _Builder, proto: Program) -> Program:
    """Return the unconsumed values (and every dropout result); drop in-place lines eager
    autograd rejects (a mutated value some backward formula saved)."""
    body = list(b.lines)
    derived = [n for n in b.names if not n.startswith("x")]
    sinks = [n for n in derived if n not in b.used and n not in b.dropouts][-4:]
    if not sinks and not b.dropouts:
        sinks = [b.names[-1]]
    # Dropout results go last, so `Program.reference` finds the masks to replay.
    outs, n_drop = sinks + list(b.side) + list(b.dropouts), len(b.dropouts)
    while True:
        prog = Program(proto.dtype, proto.inputs, tuple(body), tuple(outs), n_drop, proto.seed)
        if _eager_ok(prog):
            return prog
        inplace = [i for i, line in enumerate(body) if not _is_assignment(line)]
        assume(bool(inplace))
        del body[inplace[-1]]


def _is_assignment(line: str) -> bool:
    head = line.split(" = ", 1)[0]
    return " = " in line and head.isidentifier()


def _eager_ok(prog: Program) -> bool:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            xs = prog.make_inputs()
            outs = [o for o in prog.fn()(*xs) if o.requires_grad]
            wrt = [x for x in xs if x.requires_grad]
            if outs and wrt:
                torch.autograd.grad(outs, wrt, [torch.ones_like(o) for o in outs],
                                    allow_unused=True)
        return True
    except RuntimeError:
        return False
