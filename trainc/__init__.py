"""trainc: a training-focused compiler for PyTorch.

    step_model = trainc.compile(model)                 # or torch.compile(model, backend="trainc")
    print(trainc.explain(model, x))                    # graphs, saved bytes, kernels, fallbacks
"""
from trainc import rng as _rng  # registers torch.ops.trainc.*  # noqa: F401
from trainc.api import Explanation, compile, explain
from trainc.config import Config
from trainc.decisions import RankMismatchError
from trainc.joint import UnsupportedError
from trainc import report  # noqa: E402  trainc.report.tradeoff
from trainc.regions import policy
from trainc.step import CompiledStep, compile_step

__all__ = ["compile", "compile_step", "explain", "policy", "CompiledStep", "Explanation",
           "Config", "UnsupportedError", "RankMismatchError"]
__version__ = "0.1.0"
