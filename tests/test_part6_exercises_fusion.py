"""The checks of lesson 6.5 (course/exercises/part6_fusion.py): a stub is not attempted, a right
answer passes, and the classic mistakes fail with a message that says what to fix."""

import numpy as np
import pytest

import known_wrong
from course.exercises import check
from course.tensor import Tensor, operation

pytestmark = pytest.mark.part6

C = float(np.sqrt(2 / np.pi))


def stub(*args, **kwargs):
    raise NotImplementedError


# ===== 6.5.1 the online softmax update ==============================================================
def running_update(m, l, acc, scores, values):
    m_new = max(m, scores.max())
    a = np.exp(m - m_new)
    p = np.exp(scores - m_new)
    return m_new, l * a + p.sum(), acc * a + p @ values


def running_update_output_not_rescaled(m, l, acc, scores, values):
    m_new = max(m, scores.max())
    p = np.exp(scores - m_new)
    return m_new, l * np.exp(m - m_new) + p.sum(), acc + p @ values


def running_update_sum_not_rescaled(m, l, acc, scores, values):
    m_new = max(m, scores.max())
    a = np.exp(m - m_new)
    p = np.exp(scores - m_new)
    return m_new, l + p.sum(), acc * a + p @ values


def running_update_forgets_the_old_max(m, l, acc, scores, values):
    m_new = scores.max()  # the block's maximum, not the running one
    a = np.exp(m - m_new)
    p = np.exp(scores - m_new)
    return m_new, l * a + p.sum(), acc * a + p @ values


def running_update_no_return(m, l, acc, scores, values):
    m_new = max(m, scores.max())
    acc *= np.exp(m - m_new)


# ===== 6.5.2 bias + GELU ================================================================================
def my_bias_gelu(h, bias):
    x = h.data + bias.data
    t = np.tanh(C * (x + 0.044715 * x ** 3))

    def backward(g):
        gx = g * (0.5 * (1 + t) + 0.5 * x * (1 - t * t) * C * (1 + 3 * 0.044715 * x * x))
        return gx, gx.reshape(-1, gx.shape[-1]).sum(axis=0)

    return operation("bias_gelu", 0.5 * x * (1 + t), (h, bias), backward)


def bias_gelu_no_product_rule(h, bias):
    x = h.data + bias.data
    t = np.tanh(C * (x + 0.044715 * x ** 3))

    def backward(g):
        gx = g * 0.5 * (1 + t)
        return gx, gx.reshape(-1, gx.shape[-1]).sum(axis=0)

    return operation("bias_gelu", 0.5 * x * (1 + t), (h, bias), backward)


def bias_gelu_no_bias_gradient(h, bias):
    out = my_bias_gelu(h, bias)
    backward = out._backward
    out._backward = lambda g: (backward(g)[0], None)
    return out


def bias_gelu_from_tensor_arithmetic(h, bias):  # right values, but the engine differentiates it
    x = h + bias
    c = np.float64(np.sqrt(2 / np.pi))
    return 0.5 * x * (1 + (c * (x + 0.044715 * x * x * x)).tanh())


def bias_gelu_bias_added_first(h, bias):  # the bias added outside: the operation's inputs are h + bias alone
    x = h + bias
    value = 0.5 * x.data * (1 + np.tanh(np.sqrt(2 / np.pi) * (x.data + 0.044715 * x.data ** 3)))
    return operation("bias_gelu", value, (x,), lambda g: (g,))


def bias_gelu_inputs_swapped(h, bias):  # gradients returned in the other order than the inputs
    out = my_bias_gelu(h, bias)
    out.inputs = (bias, h)
    return out


def bias_gelu_erf(h, bias):  # the exact erf GELU: the course's is the tanh form
    from math import erf

    x = h.data + bias.data
    phi = 0.5 * (1 + np.vectorize(erf)(x / np.sqrt(2)))
    return operation("bias_gelu", x * phi, (h, bias), lambda g: (g * phi, (g * phi).sum(axis=0)))


def bias_gelu_bias_gradient_of_rows_mean(h, bias):  # the bias gradient averaged, not summed
    out = my_bias_gelu(h, bias)
    backward = out._backward
    out._backward = lambda g: (backward(g)[0], backward(g)[0].reshape(-1, g.shape[-1]).mean(axis=0))
    return out


def bias_gelu_bias_gradient_not_summed(h, bias):
    out = my_bias_gelu(h, bias)
    backward = out._backward
    out._backward = lambda g: (backward(g)[0], backward(g)[0])
    return out


