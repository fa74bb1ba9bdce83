"""Checks of lesson 6.5, fusion and FlashAttention: the online softmax update (6.5.1), bias + GELU
as one operation with its backward (6.5.2) and the tile loop of the attention forward (6.5.3).

The references are written here in NumPy (whole rows, the (T, T) scores and all), independent of
`course.kernels.fused`, which is unavailable to the learner's code while a check runs.
"""

import tracemalloc

import numpy as np

from ._core import CheckFailed, call, exercise, expect, expect_close

_C = np.sqrt(2 / np.pi)


def _triple(got, on):
    if not (isinstance(got, (tuple, list)) and len(got) == 3):
        n = f" of length {len(got)}" if isinstance(got, (tuple, list)) else ""
        raise CheckFailed(f"expected three results (m, l, acc), got {type(got).__name__}{n} on {on}")
    return [np.asarray(g, dtype=np.float64) for g in got]


# ---- 6.5.1 the online softmax update ---------------------------------------------------------------------
def _ref_update(m, l, acc, scores, values):
    m_new = max(m, scores.max())
    alpha = np.exp(m - m_new)
    p = np.exp(scores - m_new)
    return m_new, l * alpha + p.sum(), acc * alpha + p @ values


@exercise("6.5.1",
          hint="when the maximum grows from m to m_new, everything summed so far was weighted by exp(-m) "
               "instead of exp(-m_new): the running sum AND the running output need the same correction",
          answer_hint="m_new = max(m, scores.max()); a = exp(m - m_new); p = exp(scores - m_new); "
                      "return m_new, l * a + p.sum(), acc * a + p @ values")
def _(candidate, rng):
    dv = 3
    # From nothing (m = -inf, l = 0, acc = 0), then blocks that raise the maximum, then one that does not.
    values = [rng.normal(size=(4, dv)) for _ in range(4)]
    blocks = [np.array([0.5, -1.0, 2.0, 0.0]), np.array([3.0, 1.0, -2.0, 4.5]),
              np.array([-3.0, 0.0, 1.0, 2.0]), rng.normal(size=4) * 3 + 6]
    m, l, acc = -np.inf, 0.0, np.zeros(dv)
    seen_s, seen_v = [], []
    for i, (s, v) in enumerate(zip(blocks, values)):
        on = f"block {i + 1} of scores {np.round(s, 2).tolist()} after m={m:.3g}, l={l:.3g}"
        got_m, got_l, got_acc = _triple(call(candidate, m, l, acc.copy(), s.copy(), v.copy(), on=on), on)
        exp_m, exp_l, exp_acc = _ref_update(m, l, acc, s, v)
        expect_close(got_m, exp_m, on=on, what="running maximum m")
        raised = exp_m > m and np.isfinite(m)
        if not np.allclose(got_l, exp_l, rtol=1e-6):
            if raised and np.isclose(got_l, l + np.exp(s - exp_m).sum()):
                raise CheckFailed(f"the running sum l is wrong on {on}: the maximum grew, so the old sum must be "
                                  f"rescaled by exp(m - m_new) before the new terms are added")
            expect_close(got_l, exp_l, on=on, what="running sum l", rtol=1e-6)
        if not np.allclose(got_acc, exp_acc, rtol=1e-6, atol=1e-9):
            if raised and np.allclose(got_acc, acc + np.exp(s - exp_m) @ v, rtol=1e-6):
                raise CheckFailed(f"the running output acc is wrong on {on}: you rescaled the sum but not the "
                                  f"output; acc was summed against the old maximum too, so it needs the same "
                                  f"factor exp(m - m_new)")
            expect_close(got_acc, exp_acc, on=on, what="running output acc", rtol=1e-6, atol=1e-9)
        m, l, acc = exp_m, exp_l, exp_acc
        seen_s.append(s)
        seen_v.append(v)
    # After all blocks, acc / l is the softmax-weighted sum of every value seen.
    s_all, v_all = np.concatenate(seen_s), np.concatenate(seen_v)
    w = np.exp(s_all - s_all.max())
    expect_close(acc / l, (w / w.sum()) @ v_all, on="all four blocks together", what="acc / l")


