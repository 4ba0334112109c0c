"""Saved activations moved to host memory (codegen/memory/offload.py, trainc/offloading.py):
trainc.policy("offload") regions and memory budgets with offload=True, on the Triton backend.
Under the interpreter (CPU tensors) a host copy is a clone, so the wrappers' lines, the memory
plans and the values are checked; on CUDA the copies run on side streams and the peak is
measured."""
import copy
import re

import pytest
import torch
import torch.nn.functional as F

import trainc
import trainc.offloading as offloading
from trainc.codegen.memory import offload as O
from trainc.report import peak_bytes



class Block(torch.nn.Module):
    """Three linears; the middle one's pointwise tail inside a trainc.policy region."""

    def __init__(self, tag, width=64):
        super().__init__()
        self.tag = tag
        self.l1, self.l2, self.l3 = (torch.nn.Linear(width, width) for _ in range(3))

    def forward(self, x):
        x = torch.tanh(self.l1(x))
        with trainc.policy(self.tag):
            y = self.l2(x).sin().cos() * x
        return F.gelu(self.l3(y)).sum()


@pytest.fixture
def small_moves(monkeypatch):
    """Move values of the tests' small sizes, and call the host link fast enough that every
    copy overlaps the tiny kernels (the interpreter's clones take no link time)."""
    monkeypatch.setattr(O, "MIN_BYTES", 1 << 12)
    monkeypatch.setattr(offloading, "DEFAULT_BANDWIDTH", 1e16)
    monkeypatch.setenv("TRAINC_CACHE_ARTIFACTS", "0")


def _chain(width=64, rows=256, layers=4, device="cpu", dtype=torch.float32):
    """A chain of tanh(x @ w) layers: each layer's saved activations are read only by its own
    backward, in reverse order."""
    g = torch.Generator().manual_seed(0)
    ws = [(torch.randn(width, width, generator=g) / width ** 0.5).to(device, dtype)
          .requires_grad_() for _ in range(layers)]
    x = torch.randn(rows, width, generator=g).to(device, dtype).requires_grad_()

    def f(x, *ws):
        for w in ws:
            x = torch.tanh(x @ w)
        return x.square().mean()
    return f, (x, *ws)


def _grads(fn, args):
    for a in args:
        a.grad = None
    out = fn(*args)
    out.backward()
    return out.detach(), [a.grad.clone() for a in args]



def _budget_zero_with_offload_matches(f, args, want, want_grads):
    torch._dynamo.reset()
    got, grads = _grads(trainc.compile(f, backend="triton", memory_budget=0.0, offload=True),
                        args)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    for g, w in zip(grads, want_grads):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-6)


