"""trainc.testing itself: the policy catches wrong answers, programs print runnable source."""
import pytest
import torch
from hypothesis import given, settings

import trainc.codegen as codegen
from trainc.testing import Program, assert_grads_match, compare, programs, zoo_stacks
from trainc.testing.programs import InputSpec


def test_compare_accepts_eager_level_error_and_rejects_more():
    ref = torch.linspace(1, 2, 100, dtype=torch.float64)
    eager = ref.float() * (1 + 1e-4)
    assert compare("x", ref.float() * (1 + 1.5e-4), eager, ref) is None
    m = compare("x", ref.float() * (1 + 1e-3), eager, ref)
    assert m is not None and m.err_compiled > m.err_eager and "x" in str(m)


def test_compare_small_bf16_allows_one_ulp_not_more():
    """One element: eager may round exactly right (error 0); one ulp off is a valid order of
    evaluation, eight (4% here) are not."""
    ref = torch.tensor([1.5 + 2 ** -9], dtype=torch.float64)
    eager = ref.bfloat16()
    ulp = 2 ** -7
    assert compare("x", (ref + ulp).bfloat16(), eager, ref) is None
    assert compare("x", (ref + 8 * ulp).bfloat16(), eager, ref) is not None


def test_replay_refuses_masks_it_cannot_see():
    """Dropout of 0 or NaN hides the mask (the output is 0/NaN either way) while the gradient
    depends on it: the replaying oracle must refuse, not guess."""
    from trainc.testing import ReplayFunctional, UnreplayableDropout
    x = torch.tensor([0.0, 2.0, float("nan")])
    y = torch.tensor([0.0, 4.0, float("nan")])  # compiled dropout output, p = 0.5
    with pytest.raises(UnreplayableDropout):
        ReplayFunctional([y]).dropout(x, 0.5)
    ok = ReplayFunctional([y[1:2]]).dropout(x[1:2], 0.5)
    assert torch.equal(ok, y[1:2])


def test_replay_refuses_a_dropout_output_written_later():
    """A program that writes into a dropout's output through a view returns the written value:
    its mask cannot be read back from it (nightly finding programs_cpp_0_0_20261806)."""
    from trainc.testing import ReplayFunctional, UnreplayableDropout
    x = torch.tensor(3.0)
    f = ReplayFunctional([torch.tensor(3.0)])  # recorded: dropped (0), then + 3 through a view
    y = f.dropout(x, 0.9)
    f.check_unmutated()  # not written yet
    y.flatten().add_(x)
    with pytest.raises(UnreplayableDropout, match="written in place"):
        f.check_unmutated()


def test_builder_never_mutates_a_dropout_output_returned_itself():
    """flatten() of a 1-d dropout output returns that tensor itself (no _base): it is as
    frozen as a view would be (the finding above was generated this way)."""
    import torch.nn.functional  # noqa: F401
    from trainc.testing import ops
    from trainc.testing.programs import _Builder
    b = _Builder(torch.float32, [torch.randn(3)])
    b.add(ops.Line("F.dropout(x0, p=0.5)", ("x0",), "dropout"))
    b.add(ops.Line("v0.flatten()", ("v0",)))
    b.add(ops.Line("x0 * 2", ("x0",)))
    assert b.env["v1"] is b.env["v0"] and {"v0", "v1"} <= b.frozen and "v2" not in b.frozen


def test_module_replay_refuses_masks_it_cannot_see():
    """The module-stack oracle's ReplayDropout refuses as ReplayFunctional does: a bf16 stack
    can feed an exact 0 to a Dropout (findings modules_cpp_None_20261016, _0_5_20261421)."""
    from trainc.testing import UnreplayableDropout
    from trainc.testing.modules import replay_dropouts
    model = torch.nn.Sequential(torch.nn.Identity(), torch.nn.Dropout(0.5))
    x = torch.tensor([0.0, 2.0, 3.0])
    with pytest.raises(UnreplayableDropout):
        replay_dropouts(model)([torch.tensor([0.0, 4.0, 0.0])])(x)
    ref = replay_dropouts(model)([torch.tensor([5.0, 4.0, 0.0])])  # 0 kept: mask readable
    assert torch.equal(ref(x), torch.tensor([0.0, 4.0, 0.0]))