# ---- 6.5.2 bias + GELU, one operation ---------------------------------------------------------------------------
def _gelu_and_slope(x):
    t = np.tanh(_C * (x + 0.044715 * x ** 3))
    return 0.5 * x * (1 + t), 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * _C * (1 + 3 * 0.044715 * x * x)


@exercise("6.5.2",
          hint="one operation: the forward computes gelu(h + bias) and keeps what the backward needs; the "
               "backward returns one gradient per input, and the bias was added to every row",
          answer_hint="x = h.data + bias.data; y = gelu(x); backward: gx = g * gelu'(x) with gelu'(x) = "
                      "0.5 (1 + t) + 0.5 x (1 - t^2) c (1 + 3 * 0.044715 x^2); return gx, gx summed over every axis "
                      "but the last",
          forbid=["course.tensor.functional.gelu", "course.kernels.fused.bias_gelu",
                  "course.kernels.fused.linear_gelu"],
          task="write gelu's forward and backward with NumPy, in one operation")
def _(candidate, rng):
    from course.tensor import Tensor

    for shape in [(3, 5), (2, 4, 6)]:
        on = f"h of shape {shape}, bias of shape ({shape[-1]},)"
        h_data = rng.normal(size=shape) * 2
        b_data = rng.normal(size=shape[-1])
        h, b = Tensor(h_data.copy(), requires_grad=True), Tensor(b_data.copy(), requires_grad=True)
        y = call(candidate, h, b, on=on)
        expect(isinstance(y, Tensor), f"expected a Tensor (made with operation(...)) on {on}, got {type(y).__name__}")
        made_from = tuple(getattr(y, "inputs", ()) or ())
        expect(len(made_from) == 2 and made_from[0] is h and made_from[1] is b,
               f"the result was made by an operation {y.op!r} of {len(made_from)} input(s), not by one operation of "
               f"h and bias on {on}: the exercise asks for a single operation(...) whose backward you write "
               f"(Tensor arithmetic builds a chain of operations the engine differentiates for you)")
        value, slope = _gelu_and_slope(h_data + b_data)
        expect_close(y.data, value, on=on, what="forward value gelu(h + bias)")
        expect(np.array_equal(h.data, h_data) and np.array_equal(b.data, b_data),
               f"your function changed its inputs on {on}: compute into new arrays")
        g = rng.normal(size=shape)
        try:
            y.backward(g)
        except Exception as err:  # noqa: BLE001  (the learner's backward)
            if "for input 1" in str(err):  # the engine refused the bias gradient's shape
                raise CheckFailed(f"the bias gradient has the wrong shape on {on}; the bias has shape "
                                  f"({shape[-1]},): sum the gradient over the rows it was added to") from None
            raise CheckFailed(f"your backward raised {type(err).__name__}: {err} on {on}") from None
        expect(h.grad is not None, f"h got no gradient on {on}: the backward must return one per input")
        expect(b.grad is not None, f"bias got no gradient on {on}: it is an input too; return its gradient second")
        gx = g * slope
        if not np.allclose(h.grad, gx, rtol=1e-5, atol=1e-7):
            plain = g * 0.5 * (1 + np.tanh(_C * (h_data + b_data + 0.044715 * (h_data + b_data) ** 3)))
            if np.allclose(h.grad, plain, rtol=1e-5, atol=1e-7):
                raise CheckFailed(f"the gradient of h is wrong on {on}: gelu(x) = 0.5 x (1 + t) is a product, "
                                  f"and t depends on x too (the product rule gives a second term)")
            expect_close(h.grad, gx, on=on, what="gradient of h")
        lead = tuple(range(len(shape) - 1))
        if np.shape(b.grad) != (shape[-1],):
            raise CheckFailed(f"the bias gradient has shape {np.shape(b.grad)} on {on}; the bias has shape "
                              f"({shape[-1]},): sum the gradient over the rows it was added to")
        expect_close(b.grad, gx.sum(axis=lead), on=on, what="gradient of bias")


# ---- 6.5.3 the tile loop of attention ---------------------------------------------------------------------------
def _ref_attention(q, k, v, causal):
    s = q @ k.T / np.sqrt(q.shape[1])
    if causal:
        s = np.where(np.arange(len(k))[None, :] > np.arange(len(q))[:, None], -np.inf, s)
    w = np.exp(s - s.max(axis=1, keepdims=True))
    return (w / w.sum(axis=1, keepdims=True)) @ v


