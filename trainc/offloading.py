"""Saved activations in host memory: which saved values move, and the requests that tell the
codegen to move them (codegen/memory/offload.py places the copies, codegen/host_copies.py runs
them).

A value moves when a trainc.policy("offload") region made it, or when a memory budget with
Config.offload needs the memory: the budget's search (partition/variants.py) reads each
candidate plan's predicted step peak with the most saved bytes moved that the copies' estimates
allow (the forward's copies done before it ends, the backward barely waiting), then moves the
fewest that meet the cap. Values move in the order the forward makes them: the first made are
the last the backward reads, so their copies have the longest to run.
"""
from __future__ import annotations

from typing import Callable, Optional, Sequence

import torch
import torch.fx as fx

from trainc.codegen.memory import offload as O
from trainc.codegen.memory.offload import OffloadRequest
from trainc.config import world_size
from trainc.graph import OFFLOAD_NODE
from trainc.partition import Partition

# The share of the backward's estimated time it may wait for copies back and still count as
# overlapped (the estimates are rough; more waiting is a plan that costs time).
STALL_SHARE = 0.02
DEFAULT_BANDWIDTH = 2.5e10  # bytes/s where nothing is measured (a CPU device: clones)
_BANDWIDTH: dict = {}


def host_bandwidth(device: torch.device) -> float:
    """The host link's bytes per second for pinned copies, measured once per CUDA device (64 MiB
    each way, the slower direction's best of three). Under torch.distributed with several ranks
    it is DEFAULT_BANDWIDTH unmeasured: a measurement differs between ranks, and so would the
    copies' places in the wrappers (every rank must compile the same code)."""
    if device.type != "cuda" or world_size() > 1:
        return DEFAULT_BANDWIDTH
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _BANDWIDTH:
        n = 64 << 20
        dev = torch.empty(n, dtype=torch.uint8, device=device)
        host = torch.empty(n, dtype=torch.uint8, pin_memory=True)
        best = []
        for to_host in (True, False):
            times = []
            for _ in range(3):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(
                    enable_timing=True)
                start.record()
                (host.copy_(dev, non_blocking=True) if to_host else
                 dev.copy_(host, non_blocking=True))
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end) / 1e3)
            best.append(n / min(times))
        _BANDWIDTH[index] = min(best)
    return _BANDWIDTH[index]


def _outputs(gm: fx.GraphModule) -> int:
    return len(gm.graph.output_node().args[0])


def save_request(fwd_gm: fx.GraphModule, part: Partition, bandwidth: float,
                 names: Optional[Sequence[str]] = None) -> OffloadRequest:
    """The forward's request to move the saved values `names` (default: the partition's
    offloaded): its output positions (the saved values are its last outputs)."""
    wanted = set(part.offloaded if names is None else names)
    first = _outputs(fwd_gm) - len(part.saved)
    return OffloadRequest(outputs=tuple(first + j for j, s in enumerate(part.saved)
                                        if s in wanted), bandwidth=bandwidth)


def request_loads(bwd_gms: Sequence[Optional[fx.GraphModule]], part: Partition,
                  fwd_gm: fx.GraphModule, moved: Sequence[int], bandwidth: float) -> tuple:
    """Tell every backward graph which saved values arrive on the host (`moved`: the forward
    wrapper's output positions it returns as host copies); the names moved."""
    first = _outputs(fwd_gm) - len(part.saved)
    inputs = tuple(p - first for p in moved)
    for gm in bwd_gms:
        if gm is not None:
            gm.meta[O.OFFLOAD] = OffloadRequest(inputs=inputs, bandwidth=bandwidth)
    return tuple(part.saved[j] for j in inputs)


def kept_why(backend: str, moves: bool) -> str:
    """Why a value asked to move to host memory stayed on the device (explain's rule)."""
    if not moves:
        return f"backend {backend!r} keeps saved values in device memory"
    return (f"the codegen moves only whole buffers of at least {O.MIN_BYTES} bytes that it makes "
            "(no fallback's result, none written again in place), returned once or, inside a "
            "step, read again after a gap")