def test_policy_offload_region_moves_to_host_and_matches_eager(small_moves):
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = Block("offload", width=128)
    x = torch.randn(64, 128, requires_grad=True)
    ex = trainc.explain(model, x, backend="triton")
    table = ex.table(per_value=True)
    assert "saved (host)" in table and "trainc.policy('offload')" in table, table
    moved = [d for g in ex.graphs for d in g.decisions if d.offload]
    assert moved and all(d.action == "saved" for d in moved)
    torch._dynamo.reset()
    want, want_grads = _grads(model, [x])[0], [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    compiled = trainc.compile(model, backend="triton")
    got = compiled(x)
    got.backward()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    for p, g in zip(model.parameters(), want_grads):
        torch.testing.assert_close(p.grad, g, rtol=1e-4, atol=1e-5)


def test_offload_wrappers_copy_out_and_back(small_moves, tmp_path, monkeypatch):
    monkeypatch.setenv("TRAINC_DEBUG_DIR", str(tmp_path))
    f, args = _chain()
    torch._dynamo.reset()
    trainc.compile(f, backend="triton", memory_budget=0.0, offload=True)(*args).backward()
    fwd = "".join(p.read_text() for p in tmp_path.rglob("*fwd*") if p.suffix == ".py")
    bwd = "".join(p.read_text() for p in tmp_path.rglob("*bwd*") if p.suffix == ".py")
    assert "HOSTC.save(" in fwd and "__host" in fwd, fwd[:2000]
    assert "HOSTC.load(" in bwd and "HOSTC.ready(" in bwd, bwd[:2000]


def test_budget_with_offload_lowers_the_predicted_peak(small_moves):
    """With offload allowed the lowest plan moves saved values to host: a lower predicted peak
    than recompute alone reaches, fractions read between it and the default, the same values."""
    f, args = _chain()
    want, want_grads = _grads(f, args)

    def explain(budget, offload):
        torch._dynamo.reset()
        return trainc.explain(f, *args, backend="triton", memory_budget=budget, offload=offload)

    default = explain(None, False).predicted_peak
    plain_low = explain(0.0, False).predicted_peak
    low_ex = explain(0.0, True)
    low, half = low_ex.predicted_peak, explain(0.5, True).predicted_peak
    assert low < plain_low <= default, (low, plain_low, default)
    assert low <= half <= low + 0.5 * (default - low), (low, half, default)
    notes = [n for g in low_ex.graphs for n in g.partition_notes if "moved to host" in n]
    assert notes and "candidates can move" in notes[0], notes
    assert 0 < low_ex.host_bytes <= low_ex.saved_bytes and "in host memory)" in str(low_ex)
    _budget_zero_with_offload_matches(f, args, want, want_grads)


def test_budget_note_names_what_stops_more_values_moving(small_moves, monkeypatch):
    """The budget's note names why no more saved values move: the last value the forward makes
    cannot reach host memory before the forward ends; on a slower link the backward would
    wait for its copies back."""
    f, args = _chain()

    def note(bandwidth):
        monkeypatch.setattr(offloading, "DEFAULT_BANDWIDTH", bandwidth)
        torch._dynamo.reset()
        ex = trainc.explain(f, *args, backend="triton", memory_budget=0.0, offload=True)
        return next(n for g in ex.graphs for n in g.partition_notes if "moved to host" in n)
    fast, slow = note(1e16), note(1e12)
    assert re.search(r"\(3 of 4 candidates can move; moving 4: 1 forward copies would end "
                     r"after the forward\)", fast), fast
    assert re.search(r"\(2 of 4 candidates can move; moving 3: the backward would wait "
                     r"[0-9.e-]+ ms for copies \(allowed [0-9.e-]+\)\)", slow), slow


def test_saved_views_of_whole_buffers_move_and_match_eager(small_moves, monkeypatch, tmp_path):
    """q, k and v as heads (permuted views of whole projection outputs) are saved for the
    attention's backward: their buffers move, the host copies viewed alike, and the values
    match eager's."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(128, 64, generator=g, requires_grad=True)
    ws = [(torch.randn(64, 64, generator=g) / 8).requires_grad_() for _ in range(3)]

    def f(x, wq, wk, wv):
        with trainc.policy("offload"):
            q, k, v = ((x @ w).view(2, 64, 4, 16).transpose(1, 2) for w in (wq, wk, wv))
        o = F.scaled_dot_product_attention(q, k, v)
        return o.transpose(1, 2).reshape(128, 64).square().mean()
    args = (x, *ws)
    want, want_grads = _grads(f, args)
    monkeypatch.setenv("TRAINC_DEBUG_DIR", str(tmp_path))
    torch._dynamo.reset()
    got, grads = _grads(trainc.compile(f, backend="triton"), args)
    fwd = "".join(p.read_text() for p in tmp_path.rglob("*fwd*wrapper*.py"))
    assert re.search(r"\w+__host\.as_strided\(\[2, 4, 64, 16\]", fwd), fwd[-3000:]
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    for a, b in zip(grads, want_grads):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_budget_search_dump_lists_every_rung_and_marks_the_choice(small_moves, monkeypatch,
                                                                  tmp_path):
    """21_budget_search.txt: one row per rung, the predicted ones with their offload detail,
    and the chosen plan (the one the note's moved values came from) starred."""
    f, args = _chain()
    monkeypatch.setenv("TRAINC_DEBUG_DIR", str(tmp_path))
    torch._dynamo.reset()
    trainc.explain(f, *args, backend="triton", memory_budget=0.0, offload=True)
    text = next(tmp_path.rglob("21_budget_search.txt")).read_text()
    rows = text.splitlines()[2:]
    assert text.startswith("cap ") and rows, text
    chosen = [r for r in rows if r.startswith("*")]
    assert len(chosen) == 1 and "most moved" in chosen[0], text
    assert re.search(r"candidates can move", chosen[0]), text


def test_offload_without_a_budget_or_policy_moves_nothing(small_moves):
    f, args = _chain()
    torch._dynamo.reset()
    ex = trainc.explain(f, *args, backend="triton", offload=True)
    assert not any(d.offload for g in ex.graphs for d in g.decisions)


def test_policy_offload_on_cpp_is_saved_and_says_why():
    torch._dynamo.reset()
    x = torch.randn(8, 64, requires_grad=True)
    ex = trainc.explain(Block("offload"), x, backend="cpp")
    region = [d for g in ex.graphs for d in g.decisions if "trainc.policy('offload')" in d.rule]
    assert region and all(d.action == "saved" and not d.offload for d in region)
    assert all("kept on the device: backend 'cpp'" in d.rule for d in region), region


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_offload_on_cuda_lowers_the_measured_peak_and_matches_eager(monkeypatch):
    """Large enough matmuls that the copies overlap them: the measured step peak falls with
    offload, stays within 10% of the prediction, and the gradients match eager's. More rows
    than width, so the saved activations (not the weights' gradients at the backward's end)
    make the peak that offload can lower."""
    monkeypatch.setenv("TRAINC_CACHE_ARTIFACTS", "0")
    f, args = _chain(width=4096, rows=8192, layers=4, device="cuda")
    want, want_grads = _grads(f, args)
    peaks, predicted = {}, {}
    for offload in (False, True):
        torch._dynamo.reset()
        opts = dict(backend="triton", memory_budget=0.0, offload=offload)
        predicted[offload] = trainc.explain(f, *args, **opts).predicted_peak
        torch._dynamo.reset()
        c = trainc.compile(f, **opts)
        got, grads = _grads(c, args)
        torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-4)
        for g, w in zip(grads, want_grads):
            torch.testing.assert_close(g, w, rtol=1e-2, atol=1e-4)
        for a in args:
            a.grad = None
        peaks[offload] = peak_bytes(lambda: c(*args).backward(), torch.device("cuda"))
        for a in args:
            a.grad = None
    assert peaks[True] < peaks[False], (peaks, predicted)
    assert abs(predicted[True] - peaks[True]) <= 0.1 * peaks[True], (predicted, peaks)


def _step_runs(model, x, backend):
    from trainc import records
    torch._dynamo.reset()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    step = trainc.compile_step(model, lambda m, x: m(x), opt, backend=backend)
    with records.recording() as recs:
        for _ in range(2):
            step(x)
    return recs, [p.detach().clone() for p in model.parameters()]


def test_policy_offload_in_compile_step_moves_inside_the_step(small_moves, tmp_path,
                                                               monkeypatch):
    """compile_step: the region's values leave after the forward's readers and come back
    before the backward's, in the one step wrapper; the parameters match eager SGD's."""
    monkeypatch.setenv("TRAINC_DEBUG_DIR", str(tmp_path))
    torch.manual_seed(0)
    model = Block("offload", width=128)
    eager = copy.deepcopy(model)
    x = torch.randn(64, 128)
    recs, got = _step_runs(model, x, "triton")
    opt = torch.optim.SGD(eager.parameters(), lr=0.1)
    for _ in range(2):
        eager(x).backward()
        opt.step()
        opt.zero_grad()
    for g, w in zip(got, eager.parameters()):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)
    region = [d for r in recs for d in r.decisions if "trainc.policy('offload')" in d.rule]
    assert region and any(d.offload for d in region), region
    step_src = "".join(p.read_text() for p in tmp_path.rglob("*step*") if p.suffix == ".py")
    assert "HOSTC.save(" in step_src and "__host); del " in step_src, step_src[-3000:]


