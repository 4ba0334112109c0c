"""assert_grads_match: run a function compiled and eagerly (same dtype and float64); apply policy.

Outputs, gradients (w.r.t. inputs and parameters that require grad), mutated inputs and module
buffers are compared; the compiled artifact is also run twice under one seed: bits must agree.
"""
from __future__ import annotations

import copy
import functools
import inspect
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence, Union

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

from trainc.testing import emulated, flips
from trainc.testing.second import reconsider
from trainc.testing.policy import (ALL_ON, ILL_CONDITIONED, Mismatch, Relaxations, bitwise_equal,
                                   compare, rel_err)

Inputs = Union[Sequence[Any], Callable[[], Sequence[Any]]]


@dataclass
class RunResult:
    """Everything one run produced, flattened, in a fixed order."""
    outputs: list
    grads: list  # w.r.t. `wrt` below, None where autograd never reached
    wrt: list[str]
    inputs_after: list  # the inputs' values after the run (mutations)
    buffers: dict
    tangent_dtypes: list  # the dtype each tangent was rounded to
    requires_grad: list  # per output


def assert_grads_match(fn: Callable, inputs: Inputs, *, seed: int = 0,
                       reference: Optional[Callable[[list], Callable]] = None,
                       source: Optional[str] = None, **compile_options: Any) -> list[Mismatch]:
    """Compile `fn` with trainc and check it against eager per DESIGN.md's correctness policy.

    `inputs`: the arguments (cloned for every run, strides kept) or a function making them.
    `reference(compiled_outputs) -> fn`: the function eager runs use instead of `fn`, for
    programs eager cannot reproduce bit for bit (dropout: replay the compiled run's masks).
    `source`: program text shown in the failure report (default: inspect.getsource(fn)).
    Raises AssertionError listing every mismatch. Returns the values excused on a second
    opinion (second.py: an eager variant as far off, a boundary flip), [] when all passed.
    """
    import trainc

    make = inputs if callable(inputs) else (lambda: [_clone(x) for x in inputs])
    torch._dynamo.reset()  # Dynamo caches every program it has seen; keep fuzz runs small
    compiled_fn = _copy(fn)
    compiled = trainc.compile(compiled_fn, **compile_options)
    state = _state(compiled_fn)
    first = _run(compiled, compiled_fn, make(), seed)
    _load_state(compiled_fn, state)
    second = _run(compiled, compiled_fn, make(), seed)
    mismatches = _bitwise(first, second)
    eager_fn = reference(first.outputs) if reference is not None else fn
    eager = _run(_copy(eager_fn), None, make(), seed)
    ref = _run(_copy(eager_fn), None, [_clone(x, torch.float64) for x in make()], seed,
               cast=torch.float64, tangent_dtypes=eager.tangent_dtypes)
    low, parts = None, {}
    if any(v.dtype == torch.float64 for _, v in _values(eager) if torch.is_tensor(v)):
        # float64 eager *is* the reference; a float32 run tells how conditioned each value is.
        low = _run(_copy(eager_fn), None, [_clone(x, torch.float32) for x in make()], seed,
                   cast=torch.float32, tangent_dtypes=eager.tangent_dtypes)
    else:
        parts = _conditioning_parts(eager_fn, make, seed, eager.tangent_dtypes, ref)
    runs = _Runs(eager_fn, make, seed, eager.tangent_dtypes)
    failed, notes = _judge(first, eager, ref, low, parts, runs)
    mismatches += failed
    if mismatches:
        raise AssertionError(_report(mismatches + notes, fn, source, compile_options))
    return notes


def _judge(comp: RunResult, eager: RunResult, ref: RunResult, low: Optional[RunResult],
           parts: dict[str, dict], runs: "_Runs", relax: Relaxations = ALL_ON
           ) -> tuple[list[Mismatch], list[Mismatch]]:
    """(failing, excused notes) for every compared value under `relax`; `parts` are the
    conditioning estimates (_conditioning_parts), `low` the float32 run of a float64 program."""
    cond = _merged(parts, relax)
    failed = _compare_runs(comp, eager, ref, low, cond, relax)
    notes: list[Mismatch] = []
    if failed and low is None:
        failed, notes = reconsider(failed, dict(_values(comp)), dict(_values(eager)),
                                   dict(_values(ref)), cond, runs, relax)
    return failed, notes


