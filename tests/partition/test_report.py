"""Decision report through trainc.explain, and the trade-off report / CLI on a tiny model."""
import csv
import json
import os

import pytest
import torch
import torch.nn as nn

import trainc
from trainc import report
from trainc.__main__ import main, parse_budget


def tiny():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.Linear(64, 16), nn.Tanh())
    return model, (torch.randn(32, 16),), lambda out, inp: out.pow(2).mean()


def test_explain_reports_totals_and_per_value_table():
    model, (x,), _ = tiny()
    expl = trainc.explain(model, x, backend="aten")
    decisions = expl.graphs[0].decisions
    saved = [d for d in decisions if d.action == "saved" and not d.is_input]
    assert expl.saved_bytes == sum(d.nbytes for d in saved) > 0
    assert expl.recompute_flops == sum(d.recompute_flops for d in decisions
                                       if d.action == "recomputed") > 0
    # The first linear's output (gelu is rebuilt from it) and tanh's derivative 1 - tanh^2.
    assert sorted(d.op for d in saved) == ["aten.addmm.default", "aten.sub.Tensor"]
    text = expl.table(per_value=True)
    for d in decisions:
        assert d.name in text and d.rule in text
    gelu = [d for d in decisions if d.op == "aten.gelu.default"][0]
    assert gelu.action == "recomputed" and gelu.shape == (32, 64) and gelu.dtype == "float32"
    assert gelu.nbytes == 32 * 64 * 4 and gelu.recompute_flops == 32 * 64


def test_tradeoff_writes_table_csv_json_png(tmp_path):
    model, inputs, loss_fn = tiny()
    result = report.tradeoff(model, inputs, loss_fn, budgets=(None, 1.0, 0.0), name="tiny",
                             steps=1, out_dir=str(tmp_path), progress=False, backend="aten")
    assert [r.budget for r in result.rows] == ["None", "1.0", "0.0"]
    assert all(r.peak_bytes > 0 and r.step_ms > 0 for r in result.rows)
    # budget 0 is the lowest simulated peak (it may save more bytes to get there: refine.py)
    assert result.rows[2].simulated_peak <= result.rows[1].simulated_peak
    assert any(r.pareto for r in result.rows)
    assert "allocator" in result.memory_method and "peak MiB" in result.table()
    rows = list(csv.DictReader(open(tmp_path / "tiny_tradeoff.csv")))
    assert len(rows) == 3 and int(rows[1]["saved_bytes"]) == result.rows[1].saved_bytes
    assert json.load(open(tmp_path / "tiny_tradeoff.json"))["rows"][0]["budget"] == "None"
    assert os.path.getsize(tmp_path / "tiny_tradeoff.png") > 1000


def test_cli_runs_a_module_callable(tmp_path, capsys):
    assert parse_budget("none") is None and parse_budget("0.5") == 0.5
    assert parse_budget("1000") == 1000 and isinstance(parse_budget("1.0"), float)
    code = main(["report", "test_report:tiny", "--budgets", "none", "0.0", "--steps", "1",
                 "--out", str(tmp_path), "--backend", "aten"])
    assert code == 0
    assert "step ms" in capsys.readouterr().out
    assert (tmp_path / "test_report_tiny_tradeoff.png").exists()


def test_tradeoff_measures_torch_compile_beside(tmp_path):
    model, inputs, loss_fn = tiny()
    result = report.tradeoff(model, inputs, loss_fn, budgets=(None, 0.0), name="tiny", steps=1,
                             out_dir=str(tmp_path), progress=False, backend="aten",
                             torch_budgets=(0.0,))
    assert [(r.compiler, r.budget) for r in result.rows] == [
        ("trainc", "None"), ("trainc", "0.0"), ("torch.compile", "0.0")]
    torch_row = result.rows[2]
    assert torch_row.peak_bytes > 0 and torch_row.step_ms > 0 and torch_row.pareto
    assert "torch.compile" in result.table()
    assert json.load(open(tmp_path / "tiny_tradeoff.json"))["rows"][2]["compiler"] == \
        "torch.compile"
    with pytest.raises(ValueError, match="activation_memory_budget"):
        report.tradeoff(model, inputs, loss_fn, budgets=(None,), torch_budgets=(2.0,))


def test_domination_of_torch_compile_points():
    def row(compiler, budget, peak, ms):
        return report.TradeoffRow(budget, 0, 0, 0, peak, ms, compiler=compiler)
    ours = [row("trainc", "None", 100, 1.0), row("trainc", "0.0", 50, 2.0)]
    dominated = report.Tradeoff("m", "cpu", "", tuple(ours + [row("torch.compile", "0.0", 60, 2.5)]))
    assert dominated.undominated_torch_rows() == []
    assert "trainc dominates" in dominated.table()
    beaten = row("torch.compile", "0.5", 70, 1.5)  # smaller than None, faster than 0.0
    mixed = report.Tradeoff("m", "cpu", "", tuple(ours + [beaten]))
    assert mixed.undominated_torch_rows() == [beaten] and "0.5" in mixed.table().splitlines()[-1]
    assert report.Tradeoff("m", "cpu", "", tuple(ours)).undominated_torch_rows() is None


def test_cli_runs_a_zoo_model(tmp_path, capsys):
    pytest.importorskip("transformers")
    code = main(["report", "zoo:gpt2", "--budgets", "none", "0.0", "--steps", "1",
                 "--out", str(tmp_path), "--backend", "aten", "--torch-budgets"])
    assert code == 0
    out = capsys.readouterr().out
    assert "step ms" in out and "torch.compile" not in out
    assert os.path.exists(tmp_path / "zoo_gpt2_tradeoff.csv")
    with pytest.raises(SystemExit, match="unknown zoo model"):
        main(["report", "zoo:nope", "--out", str(tmp_path)])