def test_compare_exact_properties():
    ref = torch.tensor([1.0, float("nan"), 3.0], dtype=torch.float64)
    eager = ref.float()
    assert "NaN" in compare("y", torch.tensor([1.0, 2.0, 3.0]), eager, ref).reason
    assert "shape" in compare("y", eager[:2], eager, ref).reason
    assert "dtype" in compare("y", eager.double(), eager, ref).reason
    ints = torch.tensor([1, 2, 3])
    assert compare("i", ints + 1, ints, ints) is not None


class _WrongGrads:
    """The aten backend with every backward graph's results scaled by 1.01."""
    name, target = "aten", codegen.ATEN

    def __init__(self, *args):  # whatever the registry passes (config), for the inner backend
        self.args = args

    def compile(self, gm, example_inputs):
        inner = codegen.AtenBackend(*self.args).compile(gm, example_inputs)
        is_bwd = any(n.name.startswith("tangents") for n in gm.graph.nodes
                     if n.op == "placeholder")

        def run(args):
            outs = inner.run(args)
            return [o * 1.01 if is_bwd and torch.is_tensor(o) and o.is_floating_point() else o
                    for o in outs]
        return codegen.CompiledGraph(run, inner.kernels, inner.fallback_ops, inner.source)


def test_assert_grads_match_catches_a_wrong_gradient(monkeypatch):
    def f(x, w):
        return (torch.tanh(x @ w).sum(-1),)
    inputs = [torch.randn(4, 3, requires_grad=True), torch.randn(3, 5, requires_grad=True)]
    assert assert_grads_match(f, inputs, backend="aten") == []
    monkeypatch.setitem(codegen.BACKENDS, "aten", _WrongGrads)
    with pytest.raises(AssertionError, match="grad of input 0.*err compiled"):
        assert_grads_match(f, inputs, backend="aten")


def test_conditioning_measures_cancellation_and_skips_ties():
    from trainc.testing.check import _conditioning, _run
    torch.manual_seed(0)

    def run_estimate(f, inputs):
        make = lambda: [x.detach().clone().requires_grad_() for x in inputs]  # noqa: E731
        eager = _run(f, None, make(), 0)
        ref = _run(f, None, [x.detach().double().requires_grad_() for x in inputs], 0,
                   cast=torch.float64, tangent_dtypes=eager.tangent_dtypes)
        return _conditioning(f, make, 0, eager.tangent_dtypes, ref)
    # 1.1a + 1.1b cancels 200-fold: one unit roundoff of the rounded products moves it ~200
    # unit roundoffs (the inputs themselves are exact in every evaluation: a + b alone is not
    # ill-conditioned, and moving inputs is no longer part of the estimate)
    cancel = run_estimate(lambda a, b: (a * 1.1 + b * 1.1,),
                          [torch.tensor([1.4271]), torch.tensor([-1.4343])])
    assert 100 * 2 ** -24 < cancel["output 0"] < 1000 * 2 ** -24
    assert cancel["grad of input 0"] < 4 * 2 ** -24  # the gradient (1.1 * tangent) is not
    exact = run_estimate(lambda a, b: (a + b,), [torch.tensor([1.4271]), torch.tensor([-1.4343])])
    assert exact["output 0"] < 4 * 2 ** -24
    # maximum(x, x.mean()) of equal values is a tie: random signs break it (a jump, not linear:
    # no estimate); moving every value up keeps it (one unit roundoff): a wrong side of the tie
    # is never excused
    tie = run_estimate(lambda x: (torch.maximum(x, x.mean()),), [torch.full((15,), 0.3)])
    assert tie.get("grad of input 0", 0.0) < 2 * 2 ** -24


