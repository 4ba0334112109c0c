"""First call and step time of trainc.compile on the real-width Llama with N layers (#9 item 5).

    TRAINC_CACHE_DIR=$(mktemp -d) TRITON_CACHE_DIR=$(mktemp -d) \
        python benchmarks/depth.py --layers 32 --regions on          # GPU: first_s, step_ms, MiB

Real-width HF Llama (hidden 2048, 32/8 heads, intermediate 5632, vocab 32000), bf16, called with
its own loss (labels) and use_cache=False (a KV cache is per-layer state: with regions it stops
the layers sharing a graph). `--regions on` compiles with `regions="auto"` (one graph for all
decoder layers), `off` the whole model as one graph. Use fresh cache directories per process
(the environment's TRAINC_CACHE_DIR / TRITON_CACHE_DIR): a warm cache measures loading, not
compiling. Prints one JSON line: first_s (wall seconds of the first forward+backward, compile
included), first_cpu_s (its process CPU seconds), compile_cpu_s = dynamo_cpu_s (Dynamo's frame
compiles: capture) + trainc_cpu_s (trainc's graph compiles), step_ms (median of --steps steps
after two), peak_mib (CUDA: peak allocated above the model and batch during a step), graphs
(trainc graphs compiled). `--first-only` stops after the first call. `--skip-kernels` (CPU
compile-time measurements under TRITON_INTERPRET=1 only): the interpreter does not run the
generated Triton kernels, so their outputs are garbage and only the compile is measured
(interpreting a real-width kernel takes seconds); the compile depends on shapes, not values.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(__file__))
from zoo import models  # noqa: E402

import trainc  # noqa: E402
from trainc import records, runtime  # noqa: E402


def build(layers: int, device: str, dtype: torch.dtype) -> torch.nn.Module:
    import transformers
    cfg = models._cfg("LlamaConfig", **dict(models._LLAMA_REAL, num_hidden_layers=layers,
                                            use_cache=False))
    torch.manual_seed(0)
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # built in bf16 directly: no float32 copy of 1.5B weights
    try:
        with torch.device(device):
            return transformers.LlamaForCausalLM(cfg).train()
    finally:
        torch.set_default_dtype(default)


class CompileTimer:
    """Process CPU seconds inside Dynamo's frame compiles (capture) and trainc's graph compiles
    (trace .. codegen): they never nest (trainc compiles a graph at its first run)."""
    def __init__(self):
        self.dynamo = self.trainc = 0.0

    def __enter__(self):
        from torch._dynamo import convert_frame
        from trainc import capture
        # (a torch without convert_frame._compile leaves dynamo_cpu_s at 0)
        self._saved = [(m, n, getattr(m, n), f) for m, n, f in (
            (convert_frame, "_compile", "dynamo"), (capture, "compile_graph", "trainc"))
            if hasattr(m, n)]
        for mod, name, fn, field in self._saved:
            setattr(mod, name, self._timed(fn, field))
        return self

    def _timed(self, fn, field):
        def run(*args, **kwargs):
            t0 = time.process_time()
            try:
                return fn(*args, **kwargs)
            finally:
                setattr(self, field, getattr(self, field) + time.process_time() - t0)
        return run

    def __exit__(self, *exc):
        for mod, name, fn, _ in self._saved:
            setattr(mod, name, fn)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--regions", choices=("on", "off"), default="on")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--backend", default="auto")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--first-only", action="store_true")
    ap.add_argument("--skip-kernels", action="store_true")
    a = ap.parse_args()
    if a.skip_kernels:
        import triton.runtime.interpreter as interpreter
        interpreter.GridExecutor.__call__ = lambda self, *args, **kwargs: None
    cuda = a.device == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    model = build(a.layers, a.device, torch.bfloat16)
    ids = torch.randint(0, 32000, (a.batch, a.seq), device=a.device)
    fn = trainc.compile(model, backend=a.backend,
                        regions="auto" if a.regions == "on" else None)

    def step():
        for p in model.parameters():
            p.grad = None
        fn(input_ids=ids, labels=ids).loss.backward()

    def timed() -> tuple[float, float]:
        sync()
        t0, c0 = time.perf_counter(), time.process_time()
        step()
        sync()
        return time.perf_counter() - t0, time.process_time() - c0

    with records.recording() as recs, CompileTimer() as ct:
        first_s, first_cpu = timed()
    out = {"layers": a.layers, "regions": a.regions, "device": a.device,
           "batch": a.batch, "seq": a.seq, "first_s": round(first_s, 2),
           "first_cpu_s": round(first_cpu, 2), "compile_cpu_s": round(ct.dynamo + ct.trainc, 2),
           "dynamo_cpu_s": round(ct.dynamo, 2), "trainc_cpu_s": round(ct.trainc, 2),
           "graphs": len(recs)}
    if not a.first_only:
        runtime.wait_for_background_compiles()
        step()
        times = []
        for _ in range(a.steps):
            sync()
            t = time.perf_counter()
            step()
            sync()
            times.append((time.perf_counter() - t) * 1e3)
        out["step_ms"] = round(statistics.median(times), 2)
        if cuda:
            for p in model.parameters():
                p.grad = None
            torch.cuda.synchronize()
            base = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            step()
            torch.cuda.synchronize()
            out["peak_mib"] = round((torch.cuda.max_memory_allocated() - base) / 2**20)
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