class BudgetOffload:
    """A memory budget's predictions for one joint graph when saved values may move: a plan ->
    its predicted step peak with the most moved that the copies allow (`__call__`), without
    moving any (`base`), and the fewest moved that meet a cap (`offload`).

    `build(plan)` gives (partition, forward graph, backward graph) after the post-grad passes;
    `models(gm)` an offload request -> that graph's MemoryPlan (codegen/driver.memory_model);
    `step_peak(part, fwd_plan, bwd_plan, moved)` the StepPeak."""

    def __init__(self, build: Callable, models: Callable, step_peak: Callable, bandwidth: float):
        self.build, self.models, self.step_peak = build, models, step_peak
        self.bandwidth = bandwidth
        self.graphs: dict = {}
        self.peaks: dict = {}  # (plan key, n) -> (peak, feasible, names the wrappers move)
        self.estimates: dict = {}  # (plan key, n) -> (forward copies late, stall s, allowed s)
        self.most: dict = {}  # plan key -> the most values that can move

    def _graphs(self, plan):
        key = _key(plan)
        if key not in self.graphs:
            part, fwd, bwd = self.build(plan)
            order = _made_order(fwd, part)
            movable = [d.name for d in part.decisions if d.action == "saved" and not d.is_input
                       and not d.offload and d.nbytes >= O.MIN_BYTES and d.name in order]
            cands = sorted(movable, key=lambda s: order[s])
            self.graphs[key] = (part, fwd, bwd, self.models(fwd), self.models(bwd), cands)
        return self.graphs[key]

    def peak(self, plan, n: int) -> tuple[int, bool, tuple]:
        """The predicted step peak with the first n candidates moved (and any the policy
        moves), whether the copies' estimates let them overlap the compute, and the names the
        wrappers move (of those asked)."""
        key = (_key(plan), n)
        if key not in self.peaks:
            part, fwd, bwd, fmodel, bmodel, cands = self._graphs(plan)
            names = list(part.offloaded) + cands[:n]
            fplan = fmodel(save_request(fwd, part, self.bandwidth, names))
            first = _outputs(fwd) - len(part.saved)
            inputs = tuple(p - first for p in fplan.moved)
            bplan = bmodel(OffloadRequest(inputs=inputs, bandwidth=self.bandwidth))
            moved = [part.saved[j] for j in inputs]
            fo, bo = fplan.offload, bplan.offload
            late, stall = (fo.late if fo else 0), (bo.stall_seconds if bo else 0.0)
            allowed = STALL_SHARE * bo.span_seconds if bo else 0.0
            ok = late == 0 and stall <= allowed
            self.estimates[key] = (late, stall, allowed)
            self.peaks[key] = (self.step_peak(part, fplan, bplan, moved).peak, ok, tuple(moved))
        return self.peaks[key]

    def base(self, plan) -> int:
        return self.peak(plan, 0)[0]

    def __call__(self, plan) -> int:
        k = _key(plan)
        if k not in self.most:
            self.most[k] = _most(lambda n: self.peak(plan, n), len(self._graphs(plan)[5]))
        return self.peak(plan, self.most[k])[0]

    def limit(self, plan) -> str:
        """Why no more than the most candidates of `plan` can move (the budget's note)."""
        self(plan)
        most, n = self.most[_key(plan)], len(self._graphs(plan)[5])
        if n == 0:
            return (f"no saved value of the plan can move (the candidates: at least {O.MIN_BYTES} "
                    "bytes, made by the forward, not an input)")
        if most == n:
            return f"all {n} candidates can move"
        late, stall, allowed = self.estimates[(_key(plan), most + 1)]
        why = f"{late} forward copies would end after the forward" if late else \
            f"the backward would wait {stall * 1e3:.3g} ms for copies (allowed {allowed * 1e3:.3g})"
        return f"{most} of {n} candidates can move; moving {most + 1}: {why}"

    def describe(self, plan) -> str:
        """A plan's offload detail for the search table: its peak with none moved, the most
        that can move and their bytes, and what stops one more."""
        self(plan)
        most = self.most[_key(plan)]
        part = self._graphs(plan)[0]
        moved = set(self.peak(plan, most)[2])
        host = sum(d.nbytes for d in part.decisions if d.name in moved)
        return (f"none moved {self.base(plan) / 2 ** 20:.1f} MiB; most moved "
                f"{host / 2 ** 20:.1f} MiB to host; {self.limit(plan)}")

    def offload(self, plan, cap: int) -> tuple[tuple[str, ...], int]:
        """The fewest candidates (in the forward's order) whose moving meets `cap`, within the
        most that can move: the names the wrappers then move, and the predicted peak."""
        self(plan)
        peak, _, moved = self.peak(plan, _fewest(lambda n: self.peak(plan, n),
                                                 self.most[_key(plan)], cap))
        return moved, peak