def _merged(parts: dict[str, dict], relax: Relaxations) -> dict[str, float]:
    """The largest estimate per value among the parts `relax` keeps (parts are named by their
    Relaxations field)."""
    out: dict[str, float] = {}
    for name, part in parts.items():
        if getattr(relax, name):
            for what, err in part.items():
                out[what] = max(out.get(what, 0.0), err)
    return out


class _Runs:
    """The extra runs second.reconsider asks for after a failure (second.Runs)."""

    def __init__(self, fn: Callable, make: Callable, seed: int, tangent_dtypes: list):
        self.fn, self.make, self.seed, self.tangent_dtypes = fn, make, seed, tangent_dtypes

    def values(self, run: RunResult) -> dict:
        return dict(_values(run))

    def variants(self) -> list[str]:
        """channels-last where there are 4-d images or 2-d convolutions; one thread (ATen's
        reductions split over threads: another order) where eager runs on several."""
        out = []
        mods = self.fn.modules() if isinstance(self.fn, torch.nn.Module) else []
        if any(isinstance(m, torch.nn.Conv2d) for m in mods) or any(
                torch.is_tensor(x) and x.dim() == 4 and x.is_floating_point()
                for x in self.make()):
            out.append("channels-last")
        if torch.get_num_threads() > 1:
            out.append("one thread")
        return out

    def eager_variant(self, name: str) -> dict:
        fn, args = _copy(self.fn), self.make()
        if name == "channels-last":
            if isinstance(fn, torch.nn.Module):
                fn = fn.to(memory_format=torch.channels_last)
            args = [x.detach().contiguous(memory_format=torch.channels_last).requires_grad_(
                x.requires_grad) if torch.is_tensor(x) and x.dim() == 4 else x for x in args]
            return dict(_values(_run(fn, None, args, self.seed, tangent_dtypes=self.tangent_dtypes)))
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            return dict(_values(_run(fn, None, args, self.seed,
                                     tangent_dtypes=self.tangent_dtypes)))
        finally:
            torch.set_num_threads(threads)

    def _ref_run(self) -> RunResult:
        return _run(_copy(self.fn), None, [_clone(x, torch.float64) for x in self.make()],
                    self.seed, cast=torch.float64, tangent_dtypes=self.tangent_dtypes)

    def record(self, low_precision: bool) -> list:
        if low_precision:
            return flips.recorded(lambda: _run(_copy(self.fn), None, self.make(), self.seed,
                                               tangent_dtypes=self.tangent_dtypes))
        return flips.recorded(self._ref_run)

    def flipped_reference(self, chosen: dict) -> dict:
        return dict(_values(flips.flipped(self._ref_run, chosen)))


def _copy(fn: Callable) -> Callable:
    return copy.deepcopy(fn) if isinstance(fn, torch.nn.Module) else fn


def _run(call: Callable, module: Optional[Callable], args: list, seed: int,
         cast: Optional[torch.dtype] = None, tangent_dtypes: Optional[list] = None
         ) -> RunResult:
    """Run once under `seed`; backward with fixed random tangents on every differentiable output."""
    if module is None and isinstance(call, torch.nn.Module):
        module = call
        if cast is not None:
            module.to(cast)
    params = list(module.named_parameters()) if isinstance(module, torch.nn.Module) else []
    torch.manual_seed(seed)
    outs, _ = tree_flatten(call(*args))
    wrt = [(f"input {i}", a) for i, a in enumerate(args)
           if torch.is_tensor(a) and a.requires_grad]
    wrt += [(f"param {n}", p) for n, p in params if p.requires_grad]
    diff = [o for o in outs if torch.is_tensor(o) and o.requires_grad]
    dtypes = [o.dtype for o in diff]
    tangents = _tangents(diff, seed, tangent_dtypes or dtypes)
    grads: list = [None] * len(wrt)
    if diff and wrt:
        grads = list(torch.autograd.grad(diff, [t for _, t in wrt], tangents, allow_unused=True))
    buffers = {n: b.detach().clone() for n, b in module.named_buffers()} \
        if isinstance(module, torch.nn.Module) else {}
    after = [a.detach().clone() if torch.is_tensor(a) else a for a in args]
    return RunResult([o.detach() if torch.is_tensor(o) else o for o in outs], grads,
                     [n for n, _ in wrt], after, buffers, dtypes,
                     [torch.is_tensor(o) and o.requires_grad for o in outs])


