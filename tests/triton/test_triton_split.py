"""Reductions of a large tensor to scalars run as a multi-block two-stage kernel (split.py):
values match eager (NaN, integers, bool any/all, bf16), later loops of the kernel read the
reduction results, results are bitwise reproducible, and small reductions stay one block."""
import re

import torch

from triton_helpers import DEVICE, assert_same, check, compile_triton
from trainc.codegen.triton import split


def _big(*shape, dtype=torch.float32):
    return torch.randn(*shape, dtype=dtype, generator=torch.Generator().manual_seed(0))


def _split_kernels(c) -> int:
    return c.extra["triton"].count("_b0(")


def test_scalar_reductions_and_following_loops_split():
    def f(x):
        m = x.mean()
        return (x.sum(), m, x - m, x.amax(), x.amin(), (x > 3).any(), (x > -10).all(),
                torch.var(x), (x * 0.001 + 1).prod(), x / x.abs().sum())
    c = check(f, _big(300, 301), rtol=1e-4, atol=1e-5)
    assert _split_kernels(c) >= 1


def test_split_nan_and_integers():
    x = _big(300, 301)
    x[7, 9] = float("nan")
    c = check(lambda x: (x.sum(), x.amax(), x.amin()), x)
    assert _split_kernels(c) == 1
    xi = torch.randint(-5, 5, (300, 301))
    check(lambda x: (x.sum(), x.amax(), x.amin()), xi)


def test_split_bf16_uses_float_results_downstream():
    x = _big(256, 512, dtype=torch.bfloat16)
    ref = lambda x: (x.float().sum(), x.float() - x.float().mean())
    c = compile_triton(ref, x.to(DEVICE))
    got = c.run([x.to(DEVICE)])
    want = ref(x.to(DEVICE))
    for g, w in zip(got, want):
        assert_same(g, w, 1e-5, 1e-5, "bf16 split")
    assert _split_kernels(c) >= 1


def test_split_is_bitwise_reproducible_and_small_stays_one_block():
    x = _big(200, 700).to(DEVICE)
    c = compile_triton(lambda x: (x.sum(), (x * x).sum()), x)
    a, b = c.run([x]), c.run([x])
    assert all(torch.equal(u, v) for u, v in zip(a, b))
    small = compile_triton(lambda x: (x.sum(),), x[:10])
    assert _split_kernels(small) == 0
    assert split.SPLIT_LIMIT < 200 * 700


def test_few_outputs_over_many_elements_split_on_the_outer_reduced_dim(monkeypatch):
    """Per-channel statistics (NCHW and channels-last) and column sums: part[s, i] over the
    inner dims, then out[i] over s (codegen/split_reductions.py)."""
    from trainc.codegen import split_reductions as sr
    monkeypatch.setattr(sr, "SPLIT_MIN_ELEMENTS", 256)
    x = _big(8, 6, 16, 16)
    x[1, 2, 3, 4] = float("nan")
    cl = x.contiguous(memory_format=torch.channels_last)

    def f(x, y, b):
        m = x.mean((0, 2, 3))
        return (m, ((x - m[:, None, None]) ** 2).sum((0, 2, 3)), x.amax((0, 2, 3)),
                x.amin((0, 2)), y.sum(0), b.sum((0, 1)))
    columns = []
    for a in (x, cl):
        c = check(f, a, _big(64, 8, 5).view(64 * 8, 5), _big(16, 32, 7), rtol=1e-4, atol=1e-5)
        # mean, centered squares, amax and b's sum split; the others reduce too few elements
        # per output (amin) or have one reduced dim (y's column sums)
        assert len(set(re.findall(r"buf\d+_part\b", c.source))) == 4, "not split"
        run = getattr(c.run, "run", c.run)  # on CUDA, inside the precompile's _FirstRun
        columns.append([k.ks.column for k in vars(run.__globals__["K"]).values()])
    # reads along x (wide x tiles, looped): the final stages and y's column sums; channels-last,
    # the partials of the per-channel statistics too (kernel0: the mean's and the centered
    # squares' partials, one kernel)
    assert 0 < sum(columns[0]) <= sum(columns[1]) and columns[1][0] and not columns[0][0], \
        columns
    # bf16: the partials are float32, one rounding at the end as in eager
    c = check(lambda b: b.sum((0, 1)), _big(16, 32, 7, dtype=torch.bfloat16), rtol=8e-3)
    assert "_part" in c.source
    monkeypatch.setattr(sr, "SPLIT_MIN_ELEMENTS", 1 << 30)
    assert "_part" not in check(f, x, _big(512, 5), _big(16, 32, 7), rtol=1e-4,
                                atol=1e-5).source


