"""trainc.explain reports per graph the allocations before/after the post-grad passes and the
number of reinplaced ops."""
from __future__ import annotations

import torch

import trainc


def test_explain_reports_allocations_and_reinplaced_ops():
    torch._dynamo.reset()
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4),
                                torch.nn.BatchNorm1d(4))
    e = trainc.explain(model, torch.randn(5, 8), backend="aten")
    (g,) = e.graphs
    stats = dict(g.passes)
    assert set(stats) == {"fwd", "bwd"}
    for s in stats.values():
        assert s.allocs_after <= s.allocs_before and s.bytes_after <= s.bytes_before
    assert stats["bwd"].reinplaced > 0 and stats["bwd"].bytes_after < stats["bwd"].bytes_before
    assert e.reinplaced_ops == sum(s.reinplaced for s in stats.values())
    text = str(e)
    assert "allocs before" in text and "reinplaced" in text
    row = next(line for line in text.splitlines() if line.startswith(f"graph_{g.graph_id}.bwd"))
    assert row.split()[1:] == [str(stats["bwd"].allocs_before),
                               f"{stats['bwd'].bytes_before / 2**20:.3f}",
                               str(stats["bwd"].allocs_after),
                               f"{stats['bwd'].bytes_after / 2**20:.3f}",
                               str(stats["bwd"].reinplaced)]
