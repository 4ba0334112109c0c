"""options={"cudagraphs": True}: refused with a clear error on CPU; on CUDA (gpu mark) a compiled
model and a compile_step replay CUDA graphs and match the runs without them."""
import copy

import pytest
import torch

import trainc


def _mlp():
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))


@pytest.mark.parametrize("backend", ["cpp", "aten"])
def test_cudagraphs_is_refused_on_cpu(backend):
    fn = trainc.compile(_mlp(), backend=backend, cudagraphs=True)
    with pytest.raises(trainc.UnsupportedError, match="cudagraphs=True .* needs CUDA tensors"):
        fn(torch.randn(3, 16))
    opt_model = _mlp()
    step = trainc.compile_step(opt_model, lambda m, x: m(x).sum(),
                               torch.optim.SGD(opt_model.parameters(), lr=0.1),
                               backend=backend, cudagraphs=True)
    with pytest.raises(trainc.UnsupportedError, match="needs CUDA tensors"):
        step(torch.randn(3, 16))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cudagraphs_replay_matches_plain_runs_on_gpu():
    model = _mlp().cuda()
    ref = copy.deepcopy(model)
    g_fn = trainc.compile(model, backend="triton", cudagraphs=True)
    r_fn = trainc.compile(ref, backend="triton")
    for i in range(4):  # run, capture, replay, replay with a new batch
        x = torch.randn(8, 16, device="cuda")
        a, b = g_fn(x), r_fn(x)
        a.square().sum().backward()
        b.square().sum().backward()
        torch.testing.assert_close(a, b)
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad)
    m2 = _mlp().cuda()
    r2 = copy.deepcopy(m2)  # the same initial weights: the two steps must agree
    lf = lambda m, x, y: torch.nn.functional.mse_loss(m(x), y)
    s1 = trainc.compile_step(m2, lf, torch.optim.AdamW(m2.parameters(), lr=1e-2),
                             backend="triton", cudagraphs=True)
    s2 = trainc.compile_step(r2, lf, torch.optim.AdamW(r2.parameters(), lr=1e-2),
                             backend="triton")
    ptrs = [p.data_ptr() for p in m2.parameters()]
    for i in range(5):
        x, y = torch.randn(8, 16, device="cuda"), torch.randn(8, 4, device="cuda")
        torch.testing.assert_close(s1(x, y), s2(x, y))
    for p, q in zip(m2.parameters(), r2.parameters()):
        torch.testing.assert_close(p, q)
    assert [p.data_ptr() for p in m2.parameters()] == ptrs


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cudagraphs_peak_counts_the_private_pool_on_gpu():
    """A replay allocates almost nothing; the graph's private pool holds its buffers between
    calls, and peak_bytes must count it (at least the plain run's peak)."""
    from trainc.report import peak_bytes
    lf = lambda m, x, y: torch.nn.functional.mse_loss(m(x), y)
    x, y = torch.randn(256, 16, device="cuda"), torch.randn(256, 4, device="cuda")
    peaks = {}
    for graphs in (False, True):
        m = _mlp().cuda()
        step = trainc.compile_step(m, lf, torch.optim.SGD(m.parameters(), lr=1e-2),
                                   backend="triton", cudagraphs=graphs)
        for _ in range(3):
            step(x, y)
        peaks[graphs] = peak_bytes(lambda: step(x, y), torch.device("cuda"))
    assert peaks[True] >= peaks[False] > 0


def test_static_inputs_are_declared_by_the_graph():
    """compile_step declares parameters, buffers and optimizer state as staying put; the batch
    and CPU scalars are copied in (CPU: checked on the graph given to the backend)."""
    from trainc.codegen.cudagraphs import STATIC_INPUTS
    seen = {}
    import trainc.pipeline as step_mod  # compile_step's backend comes from pipeline.backend_for
    real = step_mod.get_backend

    def spy(name, device, config=None):
        backend = real(name, device, config)
        inner = backend.compile

        def compile(gm, example_inputs):
            seen["static"] = gm.meta.get(STATIC_INPUTS)
            seen["placeholders"] = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
            return inner(gm, example_inputs)
        backend.compile = compile
        return backend
    model = _mlp()
    step = trainc.compile_step(model, lambda m, x: m(x).sum(),
                               torch.optim.AdamW(model.parameters(), lr=0.1), backend="aten")
    step_mod.get_backend = spy
    try:
        step(torch.randn(3, 16))
    finally:
        step_mod.get_backend = real
    n_params = len(list(model.parameters()))
    static = seen["static"]
    # the parameters and their step, exp_avg and exp_avg_sq stay put (the runner still copies
    # the CPU step counts in: only CUDA inputs are captured in place); the hyperparameters and
    # the batch do not
    assert len(static) == 4 * n_params
    assert seen["placeholders"][-1] not in static


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_compile_step_replays_a_cuda_graph_by_default_on_gpu():
    """Default options on CUDA: one capture however the batch tensors move, LR scheduler
    changes and dropout seeds reach the replays, and the results match cudagraphs=False."""
    def build():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(),
                                   torch.nn.Dropout(0.2), torch.nn.Linear(32, 4)).cuda()
    lf = lambda m, x, y: torch.nn.functional.mse_loss(m(x), y)
    runs = {}
    for graphs in (None, False):
        m = build()
        opt = torch.optim.AdamW(m.parameters(), lr=1e-2, weight_decay=0.1)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
        options = {} if graphs is None else {"cudagraphs": graphs}
        step = trainc.compile_step(m, lf, opt, backend="triton", **options)
        torch.manual_seed(1)
        losses = []
        for i in range(7):
            x = torch.randn(8 + 0 * i, 16, device="cuda")  # a new tensor (address) each step
            y = torch.randn(8, 4, device="cuda")
            losses.append(step(x, y))
            sched.step()
        runs[graphs] = (losses, [p.detach().clone() for p in m.parameters()],
                        [s["exp_avg_sq"].clone() for s in opt.state.values()], step)
    for a, b in zip(runs[None][0], runs[False][0]):
        torch.testing.assert_close(a, b)
    for a, b in zip(runs[None][1] + runs[None][2], runs[False][1] + runs[False][2]):
        torch.testing.assert_close(a, b)
    (comp,) = {id(c): c for c in runs[None][3].cache.values()}.values()
    runner = comp.graph.extra["cudagraphs"]
    assert runner.captures == 1 and runner.calls == 7
    assert "cudagraphs" not in next(iter(runs[False][3].cache.values())).graph.extra


