"""GPU kernel/host profile of one shared model, trainc vs Inductor (a diagnostic, not a table).

    python benchmarks/kprof.py MODEL DTYPE fwdbwd|step [MODES]   (MODES: inductor,trainc,...)
    KPROF_OFF=variance,scalars,cudaempty python benchmarks/kprof.py ...  (A/B: those changes off)

Per mode: median wall ms of 15 (ITERS=N) CUDA-event-timed steps, host ms to issue a step, then
torch.profiler over 5 steps: kernel ms and launches per step and the top kernels (TOP=N, default
25). step: trainc.compile_step vs the model+loss compiled with a compiled AdamW step (modes
trainc, trainc_nographs, inductor). Run each mode in its own process for host numbers: a
profiled mode can leave launch hooks behind that slow the next one.
"""
import collections, json, os, statistics, sys, time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
for _bench in (os.path.join(HERE, "suite_models"),):
    if os.path.isdir(_bench):
        sys.path.insert(0, os.path.abspath(_bench))
import models  # noqa: E402
import trainc  # noqa: E402

# KPROF_OFF=variance,scalars: time trainc without session 11's untimed Triton changes (the
# parallel variance split, stored one-element scalars), for an A/B in separate processes
_off = set(filter(None, os.environ.get("KPROF_OFF", "").split(",")))
if "variance" in _off:
    from trainc.codegen import split_reductions as _sr
    _sr._split_variance = lambda *a: None
if "scalars" in _off:
    from trainc.codegen import graph as _graph
    _graph.SCALAR_LIMIT = 1 << 30
if "cudaempty" in _off:  # CUDA wrappers allocate through torch.empty_strided
    from trainc.codegen import wrapper as _wrapper
    _wrapper.EMPTY_CUDA = None

name, dt, kind = sys.argv[1], getattr(torch, sys.argv[2]), sys.argv[3]
modes = sys.argv[4].split(",") if len(sys.argv) > 4 else ["inductor", "trainc"]


def make(mode):
    torch._dynamo.reset()
    m, x, loss = models.build(name, "cuda", "gpu", dt)
    xs = tuple(t.detach() for t in x)
    if kind == "fwdbwd":
        fn = {"eager": lambda: m, "inductor": lambda: torch.compile(m),
              "trainc": lambda: trainc.compile(m, backend="triton")}[mode]()
        return lambda: models.step(fn, x, loss)
    lf = lambda mm, *a: loss(mm(*a), a)
    if mode.startswith("trainc"):
        opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
        kw = {"trainc_nographs": dict(cudagraphs=False)}.get(mode, {})
        st = trainc.compile_step(m, lf, opt, backend="triton", **kw)
        return lambda: st(*xs)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-4, foreach=True)
    fl = torch.compile(lambda *a: loss(m(*a), a))
    os_ = torch.compile(opt.step)

    def step():
        l = fl(*xs)
        l.backward()
        os_()
        opt.zero_grad(set_to_none=True)
        return l
    return step


res = {}
for mode in modes:
    f = make(mode)
    for _ in range(3):
        f()
    torch.cuda.synchronize()
    walls, hosts = [], []
    for _ in range(int(os.environ.get("ITERS", "15"))):
        torch.cuda.synchronize()
        s, e = torch.cuda.Event(True), torch.cuda.Event(True)
        t = time.perf_counter()
        s.record()
        f()
        e.record()
        hosts.append((time.perf_counter() - t) * 1e3)
        torch.cuda.synchronize()
        walls.append(s.elapsed_time(e))
    n = 5
    from torch.profiler import profile, ProfilerActivity
    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as p:
        for _ in range(n):
            f()
        torch.cuda.synchronize()
    agg = collections.defaultdict(lambda: [0, 0.0])
    tot, cnt = 0.0, 0
    for ev in p.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            k = ev.name[:90]
            agg[k][0] += 1
            agg[k][1] += getattr(ev, "device_time_total", None) or ev.cuda_time_total
    for k, (c, t) in agg.items():
        tot += t
        cnt += c
    top = sorted(agg.items(), key=lambda kv: -kv[1][1])[:int(os.environ.get("TOP", "25"))]
    print(f"== {name} {sys.argv[2]} {kind} {mode}: wall {statistics.median(walls):.3f} ms, host "
          f"{statistics.median(hosts):.3f} ms, kernels {tot / n / 1e3:.3f} ms, "
          f"launches {cnt / n:.0f}",
          flush=True)
    for k, (c, t) in top:
        print(f"   {t / n / 1e3:8.3f} ms  x{c / n:5.1f}  {k}")
    res[mode] = dict(wall=statistics.median(walls), host=statistics.median(hosts),
                     kernels=tot / n / 1e3, launches=cnt / n)
    del f
    torch.cuda.empty_cache()
print(json.dumps(res))
