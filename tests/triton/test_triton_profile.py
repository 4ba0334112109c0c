"""profile_kernels times every generated kernel launch and knows the bytes each must move: the
suite's bandwidth report (benchmarks/suite.py) picks the largest kernels from it."""
import os
import sys

import pytest
import torch

from triton_helpers import DEVICE, compile_triton
from trainc.codegen.triton.launch import profile_kernels

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))


def test_profile_kernels_times_each_launch_with_its_bytes():
    x = torch.randn(64, 32, device=DEVICE)
    c = compile_triton(lambda x: (torch.softmax(x, 1), x.sum(0) * 2), x)
    with profile_kernels() as prof:
        for _ in range(3):
            c.run([x])
    assert prof and all(len(ms) == 3 and min(ms) >= 0 for ms in prof.values())
    infos = {l.info.name: l.info for l in prof}
    assert set(infos) == {k.name for k in c.kernels}
    assert all(i.bytes_read + i.bytes_written >= 64 * 4 for i in infos.values())
    c.run([x])  # outside the block: nothing recorded, nothing breaks


def test_suite_bandwidth_rows_rank_kernels_by_bytes():
    import suite
    x = torch.randn(256, 64, device=DEVICE)
    c = compile_triton(lambda x: (x * 2, x[:8].sum(1)), x)
    rows = suite.kernel_bandwidth(lambda: c.run([x]), top=1, reps=2)
    assert len(rows) == 1 and rows[0]["mb"] >= 2 * 256 * 64 * 4 / 1e6 - 1e-9
    text = suite.bandwidth_table([{"model": "m", "dtype": "float32", "bandwidth": rows}])
    assert "% of 4.3 TB/s" in text and rows[0]["kernel"] in text


def test_precompile_runs_every_job_and_survives_failures():
    from trainc.codegen.triton.launch import precompile
    done = []

    class Fake:
        def __init__(self, n, fail=False):
            self.n, self.fail = n, fail

        def warmups(self):
            def job(i):
                if self.fail:
                    raise RuntimeError("does not compile")
                done.append((self.n, i))
            return [lambda i=i: job(i) for i in range(2)]
    pending = precompile([Fake(0), Fake(1)], workers=4)
    assert pending.submitted == 4 and done == []  # started; compiled at finish()
    pending.finish()
    assert sorted(done) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    pending.finish()  # once only
    assert len(done) == 4
    precompile([Fake(2, fail=True), Fake(3)], workers=4).finish()  # failures: left to launch
    assert precompile([Fake(4)], workers=1).submitted == 0
    x = torch.randn(8, device=DEVICE)
    c = compile_triton(lambda x: (x * 2,), x)
    if DEVICE == "cpu":
        assert c.extra["precompiled"] == 0  # the interpreter compiles nothing
