"""benchmarks/step_suite.py's CPU path at --scale tiny: sharded run, markdown table and JSON."""
import json
import os
import subprocess
import sys

import pytest

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks", "step_suite.py")


def test_tiny_sharded_run_writes_table_and_json(tmp_path):
    out = tmp_path / "out"
    cmd = [sys.executable, SCRIPT, "--scale", "tiny", "--iters", "2", "--jobs", "2",
           "--dtypes", "float32,bfloat16", "--backend", "aten", "--out", str(out),
           "--budget-models", "normact",
           "--modes", "eager_foreach,eager_fused,trainc,trainc_budget",
           "normact"]
    subprocess.run(cmd, check=True, capture_output=True, timeout=300, cwd=str(tmp_path))
    rows = json.loads((out / "step_suite.json").read_text())["rows"]
    got = {(r["dtype"], r["mode"]) for r in rows if "error" not in r}
    assert got == {(d, m) for d in ("float32", "bfloat16")  # one shard per dtype
                   for m in ("eager_foreach", "eager_fused", "trainc", "trainc_budget")}, rows
    losses = {r["mode"]: r["loss"] for r in rows if r["dtype"] == "float32"}
    assert max(losses.values()) - min(losses.values()) < 1e-3, losses  # same steps, same math
    table = (out / "step_suite.md").read_text()
    assert "| normact | bfloat16 | " in table and "trainc_budget (0.0)" in table