def test_policy_offload_in_compile_step_on_cpp_stays_on_device_and_says_so():
    torch.manual_seed(0)
    recs, _ = _step_runs(Block("offload"), torch.randn(8, 64), "cpp")
    region = [d for r in recs for d in r.decisions if "trainc.policy('offload')" in d.rule]
    assert region and all(not d.offload and "backend 'cpp'" in d.rule for d in region)


class Chain(torch.nn.Module):
    def __init__(self, width=64, layers=4):
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(width, width, bias=False)
                                          for _ in range(layers))

    def forward(self, x):
        for layer in self.layers:
            x = torch.tanh(layer(x))
        return x.square().mean()


def test_compile_step_budget_with_offload_moves_saved_values(small_moves):
    """compile_step under a budget with offload=True: the step's predicted peak falls below
    recompute alone's, values move inside the step, and SGD's parameters match eager's."""
    from trainc import records
    torch.manual_seed(0)
    base, x = Chain(), torch.randn(256, 64)
    eager = copy.deepcopy(base)
    opt = torch.optim.SGD(eager.parameters(), lr=0.1)
    for _ in range(2):
        eager(x).backward()
        opt.step()
        opt.zero_grad()
    chosen = {}
    for offload in (False, True):
        torch._dynamo.reset()
        model = copy.deepcopy(base)
        step = trainc.compile_step(model, lambda m, x: m(x), torch.optim.SGD(
            model.parameters(), lr=0.1), backend="triton", memory_budget=0.0, offload=offload)
        with records.recording() as recs:
            for _ in range(2):
                step(x)
        note = next(n for r in recs for n in r.partition_notes if "chosen plan" in n)
        chosen[offload] = float(note.split("chosen plan ")[1].split(" MiB")[0])
        moved = [d for r in recs for d in r.decisions if d.offload]
        assert bool(moved) == offload, (offload, note)
        for g, w in zip(model.parameters(), eager.parameters()):
            torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-6)
    assert chosen[True] < chosen[False], chosen


