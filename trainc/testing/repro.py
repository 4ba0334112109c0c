"""Standalone repro scripts: one captured graph, its inputs (embedded) and the compile options
of the first failing stage and of the last passing one; `python repro.py` checks both."""
from __future__ import annotations

import base64
import io
import re
from typing import Optional

import torch
import torch.fx as fx

_SCRIPT = '''# trainc repro, written by trainc.testing.bisect. First failing stage: {stage}
# `python {path}`: the graph below under the last passing stage's options (must pass), then
# under the failing stage's (prints the mismatch, exits 1).
import base64
import io
import math
import operator
import sys

import torch
from torch import device, inf, nan

import trainc
from trainc.testing import assert_grads_match

{graph}

INPUTS = """
{inputs}"""
SEED = {seed}
PASSING = {passing}  # {passing_stage}
FAILING = {failing}


def make_inputs():
    return torch.load(io.BytesIO(base64.b64decode(INPUTS)), weights_only=True)


def main() -> int:
    if PASSING is not None:
        assert_grads_match(Repro(), make_inputs(), seed=SEED, **PASSING)
        print("passes with the last passing stage's options")
    try:
        assert_grads_match(Repro(), make_inputs(), seed=SEED, **FAILING)
    except Exception as e:  # a mismatch (AssertionError), or the stage crashes
        print(f"{{type(e).__name__}}: {{e}}")
        print("reproduced: fails with the failing stage's options")
        return 1
    print("did not reproduce")
    return 0


if __name__ == "__main__":
    sys.exit(main())
'''


def write(path: str, gm: fx.GraphModule, inputs: list, failing, passing: Optional[object],
          seed: int) -> str:
    """Write the repro script for `gm` called on `inputs`; returns `path`."""
    buf = io.BytesIO()
    torch.save(list(inputs), buf)
    data = base64.b64encode(buf.getvalue()).decode()
    text = _SCRIPT.format(
        stage=failing, path=path, graph=_graph_class(gm), seed=seed,
        inputs="\n".join(data[i:i + 96] for i in range(0, len(data), 96)),
        passing=_options(passing.options) if passing is not None else None,
        passing_stage=passing if passing is not None else "no stage passes",
        failing=_options(failing.options))
    with open(path, "w") as f:
        f.write(text)
    return path


def _graph_class(gm: fx.GraphModule) -> str:
    body = gm.print_readable(print_output=False, include_stride=True, include_device=True)
    return re.sub(r"^class .*?\(torch\.nn\.Module\):", "class Repro(torch.nn.Module):", body,
                  count=1)


def _options(options: dict) -> str:
    """The options as a Python literal (those whose repr is not one cannot be written)."""
    kept = {k: v for k, v in options.items() if _literal(v)}
    lines = [f"    {k!r}: {v!r}," for k, v in sorted(kept.items())]
    return "{\n" + "\n".join(lines) + "\n}"


def _literal(v) -> bool:
    import ast
    try:
        return ast.literal_eval(repr(v)) == v
    except (ValueError, SyntaxError):
        return False
