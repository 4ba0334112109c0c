"""More op families for random programs: the compositions a held-out fuzz found wrong (issue 34).

Same contract as ops.py: `op(draw, b) -> Optional[Line]`. These draw whole sub-expressions
(softmax into log_softmax, a norm into a division, a view between two pointwise ops, a reduction
of a reduction) because single ops the existing catalog already covers pass alone; what broke
were their compositions. `side` lines are integer/bool results, returned but never fed on.
"""
from __future__ import annotations

from typing import Optional

import hypothesis.strategies as st
import torch

from trainc.testing.ops import Line, _broadcasts, _dim, _tuple

# Pointwise ops with a kink, a clamp boundary or a singular point: where a decomposition can
# pick the other side of a tie, or its gradient convention at the boundary can differ.
KINKED = ("F.hardtanh({a})", "F.relu6({a} * 4)", "F.hardtanh({a}, -0.3, 0.7)",
          "F.leaky_relu({a}, 0.01)", "F.leaky_relu({a}, -0.5)", "F.hardswish({a})",
          "F.hardsigmoid({a})", "F.elu({a})", "F.mish({a})", "torch.atan({a})",
          "{a}.clamp(min=0.0)", "{a}.clamp(max=0.25)", "torch.sign({a}) * {a}",
          "torch.sqrt({a} * {a} + 1e-6)", "torch.sqrt({a}.abs() + 1e-3)",
          "{a} / torch.sqrt({a} * {a} + 1)", "torch.cos(-{a})", "torch.tanh(-torch.sin({a}))")
# Ops whose eager float64 kernel is not a float64 oracle: ATen's CPU hardsigmoid backward
# multiplies by (1.0f / 6.0f), a float32 constant (3e-8 off; tests/fuzz/test_findings.py).
FLOAT64_INEXACT = ("F.hardsigmoid({a})",)
PAIRS = ("torch.atan2({a}, {b})", "torch.atan2({a}, {b}.abs() + 0.5)", "torch.minimum({a}, {b})",
         "torch.where({a} > {b}, torch.maximum({a}, {b}), torch.minimum({a}, {b}))",
         "torch.where({a} >= {b}, {a}, -{b})", "torch.where({a} < 0, {b}, {a} * {b})",
         "torch.maximum({a}, {b}) - torch.minimum({a}, {b})", "{a}.clamp(min={b})",
         "torch.hypot({a}, {b})", "{a} / ({b} * {b} + 0.5)",
         "F.leaky_relu({a} - {b}, 0.2)")
NORMS = ("torch.linalg.vector_norm({a}, dim={d}, keepdim={k})", "{a}.norm()",
         "{a} / ({a}.norm(dim={d}, keepdim=True) + 1e-6)", "F.normalize({a}, dim={d})",
         "{a} * torch.rsqrt({a}.pow(2).mean({d}, keepdim=True) + 1e-6)",
         "({a} - {a}.mean({d}, keepdim=True)) / torch.sqrt({a}.var({d}, keepdim=True) + 1e-5)",
         "torch.linalg.vector_norm({a}, 1, dim={d})", "{a}.std({d}, keepdim={k})",
         "torch.sqrt(({a} * {a}).mean({d}) + 1e-8)")
SOFTMAX = ("torch.log_softmax(torch.softmax({a}, {d}), {d2})",
           "torch.softmax(torch.log_softmax({a}, {d}), {d2})",
           "(torch.softmax({a}, {d}) * torch.log_softmax({a}, {d})).sum({d})",
           "torch.log_softmax({a} * 10, {d})", "torch.softmax({a} / 0.05, {d})",
           "torch.log_softmax({a}, {d}).mean()", "F.softmin({a}, {d})",
           "torch.log_softmax({a}, {d}) - torch.logsumexp({a}, {d}, keepdim=True)",
           "torch.softmax({a}, {d}).sqrt()", "torch.log(torch.softmax({a}, {d}))")
REDUCE2 = ("{a}.sum({d}).amax()", "{a}.mean({d}).var()", "{a}.amax({d}, keepdim=True).mean()",
           "torch.logsumexp({a}.sum({d}), 0)", "{a}.amin({d}).sum()",
           "({a} - {a}.mean({d}, keepdim=True)).pow(2).mean({d}).sqrt()",
           "{a}.max({d}).values", "{a}.min({d}).values.mean()", "{a}.mean({d}).mean()",
           "{a}.sum({d}, keepdim=True) / {a}.abs().sum().clamp(min=1e-3)",
           "{a}.prod({d})", "{a}.cumsum({d}).amax()")
