"""Shared test setup: make tests/ helpers and the benchmark suite models importable."""
import os
import sys

# Without a GPU, Triton kernels run on CPU tensors through its interpreter. It must be set
# before anything imports triton, so here, not in tests/triton/.
if not os.environ.get("TRITON_INTERPRET"):
    import torch

    if not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"

# Compiled artifacts cached on disk would let a later run (or a test that patches a stage)
# skip the code under test; tests/codegen/test_artifact_cache.py turns it on where it tests it.
os.environ.setdefault("TRAINC_CACHE_ARTIFACTS", "0")

HERE = os.path.dirname(__file__)
sys.path.insert(0, HERE)
BENCH = os.path.join(HERE, "..", "benchmarks", "suite_models")  # the suite models: import models
sys.path.insert(0, os.path.abspath(BENCH))

# Hypothesis profiles: "ci" (default; derandomized, so the default suite is reproducible) and
# "nightly" (`pytest --hypothesis-profile=nightly tests/fuzz`: random, thousands of examples).
try:
    from hypothesis import HealthCheck, Phase, settings
except ImportError:  # hypothesis is a test extra; only the fuzz tests need it
    settings = None
if settings is not None:
    _slow_ok = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much]
    # ci does not shrink: one example costs ~0.3 s, shrinking a failure can take minutes.
    settings.register_profile("ci", max_examples=8, deadline=None, derandomize=True,
                              database=None, suppress_health_check=_slow_ok, print_blob=True,
                              phases=[Phase.explicit, Phase.reuse, Phase.generate])
    # TRAINC_FUZZ_EXAMPLES overrides the count, e.g. to split a nightly run over many processes;
    # TRAINC_FUZZ_SHRINK=0 reports failures unshrunk (time-limited runs: the program still prints).
    _phases = list(Phase) if os.environ.get("TRAINC_FUZZ_SHRINK", "1") != "0" else \
        [p for p in Phase if p not in (Phase.shrink, Phase.explain)]
    settings.register_profile("nightly", deadline=None, phases=_phases,
                              max_examples=int(os.environ.get("TRAINC_FUZZ_EXAMPLES", "2000")),
                              suppress_health_check=_slow_ok, print_blob=True)
    settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