def bias_gelu_with_library(h, bias):
    import course.tensor.functional as F
    return F.gelu(h + bias)


def bias_gelu_relu(h, bias):
    x = h.data + bias.data
    return operation("relu", np.maximum(x, 0), (h, bias), lambda g: (g * (x > 0), (g * (x > 0)).sum(axis=0)))


# ===== 6.5.3 the tile loop of the attention forward ===================================================
def _tiled(q, k, v, block, causal=True, mask_inside=True, rescale_output=True, stop_at_t=True):
    t, d = q.shape
    out = np.zeros((t, v.shape[1]))
    starts = range(0, t, block) if stop_at_t else range(0, t - t % block, block)
    for i0 in starts:
        i1 = min(i0 + block, t)
        m = np.full(i1 - i0, -np.inf)
        l = np.zeros(i1 - i0)
        acc = np.zeros((i1 - i0, v.shape[1]))
        for j0 in (range(0, i1, block) if causal else range(0, t, block)):
            if not stop_at_t and j0 + block > t:
                break
            j1 = min(j0 + block, t)
            s = q[i0:i1] @ k[j0:j1].T / np.sqrt(d)
            if causal and mask_inside:
                s = np.where(np.arange(j0, j1)[None, :] > np.arange(i0, i1)[:, None], -np.inf, s)
            m_new = np.maximum(m, s.max(axis=1))
            a = np.exp(m - m_new)
            p = np.exp(s - m_new[:, None])
            l = l * a + p.sum(axis=1)
            acc = (acc * a[:, None] if rescale_output else acc) + p @ v[j0:j1]
            m = m_new
        out[i0:i1] = acc / l[:, None]
    return out


def tiled_attention(q, k, v, block, causal=True):
    return _tiled(q, k, v, block, causal)


def tiled_attention_no_mask_inside(q, k, v, block, causal=True):
    return _tiled(q, k, v, block, causal, mask_inside=False)


def tiled_attention_output_not_rescaled(q, k, v, block, causal=True):
    return _tiled(q, k, v, block, causal, rescale_output=False)


def tiled_attention_drops_the_last_tile(q, k, v, block, causal=True):
    return _tiled(q, k, v, block, causal, stop_at_t=False)


def tiled_attention_ignores_causal(q, k, v, block, causal=True):
    return _tiled(q, k, v, block, True)


def attention_whole(q, k, v, block, causal=True):
    s = q @ k.T / np.sqrt(q.shape[1])
    if causal:
        s = np.where(np.arange(len(k))[None, :] > np.arange(len(q))[:, None], -np.inf, s)
    w = np.exp(s - s.max(axis=1, keepdims=True))
    return (w / w.sum(axis=1, keepdims=True)) @ v


def attention_by_strips(q, k, v, block, causal=True):  # (block, T) strips of scores: rows, not tiles
    out = np.empty((len(q), v.shape[1]))
    for i in range(0, len(q), block):
        s = q[i:i + block] @ k.T / np.sqrt(q.shape[1])
        if causal:
            s = np.where(np.arange(len(k))[None, :] > np.arange(i, min(i + block, len(q)))[:, None], -np.inf, s)
        w = np.exp(s - s.max(axis=1, keepdims=True))
        out[i:i + block] = (w / w.sum(axis=1, keepdims=True)) @ v
    return out


def attention_library(q, k, v, block, causal=True):
    from course.kernels import fused
    out, _ = fused.attention_forward(q, k, v, causal)
    return out


RIGHT = {"6.5.1": running_update, "6.5.2": my_bias_gelu, "6.5.3": tiled_attention}