def test_channels_last_statistics_cut_their_second_reduced_dim_into_the_parts(monkeypatch):
    """Per-channel statistics of a channels-last tensor split on N and on pieces of H
    (split_reductions._finer_columns): parts (N * q, C), each reducing H / q x W rows with
    wide tiles along C (column mode); NCHW keeps parts (N, C). Values (NaN, the variance's
    parallel form, bf16) as eager's."""
    from trainc.codegen import split_reductions as sr
    monkeypatch.setattr(sr, "SPLIT_MIN_ELEMENTS", 256)
    monkeypatch.setattr(sr, "COLUMN_MIN_PART", 32)
    x = _big(4, 6, 16, 8) * 0.01 + 100
    x[1, 2, 3, 4] = float("nan")
    x[2] = _big(6, 16, 8)
    f = lambda x: (*torch.var_mean(x, dim=(0, 2, 3), correction=0), x.amax((0, 2, 3)),
                   (x * x).sum((0, 2, 3)))
    cl = x.contiguous(memory_format=torch.channels_last)
    c = check(f, cl, rtol=1e-4, atol=1e-5)
    # 16 rows of H in 4 pieces of 4: each part reduces 4 x 8 = 32 elements
    assert re.search(r"empty\(\(16, 6\)", c.source), c.source
    run = getattr(c.run, "run", c.run)
    assert any(k.ks.column for k in vars(run.__globals__["K"]).values())
    plain = check(f, x, rtol=1e-4, atol=1e-5)
    assert re.search(r"empty\(\(4, 6\)", plain.source) and \
        not re.search(r"empty\(\(16, 6\)", plain.source), plain.source
    check(lambda b: b.sum((0, 2, 3)), _big(4, 6, 16, 8, dtype=torch.bfloat16)
          .contiguous(memory_format=torch.channels_last), rtol=8e-3)
    monkeypatch.setattr(sr, "COLUMN_LANES", 4 * 6)
    assert not re.search(r"empty\(\(16, 6\)", check(f, cl, rtol=1e-4, atol=1e-5).source)


def test_one_long_reduced_dim_splits_into_parts(monkeypatch):
    """Column sums over many rows (normact's LayerNorm weight and bias gradients: 65536 rows
    into each of 4096 columns, one program per few columns) are cut into parts of rows first:
    part[s, i] over rows s * k .. s * k + k - 1, then out[i] over s; a variance over the rows
    after its mean takes the parallel form. Rows that do not divide into parts stay whole."""
    from trainc.codegen import split_reductions as sr
    monkeypatch.setattr(sr, "SPLIT_MIN_ELEMENTS", 256)
    monkeypatch.setattr(sr, "SPLIT_ONE_DIM_MIN_PART", 16)
    x, g = _big(512, 6), _big(512, 6)
    x[7, 2] = float("nan")
    f = lambda x, g: ((g * x).sum(0), g.sum(0), x.amax(0), *torch.var_mean(g, dim=0))
    c = check(f, x, g, rtol=1e-4, atol=1e-5)
    parts = set(re.findall(r"(buf\d+_part)\b", c.source))
    assert len(parts) >= 4, parts
    assert re.search(r"empty\(\(32, 6\)", c.source), "512 rows in 32 parts of 16"
    odd = check(lambda g: g.sum(0), _big(509, 6), rtol=1e-4, atol=1e-5)
    assert "_part" not in odd.source
    monkeypatch.setattr(sr, "SPLIT_ONE_DIM_MIN_PART", 1 << 20)
    assert "_part" not in check(lambda g: g.sum(0), g, rtol=1e-4, atol=1e-5).source


def test_column_sums_over_few_rows_split_into_parts(monkeypatch):
    """A weight gradient of a norm (products of [tokens, hidden] tensors summed over the
    tokens) reads across the grain one program per few columns: it splits its last reduced
    dim into parts moved to the front (split_reductions._in_parts), or, when that dim does not
    divide, takes its first reduced dim as the parts. Rows along the contiguous dim do not
    split. (Thresholds lowered: the defaults start at a million elements.)"""
    from trainc.codegen import split_reductions as sr
    for name, value in (("COLUMN_MIN_TOTAL", 1 << 14), ("COLUMN_MIN_ELEMENTS", 256),
                        ("COLUMN_PARTS", 16), ("COLUMN_MIN_PART", 64)):
        monkeypatch.setattr(sr, name, value)
    g, h, x = (_big(4, 128, 32, dtype=torch.bfloat16) for _ in range(3))
    f = lambda g, h, x: ((g + h) * x).sum((0, 1))
    c = check(f, g, h, x, rtol=8e-3)
    # 4 x 128 rows: the last dim in 8 parts of 16, each part reducing 4 x 16 = 64 rows
    assert re.search(r"empty\(\(8, 32\)", c.source), c.source
    # 67 rows do not divide: the 8 of the first reduced dim are the parts (ViT's 197 tokens)
    odd = check(lambda g, x: (g * x).sum((0, 1)), *(_big(8, 67, 32) for _ in range(2)),
                rtol=1e-4, atol=1e-4)
    assert re.search(r"empty\(\(8, 32\)", odd.source), odd.source
    assert "_part" not in check(lambda x: x.sum(-1), _big(64, 512), rtol=1e-4,
                                atol=1e-4).source
    monkeypatch.setattr(sr, "COLUMN_MIN_TOTAL", 1 << 40)
    assert "_part" not in check(f, g, h, x, rtol=8e-3).source


