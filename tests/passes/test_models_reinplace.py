"""The shared models at scale "cpu": with every pass on and the mutation checker enabled, grads
and buffers match eager against a float64 oracle; each post-grad graph gives bitwise the same
outputs with the passes on and off; the backward graphs allocate fewer bytes, and gpt's
embedding backward writes its index_put in place."""
from __future__ import annotations

import pytest
import torch

import models  # noqa: E402  benchmarks/suite_models (tests/conftest.py puts it on the path)
from pass_programs import copy_gm
from test_reinplace import assert_reinplace_keeps_values
from trainc import pipeline, records
from trainc.api import compile as trainc_compile
from trainc.passes import STATS
from trainc.passes._graph import written_args
from trainc.testing import compare

aten = torch.ops.aten


def _grads(name: str, dtype: torch.dtype, compiled: bool, monkeypatch=None):
    torch._dynamo.reset()
    model, inputs, loss_fn = models.build(name, dtype=dtype)
    captured = []
    if compiled:
        real = pipeline.run_passes

        def spy(gm, passes, **kw):
            before = copy_gm(gm) if list(passes) != list(pipeline.JOINT_PASSES) else None
            out = real(gm, passes, **kw)
            if before is not None:
                captured.append((before, out))
            return out

        monkeypatch.setattr(pipeline, "run_passes", spy)
        model_fn = trainc_compile(model, backend="aten", check_mutations=True)
    else:
        model_fn = model
    with records.recording() as recs:
        loss_fn(model_fn(*inputs), inputs).backward()
    values = [p.grad for p in model.parameters()] + list(model.buffers())
    values += [x.grad for x in inputs if x.requires_grad]
    return values, captured, recs


@pytest.mark.parametrize("name", models.NAMES)
def test_model_passes_keep_grads_and_cut_backward_allocations(name, monkeypatch):
    got, captured, recs = _grads(name, torch.float32, True, monkeypatch)
    eager, _, _ = _grads(name, torch.float32, False)
    ref, _, _ = _grads(name, torch.float64, False)
    for k, (c, e, r) in enumerate(zip(got, eager, ref)):
        assert compare(f"{name} value {k}", c, e, r) is None
    assert len(captured) == 2, "one forward and one backward graph"
    for before, _ in captured:
        assert_reinplace_keeps_values(before)
    (_, fwd), (_, bwd) = captured
    stats = bwd.meta[STATS]
    assert stats.reinplaced > 0 and stats.bytes_after < stats.bytes_before
    assert dict(recs[0].passes)["bwd"] == stats
    if name == "gpt":
        targets = [n.target for n in bwd.graph.nodes]
        assert aten.index_put.default not in targets and aten.index_put_.default in targets
    if name == "convnet":  # BatchNorm running stats: written straight into the buffers
        placeholders = {n.name for n in fwd.graph.nodes if n.op == "placeholder"}
        written = [w.name for n in fwd.graph.nodes for w in written_args(n)]
        assert sum(w in placeholders for w in written) >= 8