def _conditioning(fn: Callable, make: Callable, seed: int, tangent_dtypes: list,
                  ref: RunResult) -> dict[str, float]:
    """Both estimates of _conditioning_parts, the larger per value."""
    return _merged(_conditioning_parts(fn, make, seed, tangent_dtypes, ref), ALL_ON)


def _conditioning_parts(fn: Callable, make: Callable, seed: int, tangent_dtypes: list,
                        ref: RunResult) -> dict[str, dict[str, float]]:
    """How far each value moves when every intermediate result moves by one unit roundoff of
    the run's dtype ("rounding_conditioning", float64 runs): the error an exactly rounded
    evaluation in that dtype can carry, large where a value is ill-conditioned (a sum of rounded
    terms that cancels, sin of a large sum). Estimated where the response is linear: a 16x
    smaller move must move the value ~16x less; where it does not (a max tie, a comparison
    flipping), no estimate is made. Plus "emulated_spread" (_emulated_spread). Keys are
    Relaxations fields. Inputs, parameters and tangents are never moved: eager and compiled get
    them exactly (moving them, as this did until session 27, excused errors no evaluation makes:
    BENCHMARKS.md, policy review)."""
    def run_rounding(scale: float, draw: int) -> RunResult:
        # the inputs are made outside the mode: eager and compiled get them exactly
        args = [_clone(x, torch.float64) for x in make()]
        with _RoundEachOp(_unit_roundoff(make(), tangent_dtypes), scale, draw):
            return _run(_copy(fn), None, args, seed, cast=torch.float64,
                        tangent_dtypes=tangent_dtypes)

    out: dict[str, float] = {}
    refs = dict(_values(ref))
    # Every intermediate result moved with random signs, two draws (a cancellation of rounded
    # intermediates, tanh(x) - erf(tanh(x)); one draw can move both terms alike and see nothing).
    for runner in [functools.partial(run_rounding, draw=d) for d in (1, 2)]:
        try:
            big, small = runner(1.0), runner(1.0 / 16)
        except Exception:  # eager cannot run the moved inputs (e.g. out of domain): no estimate
            continue
        for (what, b), (_, s) in zip(_values(big), _values(small)):
            r = refs.get(what)
            if not all(torch.is_tensor(t) and t.is_floating_point() for t in (b, s, r)) \
                    or not (b.shape == s.shape == r.shape):
                continue
            mask = torch.isfinite(b) & torch.isfinite(s) & torch.isfinite(r)
            if not bool(mask.any()):
                continue
            e_big, e_small = rel_err(b, r, mask), rel_err(s, r, mask)
            if e_small > 0 and 8 <= e_big / e_small <= 32:
                out[what] = max(out.get(what, 0.0), e_big)
    return {"rounding_conditioning": out,
            "emulated_spread": _emulated_spread(fn, make, seed, tangent_dtypes, refs)}


def _emulated_spread(fn: Callable, make: Callable, seed: int, tangent_dtypes: list,
                     refs: dict, draws: int = emulated.DRAWS) -> dict[str, float]:
    """The largest error of `draws` valid low-precision evaluations (emulated.spread): float64
    runs with every op's result rounded to the run's lowest dtype. Needed where rounding flips
    a cutoff (a ReLU6 input near 0 in bfloat16: zoo_cpp_None_34102_43, draws of 0.05-5.2 where
    eager got 0.05)."""
    low = _lowest_dtype(make(), tangent_dtypes)
    if low is None:
        return {}

    def evaluate(mode) -> dict:
        args = [_clone(x, torch.float64) for x in make()]  # exact: made outside the mode
        with mode:
            run = _run(_copy(fn), None, args, seed, cast=torch.float64,
                       tangent_dtypes=tangent_dtypes)
        return dict(_values(run))
    return emulated.spread(evaluate, low, refs, draws)


