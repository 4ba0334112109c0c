"""The compiled-library cache: a second compile in a new process hits the disk cache."""
import os
import subprocess
import sys

SCRIPT = r"""
import sys, torch
sys.path[:0] = [{here!r}, {tests!r}]  # cpp_helpers, and the shared tests/policy.py
from cpp_helpers import compile_cpp
c = compile_cpp(lambda x: (x.sin() * 2).sum(1), torch.randn(4, 8))
x = torch.randn(4, 8)
assert torch.allclose(c.run([x])[0], (x.sin() * 2).sum(1), atol=1e-6)
print("HIT" if c.extra["cache_hit"] else "MISS", c.extra["library"])
"""


def _run(cache: str) -> str:
    env = dict(os.environ, TRAINC_CACHE_DIR=cache)
    here = os.path.dirname(__file__)
    script = SCRIPT.format(here=here, tests=os.path.dirname(os.path.abspath(here)))
    out = subprocess.run([sys.executable, "-c", script], env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.strip().splitlines()[-1]


def test_second_process_hits_the_cache(tmp_path):
    first = _run(str(tmp_path))
    second = _run(str(tmp_path))
    assert first.startswith("MISS") and second.startswith("HIT")
    assert first.split()[1] == second.split()[1]
    assert not [f for f in os.listdir(os.path.dirname(first.split()[1])) if "tmp" in f]


def test_missing_compiler_is_a_clear_error(monkeypatch):
    import pytest
    import torch
    from trainc.codegen.cpp import CppBackend
    from trainc.codegen.cpp.build import CompilerMissing
    from trainc.config import make_config
    from torch.fx.experimental.proxy_tensor import make_fx
    gm = make_fx(lambda x: (x * 2,), tracing_mode="fake")(torch.randn(3))
    backend = CppBackend(make_config(cpp_compiler="no-such-cxx-trainc"))
    with pytest.raises(CompilerMissing, match="install g\\+\\+"):
        backend.compile(gm, [None])