@pytest.mark.slow
def test_tradeoff_report_shows_the_bytes_moved_to_host(small_moves, tmp_path):
    import trainc.report
    torch.manual_seed(0)
    model, x = Chain(), torch.randn(256, 64)
    result = trainc.report.tradeoff(model, (x,), lambda out, inputs: out, (None, 0.0),
                                    steps=2, out_dir=str(tmp_path), progress=False,
                                    backend="triton", offload=True)
    by_budget = {r.budget: r for r in result.rows}
    assert by_budget["None"].host_bytes == 0 < by_budget["0.0"].host_bytes
    assert by_budget["0.0"].host_bytes <= by_budget["0.0"].saved_bytes
    assert "host MiB" in result.table()


def test_budget_reads_against_the_default_plan_with_values_moved(small_moves):
    """A deep tanh chain: no recompute plan lowers the peak below the default's, but moving the
    default's saved values does. The budget's lowest peak is then the default plan with the
    most moved, budget 0 reaches it, and the values match eager's."""
    f, args = _chain(layers=12)
    want, want_grads = _grads(f, args)
    torch._dynamo.reset()
    default = trainc.explain(f, *args, backend="triton").predicted_peak
    torch._dynamo.reset()
    low = trainc.explain(f, *args, backend="triton", memory_budget=0.0, offload=True)
    assert low.predicted_peak < 0.75 * default, (low.predicted_peak, default)
    assert low.host_bytes > 0
    _budget_zero_with_offload_matches(f, args, want, want_grads)