def test_program_source_is_runnable():
    prog = Program(torch.float32, (InputSpec((2, 3)), InputSpec((3,), False, "expanded", (0,))),
                   ("v0 = x0 * x1", "v1 = v0.sum(1, keepdim=True)", "v0.mul_(0.5)"),
                   ("v0", "v1"), 0, 7)
    ns = {}
    exec(prog.source, ns)
    xs = ns["make_inputs"]()
    assert xs[1].stride() == (0,) and xs[0].requires_grad and not xs[1].requires_grad
    for a, b in zip(ns["program"](*xs), prog.fn()(*prog.make_inputs())):
        assert torch.equal(a, b)


@settings(max_examples=20)
@given(prog=programs(max_ops=10))
def test_generated_programs_run_eagerly_and_print(prog):
    outs = prog.fn()(*prog.make_inputs())
    assert len(outs) == len(prog.outputs) >= 1
    assert "def program(" in repr(prog) and "def make_inputs(" in repr(prog)


def test_round_each_op_moves_results_not_views_and_scales_linearly():
    """The conditioning runs' intermediate rounding: every functional op's float64 result moves
    by scale unit roundoffs with fixed signs (linear in scale); views and in-place ops keep
    aliasing their inputs."""
    from trainc.testing.check import _RoundEachOp
    x = torch.linspace(1, 2, 12, dtype=torch.float64)
    moved = {}
    for scale in (1.0, 1 / 16):
        with _RoundEachOp(1e-6, scale):
            y = x * 1.0
            v = y.view(3, 4)
            v.add_(0.0)
        assert v.data_ptr() == y.data_ptr() and torch.equal(v.reshape(-1), y)
        moved[scale] = (y - x) / x
    assert 0 < moved[1.0].abs().max() <= 1e-6 * (1 + 1e-9)
    torch.testing.assert_close(moved[1.0], 16 * moved[1 / 16])
    with _RoundEachOp(1e-6, 1.0, draw=2):  # another draw: other signs
        y2 = x * 1.0
    assert not torch.equal((y2 - x) / x, moved[1.0])


@settings(max_examples=40)
@given(prog=programs(max_ops=12))
def test_broadened_programs_return_side_outputs_exactly(prog):
    """Integer/bool side outputs (argmax, comparisons) are returned, never fed to float ops."""
    outs = prog.fn()(*prog.make_inputs())
    sides = [name for name in prog.outputs if name.startswith("s")]
    for name, out in zip(prog.outputs, outs):
        assert (not out.is_floating_point()) == name.startswith("s")
    assert not any(f"({s}" in line or f" {s}," in line for s in sides
                   for line in prog.body if not line.startswith(f"{s} ="))


def test_input_specials_place_ties_signed_zeros_and_magnitudes():
    spec = InputSpec((2, 5), special=((0, "tie"), (3, "near"), (6, "-0.0"), (8, "6.0")),
                     scale=1e4)
    prog = Program(torch.float32, (spec,), ("v0 = x0 * 2.0",), ("v0",), 0, 3)
    x = prog.make_inputs()[0].detach().view(-1)
    assert x[0] == x[1] and 0 < abs(x[3] - x[4]) <= 4 * torch.finfo(x.dtype).eps * abs(x[4])
    assert x[6] == 0 and torch.signbit(x[6]) and x[8] == 6.0 and x[2].abs() > 1  # scaled by 1e4


def test_float64_programs_never_draw_inexact_eager_ops():
    from hypothesis import find
    from trainc.testing.compositions import FLOAT64_INEXACT
    try:
        find(programs(dtypes=(torch.float64,), max_ops=20),
             lambda p: any(op.split("(")[0] in line for op in FLOAT64_INEXACT for line in p.body),
             settings=settings(max_examples=150, database=None))
    except Exception as e:  # hypothesis.errors.NoSuchExample: none drawn, as it should be
        assert type(e).__name__ == "NoSuchExample"
    else:
        raise AssertionError("a float64 program drew an op whose eager float64 kernel is inexact")


@settings(max_examples=10)
@given(stack=zoo_stacks())
def test_zoo_stacks_run_in_train_mode_and_print(stack):
    model = stack.make_model()
    assert model.training and "class Model" in repr(stack)
    outs = model(*stack.make_inputs())
    assert outs[0].dim() in (2, 4)


