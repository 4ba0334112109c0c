"""Triton compile workers, started by compile_pool.py as a script: it imports Triton only.

Importing the trainc package and torch in a worker took seconds (BENCHMARKS.md): workers were
ready after the lead had its kernels generated. Triton compiles without
torch when it is told the GPU target: the lead sends its target first ({"target": [backend,
arch, warp_size]}), and each worker then compiles with a driver that answers from it
(`TargetDriver`: no torch, no CUDA context) and with stand-ins for torch's dtypes
(`_DType`, which Triton reads by name: a job compiles to the same cache entry as the lead's
own warmup with torch dtypes, tested with triton 3.6 and 3.9). Without a target line (not
CUDA) a worker imports torch and asks Triton's own driver, as before.

`compile_worker.py R0,W0 R1,W1 ...`: one process imports Triton, then forks a worker per pair
of pipe descriptors (jobs in on R, answers out on W). Without arguments it is one worker on
stdin/stdout. A worker reads job specs (compile_pool.job_spec, one JSON list per line) and
answers each, in order, with "ok" or "failed <error>"; it exits at end of input.
"""
import os
import sys
from typing import Optional

if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
    del sys.path[0]  # this folder's modules (launch, printer, ...) must not shadow others

import importlib.util  # noqa: E402
import json  # noqa: E402

import triton  # noqa: E402, F401  (imported before the first job arrives: the lead is tracing)


class _DType:
    """Stands in for a torch.dtype in a warmup job: Triton takes a pointer argument's type from
    str(arg.dtype) ("torch.bfloat16" -> *bf16), and MockTensor from a dtype of module torch."""

    def __init__(self, name: str):
        self.name = name

    def __str__(self) -> str:
        return f"torch.{self.name}"

    __repr__ = __str__


_DType.__module__ = "torch"
_DType.__name__ = "dtype"


class TargetDriver:
    """What Triton's JIT asks the active driver during a warmup, answered from the lead's
    target; the C launcher class is the CUDA backend's."""

    def __init__(self, target: list):
        from triton.backends.compiler import GPUTarget
        self.target = GPUTarget(*target)
        if self.target.backend == "cuda":
            from triton.backends.nvidia.driver import CudaLauncher
            self.launcher_cls = CudaLauncher

    def get_current_target(self):
        return self.target

    def get_current_device(self) -> int:
        return 0

    def get_current_stream(self, device=None) -> int:
        return 0


def use_target(target: list, ptxas_version: Optional[str] = None) -> None:
    """Compile for `target` without torch. Triton 3.6's argument specialization (C++) imports
    torch to test for torch.Tensor: a stand-in module whose Tensor nothing is an instance of
    keeps the real one (seconds of imports) out; the arguments are MockTensors.
    `ptxas_version`: the version string the lead's cache keys carry (Triton hashes with the
    version it cached at its first compile, which may not be the ptxas it now runs)."""
    from triton.runtime.driver import driver
    driver.set_active(TargetDriver(target))
    if ptxas_version is not None:
        from triton import knobs
        knobs.nvidia.mock_ptx_version = ptxas_version
    if "torch" not in sys.modules:
        import types
        stand_in = types.ModuleType("torch")
        stand_in.Tensor = type("Tensor", (), {})
        sys.modules["torch"] = stand_in


_DTYPES: dict = {}  # one stand-in per name, kept: Triton caches type strings per dtype object


def _arguments(dtypes: list, torchless: bool) -> list:
    if torchless:
        from triton.runtime.jit import MockTensor
        return [MockTensor(_DTYPES.setdefault(d, _DType(d))) for d in dtypes]
    import torch
    return [getattr(torch, d) for d in dtypes]


def compile_job(spec: list, modules: dict, torchless: bool = False) -> None:
    path, name, dtypes, meta = spec
    if path not in modules:
        s = importlib.util.spec_from_file_location(os.path.basename(path)[:-3], path)
        module = importlib.util.module_from_spec(s)
        s.loader.exec_module(module)
        modules[path] = module
    kernel = getattr(modules[path], name).warmup(*_arguments(dtypes, torchless), grid=(1,),
                                                 **meta)
    try:  # also its C launcher (cached on disk per signature, ~0.3 s of gcc each); not
        # _init_handles, which would load the module onto the GPU
        from triton.runtime import driver
        driver.active.launcher_cls(kernel.src, kernel.metadata)
    except Exception:  # noqa: BLE001 (optional: the first launch builds what is missing)
        pass


def serve(jobs, answers) -> None:
    """Answer each job line; a JSON object line ({"target": [backend, arch, warp_size]}) is
    not a job: it sets the target (use_target) and gets no answer."""
    modules: dict = {}
    torchless = False
    for line in jobs:  # one job per line until the lead closes the pipe
        if line.startswith("{"):
            try:
                message = json.loads(line)
                use_target(message["target"], message.get("ptxas_version"))
                torchless = True
            except Exception:  # noqa: BLE001 (then torch and Triton's own driver, as before)
                pass
            continue
        try:
            compile_job(json.loads(line), modules, torchless)
            answers.write("ok\n")
        except Exception as e:  # noqa: BLE001 (the in-process compile reports real errors)
            message = str(e).strip().splitlines()[:1]
            answers.write(f"failed {type(e).__name__}: {''.join(message)[:300]}\n")
        answers.flush()


def fork_workers(pairs: list[tuple[int, int]]) -> None:
    """Fork a worker per pair. Nothing before the fork may touch the GPU (Triton's driver
    asks CUDA for its devices): a forked child cannot use a CUDA its parent initialized."""
    children = []
    for i, (r, w) in enumerate(pairs):
        pid = os.fork()
        if pid == 0:
            try:
                for j, fds in enumerate(pairs):
                    if j != i:
                        for fd in fds:
                            os.close(fd)
                with open(r) as jobs, open(w, "w") as answers:
                    serve(jobs, answers)
            finally:
                os._exit(0)
        children.append(pid)
    for r, w in pairs:  # only the children hold them now: a child's exit ends its answers
        os.close(r)
        os.close(w)
    for pid in children:
        os.waitpid(pid, 0)


def hash_triton() -> None:
    """Compute the hash of Triton's own files that leads every cache key (`triton_key`, ~0.3 s:
    reading and hashing libtriton) once, before the fork: each worker would otherwise pay it at
    its first job, all at once, beside the lead's trace."""
    try:
        from triton.runtime.cache import triton_key
        triton_key()
    except Exception:  # noqa: BLE001 (another Triton: its first compile computes its keys)
        pass


def main() -> None:
    if len(sys.argv) > 1:
        hash_triton()
        fork_workers([tuple(int(x) for x in a.split(",")) for a in sys.argv[1:]])
    else:
        serve(sys.stdin, sys.stdout)


if __name__ == "__main__":
    main()
