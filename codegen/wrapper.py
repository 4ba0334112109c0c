"""Schedule + memory plan -> the Python wrapper: allocates buffers, calls kernels and ATen,
frees after last use.

The memory plan (codegen/memory/) decides every allocation, reuse, in-place take, free and kept
buffer first; the printer here spells each of its events as a line. Kernels take data pointers
(C++) or tensors (Triton); buffers are allocated on `device`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

import torch

from trainc.codegen.graph import Buffer, CallNode, TensorArg
from trainc.codegen.host_copies import HostCopies
from trainc.codegen.memory import MemoryPlan, peak_rows, plan_memory
from trainc.codegen.memory.inplace import OUT_VARIANTS
from trainc.codegen.memory.kept import Kept, held_arenas, note_held  # noqa: F401 (re-exported)
from trainc.codegen.memory.offload import Offload
from trainc.codegen.memory.walk import LOADS, MAKES, Event, reads
from trainc.codegen.scheduler import Kernel, Schedule

aten = torch.ops.aten
# The same ops through torch's generated Python bindings: an OpOverload call goes through the
# boxed operator path, microseconds more per call.
FAST_CALLS = {aten.mm.out: torch.mm, aten.addmm.out: torch.addmm, aten.bmm.out: torch.bmm,
              aten.convolution.default: torch.convolution, aten.addmm_.default: torch.Tensor.addmm_}


@dataclass(frozen=True)
class Wrapper:
    source: str
    namespace: dict
    # fresh_bytes: what one run allocates (wrapper + ATen results); peak_bytes: most of it
    # alive at once (pooled buffers count as alive); inplace: results written into their target
    stats: dict = field(default_factory=dict)

    def build(self, kernels: Any) -> Callable[[list], list]:
        ns = dict(self.namespace, K=kernels)
        if "KEEP" in ns:  # each built wrapper owns its kept buffers
            k = ns["KEEP"]
            ns["KEEP"] = Kept(k.nbytes, k.specs, k.device)
        exec(compile(self.source, "<trainc wrapper>", "exec"), ns)
        return ns["run"]


def _empty_cpu(size: tuple, stride: tuple, dtype: torch.dtype) -> torch.Tensor:
    return torch.empty_strided(size, stride, dtype=dtype)


# CPU buffers: Dynamo's allocator entry point skips the Python argument parser and the
# dispatcher (0.5 vs 2.3 us per buffer; gpt allocates ~40 per step); torch.empty_strided where
# a torch build lacks it. CUDA has one too, for the current device only (cuda_empty).
_GUARDS = getattr(getattr(torch._C, "_dynamo", None), "guards", None)
EMPTY_CPU = getattr(_GUARDS, "_empty_strided_cpu", _empty_cpu)
EMPTY_CUDA = getattr(_GUARDS, "_empty_strided_cuda", None)


def cuda_empty(device: torch.device) -> Callable:
    """The allocator a CUDA wrapper uses for one call: Dynamo's current-device entry point when
    `device` is the current device (or names none), else torch.empty_strided on `device`."""
    if EMPTY_CUDA is not None and (device.index is None or
                                   device.index == torch.cuda.current_device()):
        return EMPTY_CUDA
    return lambda size, stride, dtype: torch.empty_strided(size, stride, dtype=dtype,
                                                           device=device)


def restride(t: torch.Tensor, stride) -> torch.Tensor:
    """t laid out with `stride` (inputs and ATen results the kernels index by stride): t itself
    when only the strides of size-1 dims differ (they are never used to index), else a copy.
    A target stride of 0 on a longer dim (an expanded layout) is a saved value the forward
    traced as an expand (graph inputs with other strides recompile): its slices along those
    dims are equal, so the first one is laid out and expanded."""
    if all(n == 1 or a == b for n, a, b in zip(t.shape, t.stride(), stride)):
        return t
    shape = tuple(t.shape)
    flat = [d for d, (n, b) in enumerate(zip(shape, stride)) if n > 1 and b == 0]
    for d in flat:
        t = t.narrow(d, 0, 1)
    out = torch.empty_strided(t.shape, stride, dtype=t.dtype, device=t.device).copy_(t)
    return out.expand(shape) if flat else out


SCALAR_ALIGN = 16  # bytes: Triton specializes a kernel on each pointer's 16-byte alignment


def pack_scalars(ts: Sequence[torch.Tensor]) -> torch.Tensor:
    """One-element tensors of one dtype as rows of a (n, SCALAR_ALIGN // itemsize) tensor, the
    value in column 0: row j starts 16*j bytes in, so each scalar's view is as aligned as
    Triton's precompile assumes (packed tightly, 3 in 4 float32 views were not: their kernels
    compiled again at their first launch)."""
    width = max(1, SCALAR_ALIGN // ts[0].element_size())
    # (host time before a step's first launch: one op per scalar only where one is not 0-d)
    flat = ts if all(t.dim() == 0 for t in ts) else [t.reshape(()) for t in ts]
    return torch.stack(flat).unsqueeze(1).expand(len(ts), width).clone()


def scalar_views(packed: torch.Tensor, ts: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """The scalars of a packed (n, width) tensor, each viewed in its original shape (unbind:
    one op for all of them)."""
    views = packed[:, 0].unbind(0)
    return [v if t.dim() == 0 else v.view(t.shape) for v, t in zip(views, ts)]


def upload_scalars(device: torch.device, *ts: torch.Tensor) -> list[torch.Tensor]:
    """CPU scalars of one dtype on `device` in one host-to-device copy (already there, as in a
    CUDA graph's capture: as they are)."""
    if all(t.device == device for t in ts):
        return list(ts)
    packed = pack_scalars(ts).to(device, non_blocking=True)
    return scalar_views(packed, ts)


class _Printer:
    """Spells the wrapper from the schedule and its memory plan, one line at a time."""

    def __init__(self, sched: Schedule, plan: MemoryPlan, params: dict[str, list[str]],
                 tensors: bool, device: Optional[torch.device], host_scalars: Sequence[str] = (),
                 gemm: Optional[Callable[..., Optional[Callable]]] = None):
        self.s, self.g, self.plan, self.params = sched, sched.graph, plan, params
        self.gemm = gemm or (lambda call, inplace=False: None)
        self.host_scalars = list(host_scalars)
        self.tensors, self.device = tensors, device
        self.lines: list[str] = []
        self.ns: dict = {"torch": torch, "restride": restride, "device": torch.device,
                         "upload_scalars": upload_scalars, "inf": float("inf"),
                         "nan": float("nan"), "DEVICE": device}
        if device is None or device.type == "cpu":
            self.ns["empty"] = EMPTY_CPU
        elif device.type == "cuda":
            self.ns["cuda_empty"] = cuda_empty
        self.kept = {k.buf: (j, k) for j, k in enumerate(plan.kept)}
        self.view_once = {k.buf for k in plan.kept if k.view}
        if plan.kept:
            self.ns["KEEP"] = Kept(plan.arena_bytes, [(k.offset, k.shape, k.stride, k.dtype)
                                                     for k in plan.kept], device)
        self.host_outputs = set(plan.offload.saves) if plan.offload else set()
        if plan.offload:
            self.ns["OFF"] = HostCopies(device)

    def emit(self, line: str) -> None:
        self.lines.append("    " + line)

    def write(self) -> str:
        g = self.g
        self.emit(f"{', '.join(g.params) + ',' if g.params else '_'} = args")
        if self.plan.kept:
            self.emit("KEPT = KEEP.acquire()")
        self.emit("args.clear()")  # run(args) takes the inputs over: see walk.py's free()
        self.unchecked = list(g.inputs)
        self.uploads = self._scalar_groups()
        if "cuda_empty" in self.ns:  # looked up once per call
            self.emit("empty = cuda_empty(DEVICE)")
        for name, t in g.consts.items():
            self.ns[name] = t
        launches = self.tensors and any(isinstance(it, Kernel) for it in self.s.items)
        if launches:  # Triton: the stream and launch hooks, looked up once per call
            self.emit("K.begin()")
        if self.plan.offload:
            self.emit("HOSTC = OFF.begin()")
        for k, item in enumerate(self.s.items):
            events = self.plan.item_events(k)
            for e in events:
                if e.kind in LOADS:
                    self._event(e)
            self._prepare_inputs(set(reads(item, self.params)))
            makes = [e for e in events if e.kind in MAKES]
            if isinstance(item, Kernel):
                self._kernel(item, makes)
            else:
                self._call(item, self.plan.forms[k], makes)
            for e in events:
                if e.kind not in MAKES and e.kind not in LOADS:
                    self._event(e)
        self._prepare_inputs(set(g.inputs))  # inputs only returned
        if launches:  # (a call that raised leaves it set: the next call sets it again)
            self.emit("K.end()")
        if self.plan.kept:
            self.emit("KEEP.release(KEPT)")
        outs = ", ".join(self._host_arg(a) if isinstance(a, TensorArg) and
                         a.buf in self.host_outputs else self._arg(a) for a in g.outputs)
        self.emit(f"return [{outs}]")
        return "def run(args):\n" + "\n".join(self.lines) + "\n"

    def _event(self, e: Event) -> None:
        """The line of one memory event (aten results and pooled buffers have none)."""
        if e.kind == "alloc":
            self._alloc(e.buf)
        elif e.kind == "reuse":
            self.emit(f"{e.buf} = {e.src}.view({list(self.g.buffers[e.buf].shape)}); "
                      f"del {e.src}")
        elif e.kind == "inplace":
            self.emit(f"{e.buf} = {e.src}  # in place")
        elif e.kind in ("free", "drop"):
            self.emit(f"del {e.buf}")
        elif e.kind == "offload":
            self.emit(f"{e.buf}__host = HOSTC.save({e.buf})  # to host")
        elif e.kind == "prefetch":
            self.emit(f"{e.buf}, {e.buf}__ready = HOSTC.load({e.src or e.buf})"
                      + (f"; del {e.src}" if e.src else "") + "  # back from host")
        elif e.kind == "ready":
            self.emit(f"HOSTC.ready({e.buf}__ready); del {e.buf}__ready")

    def _alloc(self, name: str) -> None:
        b: Buffer = self.g.buffers[name]
        if name in self.kept:
            j, k = self.kept[name]
            self.emit(f"{name} = KEPT[{j}]  # {list(k.shape)} strides {list(k.stride)}")
        elif "empty" in self.ns or "cuda_empty" in self.ns:
            self.emit(f"{name} = empty({tuple(b.shape)}, {tuple(b.stride)}, {b.dtype})")
        else:
            self.emit(f"{name} = torch.empty_strided({list(b.shape)}, {list(b.stride)}, "
                      f"device=DEVICE, dtype={b.dtype})")

    def _scalar_groups(self) -> list[list[str]]:
        """CPU scalars of a CUDA graph (optimizer step counts and hyperparameters, the RNG
        seed) go to the device in one copy per dtype, not one per kernel launch that reads
        them."""
        groups: dict[torch.dtype, list[str]] = {}
        for name in self.host_scalars:
            groups.setdefault(self.g.buffers[name].dtype, []).append(name)
        return list(groups.values())

    def _prepare_inputs(self, names: set[str]) -> None:
        """Each input's layout check, and the upload of its group of CPU scalars, just before
        the first item that reads it: the host reaches the step's first launches sooner (the
        GPU waits for them), and the rest runs while kernels do."""
        for name in [n for n in self.unchecked if n in names]:
            b = self.g.buffers[name]
            self.emit(f"if {name}.stride() != {b.stride} and {name}.numel() > 1: "
                      f"{name} = restride({name}, {b.stride})")
            self.unchecked.remove(name)
        for group in [u for u in self.uploads if names.intersection(u)]:
            self.emit(f"{', '.join(group)}, = upload_scalars(DEVICE, {', '.join(group)})")
            self.uploads.remove(group)

    def _kernel(self, k: Kernel, makes: list[Event]) -> None:
        for e in makes:
            self._event(e)
        ptr = "" if self.tensors else ".data_ptr()"
        ptrs = ", ".join(f"{b}{ptr}" for b in self.params[k.name])
        self.emit(f"K.{k.name}({ptrs})")

    def _call(self, c: CallNode, form: str, makes: list[Event]) -> None:
        op = f"op_{len([x for x in self.ns if x.startswith('op_')])}"
        args = ", ".join(self._arg(a) for a in c.args)
        kwargs = "".join(f", {k}={self._arg(v)}" for k, v in c.kwargs.items())
        if form == "inplace":
            target, key = c.inplace
            self.ns[op] = self.gemm(c, inplace=True) or FAST_CALLS.get(target, target)
            dest = makes[0].src
            kwargs += f", {key}={dest}" if isinstance(key, str) else ""
            self.emit(f"{op}({args}{kwargs})  # {c.kind} in place {c.origin}")
            self._event(makes[0])
            return
        if form == "out":
            out_op = OUT_VARIANTS[c.target]
            self.ns[op] = FAST_CALLS.get(out_op, out_op)
            for e in makes:
                self._event(e)
            self.emit(f"{op}({args}, out={c.outputs[0]})  # {c.origin}")
            return
        self.ns[op] = self.gemm(c) or FAST_CALLS.get(c.target, c.target)
        names = [o or "_" for o in c.outputs]
        single = not isinstance(_result_kind(c), tuple)
        lhs = names[0] if single else ", ".join(names) + ","
        self.emit(f"{lhs} = {op}({args}{kwargs})  # {c.kind} {c.origin}")
        for o in c.outputs:
            if o is not None:
                b = self.g.buffers[o]
                self.emit(f"if {o}.stride() != {b.stride} and {o}.numel() > 1: "
                          f"{o} = restride({o}, {b.stride})")

    def _host_arg(self, a: TensorArg) -> str:
        """An output moved to host: the buffer's host copy, viewed as the output views the
        buffer (offload.covers: all of it, dense)."""
        return f"{a.buf}__host" + ("" if a.whole else _view_text(a.shape, a.stride))

    def _arg(self, a) -> str:
        if isinstance(a, TensorArg):
            if a.whole:
                return a.buf
            if a.offset == 0:  # as_strided keeps the base's storage offset by default
                return a.buf if a.buf in self.view_once else a.buf + _view_text(a.shape, a.stride)
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


def _view_text(shape, stride) -> str:
    return f".as_strided({list(shape)}, {list(stride)})"


def _peak_comment(stats: dict) -> str:
    """The planned peak and the largest buffers live there, as a comment atop the wrapper."""
    lines = [f"# planned peak {stats['peak_bytes'] / 2**20:.3f} MiB of buffers this wrapper "
             f"allocates; the largest live there:"]
    lines += [f"#   {name:10s} {str(list(shape)):24s} {dtype:15s} {nb / 2**20:9.3f} MiB  "
              f"{', '.join(origins)[:60]}" for name, shape, dtype, nb, origins in
              stats["peak_live"]]
    return "\n".join(lines) + "\n"


def write_wrapper(sched: Schedule, params: dict[str, list[str]], *, tensors: bool = False,
                  device: Optional[torch.device] = None, keep: bool = False,
                  host_scalars: Sequence[str] = (),
                  gemm: Optional[Callable[..., Optional[Callable]]] = None,
                  offload: Optional[Offload] = None) -> Wrapper:
    """`params`: per kernel name, the buffers it takes, in order: as data pointers (C++
    functions through ctypes) or, with `tensors`, as tensors (Triton launchers). Buffers are
    allocated on `device` (None: torch's default device); with `keep`, those that never leave
    the wrapper once, then kept across calls (stats["kept_bytes"]). `host_scalars`: one-element
    CPU inputs of a graph whose kernels run on `device`, copied there once per call. `gemm`:
    per mm/addmm call (and `inplace=True`: one run in place), a function to call instead of
    ATen's out= or in-place form (codegen/cpp/gemm.py), or None. `offload`: buffers moved to
    host and back (codegen/memory/offload.py). The memory plan comes first
    (stats["memory_plan"]); the wrapper is printed from it."""
    plan = plan_memory(sched, params, keep=keep, tensors=tensors, gemm=gemm, offload=offload)
    p = _Printer(sched, plan, params, tensors, device, host_scalars, gemm)
    body = p.write()
    stats = {"fresh_bytes": plan.fresh_bytes - plan.arena_bytes, "peak_bytes": plan.peak_bytes,
             "inplace": len(plan.storage), "kept_bytes": plan.arena_bytes,
             "peak_live": peak_rows(plan, sched), "memory_plan": plan,
             # the layout of each tensor output (None: not a tensor), for the next graph's inputs
             "output_strides": tuple(tuple(a.stride) if isinstance(a, TensorArg) else None
                                     for a in sched.graph.outputs)}
    return Wrapper(_peak_comment(stats) + body, p.ns, stats)