class _ShiftedRelu:
    """The aten backend with every relu(x) computed as relu(x - SHIFT): an evaluation whose
    rounding put inputs within SHIFT of 0 on the other side (forward and backward alike).
    `scale` also multiplies the backward's results (a planted wrong kernel)."""
    name, target = "aten", codegen.ATEN
    SHIFT, scale = 2 ** -20, 1.0

    def __init__(self, *args):
        self.args = args

    def compile(self, gm, example_inputs):
        for n in list(gm.graph.nodes):
            if n.target in (torch.ops.aten.relu.default, torch.ops.aten.relu_.default):
                with gm.graph.inserting_before(n):
                    moved = gm.graph.call_function(torch.ops.aten.sub.Tensor,
                                                   (n.args[0], self.SHIFT))
                    moved.meta = dict(n.args[0].meta)
                n.args = (moved,)
        gm.recompile()
        inner = codegen.AtenBackend(*self.args).compile(gm, example_inputs)
        is_bwd = any(n.name.startswith("tangents") for n in gm.graph.nodes
                     if n.op == "placeholder")
        scale = self.scale

        def run(args):
            outs = inner.run(args)
            return [o * scale if is_bwd and torch.is_tensor(o) and o.is_floating_point() else o
                    for o in outs]
        return codegen.CompiledGraph(run, inner.kernels, inner.fallback_ops, inner.source)


def _near_relu_inputs():
    """a * b - c with element 0 one ulp of a0 b0 above 0 in float32 and 0.5-1.5 ulps in
    float64 (|a b| in 1..6, one ulp ~2e-7): positive in both, within rounding of 0."""
    g = torch.Generator().manual_seed(3)
    a = 1 + torch.rand(64, generator=g)
    b = 1 + 2 * torch.rand(64, generator=g)
    c = torch.randn(64, generator=g)
    c[0] = torch.nextafter(a[0] * b[0], torch.tensor(-1.0))
    w = torch.randn(64, generator=g)
    return [a.requires_grad_(), b.requires_grad_(), c.requires_grad_(), w]


def _relu_program(a, b, c, w):
    return (torch.relu(a * b - c) * w,)


def test_boundary_flip_is_reported_not_failed(monkeypatch):
    """The compiled run puts one ReLU input within rounding of 0 on the other side: its
    gradients differ from float64 by a whole element (1e4x eager's error), yet float64 with that element
    flipped is what it computed: a boundary flip, returned as a note."""
    inputs = _near_relu_inputs()
    assert assert_grads_match(_relu_program, inputs, backend="aten") == []
    monkeypatch.setitem(codegen.BACKENDS, "aten", _ShiftedRelu)
    notes = assert_grads_match(_relu_program, inputs, backend="aten")
    assert notes and all(n.kind == "boundary flip" for n in notes)
    assert "grad of input 0" in {n.what for n in notes}
    assert "aten.relu" in str(notes[0]) and notes[0].err_compiled > 100 * notes[0].err_eager


def test_wrong_kernel_near_a_cutoff_still_fails(monkeypatch):
    """The same flip plus backward results 1% off: no flipped float64 run explains that."""
    monkeypatch.setitem(codegen.BACKENDS, "aten", _ShiftedRelu)
    monkeypatch.setattr(_ShiftedRelu, "scale", 1.01)
    with pytest.raises(AssertionError, match="near a cutoff, no flip of them explains it"):
        assert_grads_match(_relu_program, _near_relu_inputs(), backend="aten")


def test_flip_far_from_the_cutoff_still_fails(monkeypatch):
    """A shift far beyond eager's rounding flips elements no valid evaluation would: fails."""
    monkeypatch.setitem(codegen.BACKENDS, "aten", _ShiftedRelu)
    monkeypatch.setattr(_ShiftedRelu, "SHIFT", 0.05)
    g = torch.Generator().manual_seed(4)
    x = torch.randn(64, generator=g)
    x[0] = 0.02  # flipped by the shift, 3e5 roundings from 0
    with pytest.raises(AssertionError, match="grad of input 0"):
        assert_grads_match(lambda x: (torch.relu(x * 1.0),), [x.requires_grad_()],
                           backend="aten")