def _most(peak: Callable[[int], tuple], n: int) -> int:
    """The most candidates that can move (peak(k)[1]: moving the first k overlaps the compute;
    that falls as more move), of n."""
    lo, hi = 0, n
    if peak(hi)[1]:
        return hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if peak(mid)[1] else (lo, mid)
    return lo


def _fewest(peak: Callable[[int], tuple], most: int, cap: int) -> int:
    """The fewest candidates whose moving brings peak(k)[0] under `cap`, at most `most`."""
    if peak(0)[0] <= cap:
        return 0
    lo, hi = 0, most  # peak(lo) > cap >= peak(hi), or hi = most
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if peak(mid)[0] <= cap else (mid, hi)
    return hi


def _made_order(fwd: fx.GraphModule, part: Partition) -> dict[str, int]:
    """Saved value name -> where the forward graph makes it (the saved values are its last
    outputs; the post-grad passes may have renamed their nodes)."""
    place = {n: i for i, n in enumerate(fwd.graph.nodes)}
    outs = fwd.graph.output_node().args[0]
    first = len(outs) - len(part.saved)
    return {s: place[o] for s, o in zip(part.saved, outs[first:]) if isinstance(o, fx.Node)}


def _key(plan) -> tuple:
    return tuple(n.name for n in plan.saved)


class StepOffload:
    """compile_step's budget predictions where saved values may move within the step graph
    (codegen/memory/offload.py plan_inner): a stitched step -> its predicted peak with the most
    moved that the copies allow (`__call__`), with none (`base`), and the fewest (in the
    forward's order) that meet a cap (`offload`: the names moved and the peak).

    `prepare(stitched)` gives the graph after the post-grad passes; `models(gm)` an offload
    request -> its MemoryPlan (codegen/driver.memory_model)."""

    def __init__(self, prepare: Callable, models: Callable, bandwidth: float):
        self.prepare, self.models, self.bandwidth = prepare, models, bandwidth

    def _model(self, stitched: fx.GraphModule):
        g = self.prepare(stitched)
        names = [n.meta[OFFLOAD_NODE] for n in g.graph.nodes if OFFLOAD_NODE in n.meta and
                 _nbytes(n) >= O.MIN_BYTES]
        return self.models(g), names, {}

    def _peak(self, model, names: list, memo: dict, n: int) -> tuple[int, bool, tuple]:
        if n not in memo:
            plan = model(O.OffloadRequest(inner=True, names=tuple(names[:n]),
                                          bandwidth=self.bandwidth) if n else None)
            o = plan.offload
            ok = o is None or o.stall_seconds <= STALL_SHARE * o.span_seconds
            memo[n] = (plan.peak_bytes, ok, plan.moved_nodes)
        return memo[n]

    def base(self, stitched: fx.GraphModule) -> int:
        return self._peaks(stitched)[0](0)[0]

    def __call__(self, stitched: fx.GraphModule) -> int:
        peak, n = self._peaks(stitched)
        return peak(_most(peak, n))[0]

    def offload(self, stitched: fx.GraphModule, cap: int) -> tuple[tuple[str, ...], int]:
        peak, n = self._peaks(stitched)
        found, _, moved = peak(_fewest(peak, _most(peak, n), cap))
        return moved, found

    def _peaks(self, stitched: fx.GraphModule) -> tuple[Callable[[int], tuple], int]:
        """k -> (peak, overlaps, moved) with the first k candidates asked to move, memoised;
        and the number of candidates."""
        model, names, memo = self._model(stitched)
        return (lambda k: self._peak(model, names, memo, k)), len(names)


def _nbytes(n: fx.Node) -> int:
    v = n.meta.get("val")
    return v.numel() * v.element_size() if isinstance(v, torch.Tensor) else 0
