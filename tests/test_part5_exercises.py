"""The checks of part 5: a stub is not attempted, a wrong answer fails naming the input and what to
fix, a right answer passes."""

import math

import numpy as np
import pytest

from course.exercises import check

import known_wrong  # tests/known_wrong.py

pytestmark = pytest.mark.part5


def stub(*args, **kwargs):
    raise NotImplementedError


def forgot_return(*args, **kwargs):
    pass


# ---- 5.1 right answers -------------------------------------------------------------------------------


def discretize_bilinear(A, B, delta):
    inverse = 1 / (1 - delta * A / 2)
    return inverse * (1 + delta * A / 2), inverse * delta * B


def zoh(A, B, delta):
    return np.exp(delta * A), np.expm1(delta * A) / (delta * A) * delta * B


def discretize_mamba(delta, A, B, u):
    return np.exp(delta[..., None] * A), np.einsum("bld,bln->bldn", delta * u, B)


def ssm_kernel_dense(A_bar, B_bar, C, L):
    return np.array([C @ np.linalg.matrix_power(A_bar, j) @ B_bar for j in range(L)])


def ssm_recurrence_varying(A, B, C, D, u, deltas, x0):
    x, y = x0, []
    for u_k, delta in zip(u, deltas):
        A_bar, B_bar = zoh(A, B, delta)
        x = A_bar * x + B_bar * u_k
        y.append(C @ x + D * u_k)
    return y, x  # a list is fine


# ---- 5.1 wrong answers -------------------------------------------------------------------------------


def bilinear_euler(A, B, delta):
    return 1 + delta * A, delta * B


def bilinear_upside_down(A, B, delta):
    A_bar, B_bar = discretize_bilinear(A, B, delta)
    return 1 / A_bar, B_bar


def bilinear_b_not_divided(A, B, delta):
    return discretize_bilinear(A, B, delta)[0], delta * B


def bilinear_by_zoh(A, B, delta):
    safe = np.where(A == 0, 1.0, A)
    return np.exp(delta * A), np.where(A == 0, 1.0, np.expm1(delta * safe) / (delta * safe)) * delta * B


def mamba_with_zoh(delta, A, B, u):
    deltaA, deltaB_u = discretize_mamba(delta, A, B, u)
    dA = delta[..., None] * A
    return deltaA, deltaB_u * np.expm1(dA) / dA


def kernel_from_one(A_bar, B_bar, C, L):
    return ssm_kernel_dense(A_bar, B_bar, C, L + 1)[1:]


def kernel_entrywise_power(A_bar, B_bar, C, L):
    return np.array([C @ (A_bar ** j) @ B_bar for j in range(L)])


def kernel_transposed(A_bar, B_bar, C, L):
    return np.array([B_bar @ np.linalg.matrix_power(A_bar, j) @ C for j in range(L)])


def kernel_diagonal_only(A_bar, B_bar, C, L):  # the lesson's kernel, on the diagonal of A_bar
    return (np.diag(A_bar)[None, :] ** np.arange(L)[:, None]) @ (C * B_bar)


def recurrence_reads_old_state(A, B, C, D, u, deltas, x0):
    x, y = x0, []
    for u_k, delta in zip(u, deltas):
        A_bar, B_bar = zoh(A, B, delta)
        y.append(C @ x + D * u_k)
        x = A_bar * x + B_bar * u_k
    return np.array(y), x


def recurrence_without_d(A, B, C, D, u, deltas, x0):
    return ssm_recurrence_varying(A, B, C, 0.0, u, deltas, x0)


def recurrence_from_zero(A, B, C, D, u, deltas, x0):
    return ssm_recurrence_varying(A, B, C, D, u, deltas, np.zeros_like(x0))


def recurrence_first_delta(A, B, C, D, u, deltas, x0):
    return ssm_recurrence_varying(A, B, C, D, u, np.full(len(u), deltas[0]), x0)


def recurrence_simple_rule(A, B, C, D, u, deltas, x0):
    x, y = x0, []
    for u_k, delta in zip(u, deltas):
        x = np.exp(delta * A) * x + delta * B * u_k
        y.append(C @ x + D * u_k)
    return y, x


def recurrence_x0_as_input(A, B, C, D, u, deltas, x0):
    # x0 taken for an input written into a zero state before the first step
    A_bar, B_bar = zoh(A, B, deltas[0])
    return ssm_recurrence_varying(A, B, C, D, u, deltas, B_bar * x0)


# ---- 5.2 right and wrong answers ------------------------------------------------------------------


def combine(first, second):
    (a1, b1), (a2, b2) = first, second
    return a1 * a2, a2 * b1 + b2


def combine_affine(first, second):
    (A1, b1), (A2, b2) = first, second
    return A2 @ A1, A2 @ b1 + b2


def combine_affine_wrong_order(first, second):
    (A1, b1), (A2, b2) = first, second
    return A1 @ A2, A2 @ b1 + b2


def combine_affine_offset_wrong(first, second):
    (A1, b1), (A2, b2) = first, second
    return A2 @ A1, A1 @ b2 + b1


def scan_step(x, u_t, delta_t, A, B_t, C_t, D):
    x_new = np.exp(delta_t[..., None] * A) * x + np.einsum("bd,bn->bdn", delta_t * u_t, B_t)
    return x_new, np.einsum("bdn,bn->bd", x_new, C_t) + D * u_t