class _FakeRuns:
    """second.Runs with a fixed eager variant and no cutoff ops."""

    def __init__(self, variant):
        self.variant = variant

    def variants(self):
        return ["channels-last"]

    def eager_variant(self, name):
        return {"grad of w": self.variant}

    def record(self, low_precision):
        return []

    def flipped_reference(self, chosen):
        raise AssertionError("no cutoffs: never asked")


def test_eager_variant_spread_excuses_only_what_a_variant_also_gives():
    """A value 8x eager's error passes when eager in channels-last is 5x off too (the spread
    is eager's error), and fails when every variant is as close as eager."""
    from trainc.testing.second import reconsider
    ref = torch.linspace(1, 2, 100, dtype=torch.float64)
    eager, comp = ref.float() * (1 + 1e-5), ref.float() * (1 + 8e-5)
    m = compare("grad of w", comp, eager, ref)
    assert m is not None
    vals = ({"grad of w": comp}, {"grad of w": eager}, {"grad of w": ref})
    still, notes = reconsider([m], *vals, {}, _FakeRuns(ref.float() * (1 - 5e-5)))
    assert not still and notes[0].kind == "eager variant" and "channels-last" in str(notes[0])
    still, notes = reconsider([m], *vals, {}, _FakeRuns(ref.float() * (1 + 1e-5)))
    assert still and not notes


def test_eager_variants_of_a_conv_model_run_channels_last_and_one_thread():
    from trainc.testing.check import _Runs
    model = torch.nn.Sequential(torch.nn.Conv2d(2, 3, 3), torch.nn.BatchNorm2d(3))
    make = lambda: [torch.randn(2, 2, 5, 5, generator=torch.Generator().manual_seed(0))]  # noqa
    runs = _Runs(model, make, 0, [torch.float32])
    assert "channels-last" in runs.variants()
    for name in ("channels-last", "one thread"):
        vals = runs.eager_variant(name)
        assert {"output 0", "grad of param 0.weight", "buffer 1.running_var"} <= set(vals)
    assert torch.get_num_threads() >= 1 and model[0].weight.is_contiguous()


@pytest.mark.skipif("cpp" not in codegen.BACKENDS, reason="cpp backend not registered")
def test_second_opinion_still_fails_the_float_accumulator_kernels(monkeypatch):
    """Finding zoo_cpp_None_34102_69 with the kernels it was found with (float accumulators,
    10x eager's error on a BN bias gradient, BatchNorm statistics in float32 as then):
    channels-last and one-thread eager runs and the ReLU's near-zero inputs do not explain it."""
    import os
    import runpy

    from trainc import decomps
    from trainc.codegen.cpp import exprs, reductions
    monkeypatch.setattr(reductions, "acc_ctype", lambda op, dtype: exprs.ctype(dtype))
    monkeypatch.delitem(decomps.TABLE, torch.ops.aten.var_mean.correction)
    path = os.path.join(os.path.dirname(__file__), "findings", "zoo_cpp_None_34102_69.py")
    ns = runpy.run_path(path)
    with pytest.raises(AssertionError, match=r"grad of param m2\.1\.bias: exceeds"):
        assert_grads_match(ns["make_model"](), ns["make_inputs"], **ns["OPTS"])


def test_near_cutoffs_skip_exact_ties_and_far_values():
    from trainc.testing import flips
    ref = torch.tensor([0.0, 1e-7, -3e-7, 0.5], dtype=torch.float64)
    low = torch.tensor([0.0, 2e-7, -2e-7, 0.5])  # eager's rounding here: up to 1e-7
    cut = torch.zeros(4, dtype=torch.float64)
    near = flips.near_cutoffs([("aten.relu.default", low, cut)],
                              [("aten.relu.default", ref, cut)])
    assert len(near) == 1 and near[0].flat == (1, 2) and "2 input(s)" in str(near[0])
    assert flips.subsets(near) == [{0: [1]}, {0: [2]}, {0: [1, 2]}]