KNOWN_WRONG = {
    "6.5.1": [(running_update_output_not_rescaled, ["rescaled the sum but not the output"]),
              (running_update_sum_not_rescaled, ["running sum l", "rescaled by exp(m - m_new)"]),
              (running_update_forgets_the_old_max, ["running maximum m"]),
              (running_update_no_return, ["returned None"])],
    "6.5.2": [(bias_gelu_no_product_rule, ["product rule"]),
              (bias_gelu_no_bias_gradient, ["bias got no gradient"]),
              (bias_gelu_bias_gradient_not_summed, ["sum the gradient over the rows"]),
              (bias_gelu_with_library, ["write this yourself"]),
              (bias_gelu_relu, ["forward value gelu(h + bias)"]),
              (bias_gelu_from_tensor_arithmetic, ["not by one operation of h and bias", "single operation"]),
              (bias_gelu_bias_added_first, ["of 1 input(s), not by one operation of h and bias"]),
              (bias_gelu_inputs_swapped, ["not by one operation of h and bias"]),
              (bias_gelu_erf, ["forward value gelu(h + bias)"]),
              (bias_gelu_bias_gradient_of_rows_mean, ["gradient of bias"])],
    "6.5.3": [(tiled_attention_no_mask_inside, ["inside a tile", "masked"]),
              (tiled_attention_output_not_rescaled, ["attention output"]),
              (tiled_attention_drops_the_last_tile, ["does not divide T"]),
              (tiled_attention_ignores_causal, ["causal=False"]),
              (attention_whole, ["(512, 512) matrices of scores", "2.0 MiB each"]),
              (attention_by_strips, ["(64, 512) strip of scores", "whole rows of scores, not tiles"]),
              (attention_library, ["write this yourself"])],
}


@pytest.mark.parametrize("exercise_id", sorted(RIGHT))
def test_stub_is_not_attempted_and_the_solution_passes(exercise_id):
    assert check(exercise_id, stub).status == "not attempted"
    result = check(exercise_id, RIGHT[exercise_id])
    assert result.status == "passed", result.message


@pytest.mark.parametrize("exercise_id,wrong,words", known_wrong.cases(KNOWN_WRONG))
def test_known_wrong_answer_fails_saying_why(exercise_id, wrong, words):
    known_wrong.assert_fails_saying(exercise_id, wrong, words)


def test_the_6_5_2_solution_agrees_with_the_library(rng):
    from course.kernels import fused
    h, b = rng.normal(size=(4, 6)), rng.normal(size=6)
    ours = my_bias_gelu(Tensor(h), Tensor(b)).data
    np.testing.assert_allclose(ours, fused.bias_gelu(Tensor(h), Tensor(b)).data, rtol=1e-12)


# ===== right answers written otherwise ==================================================================

def running_update_by_weights(m, l, acc, scores, values):
    m_new = np.max(np.append(scores, m))
    old, new = np.exp(m - m_new), np.exp(scores - m_new)  # the weight of what was seen, and of the block
    return m_new, old * l + new.sum(), old * acc + np.einsum("n,nd->d", new, values)


def bias_gelu_with_sech(h, bias):
    x = h.data + bias.data
    u = C * (x + 0.044715 * x ** 3)
    y = 0.5 * x * (1 + np.tanh(u))

    def backward(g):
        du = C * (1 + 0.134145 * x * x)
        gx = g * (0.5 * (1 + np.tanh(u)) + 0.5 * x * du / np.cosh(u) ** 2)
        return gx, np.sum(gx, axis=tuple(range(gx.ndim - 1)))

    return operation("bias_gelu", y, (h, bias), backward)


def bias_gelu_by_sigmoid_form(h, bias):  # right: 0.5 (1 + tanh u) is sigmoid(2u)
    x = h.data + bias.data
    s = 1 / (1 + np.exp(-2 * C * (x + 0.044715 * x ** 3)))

    def backward(g):
        gx = g * (s + x * s * (1 - s) * 2 * C * (1 + 3 * 0.044715 * x * x))
        return [gx, gx.sum(axis=tuple(range(gx.ndim - 1)))]

    return operation("bias_gelu", x * s, [h, bias], backward)


def tiled_attention_row_by_row(q, k, v, block, causal=True):
    t, d = q.shape
    out = np.empty((t, v.shape[1]))
    for i in range(t):  # one query at a time: a (1, block) tile of scores
        m, l, acc = -np.inf, 0.0, np.zeros(v.shape[1])
        last = i + 1 if causal else t
        for j0 in range(0, last, block):
            j1 = min(j0 + block, last)
            s = k[j0:j1] @ q[i] / np.sqrt(d)
            m_new = max(m, s.max())
            p = np.exp(s - m_new)
            l, acc, m = l * np.exp(m - m_new) + p.sum(), acc * np.exp(m - m_new) + p @ v[j0:j1], m_new
        out[i] = acc / l
    return out


@pytest.mark.parametrize("exercise_id,candidate", [
    ("6.5.1", running_update_by_weights), ("6.5.2", bias_gelu_with_sech), ("6.5.2", bias_gelu_by_sigmoid_form), ("6.5.3", tiled_attention_row_by_row)])
def test_right_answers_written_otherwise_pass(exercise_id, candidate):
    result = check(exercise_id, candidate)
    assert result.status == "passed", result.message