def scan_step_old_state(x, u_t, delta_t, A, B_t, C_t, D):
    x_new, _ = scan_step(x, u_t, delta_t, A, B_t, C_t, D)
    return x_new, np.einsum("bdn,bn->bd", x, C_t) + D * u_t


def selective_scan_from(u, delta, A, B, C, D, h0):
    h = h0
    ys = []
    for k in range(u.shape[1]):
        h, y = scan_step(h, u[:, k], delta[:, k], A, B[:, k], C[:, k], D)
        ys.append(y)
    return np.stack(ys, axis=1), h


def selective_scan_without_d(u, delta, A, B, C, D, h0):
    return selective_scan_from(u, delta, A, B, C, np.zeros_like(D), h0)


def selective_scan_from_zero(u, delta, A, B, C, D, h0):
    return selective_scan_from(u, delta, A, B, C, D, np.zeros_like(h0))


def selective_scan_by_library(u, delta, A, B, C, D, h0):
    from course.mamba import selective_scan
    return selective_scan(u, delta, A, B, C, D), h0


def combine_by_library(first, second):
    from course.mamba.scan import combine
    return combine(first, second)


def parallel_scan_by_library(a, b, combine):
    from course.mamba.scan import linear_recurrence
    return linear_recurrence(a[None], b[None], "parallel")[0]


def parallel_scan(a, b, combine):
    a, b = np.array(a, dtype=float), np.array(b, dtype=float)
    offset = 1
    while offset < len(a):
        a[offset:], b[offset:] = combine((a[:-offset], b[:-offset]), (a[offset:], b[offset:]))
        offset *= 2
    return b


def scan_one_by_one(a, b, combine):
    h = [(a[0], b[0])]
    for t in range(1, len(a)):
        h.append(combine(h[-1], (a[t], b[t])))
    return np.array([p[1] for p in h])


# ---- 5.3 right and wrong answers ------------------------------------------------------------------


def rms_norm_backward(x, weight, grad, eps=1e-5):
    r = 1 / np.sqrt((x * x).mean(-1, keepdims=True) + eps)
    xhat = x * r
    gw = grad * weight
    dx = r * (gw - xhat * (gw * xhat).mean(-1, keepdims=True))
    return dx, (grad * xhat).reshape(-1, x.shape[-1]).sum(0)


def rms_norm_backward_constant_r(x, weight, grad, eps=1e-5):
    r = 1 / np.sqrt((x * x).mean(-1, keepdims=True) + eps)
    return grad * weight * r, (grad * x * r).reshape(-1, x.shape[-1]).sum(0)


def rms_norm_backward_by_library(x, weight, grad, eps=1e-5):
    from course.mamba import rms_norm
    from course.tensor import Tensor
    xt, wt = Tensor(x, requires_grad=True), Tensor(weight, requires_grad=True)
    rms_norm(xt, wt, eps).backward(grad)
    return xt.grad, wt.grad


def causal_conv1d(x, weight, bias):
    b, l, d = x.shape
    k = weight.shape[1]
    padded = np.concatenate([np.zeros((b, k - 1, d)), x], axis=1)
    return sum(padded[:, j:j + l] * weight[:, j] for j in range(k)) + bias


def causal_conv1d_backward(x, weight, grad):
    b, l, d = x.shape
    k = weight.shape[1]
    padded_g = np.concatenate([grad, np.zeros((b, k - 1, d))], axis=1)  # outputs past the end: no gradient
    padded_x = np.concatenate([np.zeros((b, k - 1, d)), x], axis=1)
    dx = sum(padded_g[:, k - 1 - j:k - 1 - j + l] * weight[:, j] for j in range(k))
    dw = np.stack([(grad * padded_x[:, j:j + l]).sum(axis=(0, 1)) for j in range(k)], axis=1)
    return dx, dw


def causal_conv1d_backward_forward_in_time(x, weight, grad):
    _, dw = causal_conv1d_backward(x, weight, grad)
    return causal_conv1d(grad, weight, 0.0), dw


def causal_conv1d_backward_by_library(x, weight, grad):
    from course.mamba import causal_conv1d
    from course.tensor import Tensor
    xt, wt = Tensor(x, requires_grad=True), Tensor(weight, requires_grad=True)
    causal_conv1d(xt, wt, None).backward(grad)
    return xt.grad, wt.grad


def conv_step(conv_state, u_t, weight, bias):
    window = np.concatenate([conv_state, u_t[:, None]], axis=1)
    return (window * weight.T).sum(axis=1) + bias, window[:, 1:]


def conv_step_state_stays(conv_state, u_t, weight, bias):
    return conv_step(conv_state, u_t, weight, bias)[0], conv_state


def conv_step_newest_first(conv_state, u_t, weight, bias):
    window = np.concatenate([u_t[:, None], conv_state[:, ::-1]], axis=1)  # newest first
    return (window * weight.T).sum(axis=1) + bias, conv_step(conv_state, u_t, weight, bias)[1]


def conv_step_by_library(conv_state, u_t, weight, bias):
    from course.mamba import causal_conv1d
    from course.tensor import Tensor
    window = np.concatenate([conv_state, u_t[:, None]], axis=1)
    return causal_conv1d(Tensor(window), Tensor(weight), Tensor(bias)).data[:, -1], window[:, 1:]


def ssm_parameters(u, x_proj_weight, dt_proj_weight, dt_proj_bias, n):
    r = dt_proj_weight.shape[1]
    dbc = u @ x_proj_weight.T
    return np.logaddexp(0, dbc[..., :r] @ dt_proj_weight.T + dt_proj_bias), dbc[..., r:r + n], dbc[..., r + n:]


