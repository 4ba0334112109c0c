"""benchmarks/step_suite.py's CPU path at --scale tiny: sharded run, markdown table and JSON."""
import json
import os
import subprocess
import sys

import pytest

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks", "step_suite.py")
pytest.importorskip("models", reason="needs the shared benchmark suite (../shared/bench)")


def test_tiny_sharded_run_writes_table_and_json(tmp_path):
    out = tmp_path / "out"
    cmd = [sys.executable, SCRIPT, "--scale", "tiny", "--iters", "2", "--jobs", "2",
           "--dtypes", "float32", "--backend", "aten", "--out", str(out), "--budget-models",
           "mlp", "--modes", "eager_foreach,eager_fused,trainc,trainc_budget", "mlp", "normact"]
    subprocess.run(cmd, check=True, capture_output=True, timeout=300, cwd=str(tmp_path))
    rows = json.loads((out / "step_suite.json").read_text())["rows"]
    got = {(r["model"], r["mode"]) for r in rows if "error" not in r}
    # Budget rows only on --budget-models; every other mode on both models.
    assert got == {("mlp", "eager_foreach"), ("mlp", "eager_fused"), ("mlp", "trainc"),
                   ("mlp", "trainc_budget"), ("normact", "eager_foreach"),
                   ("normact", "eager_fused"), ("normact", "trainc")}, rows
    losses = {r["mode"]: r["loss"] for r in rows if r["model"] == "mlp"}
    assert max(losses.values()) - min(losses.values()) < 1e-4, losses  # same steps, same math
    table = (out / "step_suite.md").read_text()
    assert "| mlp | float32 | " in table and "trainc_budget (0.0)" in table