def _lowest_dtype(args: list, tangent_dtypes: list) -> Optional[torch.dtype]:
    dtypes = [x.dtype for x in args if _perturbable(x)] + [
        d for d in tangent_dtypes if d.is_floating_point and d != torch.float64]
    return max(dtypes, key=lambda d: torch.finfo(d).eps, default=None)


def _unit_roundoff(args: list, tangent_dtypes: list) -> float:
    """The largest unit roundoff among the run's floating inputs and outputs (below float64):
    the rounding each intermediate of the real run carries."""
    dtypes = [x.dtype for x in args if _perturbable(x)] + [
        d for d in tangent_dtypes if d.is_floating_point and d != torch.float64]
    return max((torch.finfo(d).eps / 2 for d in dtypes), default=0.0)


class _RoundEachOp(TorchDispatchMode):
    """Moves every float64 result of a functional ATen op (forward and backward) by `scale`
    unit roundoffs `u`, with a sign per element drawn from a generator seeded by the op's call
    index (the same signs at every scale): the rounding error each intermediate carries in a
    lower-precision run. Views and in-place ops are left alone (their results alias inputs)."""

    def __init__(self, u: float, scale: float, draw: int = 1):
        super().__init__()
        self.u, self.scale, self.draw, self.calls = u, scale, draw, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if not self.u or not emulated.rounds(func, args):
            return out
        self.calls += 1
        g = torch.Generator().manual_seed(self.draw * 1_000_003 + self.calls)  # 32-bit seeds

        def move(t):
            if not (torch.is_tensor(t) and t.dtype == torch.float64 and t.numel()
                    and t.layout == torch.strided and t.is_contiguous()):
                return t
            signs = torch.randint(0, 2, t.shape, generator=g).to(t.dtype).mul_(2).sub_(1)
            return t * (1 + self.scale * self.u * signs.to(t.device))
        return tree_map(move, out)


def _perturbable(x: Any) -> bool:
    return torch.is_tensor(x) and x.is_floating_point() and x.dtype != torch.float64


def _tangents(outs: list, seed: int, dtypes: list) -> list:
    """The same values in every run: drawn in float64, rounded to the (eager) output dtype."""
    g = torch.Generator().manual_seed(seed + 12345)
    return [torch.randn(o.shape, generator=g, dtype=torch.float64).to(d).to(o.dtype)
            for o, d in zip(outs, dtypes)]


def _values(run: RunResult) -> list[tuple[str, Any]]:
    """Every compared value of a run, named as the failure report names it."""
    vals = [(f"output {i}", v) for i, v in enumerate(run.outputs)]
    vals += [(f"grad of {n}", g) for n, g in zip(run.wrt, run.grads)]
    vals += [(f"input {i} after the call", v) for i, v in enumerate(run.inputs_after)]
    return vals + [(f"buffer {n}", b) for n, b in run.buffers.items()]


# float32 -> float64 rounding error ratio: scales a float32 run's error to float64's.
_F32_TO_F64 = 2.0 ** -29
# A float32 error above this is not proportional to the value's conditioning any more.
_SATURATED = 0.1