def test_cudagraphs_option_is_validated():
    """"auto" (compile_step's default on CUDA, config.resolve) is a value users may give too."""
    with pytest.raises(ValueError, match="cudagraphs must be None"):
        trainc.compile(_mlp(), cudagraphs="sometimes")
    trainc.compile(_mlp(), cudagraphs="auto")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_default_skips_the_graph_when_copies_outweigh_launches_on_gpu():
    """A step of a few kernels over a large batch: a replay would copy the batch every call
    for little launch time saved, so the default runs it plainly (cudagraphs=True captures)."""
    lf = lambda m, x: m(x).square().mean()
    x = torch.randn(1 << 20, 16, device="cuda")  # 64 MiB
    notes = {}
    for option in ({}, {"cudagraphs": True}):
        m = torch.nn.Linear(16, 4).cuda()
        step = trainc.compile_step(m, lf, torch.optim.SGD(m.parameters(), lr=1e-3),
                                   backend="triton", **option)
        for _ in range(3):
            step(x)
        runner = next(iter(step.cache.values())).graph.extra["cudagraphs"]
        notes[bool(option)] = (runner.graph is not None, runner.note)
    assert notes[False][0] is False and "not captured" in notes[False][1]
    assert notes[True][0] is True


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_default_graphs_of_two_batch_shapes_on_gpu():
    """A step that sees two batch shapes captures two graphs; alternating them matches plain
    runs."""
    lf = lambda m, x, y: torch.nn.functional.mse_loss(m(x), y)
    results = {}
    for option in ({}, {"cudagraphs": False}):
        torch.manual_seed(0)  # both runs start from the same weights
        m = _mlp().cuda()
        step = trainc.compile_step(m, lf, torch.optim.SGD(m.parameters(), lr=1e-2,
                                                          momentum=0.9), backend="triton",
                                   **option)
        torch.manual_seed(3)
        out = []
        for i in range(8):
            n = 8 if i % 2 else 5
            out.append(step(torch.randn(n, 16, device="cuda"), torch.randn(n, 4, device="cuda")))
        key = "plain" if option else "graphs"
        results[key] = (out, [p.detach().clone() for p in m.parameters()], step)
    for a, b in zip(results["graphs"][0] + results["graphs"][1],
                    results["plain"][0] + results["plain"][1]):
        torch.testing.assert_close(a, b)
    runners = [c.graph.extra["cudagraphs"] for c in
               {id(c): c for c in results["graphs"][2].cache.values()}.values()]
    # the first step runs before SGD has momentum buffers: a graph of its own, called once
    repeated = [r for r in runners if r.calls > 1]
    assert len(runners) == 3 and len(repeated) == 2
    assert all(r.graph is not None for r in repeated)


def test_auto_skips_a_step_whose_host_runs_ahead_of_the_gpu():
    """compile_step's default measures one plain call: a step whose host work is a small share
    of its GPU time (the GPU never waits for launches) gains nothing from a replay, and the
    graph's pool would hold memory: not captured. A host-bound step is."""
    from trainc.codegen.cudagraphs import CudaGraphRunner
    runner = CudaGraphRunner(lambda args: args, static=[], launches=40)
    runner.host_share = 0.2
    assert not runner.worth_it([]) and "host work takes 20%" in runner.note
    runner.host_share = 1.5
    assert runner.worth_it([])
    assert CudaGraphRunner(lambda args: args, launches=None).worth_it([])  # cudagraphs=True


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_default_skips_a_gpu_bound_step_on_gpu():
    """Large matmuls: the host launches a step far faster than the GPU runs it."""
    m = torch.nn.Sequential(torch.nn.Linear(4096, 4096), torch.nn.Linear(4096, 4096)).cuda()
    step = trainc.compile_step(m, lambda m, x: m(x).square().mean(),
                               torch.optim.SGD(m.parameters(), lr=1e-5), backend="triton")
    x = torch.randn(8192, 4096, device="cuda")
    for _ in range(4):
        step(x)
    runner = next(iter(step.cache.values())).graph.extra["cudagraphs"]
    assert runner.graph is None and "host work" in runner.note, runner.note