@exercise("6.5.3", inside=True,
          hint="for each tile of queries: m = -inf, l = 0, acc = 0 per row; for each tile of keys, score it, mask "
               "what lies in the future (inside the tile too), fold it in with the online update; then acc / l",
          answer_hint="for i0 in range(0, T, block): for j0 in range(0, T, block): s = q[i0:i1] @ k[j0:j1].T / "
                      "sqrt(d); where key j0 + j > query i0 + i: s = -inf; m_new = max(m, s.max(1)); "
                      "a = exp(m - m_new); p = exp(s - m_new[:, None]); l = l a + p.sum(1); acc = acc a[:, None] + p @ "
                      "v[j0:j1]; m = m_new. out[i0:i1] = acc / l[:, None] (slices stop at T)",
          forbid=["course.kernels.fused.attention", "course.kernels.fused.attention_forward",
                  "course.tensor.functional.scaled_dot_product_attention", "course.tensor.functional.softmax"],
          task="compute attention tile by tile with the online softmax")
def _(candidate, rng):
    cases = [(8, 4, True), (8, 4, False), (10, 4, True), (7, 3, False), (16, 16, True), (5, 8, True)]
    for t, block, causal in cases:
        q, k, v = rng.normal(size=(t, 4)), rng.normal(size=(t, 4)) * 2, rng.normal(size=(t, 3))
        on = f"T={t}, block={block}, causal={causal}" + (" (the tile size does not divide T)" if t % block else "")
        got = call(candidate, q.copy(), k.copy(), v.copy(), block, causal=causal, on=on)
        got = np.asarray(got, dtype=np.float64)
        expected = _ref_attention(q, k, v, causal)
        if got.shape != expected.shape:
            raise CheckFailed(f"the result has shape {got.shape} on {on}, expected {expected.shape}"
                              + (": the last tile is shorter; let slices stop at T" if t % block else ""))
        if not np.allclose(got, expected, rtol=1e-5, atol=1e-7):
            if causal and np.allclose(got, _tile_mask_only(q, k, v, block), rtol=1e-5, atol=1e-7):
                raise CheckFailed(f"wrong on {on}: skipping the tiles that lie wholly in the future is not "
                                  f"enough; inside a tile on the diagonal, key j must still be masked for the "
                                  f"queries before it")
            if np.isnan(got).any():
                raise CheckFailed(f"the result holds nan on {on}: a row whose scores in a tile are all masked "
                                  f"gives exp(-inf - (-inf)); compute the rescaling only from rows that saw a key")
            expect_close(got, expected, on=on, what="attention output")
    # Tiles keep memory small: no (T, T) array of scores.
    t, block = 512, 64
    q, k, v = (rng.normal(size=(t, 8)) for _ in range(3))
    tracemalloc.start()
    try:
        call(candidate, q, k, v, block, causal=True, on=f"T={t}, block={block}")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    full, strip = t * t * 8, block * t * 8  # bytes of a (T, T) matrix of scores, and of a (block, T) strip
    if peak >= full // 4:
        what = (f"as much as {peak / full:.1f} ({t}, {t}) matrices of scores ({full / 2 ** 20:.1f} MiB each)"
                if peak >= full * 0.75 else
                f"{peak / strip:.1f} times a ({block}, {t}) strip of scores ({strip / 2 ** 20:.2f} MiB): whole rows "
                f"of scores, not tiles")
        raise CheckFailed(f"with T={t} and block={block} your function used {peak / 2 ** 20:.2f} MiB at its peak, "
                          f"{what}: work on one (block, block) tile at a time")


def _tile_mask_only(q, k, v, block):
    """Attention that skips future tiles but never masks inside a tile: the classic mistake."""
    t = len(q)
    s = q @ k.T / np.sqrt(q.shape[1])
    tiles_q, tiles_k = np.arange(t)[:, None] // block, np.arange(t)[None, :] // block
    s = np.where(tiles_k > tiles_q, -np.inf, s)
    w = np.exp(s - s.max(axis=1, keepdims=True))
    return (w / w.sum(axis=1, keepdims=True)) @ v
