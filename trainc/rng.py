"""Functional, counter-based RNG: random ops become `trainc.philox_uniform(seed, offset, size)`.

Element i of a random op draws Philox4x32-10 at counter (offset + i) under key `seed`, the same
stream as Triton's `tl.rand(seed, offset + i)`, so a recomputed op replays its forward bits.
"""
from __future__ import annotations

import contextlib
from typing import Iterator, Optional

import torch

aten = torch.ops.aten

_ROUND_A, _ROUND_B = 0xD2511F53, 0xCD9E8D57
_KEY_A, _KEY_B = 0x9E3779B9, 0xBB67AE85
_M32 = 0xFFFFFFFF
MAX_OFFSET = 2**32  # the counter is 32 bits wide, as in tl.rand


def philox_uint32(seed: int, counter: torch.Tensor, rounds: int = 10) -> torch.Tensor:
    """First word of Philox4x32 at (counter, 0, 0, 0); int64 tensor holding uint32 values."""
    c0, c1 = counter & _M32, torch.zeros_like(counter)
    c2, c3 = torch.zeros_like(counter), torch.zeros_like(counter)
    k0, k1 = seed & _M32, (seed >> 32) & _M32
    for _ in range(rounds):
        # int64 products wrap mod 2**64; the masked halves are the exact 32x32->64 product.
        p0, p2 = c0 * _ROUND_A, c2 * _ROUND_B
        c0, c2, c1, c3 = ((p2 >> 32) & _M32) ^ c1 ^ k0, ((p0 >> 32) & _M32) ^ c3 ^ k1, \
            p2 & _M32, p0 & _M32
        k0, k1 = (k0 + _KEY_A) & _M32, (k1 + _KEY_B) & _M32
    return c0


def uint32_to_uniform(x: torch.Tensor) -> torch.Tensor:
    """Triton's uint_to_uniform_float: bitcast to int32, fold negatives, scale by 2**-31."""
    x = torch.where(x >= 2**31, x - 2**32, x)
    x = torch.where(x < 0, -x - 1, x)
    return x.to(torch.float32) * 4.6566127342e-10


@torch.library.custom_op("trainc::philox_uniform", mutates_args=())
def philox_uniform(seed: torch.Tensor, offset: int, size: list[int], dtype: torch.dtype,
                   device: torch.device) -> torch.Tensor:
    """Uniform [0, 1) values of `size`; element i uses counter offset + i (row-major)."""
    numel = 1
    for s in size:
        numel *= s
    if offset + numel > MAX_OFFSET:
        raise RuntimeError("trainc: one graph draws more than 2**32 random numbers per call")
    counter = torch.arange(offset, offset + numel, dtype=torch.int64, device=device)
    bits = philox_uint32(int(seed.item()), counter)
    return uint32_to_uniform(bits).to(dtype).reshape(size)


@philox_uniform.register_fake
def _(seed, offset, size, dtype, device):
    return torch.empty(size, dtype=dtype, device=device)


class RngTracer:
    """Hands out consecutive counter ranges of one seed to the random ops of one trace."""

    def __init__(self, seed: torch.Tensor):
        self.seed, self.offset, self.used = seed, 0, False

    def uniform(self, size, dtype, device) -> torch.Tensor:
        size = [int(s) for s in size]
        numel = 1
        for s in size:
            numel *= s
        out = torch.ops.trainc.philox_uniform(self.seed, self.offset, size, dtype, device)
        self.offset, self.used = self.offset + numel, True
        return out


_current: Optional[RngTracer] = None


@contextlib.contextmanager
def tracing(seed: torch.Tensor) -> Iterator[RngTracer]:
    global _current
    prev, _current = _current, RngTracer(seed)
    try:
        yield _current
    finally:
        _current = prev


def _tracer() -> RngTracer:
    if _current is None:
        raise RuntimeError("trainc: a random op was traced outside trainc's RNG context")
    return _current


def _float_dtype(dtype: Optional[torch.dtype]) -> torch.dtype:
    return dtype if dtype is not None else torch.get_default_dtype()