def ssm_parameters_no_softplus(u, x_proj_weight, dt_proj_weight, dt_proj_bias, n):
    r = dt_proj_weight.shape[1]
    _, B, C = ssm_parameters(u, x_proj_weight, dt_proj_weight, dt_proj_bias, n)
    return (u @ x_proj_weight.T)[..., :r] @ dt_proj_weight.T + dt_proj_bias, B, C


def ssm_parameters_swapped(u, x_proj_weight, dt_proj_weight, dt_proj_bias, n):
    delta, B, C = ssm_parameters(u, x_proj_weight, dt_proj_weight, dt_proj_bias, n)
    return delta, C, B


def count_parameters(d_model, n_layer, vocab_size, d_state=16, expand=2, d_conv=4):
    E, d, n, k = d_model, expand * d_model, d_state, d_conv
    r = -(-d_model // 16)
    layer = E + 3 * d * E + d * k + d + d * (r + 2 * n) + r * d + d + d * n + d
    return n_layer * layer + (-(-vocab_size // 8) * 8) * E + E


def count_parameters_untied(d_model, n_layer, vocab_size, d_state=16, expand=2, d_conv=4):
    return count_parameters(d_model, n_layer, vocab_size, d_state, expand, d_conv) + (-(-vocab_size // 8) * 8) * d_model


def count_parameters_unpadded(d_model, n_layer, vocab_size, d_state=16, expand=2, d_conv=4):
    padded = -(-vocab_size // 8) * 8
    return count_parameters(d_model, n_layer, vocab_size, d_state, expand, d_conv) - (padded - vocab_size) * d_model


def count_parameters_by_library(d_model, n_layer, vocab_size, d_state=16, expand=2, d_conv=4):
    from course.mamba import Mamba, MambaConfig
    config = MambaConfig(d_model, n_layer, vocab_size, d_state=d_state, expand=expand, d_conv=d_conv)
    return Mamba(config).num_parameters()


def silu(z):
    return z / (1 + np.exp(-z))


def residual_block_forward(x, norm_weight, in_proj_weight, mix, out_proj_weight, eps=1e-5):
    h = x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps) * norm_weight
    u, res = np.split(h @ in_proj_weight.T, 2, axis=-1)
    return x + (mix(u) * silu(res)) @ out_proj_weight.T


def block_without_residual(x, norm_weight, in_proj_weight, mix, out_proj_weight, eps=1e-5):
    return residual_block_forward(x, norm_weight, in_proj_weight, mix, out_proj_weight, eps) - x


def block_normed_residual(x, norm_weight, in_proj_weight, mix, out_proj_weight, eps=1e-5):
    h = x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps) * norm_weight
    return block_without_residual(x, norm_weight, in_proj_weight, mix, out_proj_weight, eps) + h


def block_halves_swapped(x, norm_weight, in_proj_weight, mix, out_proj_weight, eps=1e-5):
    h = x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps) * norm_weight
    res, u = np.split(h @ in_proj_weight.T, 2, axis=-1)
    return x + (mix(u) * silu(res)) @ out_proj_weight.T


def block_gate_without_silu(x, norm_weight, in_proj_weight, mix, out_proj_weight, eps=1e-5):
    h = x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps) * norm_weight
    u, res = np.split(h @ in_proj_weight.T, 2, axis=-1)
    return x + (mix(u) * res) @ out_proj_weight.T


def block_gate_sigmoid(x, norm_weight, in_proj_weight, mix, out_proj_weight, eps=1e-5):
    h = x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps) * norm_weight
    u, res = np.split(h @ in_proj_weight.T, 2, axis=-1)
    return x + (mix(u) / (1 + np.exp(-res))) @ out_proj_weight.T


def block_mix_on_everything(x, norm_weight, in_proj_weight, mix, out_proj_weight, eps=1e-5):
    h = x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps) * norm_weight
    both = mix(h @ in_proj_weight.T)
    u, res = np.split(both, 2, axis=-1)
    return x + (u * silu(res)) @ out_proj_weight.T


def block_eps_ignored(x, norm_weight, in_proj_weight, mix, out_proj_weight, eps=1e-5):
    return residual_block_forward(x, norm_weight, in_proj_weight, mix, out_proj_weight)


def block_by_library(x, norm_weight, in_proj_weight, mix, out_proj_weight, eps=1e-5):
    from course.mamba import MambaConfig, ResidualBlock
    layer = ResidualBlock(MambaConfig(x.shape[-1], 1, 10), np.random.default_rng(0))
    return layer(x).data


# ---- 5.4 right and wrong answers ------------------------------------------------------------------


def masked_accuracy(logits, targets, vocab_size):
    keep = targets != -1
    return (logits[..., :vocab_size].argmax(-1) == targets)[keep].mean()


def masked_accuracy_all_positions(logits, targets, vocab_size):
    return (logits[..., :vocab_size].argmax(-1) == targets).mean()


def masked_accuracy_with_padding(logits, targets, vocab_size):
    keep = targets != -1
    return (logits.argmax(-1) == targets)[keep].mean()


def masked_accuracy_by_library(logits, targets, vocab_size):
    from course.data import masked_accuracy
    return masked_accuracy(logits, targets, vocab_size)


def sequence_accuracy(logits, targets, vocab_size):
    right = (logits[..., :vocab_size].argmax(-1) == targets) | (targets == -1)
    return right.all(axis=-1).mean()


