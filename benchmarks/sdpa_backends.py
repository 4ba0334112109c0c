"""Causal SDPA forward+backward per backend on CUDA, at the zoo Llama's attention shape.

    python benchmarks/sdpa_backends.py [--shape 4,32,2048,64] [--kv-heads 8]

Median ms of CUDA-event-timed fwd+bwd for each backend torch lets run the case, and the
achieved TFLOP/s (causal: half of 4*B*H*S^2*D forward, 2.5x that backward).
"""
import argparse
import statistics

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def time_backend(backend, q, k, v, iters: int = 20) -> float:
    with sdpa_kernel([backend]):
        times = []
        for i in range(iters + 3):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            out.backward(torch.ones_like(out))
            e.record()
            torch.cuda.synchronize()
            if i >= 3:
                times.append(s.elapsed_time(e))
            q.grad = k.grad = v.grad = None
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="4,32,2048,64")
    a = ap.parse_args()
    b, h, s, d = map(int, a.shape.split(","))
    mk = lambda: torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16,
                             requires_grad=True)
    q, k, v = mk(), mk(), mk()
    flops = 3.5 * 4 * b * h * s * s * d / 2
    for backend in (SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION,
                    SDPBackend.EFFICIENT_ATTENTION):
        try:
            ms = time_backend(backend, q, k, v)
            print(f"{backend.name:22s} {ms:7.3f} ms  {flops / ms / 1e9:6.1f} TFLOP/s", flush=True)
        except RuntimeError as e:
            print(f"{backend.name:22s} unavailable: {str(e)[:80]}")


if __name__ == "__main__":
    main()