def _uniform_like(x: torch.Tensor, dtype=None) -> torch.Tensor:
    # Draw in float32 and cast, so float16/bfloat16 masks match float32 ones bit for bit.
    u = _tracer().uniform(x.shape, torch.float32, x.device)
    return u.to(dtype or x.dtype)


def _normal(size, dtype, device) -> torch.Tensor:
    """Box-Muller on two uniform draws."""
    u1 = _tracer().uniform(size, torch.float32, device)
    u2 = _tracer().uniform(size, torch.float32, device)
    r = torch.sqrt(-2.0 * torch.log1p(-u1))  # 1 - u1 is in (0, 1]: log is finite
    return (r * torch.cos(2 * torch.pi * u2)).to(dtype)


def _bernoulli_p(self, p=0.5, generator=None):
    _no_generator(generator)
    return (_uniform_like(self, torch.float32) < p).to(self.dtype)


def _bernoulli_tensor(self, generator=None):
    _no_generator(generator)
    return (_uniform_like(self, torch.float32) < self).to(self.dtype)


def _bernoulli_inplace_float(self, p=0.5, generator=None):
    return self.copy_(_bernoulli_p(self, p, generator))


def _bernoulli_inplace_tensor(self, p, generator=None):
    _no_generator(generator)
    return self.copy_((_uniform_like(self, torch.float32) < p).to(self.dtype))


def _native_dropout(x, p, train):
    if not train or p == 0:
        return x.clone(), torch.ones_like(x, dtype=torch.bool)
    if p == 1:
        return torch.zeros_like(x), torch.zeros_like(x, dtype=torch.bool)
    keep = _uniform_like(x, torch.float32) < (1 - p)
    return x * keep * (1.0 / (1 - p)), keep


def _rand(size, *, generator=None, dtype=None, layout=None, device=None, pin_memory=None):
    _no_generator(generator)
    return _tracer().uniform(size, torch.float32, device or "cpu").to(_float_dtype(dtype))


def _rand_like(x, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return _tracer().uniform(x.shape, torch.float32, device or x.device).to(dtype or x.dtype)


def _randn(size, *, generator=None, dtype=None, layout=None, device=None, pin_memory=None):
    _no_generator(generator)
    return _normal(size, _float_dtype(dtype), device or "cpu")


def _randn_like(x, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return _normal(x.shape, dtype or x.dtype, device or x.device)


def _uniform_inplace(self, from_=0.0, to=1.0, *, generator=None):
    _no_generator(generator)
    u = _uniform_like(self, torch.float32)
    return self.copy_((u * (to - from_) + from_).to(self.dtype))


def _normal_inplace(self, mean=0.0, std=1.0, *, generator=None):
    _no_generator(generator)
    return self.copy_(_normal(self.shape, torch.float32, self.device) * std + mean)


def _no_generator(generator) -> None:
    if generator is not None:
        raise NotImplementedError("trainc: random ops with an explicit torch.Generator are not "
                                  "supported; drop the generator argument or run eagerly")


DECOMPOSITIONS = {
    aten.bernoulli.default: _bernoulli_tensor,
    aten.bernoulli.p: _bernoulli_p,
    aten.bernoulli_.float: _bernoulli_inplace_float,
    aten.bernoulli_.Tensor: _bernoulli_inplace_tensor,
    aten.native_dropout.default: _native_dropout,
    aten.rand.default: _rand,
    aten.rand_like.default: _rand_like,
    aten.randn.default: _randn,
    aten.randn_like.default: _randn_like,
    aten.uniform_.default: _uniform_inplace,
    aten.normal_.default: _normal_inplace,
}


def draw_seed() -> torch.Tensor:
    """A fresh seed from torch's CPU generator: manual_seed reproduces, consecutive calls differ.
    A CPU scalar on every device, so drawing it never synchronizes a GPU."""
    return torch.randint(0, 2**62, (), dtype=torch.int64)