def sequence_accuracy_per_token(logits, targets, vocab_size):
    return masked_accuracy(logits, targets, vocab_size)


def gpt_count(vocab_size, block_size, n_layer, C):
    return (vocab_size + block_size) * C + n_layer * (12 * C * C + 13 * C) + 2 * C + vocab_size * C


def gpt_width(n_params, vocab_size, block_size, n_layer, n_head):
    best, C = None, n_head
    while best is None or gpt_count(vocab_size, block_size, n_layer, C - n_head) < n_params:
        if best is None or abs(gpt_count(vocab_size, block_size, n_layer, C) - n_params) < \
                abs(gpt_count(vocab_size, block_size, n_layer, best) - n_params):
            best = C
        C += n_head
    return best


def gpt_width_no_biases(n_params, vocab_size, block_size, n_layer, n_head):
    widths = range(n_head, 4096, n_head)
    return min(widths, key=lambda C: abs((vocab_size * 2 + block_size) * C + n_layer * 12 * C * C - n_params))


def gpt_width_any(n_params, vocab_size, block_size, n_layer, n_head):
    return min(range(1, 4096), key=lambda C: abs(gpt_count(vocab_size, block_size, n_layer, C) - n_params))


CASES = [
    ("5.1.1", discretize_bilinear, bilinear_euler, "Euler's rule"),
    ("5.1.2", discretize_mamba, mamba_with_zoh, "zero-order-hold factor"),
    ("5.1.3", ssm_kernel_dense, kernel_entrywise_power, "each entry to the power j"),
    ("5.1.4", ssm_recurrence_varying, recurrence_reads_old_state, "before the update"),
    ("5.2.1", combine_affine, combine_affine_wrong_order, "wrong order"),
    ("5.2.2", scan_step, scan_step_old_state, "old state"),
    ("5.2.3", selective_scan_from, selective_scan_without_d, "skip term"),
    ("5.2.4", parallel_scan, scan_one_by_one, "log-depth scan"),
    ("5.3.1", rms_norm_backward, rms_norm_backward_constant_r, "as a constant"),
    ("5.3.2", causal_conv1d_backward, causal_conv1d_backward_forward_in_time, "forward in time"),
    ("5.3.3", conv_step, conv_step_state_stays, "did not move on"),
    ("5.3.4", ssm_parameters, ssm_parameters_no_softplus, "softplus"),
    ("5.3.5", count_parameters, count_parameters_untied, "tied"),
    ("5.3.6", residual_block_forward, block_without_residual, "lacks the residual"),
    ("5.4.1", masked_accuracy, masked_accuracy_all_positions, "every position"),
    ("5.4.2", sequence_accuracy, sequence_accuracy_per_token, "all its answers"),
    ("5.4.3", gpt_width, gpt_width_no_biases, "expected n_embd="),
]


@pytest.mark.parametrize("exercise_id,right,wrong,named", CASES, ids=[c[0] for c in CASES])
def test_stub_wrong_right(exercise_id, right, wrong, named, capsys):
    assert check(exercise_id, stub).status == "not attempted"
    failed = check(exercise_id, wrong)
    assert failed.status == "failed"
    assert named in failed.message
    forgot = check(exercise_id, forgot_return)
    assert forgot.status == "failed" and "forget `return`" in forgot.message
    assert check(exercise_id, right).status == "passed"
    assert capsys.readouterr().out.strip().splitlines()[-1] == f"[{exercise_id}] passed."


def parallel_scan_order_swapped(a, b, combine):
    a, b = np.array(a, dtype=float), np.array(b, dtype=float)
    offset = 1
    while offset < len(a):
        a[offset:], b[offset:] = combine((a[offset:], b[offset:]), (a[:-offset], b[:-offset]))
        offset *= 2
    return b


def sequence_accuracy_counting_blanks(logits, targets, vocab_size):
    return (logits[..., :vocab_size].argmax(-1) == targets).all(axis=-1).mean()


def sequence_accuracy_partial_credit(logits, targets, vocab_size):
    keep = targets != -1
    right = (logits[..., :vocab_size].argmax(-1) == targets) & keep
    return (right.sum(-1) / keep.sum(-1)).mean()


def rms_norm_backward_eps_ignored(x, weight, grad, eps=1e-5):
    return rms_norm_backward(x, weight, grad)


def rms_norm_backward_by_autograd(x, weight, grad, eps=1e-5):
    from course.tensor import Tensor
    xt, wt = Tensor(x, requires_grad=True), Tensor(weight, requires_grad=True)
    (xt / ((xt * xt).mean(axis=-1, keepdims=True) + eps).sqrt() * wt).backward(grad)
    return xt.grad, wt.grad


def selective_scan_by_private_kernel(u, delta, A, B, C, D, h0):
    from course.mamba import scan
    b, l, d = u.shape
    a = np.exp(delta[..., None] * A)
    h = np.empty((b, l + 1, d, A.shape[1]))
    h[:, 0] = h0
    y = np.empty_like(u)
    scan._fast_forward_kernel(u, delta, B, C, D, a, y, h)
    return y, h[:, -1]


def finite_differences(f, a, grad, h=1e-6):
    """d sum(f() * grad) / d a by central differences, with a step relative to each entry (the careful kind)."""
    out = np.zeros(a.shape)
    for idx in np.ndindex(*a.shape):
        old = a[idx]
        step = h * max(1.0, abs(old))
        a[idx] = old + step
        plus = f()
        a[idx] = old - step
        minus = f()
        a[idx] = old
        out[idx] = ((plus - minus) * grad).sum() / (2 * step)
    return out