def test_column_sums_weigh_loads_by_bytes(monkeypatch):
    """A LayerNorm weight gradient (convnext): two [tokens, hidden] tensors read along the
    outputs and per-token statistics (a [tokens] vector) read along the rows. Counted one a
    load the two sides tied and the sum ran looped across the grain; by bytes it splits, and
    its parts run as column tiles. Where whole tensors tie (one transposed), it splits too."""
    from trainc.codegen import split_reductions as sr
    for name, value in (("COLUMN_MIN_TOTAL", 1 << 14), ("COLUMN_MIN_ELEMENTS", 256),
                        ("COLUMN_PARTS", 16), ("COLUMN_MIN_PART", 64)):
        monkeypatch.setattr(sr, name, value)
    g, x = (_big(8, 67, 64) for _ in range(2))
    mu, rs = _big(8, 67, 1), _big(8, 67, 1)
    f = lambda g, x, mu, rs: (g * ((x - mu) * rs)).sum((0, 1))
    c = check(f, g, x, mu, rs, rtol=1e-4, atol=1e-4)
    assert re.search(r"empty\(\(8, 64\)", c.source), c.source
    one = check(lambda g, mu, rs: (g * (mu * rs)).sum((0, 1)), g, mu, rs, rtol=1e-4, atol=1e-4)
    assert re.search(r"empty\(\(8, 64\)", one.source), one.source  # one load outweighs two
    xt = _big(8, 64, 67).transpose(1, 2)  # read along the rows where g is read along outputs
    t = check(lambda g, x: (g * x).sum((0, 1)), g, xt, rtol=1e-4, atol=1e-4)
    assert re.search(r"empty\(\(8, 64\)", t.source), t.source


def test_variance_after_its_mean_splits_the_parallel_way(monkeypatch):
    """var_mean / batch-norm statistics over many elements: the partials of the sum, of the
    deviations from each part's own mean and of their squares in one kernel, the totals
    (Chan's combination) in one more; as accurate as the two-pass split, also far from 0."""
    from trainc.codegen import split_reductions as sr
    monkeypatch.setattr(sr, "SPLIT_MIN_ELEMENTS", 256)
    x = _big(8, 6, 16, 16) * 0.01 + 1000
    f = lambda x: torch.var_mean(x, dim=(0, 2, 3), correction=1)
    errors = {}
    for chan in (True, False):
        if not chan:
            monkeypatch.setattr(sr, "_split_variance", lambda *a: None)
        for a in (x, x.contiguous(memory_format=torch.channels_last)):
            c = compile_triton(f, a.to(DEVICE))
            var, mean = c.run([a.to(DEVICE)])
            rv, rm = torch.var_mean(a.double(), dim=(0, 2, 3), correction=1)
            errors.setdefault(chan, []).append(
                ((var.cpu().double() - rv).norm() / rv.norm()).item())
            assert_same(mean.cpu(), rm.float(), 1e-6, 0, "mean")
            assert len(re.findall(r"K\.kernel\w+\(", c.source)) == (2 if chan else 4)
    assert all(e < 2e-5 for e in errors[True]), errors
    assert all(a <= 1.5 * b for a, b in zip(errors[True], errors[False])), errors


def test_other_sums_of_deviations_split_plainly(monkeypatch):
    """Only sum((x - mean) ** 2) takes the parallel form: a cube, a product with another tensor
    or a mean of something else split the two-pass way and stay right."""
    from trainc.codegen import split_reductions as sr
    monkeypatch.setattr(sr, "SPLIT_MIN_ELEMENTS", 256)
    x, y = _big(8, 6, 16, 16), _big(8, 6, 16, 16)
    m = lambda t: t.mean((0, 2, 3), keepdim=True)
    check(lambda x, y: (((x - m(x)) ** 3).sum((0, 2, 3)), ((x - m(x)) * y).sum((0, 2, 3)),
                        ((x - m(y)) ** 2).sum((0, 2, 3)), torch.var(x, (0, 2, 3))),
          x, y, rtol=1e-4, atol=1e-5)