def _compare_runs(comp: RunResult, eager: RunResult, ref: RunResult,
                  low: Optional[RunResult], cond: Optional[dict] = None,
                  relax: Relaxations = ALL_ON) -> list[Mismatch]:
    if len(comp.outputs) != len(eager.outputs):
        return [Mismatch("outputs", f"compiled gave {len(comp.outputs)}, eager "
                                    f"{len(eager.outputs)}")]
    if comp.wrt != eager.wrt:
        return [Mismatch("grads", f"compiled differentiates {comp.wrt}, eager {eager.wrt}")]
    if set(comp.buffers) != set(eager.buffers):
        return [Mismatch("buffers", f"compiled has {sorted(comp.buffers)}, eager "
                                    f"{sorted(eager.buffers)}")]
    low_vals = dict(_values(low)) if low is not None else {}
    out = [Mismatch(f"output {i}", f"requires_grad {c} != eager {e}")
           for i, (c, e) in enumerate(zip(comp.requires_grad, eager.requires_grad)) if c != e]
    for (what, c), (_, e), (_, r) in zip(_values(comp), _values(eager), _values(ref)):
        hint = _low_precision_err(low_vals.get(what), r, relax)
        hint = max(hint or 0.0, (cond or {}).get(what, 0.0)) or None
        out.append(compare(what, c, e, r, eager_err=hint, relax=relax))
    return [m for m in out if m]


def _low_precision_err(low: Any, ref: Any, relax: Relaxations = ALL_ON) -> Optional[float]:
    if not relax.float32_hint:
        return None
    if not (torch.is_tensor(low) and torch.is_tensor(ref) and low.shape == ref.shape
            and ref.is_floating_point()):
        return None
    mask = torch.isfinite(low) & torch.isfinite(ref)
    if not bool(mask.any()):
        return None
    err = rel_err(low, ref, mask)
    # No correct digit in float32: the float64 value is rounding noise too (ILL_CONDITIONED).
    if err > ILL_CONDITIONED and relax.ill_conditioned:
        return float("inf")
    # Less than one digit: the float32 error has saturated (sin of a 1e38 argument is off by
    # ~0.4 whatever its conditioning), so scaling it down says nothing; allow float32's error.
    return err if err > _SATURATED and relax.saturated else err * _F32_TO_F64


def _bitwise(a: RunResult, b: RunResult) -> list[Mismatch]:
    pairs = [(f"output {i}", x, y) for i, (x, y) in enumerate(zip(a.outputs, b.outputs))]
    pairs += [(f"grad of {n}", x, y) for n, x, y in zip(a.wrt, a.grads, b.grads)]
    pairs += [(f"buffer {n}", a.buffers[n], b.buffers.get(n)) for n in a.buffers]
    return [Mismatch(what, "two compiled runs with the same seed differ bitwise")
            for what, x, y in pairs if not bitwise_equal(x, y)]


def _clone(x: Any, dtype: Optional[torch.dtype] = None) -> Any:
    """A copy with the same sizes, strides, offset and requires_grad (expanded inputs stay so)."""
    if not torch.is_tensor(x):
        return x
    dtype = dtype if dtype is not None and x.is_floating_point() else x.dtype
    if x.layout != torch.strided:  # sparse: no storage to share
        return x.detach().clone().to(dtype).requires_grad_(x.requires_grad)
    y = _storage_of(x).detach().clone().to(dtype).as_strided(x.shape, x.stride(),
                                                               x.storage_offset())
    return y.requires_grad_(x.requires_grad)


def _storage_of(x: torch.Tensor) -> torch.Tensor:
    """All of x's storage as a flat tensor of x's dtype (a view: no copy)."""
    n = x.untyped_storage().nbytes() // x.element_size()
    flat = torch.empty(0, dtype=x.dtype, device=x.device)
    return flat.set_(x.untyped_storage(), 0, (n,), (1,))


def _state(obj: Any) -> dict:
    if not isinstance(obj, torch.nn.Module):
        return {}
    return {k: v.detach().clone() for k, v in obj.state_dict(keep_vars=True).items()}


def _load_state(obj: Any, state: dict) -> None:
    if state:
        current = obj.state_dict(keep_vars=True)
        with torch.no_grad():
            for k, v in state.items():
                current[k].copy_(v)


def _report(mismatches: list[Mismatch], fn: Callable, source: Optional[str],
            options: dict) -> str:
    if source is None:
        try:
            source = inspect.getsource(fn if not isinstance(fn, torch.nn.Module) else type(fn))
        except (OSError, TypeError):
            source = repr(fn)
    lines = [f"trainc result differs from eager (compile options {options}):"]
    lines += [f"  {m}" for m in mismatches]
    return "\n".join(lines + ["program:", source])