def rms_norm_backward_by_finite_differences(x, weight, grad, eps=1e-5):
    x, weight = np.array(x, dtype=float), np.array(weight, dtype=float)

    def forward():
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * weight

    return finite_differences(forward, x, grad), finite_differences(forward, weight, grad)


def rms_norm_backward_by_numerical_gradient(x, weight, grad, eps=1e-5):
    from course.tensor import numerical_gradient

    def loss(x, weight):
        return (x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * weight * grad).sum()

    arrays = [np.array(x, dtype=float), np.array(weight, dtype=float)]
    return numerical_gradient(loss, arrays, 0), numerical_gradient(loss, arrays, 1)


def causal_conv1d_backward_by_finite_differences(x, weight, grad):
    x, weight = np.array(x, dtype=float), np.array(weight, dtype=float)
    return (finite_differences(lambda: causal_conv1d(x, weight, 0.0), x, grad, h=1e-5),
            finite_differences(lambda: causal_conv1d(x, weight, 0.0), weight, grad, h=1e-5))


def count_parameters_plus_half(d_model, n_layer, vocab_size, d_state=16, expand=2, d_conv=4):
    return count_parameters(d_model, n_layer, vocab_size, d_state, expand, d_conv) + 0.5


def count_parameters_rank_floored(d_model, n_layer, vocab_size, d_state=16, expand=2, d_conv=4):
    d, r = expand * d_model, -(-d_model // 16)
    return count_parameters(d_model, n_layer, vocab_size, d_state, expand, d_conv) - n_layer * 2 * d * (
        r - d_model // 16)


def count_parameters_padded_past(d_model, n_layer, vocab_size, d_state=16, expand=2, d_conv=4):
    extra = (vocab_size // 8 + 1) * 8 - (-(-vocab_size // 8) * 8)  # 8 more rows when vocab_size is a multiple
    return count_parameters(d_model, n_layer, vocab_size, d_state, expand, d_conv) + extra * d_model


def masked_accuracy_per_row(logits, targets, vocab_size):
    right = logits[..., :vocab_size].argmax(-1) == targets
    keep = targets != -1
    return np.mean([right[i][keep[i]].mean() for i in range(len(targets)) if keep[i].any()])


def sequence_accuracy_with_padding(logits, targets, vocab_size):
    right = (logits.argmax(-1) == targets) | (targets == -1)
    return right.all(axis=-1).mean()


def gpt_width_rounded_root(n_params, vocab_size, block_size, n_layer, n_head):
    a, b = 12 * n_layer, 2 * vocab_size + block_size + 13 * n_layer + 2
    root = (-b + math.sqrt(b * b + 4 * a * n_params)) / (2 * a)
    return max(n_head, round(root / n_head) * n_head)


def gpt_width_larger_on_tie(n_params, vocab_size, block_size, n_layer, n_head):
    widths = range(n_head, 4096, n_head)
    return min(widths, key=lambda C: (abs(gpt_count(vocab_size, block_size, n_layer, C) - n_params), -C))


KNOWN_WRONG = {exercise_id: [(wrong, [named])] for exercise_id, _, wrong, named in CASES}
for exercise_id, wrong, words in [
    ("5.1.4", recurrence_without_d, ["skip term"]),
    ("5.1.4", recurrence_from_zero, ["ignore x0"]),
    ("5.1.4", recurrence_first_delta, ["the first delta"]),
    ("5.1.4", recurrence_simple_rule, ["simple rule"]),
    ("5.1.4", recurrence_x0_as_input, ["expected output y", "x0=[8, -4]"]),
    ("5.1.1", bilinear_upside_down, ["upside down"]),
    ("5.1.1", bilinear_b_not_divided, ["divides it by 1 - delta A / 2"]),
    ("5.1.1", bilinear_by_zoh, ["zero-order hold of section 2"]),
    ("5.1.3", kernel_from_one, ["starts at A_bar**1"]),
    ("5.1.3", kernel_transposed, ["transposed"]),
    ("5.1.3", kernel_diagonal_only, ["uses only A_bar's diagonal", "whole matrix"]),
    ("5.2.1", combine_affine_offset_wrong, ["second applied first"]),
    ("5.2.3", selective_scan_from_zero, ["zero state"]),
    ("5.1.2", lambda delta, A, B, u: (delta[..., None] * A, discretize_mamba(delta, A, B, u)[1]), ["deltaA"]),
    ("5.2.1", combine_by_library, ["write this yourself", "course.mamba.scan.combine"]),
    ("5.2.3", selective_scan_by_library, ["write this yourself", "course.mamba.selective_scan"]),
    ("5.2.4", parallel_scan_by_library, ["write this yourself", "linear_recurrence"]),
    ("5.3.1", rms_norm_backward_by_library, ["write this yourself", "course.mamba.rms_norm"]),
    ("5.3.1", rms_norm_backward_by_autograd, ["write this yourself", "course.tensor.Tensor.backward"]),
    ("5.3.2", causal_conv1d_backward_by_library, ["write this yourself", "course.mamba.causal_conv1d"]),
    ("5.3.3", conv_step_newest_first, ["taps in reverse order"]),
    ("5.3.3", conv_step_by_library, ["write this yourself", "causal_conv1d"]),
    ("5.3.4", ssm_parameters_swapped, ["swapped"]),
    ("5.3.5", count_parameters_unpadded, ["padded"]),
    ("5.3.5", count_parameters_by_library, ["write this yourself", "course.mamba.MambaConfig"]),
    ("5.4.1", masked_accuracy_with_padding, ["can be a padding id"]),
    ("5.4.1", masked_accuracy_by_library, ["write this yourself", "course.data.tasks.masked_accuracy"]),
    ("5.4.3", gpt_width_any, ["multiple of n_head"]),
    ("5.2.4", parallel_scan_order_swapped, ["wrong order"]),
    ("5.3.1", rms_norm_backward_eps_ignored, ["ignores the eps"]),
    ("5.4.2", sequence_accuracy_counting_blanks, ["without a target"]),
    ("5.4.2", sequence_accuracy_partial_credit, ["all its answers are right"]),
    ("5.3.6", block_normed_residual, ["normalised input back"]),
    ("5.3.6", block_halves_swapped, ["swapped"]),
    ("5.3.6", block_gate_without_silu, ["not passed through SiLU"]),
    ("5.3.6", block_gate_sigmoid, ["res * sigmoid(res)"]),
    ("5.3.6", block_mix_on_everything, ["mix got an input of shape"]),
    ("5.3.6", block_eps_ignored, ["ignores the eps"]),
    ("5.3.6", block_by_library, ["write this yourself", "course.mamba.ResidualBlock"]),
    ("5.2.3", selective_scan_by_private_kernel, ["write this yourself", "course.mamba.scan._fast_forward_kernel"]),
    ("5.3.1", rms_norm_backward_by_finite_differences, ["finite difference", "worked out by hand"]),
    ("5.3.1", rms_norm_backward_by_numerical_gradient, ["write this yourself", "numerical_gradient"]),
    ("5.3.2", causal_conv1d_backward_by_finite_differences, ["finite difference", "worked out by hand"]),
    ("5.3.5", count_parameters_plus_half, ["whole number"]),
    ("5.3.5", count_parameters_rank_floored, ["rounded up, not down"]),
    ("5.3.5", count_parameters_padded_past, ["already a multiple of 8"]),
    ("5.4.1", masked_accuracy_per_row, ["averaged the rows"]),
    ("5.4.2", sequence_accuracy_with_padding, ["padding id"]),
    ("5.4.3", gpt_width_rounded_root, ["rounded to a multiple of n_head", "n_params=143,505"]),
    ("5.4.3", gpt_width_larger_on_tie, ["on a tie"]),
]:
    KNOWN_WRONG[exercise_id].append((wrong, words))


@pytest.mark.parametrize("exercise_id,wrong,words", known_wrong.cases(KNOWN_WRONG))
def test_known_wrong_answer_fails_saying_why(exercise_id, wrong, words):
    known_wrong.assert_fails_saying(exercise_id, wrong, words)


# ---- right answers written another way: loops, float32, lists, another formula ----------------------


# 5.1.1 loop, python floats, list outputs
def bilinear_loop(A, B, delta):
    Ab, Bb = [], []
    for a, b in zip(A, B):
        Ab.append((2 + delta * a) / (2 - delta * a))
        Bb.append(2 * delta * b / (2 - delta * a))
    return Ab, Bb


# 5.1.2 broadcasting via reshape, float32
def mamba32(delta, A, B, u):
    d = delta.astype(np.float32)
    b, l, di = d.shape
    return (np.exp(d.reshape(b, l, di, 1) * A.astype(np.float32)),
            (d * u).astype(np.float32).reshape(b, l, di, 1) * B.astype(np.float32).reshape(b, l, 1, -1))


# 5.1.3 loop with a running row vector C A_bar^j
def kernel_loop(A_bar, B_bar, C, L):
    K, row = [], np.array(C, dtype=float)
    for _ in range(L):
        K.append(float(row @ B_bar))
        row = row @ A_bar
    return K


# 5.1.4 the whole sequence of decays at once, then the loop, math-module floats for the factor
def rec_vec(A, B, C, D, u, deltas, x0):
    A_bars = np.exp(np.outer(deltas, A))  # (L, n)
    B_bars = np.array([[math.expm1(d * a) / a * b for a, b in zip(A, B)] for d in deltas])
    x, y = np.array(x0, dtype=float), np.empty(len(u))
    for k in range(len(u)):
        x = A_bars[k] * x + B_bars[k] * u[k]
        y[k] = C @ x
    return y + D * u, x


# 5.2.1 einsum, list return
def comb_einsum(first, second):
    (A1, b1), (A2, b2) = first, second
    return [np.einsum("ij,jk->ik", A2, A1), np.einsum("ij,j->i", A2, b1) + b2]


# 5.2.2 explicit loops
def step_loop(x, u_t, delta_t, A, B_t, C_t, D):
    b, d_in, n = x.shape
    xn = np.zeros_like(x)
    y = np.zeros((b, d_in))
    for i in range(b):
        for d in range(d_in):
            for s in range(n):
                xn[i, d, s] = np.exp(delta_t[i, d] * A[d, s]) * x[i, d, s] + delta_t[i, d] * B_t[i, s] * u_t[i, d]
            y[i, d] = xn[i, d] @ C_t[i] + D[d] * u_t[i, d]
    return xn, y


# 5.2.3 precomputed, float32 would fail rtol 1e-7? use float64 preallocated
def scan_prealloc(u, delta, A, B, C, D, h0):
    b, l, d_in = u.shape
    dA = np.exp(np.einsum("bld,dn->bldn", delta, A))
    dBu = np.einsum("bld,bln->bldn", delta * u, B)
    y = np.empty((b, l, d_in))
    h = h0.copy()
    for k in range(l):
        h = dA[:, k] * h + dBu[:, k]
        y[:, k] = np.einsum("bdn,bn->bd", h, C[:, k])
    return y + D * u, h


# 5.2.4 down-sweep style with copies, list-of-slices
def par_scan2(a, b, combine):
    a, b = np.asarray(a, float), np.asarray(b, float)
    L, off = len(a), 1
    while off < L:
        na, nb = combine((a[:L - off], b[:L - off]), (a[off:], b[off:]))
        a = np.concatenate([a[:off], na])
        b = np.concatenate([b[:off], nb])
        off <<= 1
    return b


# 5.3.1 one vector at a time, with its Jacobian written out
def rms_bw_loop(x, weight, grad, eps=1e-5):
    d = x.shape[-1]
    dx, dw = [], np.zeros(d)
    for v, g in zip(x.reshape(-1, d), grad.reshape(-1, d)):
        r = 1 / np.sqrt(v @ v / d + eps)
        jacobian = (np.eye(d) * r - np.outer(v, v) * r ** 3 / d) * weight[:, None]
        dx.append(jacobian.T @ g)
        dw += g * v * r
    return np.array(dx).reshape(x.shape), dw


# 5.3.2 loops float32
def conv_bw_loop(x, weight, grad):
    b, l, d = x.shape
    k = weight.shape[1]
    dx = np.zeros_like(x)
    dw = np.zeros_like(weight)
    for t in range(l):
        for j in range(k):
            s = t - (k - 1) + j
            if s >= 0:
                dx[:, s] += weight[:, j] * grad[:, t]
                dw[:, j] += (grad[:, t] * x[:, s]).sum(0)
    return dx, dw


# 5.3.3 the taps on the state and on the new input apart, np.roll for the state
def conv_step_roll(conv_state, u_t, weight, bias):
    out = bias + np.einsum("bjd,dj->bd", conv_state, weight[:, :-1]) + u_t * weight[:, -1]
    new = np.roll(conv_state, -1, axis=1)
    new[:, -1] = u_t
    return out, new


# 5.3.4 split with np.split, softplus via log1p
def ssm_params2(u, xw, dw, db, n):
    r = xw.shape[0] - 2 * n
    d_, B, C = np.split(u @ xw.T, [r, r + n], axis=-1)
    z = d_ @ dw.T + db
    return np.where(z > 20, z, np.log1p(np.exp(np.minimum(z, 20)))), B, C


# 5.3.5 module by module with math.ceil
def count2(d_model, n_layer, vocab_size, d_state=16, expand=2, d_conv=4):
    E = d_model
    d = expand * E
    r = math.ceil(E / 16)
    n = d_state
    mods = [E, 2 * d * E, d * d_conv + d, d * (r + 2 * n), r * d + d, d * n, d, d * E]
    V = math.ceil(vocab_size / 8) * 8
    return np.int64(n_layer * sum(mods) + V * E + E)


# 5.3.6 the gate by its definition, z sigmoid(z), halves by slicing, the residual first
def block_loop(x, norm_weight, in_proj_weight, mix, out_proj_weight, eps=1e-5):
    out = x.copy()
    h = x / np.sqrt(np.mean(x ** 2, axis=-1, keepdims=True) + eps) * norm_weight
    both = np.einsum("bld,ed->ble", h, in_proj_weight)
    d_in = both.shape[-1] // 2
    gate = both[..., d_in:] * (1 / (1 + np.exp(-both[..., d_in:])))
    out += np.einsum("ble,de->bld", mix(both[..., :d_in]) * gate, out_proj_weight)
    return out


# 5.4.1 loop
def macc_loop(logits, targets, vocab_size):
    right = total = 0
    for i in range(targets.shape[0]):
        for t in range(targets.shape[1]):
            if targets[i, t] != -1:
                total += 1
                right += int(np.argmax(logits[i, t, :vocab_size]) == targets[i, t])
    return right / total


# 5.4.2 loop
def seqacc_loop(logits, targets, vocab_size):
    good = 0
    for i in range(targets.shape[0]):
        keep = targets[i] != -1
        good += bool(np.all(logits[i, keep, :vocab_size].argmax(-1) == targets[i, keep]))
    return good / targets.shape[0]


# 5.4.3 closed-form quadratic then neighbours
def width2(n_params, V, T, L, H):
    def cnt(C): return (V + T) * C + L * (12 * C * C + 13 * C) + 2 * C + V * C
    a, b = 12 * L, 2 * V + T + 13 * L + 2
    C0 = (-b + math.sqrt(b * b + 4 * a * n_params)) / (2 * a)
    cands = [max(H, (int(C0) // H + o) * H) for o in (-1, 0, 1, 2)]
    return min(sorted(set(cands)), key=lambda C: abs(cnt(C) - n_params))


def in_float32(fn):
    """`fn` computing in float32: the checks accept its rounding."""
    def as_float32(value):
        if isinstance(value, np.ndarray) and value.dtype == np.float64:
            return value.astype(np.float32)
        return tuple(map(as_float32, value)) if isinstance(value, tuple) else value

    return lambda *args: fn(*map(as_float32, args))


OTHER_RIGHT = [
    ("5.1.1", bilinear_loop), ("5.1.2", mamba32), ("5.1.3", kernel_loop), ("5.1.4", rec_vec),
    ("5.2.1", comb_einsum), ("5.2.2", step_loop), ("5.2.3", scan_prealloc), ("5.2.4", par_scan2),
    ("5.3.1", rms_bw_loop), ("5.3.2", conv_bw_loop), ("5.3.3", conv_step_roll), ("5.3.4", ssm_params2),
    ("5.3.5", count2), ("5.3.6", block_loop), ("5.4.1", macc_loop), ("5.4.2", seqacc_loop), ("5.4.3", width2),
    ("5.1.1", lambda A, B, d: tuple(np.float32(v) for v in discretize_bilinear(A, B, d))),
    ("5.1.3", lambda A_bar, B_bar, C, L: list(ssm_kernel_dense(A_bar, B_bar, C, L))),
] + [(i, in_float32(f)) for i, f in [
    ("5.1.4", ssm_recurrence_varying), ("5.1.3", ssm_kernel_dense), ("5.2.1", combine_affine), ("5.2.2", scan_step), ("5.2.3", selective_scan_from),
    ("5.2.4", parallel_scan), ("5.3.1", rms_norm_backward), ("5.3.2", causal_conv1d_backward), ("5.3.3", conv_step),
    ("5.3.4", ssm_parameters), ("5.3.6", residual_block_forward), ("5.4.1", masked_accuracy), ("5.4.2", sequence_accuracy)]]


@pytest.mark.parametrize("exercise_id,candidate", OTHER_RIGHT, ids=[f"{i}-{n}" for n, (i, _) in enumerate(OTHER_RIGHT)])
def test_other_right_answers_pass(exercise_id, candidate):
    result = check(exercise_id, candidate)
    assert result.status == "passed", result.message


def test_library_refused_even_when_imported_before_the_check():
    # a notebook: the import cell binds the library's scan in the learner's globals before the check runs
    learner = {}
    exec("from course.mamba import selective_scan as scan\n"
         "def candidate(u, delta, A, B, C, D, h0):\n"
         "    return scan(u, delta, A, B, C, D), h0\n", learner)
    scan = learner["scan"]

    result = check("5.2.3", learner["candidate"])
    assert result.status == "failed" and "write this yourself" in result.message
    ones = np.ones((1, 2, 1))
    args = [ones, ones, -np.ones((1, 1)), ones, ones, np.ones(1)]
    assert np.asarray(scan(*args)).shape == (1, 2, 1)  # and it works again afterwards


@pytest.mark.parametrize("config", [(64, 2, 65, 16, 2, 4), (16, 1, 8, 4, 2, 3), (40, 3, 10, 8, 1, 2),
                                    (24, 2, 3, 5, 3, 5)])
def test_the_parameter_count_of_5_3_5_is_the_library_count(config):
    from course.mamba import Mamba, MambaConfig
    E, L, V, n, expand, k = config
    model = Mamba(MambaConfig(E, L, V, d_state=n, expand=expand, d_conv=k))
    assert count_parameters(*config) == model.num_parameters()


def test_the_backward_references_of_5_3_agree_with_finite_differences():
    from course.exercises.part5 import _ref_conv, _ref_conv_backward, _ref_rms_backward
    rng = np.random.default_rng(0)
    x, w, g = rng.normal(size=(2, 5, 3)), rng.normal(size=(3, 4)), rng.normal(size=(2, 5, 3))
    rx, rw, rg = rng.normal(size=(2, 3, 6)), rng.normal(size=6), rng.normal(size=(2, 3, 6))

    def rms(x, w):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-5) * w

    for f, args, ref in [(lambda x, w: _ref_conv(x, w, np.zeros(3)), (x, w), _ref_conv_backward(x, w, g)),
                         (rms, (rx, rw), _ref_rms_backward(rx, rw, rg))]:
        grad_out = g if f is not rms else rg
        for i, a in enumerate(args):
            numeric = np.zeros_like(a)
            for idx in np.ndindex(*a.shape):
                old = a[idx]
                a[idx] = old + 1e-6
                plus = (f(*args) * grad_out).sum()
                a[idx] = old - 1e-6
                minus = (f(*args) * grad_out).sum()
                a[idx] = old
                numeric[idx] = (plus - minus) / 2e-6
            assert np.allclose(ref[i], numeric, rtol=1e-5, atol=1e-8)


def test_every_forward_of_the_scan_module_is_refused_in_5_2_3():
    # a learner finds the private functions with dir(course.mamba.scan): every one that computes the
    # scan's output is on the forbid list of the exercises that ask for a scan
    import inspect

    from course.exercises import part5
    from course.mamba import scan
    forwards = {f"course.mamba.scan.{name}" for name, obj in vars(scan).items()
                if "forward" in name and (inspect.isfunction(obj) or hasattr(obj, "py_func"))}
    assert forwards and forwards <= set(part5._SCANS), forwards - set(part5._SCANS)


def test_the_mistakes_of_5_3_5_are_named_apart_before_they_coincide():
    # vocab_size=8, d_model=16: an untied head and 8 rows of padding too many give the same count;
    # an earlier case tells them apart, so each gets its own message
    assert "tied" in check("5.3.5", count_parameters_untied).message
    assert "already a multiple of 8" in check("5.3.5", count_parameters_padded_past).message
    assert "rounded up, not down" in check("5.3.5", count_parameters_rank_floored).message


def test_x0_fed_as_an_input_is_not_told_it_read_the_state_too_early():
    message = check("5.1.4", recurrence_x0_as_input).message
    assert "before the update" not in message and "x0=[8, -4]" in message, message