SIDE = ("{a}.argmax({d})", "{a}.argmin()", "{a} > 0", "torch.isfinite({a})", "({a} > 0).sum()",
        "{a}.max({d}).indices", "torch.signbit({a})", "{a}.sort({d}).indices",
        "({a} == {a}.amax({d}, keepdim=True)).sum({d})", "{a}.isnan().any()")
VIEW_POINTWISE = ("torch.tanh({a}.transpose({d1}, {d2})).transpose({d1}, {d2}) * {a}",
                  "torch.sin({a}.reshape(-1)).reshape({a}.shape) - {a}",
                  "-torch.tanh({a}.flip({d})) * torch.sin({a})",
                  "torch.tanh({a}[..., ::2]).sum(-1)", "torch.sin(-{a}.unsqueeze(0)).squeeze(0)",
                  "torch.tanh({a}.permute({perm})).permute({perm}) + {a}.neg()",
                  "torch.sigmoid({a}.expand(2, *{a}.shape)).sum(0)")


def kinked(draw, b) -> Optional[Line]:
    a = b.pick(draw)
    text = draw(st.sampled_from(KINKED))
    if b.dtype == torch.float64 and text in FLOAT64_INEXACT:
        return None
    return Line(text.format(a=a), (a,))


def pair(draw, b) -> Optional[Line]:
    a = b.pick(draw)
    other = b.pick(draw, lambda t: _broadcasts(t.shape, b.val(a).shape))
    if other is None:
        return None
    return Line(draw(st.sampled_from(PAIRS)).format(a=a, b=other), (a, other))


def norm(draw, b) -> Optional[Line]:
    a = b.pick(draw)
    t = b.val(a)
    return Line(draw(st.sampled_from(NORMS)).format(a=a, d=_dim(draw, t), k=draw(st.booleans())),
                (a,))


def softmax_chain(draw, b) -> Optional[Line]:
    a = b.pick(draw)
    t = b.val(a)
    return Line(draw(st.sampled_from(SOFTMAX)).format(a=a, d=_dim(draw, t), d2=_dim(draw, t)),
                (a,))


def reduce_twice(draw, b) -> Optional[Line]:
    a = b.pick(draw)
    return Line(draw(st.sampled_from(REDUCE2)).format(a=a, d=_dim(draw, b.val(a))), (a,))


def side_output(draw, b) -> Optional[Line]:
    a = b.pick(draw)
    return Line(draw(st.sampled_from(SIDE)).format(a=a, d=_dim(draw, b.val(a))), (a,), "side")


def view_between(draw, b) -> Optional[Line]:
    a = b.pick(draw)
    t = b.val(a)
    n = max(t.dim(), 1)
    d1, d2 = draw(st.integers(0, n - 1)), draw(st.integers(0, n - 1))
    perm = _tuple(draw(st.permutations(range(t.dim())))) if t.dim() else "()"
    text = draw(st.sampled_from(VIEW_POINTWISE))
    if t.dim() == 0 and ("transpose" in text or "permute" in text):
        return None
    return Line(text.format(a=a, d=_dim(draw, t), d1=d1, d2=d2, perm=perm), (a,))


def batched_matmul(draw, b) -> Optional[Line]:
    """Matmuls whose batch dims broadcast: (1, m, k) @ (b, k, n), (m, k) @ (b, k, n), matvec."""
    a = b.pick(draw, lambda t: t.dim() >= 2)
    if a is None:
        return None
    t = b.val(a)
    other = b.pick(draw, lambda u: u.dim() >= 2 and u.shape[-2] == t.shape[-1]
                   and _broadcasts(t.shape[:-2], u.shape[:-2]))
    forms = [f"{a}.unsqueeze(0) @ {a}.transpose(-2, -1)",
             f"{a} @ {a}.transpose(-2, -1).unsqueeze(0).expand(2, *{a}.shape[:-2], "
             f"{a}.shape[-1], {a}.shape[-2])",
             f"torch.matmul({a}, {a}[..., :1, :].transpose(-2, -1)).squeeze(-1)",
             f"torch.softmax({a} @ {a}.transpose(-2, -1), -1) @ {a}"]
    if other is not None:
        forms += [f"{a}.unsqueeze(-3) @ {other}", f"{a} @ {other}.unsqueeze(0)",
                  f"torch.matmul({a}, {other}) / {a}.shape[-1] ** 0.5"]
    text = draw(st.sampled_from(forms))
    return Line(text, (a,) if other is None or other not in text else (a, other))


# family -> relative weight, merged with ops.OPS by programs()
OPS = {kinked: 3, pair: 3, norm: 2, softmax_chain: 2, reduce_twice: 2, side_output: 1,
       view_between: 2, batched_matmul: 2}
