"""Checks of part 2: tensors (2.1), modules and optimizers (2.2), the digits classifier (2.3).

Every exercise works on NumPy arrays, so a check can compare with a formula written here.
"""

import math

import numpy as np

from . import call, exercise, expect, expect_close


def _shape_str(a):
    return f"shape {tuple(np.shape(a))}"


def _unpack(got, names, on):
    """Accept a tuple or a list of len(names) results (a learner may return either)."""
    expect(isinstance(got, (tuple, list)) and len(got) == len(names),
           f"return ({', '.join(names)}), got {type(got).__name__}"
           f"{f' of length {len(got)}' if isinstance(got, (tuple, list)) else ''} on {on}")
    return tuple(got)


# ----- 2.1 from scalars to arrays ------------------------------------------------------------------

# A backward written by hand, not read off the autograd engines of parts 2 and 3.
_BY_HAND = dict(forbid=["course.tensor.Tensor.backward", "course.minitf.gradients"],
                task="compute the gradient by hand, in NumPy")


def _mean_backward(x_shape, axis, g):
    axes = tuple(range(len(x_shape))) if axis is None else (axis,) if isinstance(axis, int) else tuple(axis)
    axes = tuple(a % len(x_shape) for a in axes)
    count = int(np.prod([x_shape[a] for a in axes]))
    return np.broadcast_to(np.expand_dims(g, axes), x_shape) / count


@exercise("2.1.1", hint="each element of x gets an equal share of the gradient of the mean it went into: "
                        "put the averaged axes back (size 1) and spread g over them",
          answer_hint="np.broadcast_to(np.expand_dims(g, axes), x_shape) / (the number of elements averaged "
                      "together), with axes the averaged axes (all of them for None)", **_BY_HAND)
def _(candidate, rng):
    # negative axes in a tuple too: expanding g at -2, then at -1, without first turning them into
    # 1 and 2, puts the axes back in the wrong places
    cases = [((4, 3), 0), ((4, 3), 1), ((4, 3), None), ((2, 3, 4), (0, 2)), ((2, 3, 4), -1), ((5,), 0),
             ((2, 3, 4), (-2, -1)), ((2, 3, 4, 5), (-3, -1))]
    for _ in range(3):
        shape = tuple(int(n) for n in rng.integers(1, 5, size=rng.integers(1, 4)))
        cases.append((shape, int(rng.integers(-len(shape), len(shape)))))
    for x_shape, axis in cases:
        g = rng.normal(size=np.zeros(x_shape).mean(axis=axis).shape)
        on = f"x of shape {x_shape}, axis={axis}"
        got = call(candidate, x_shape, axis, np.array(g), on=on)
        expect_close(got, _mean_backward(x_shape, axis, g), on=on, what="gradient")


def _max_backward(x, axis, g):
    top = np.expand_dims(x.max(axis=axis), axis)
    mask = (x == top).astype(x.dtype)
    return mask / mask.sum(axis=axis, keepdims=True) * np.expand_dims(g, axis)


@exercise("2.1.2", hint="only the largest element of each slice changes the max, so only it gets gradient; "
                        "when several tie for the largest they share it",
          answer_hint="mask = x == x.max(axis, keepdims=True); return mask / mask.sum(axis, keepdims=True) "
                      "* np.expand_dims(g, axis)", **_BY_HAND)
def _(candidate, rng):
    cases = [(np.array([[1.0, 5.0, 2.0], [7.0, 0.0, -1.0]]), 1),
             (np.array([[1.0, 5.0, 2.0], [7.0, 0.0, -1.0]]), 0),
             (np.array([[3.0, 3.0, 1.0]]), 1)]  # a tie: the two maxima share the gradient
    for shape, axis in [((4, 5), 1), ((3, 4, 2), 0), ((3, 4, 2), -1), ((6,), 0)]:
        cases.append((rng.permutation(np.prod(shape)).reshape(shape).astype(np.float64), axis))
    for x, axis in cases:
        g = rng.normal(size=x.max(axis=axis).shape)
        on = f"x of shape {x.shape} = {np.array2string(x.ravel()[:6], precision=2)}..., axis={axis}"
        got = call(candidate, x.copy(), axis, g.copy(), on=on)
        expect_close(got, _max_backward(x, axis, g), on=on, what="gradient")


@exercise("2.1.3", hint="let the shapes guide you: dA has A's shape and dB has B's; each is a product of "
                        "G with the other factor, transposed",
          answer_hint="dA = G @ B^T and dB = A^T @ G (for a batch, swap the last two axes: np.swapaxes(B, -1, -2))",
          **_BY_HAND)
def _(candidate, rng):
    shapes = [((2, 3), (3, 4)), ((1, 1), (1, 1)), ((5, 2), (2, 1)), ((3, 2, 4), (3, 4, 5))]
    for a_shape, b_shape in shapes:
        A, B = rng.normal(size=a_shape), rng.normal(size=b_shape)
        G = rng.normal(size=(A @ B).shape)
        on = f"A of shape {a_shape}, B of shape {b_shape}"
        got = _unpack(call(candidate, A.copy(), B.copy(), G.copy(), on=on), ("dA", "dB"), on)
        expect_close(got[0], G @ np.swapaxes(B, -1, -2), on=on, what="dA")
        expect_close(got[1], np.swapaxes(A, -1, -2) @ G, on=on, what="dB")


# ----- 2.2 modules and optimizers --------------------------------------------------------------


@exercise("2.2.1", hint="the velocity remembers past gradients (it starts at zero, so the first step is plain "
                        "SGD), and the parameter moves along the velocity",
          answer_hint="v = momentum * v + grad, then p = p - lr * v; return (p, v)",
          forbid=["course.optim.SGD"], task="write the momentum update in NumPy")
def _(candidate, rng):
    cases = [(np.array([1.0]), [np.array([0.5]), np.array([-1.0]), np.array([2.0])], 0.1, 0.9),
             (rng.normal(size=(2, 3)), [rng.normal(size=(2, 3)) for _ in range(3)], 0.05, 0.5),
             (rng.normal(size=4), [rng.normal(size=4) for _ in range(2)], 0.1, 0.0)]
    for p0, grads, lr, momentum in cases:
        p, v = p0.copy(), np.zeros_like(p0)
        ep, ev = p0.copy(), np.zeros_like(p0)
        for t, g in enumerate(grads, 1):
            on = f"step {t} with lr={lr}, momentum={momentum}, p of {_shape_str(p0)}"
            got = _unpack(call(candidate, p.copy(), g.copy(), v.copy(), lr, momentum, on=on),
                          ("new_p", "new_velocity"), on)
            ev = momentum * ev + g
            ep = ep - lr * ev
            expect_close(got[1], ev, on=on, what="velocity")
            expect_close(got[0], ep, on=on, what="parameter")
            p, v = np.asarray(got[0]), np.asarray(got[1])


@exercise("2.2.2", hint="update both running averages, correct their bias with t (which counts from 1), and "
                        "keep eps outside the square root",
          answer_hint="m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2; m_hat = m / (1 - b1**t); v_hat = v / (1 - b2**t); "
                      "p -= lr m_hat / (sqrt(v_hat) + eps)",
          forbid=["course.optim.Adam", "course.optim.AdamW"], task="write the Adam update in NumPy")
def _(candidate, rng):
    cases = [(np.array([1.0]), [np.array([1.0]), np.array([-1.0]), np.array([2.0])], 0.1, 0.5, 0.75, 0.0),
             (rng.normal(size=(3, 2)), [rng.normal(size=(3, 2)) for _ in range(4)], 0.01, 0.9, 0.999, 1e-8),
             (rng.normal(size=4), [rng.normal(size=4) * 0.1 for _ in range(2)], 0.1, 0.8, 0.9, 0.5)]  # a large eps
    for p0, grads, lr, b1, b2, eps in cases:
        p, m, v = p0.copy(), np.zeros_like(p0), np.zeros_like(p0)
        ep, em, ev = p0.copy(), np.zeros_like(p0), np.zeros_like(p0)
        for t, g in enumerate(grads, 1):
            on = f"step t={t} with lr={lr}, betas=({b1}, {b2}), eps={eps}, p of {_shape_str(p0)}"
            got = _unpack(call(candidate, p.copy(), g.copy(), m.copy(), v.copy(), t, lr, b1, b2, eps, on=on),
                          ("new_p", "new_m", "new_v"), on)
            em = b1 * em + (1 - b1) * g
            ev = b2 * ev + (1 - b2) * g * g
            ep = ep - lr * (em / (1 - b1 ** t)) / (np.sqrt(ev / (1 - b2 ** t)) + eps)
            expect_close(got[1], em, on=on, what="m")
            expect_close(got[2], ev, on=on, what="v")
            expect_close(got[0], ep, on=on, what="parameter")
            p, m, v = (np.asarray(x) for x in got)


@exercise("2.2.3", hint="one norm for all the gradients together, not one each; scale them only when it is "
                        "above max_norm, and all by the same factor",
          answer_hint="norm = sqrt(sum of (g ** 2).sum() over every g); if norm > max_norm, multiply every g "
                      "by max_norm / norm; return (grads, norm)",
          forbid=["course.optim.clip_grad_norm_"], task="write the clipping in NumPy")
def _(candidate, rng):
    cases = [([np.array([3.0, 0.0]), np.array([4.0])], 1.0),
             ([np.array([0.3, 0.0]), np.array([0.4])], 1.0),
             ([rng.normal(size=(3, 4)), rng.normal(size=5)], 0.5),
             ([rng.normal(size=(2, 2)) * 0.01], 10.0)]
    for grads, max_norm in cases:
        on = f"gradients of shapes {[g.shape for g in grads]} with max_norm={max_norm}"
        clipped, total = _unpack(call(candidate, [g.copy() for g in grads], max_norm, on=on),
                                 ("clipped", "total_norm"), on)
        norm = math.sqrt(sum(float((g * g).sum()) for g in grads))
        expect_close(total, norm, on=on, what="total norm")
        scale = min(1.0, max_norm / norm)
        expect(isinstance(clipped, (list, tuple)) or hasattr(clipped, "__iter__"),
               f"return the clipped gradients as a list, got {type(clipped).__name__} on {on}")
        clipped = list(clipped)  # a generator is fine too
        expect(len(clipped) == len(grads), f"expected {len(grads)} clipped gradients, got {len(clipped)} on {on}")
        for i, (c, g) in enumerate(zip(clipped, grads)):
            expect_close(c, g * scale, on=on, what=f"clipped gradient {i}", rtol=1e-5, atol=1e-9)


def _warmup_cosine(step, warmup, total, min_ratio):
    if step < warmup:
        return (step + 1) / warmup
    if step >= total:
        return min_ratio
    progress = (step - warmup) / (total - warmup)
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


@exercise("2.2.4", hint="three phases: a straight line up that reaches 1 at the last warm-up step, half a "
                        "cosine from 1 down to min_ratio, then min_ratio from total_steps on",
          answer_hint="during warm-up (step + 1) / warmup_steps; then with progress = (step - warmup_steps) / "
                      "(total_steps - warmup_steps): min_ratio + (1 - min_ratio) * (1 + cos(pi * progress)) / 2",
          forbid=["course.optim.warmup_cosine", "course.optim.WarmupCosine"], task="write the schedule")
def _(candidate, rng):
    settings = [(4, 12, 0.0), (10, 100, 0.1), (int(rng.integers(1, 20)), int(rng.integers(30, 80)), 0.05)]
    for warmup, total, min_ratio in settings:
        for step in sorted({0, warmup - 1, warmup, (warmup + total) // 2, total - 1, total, total + 5,
                            *rng.integers(0, total + 5, size=5).tolist()}):
            on = f"step={step}, warmup_steps={warmup}, total_steps={total}, min_ratio={min_ratio}"
            got = call(candidate, step, warmup, total, min_ratio, on=on)
            expect_close(got, _warmup_cosine(step, warmup, total, min_ratio), on=on, what="factor")


# ----- 2.3 the digits classifier ---------------------------------------------------------------


def _softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


@exercise("2.3.1", hint="every output of a row depends on every input of that row; apply the Jacobian "
                        "diag(s) - s s^T to g without building it: one sum over the row is enough",
          answer_hint="s * (g - (g * s).sum(axis=-1, keepdims=True))", **_BY_HAND)
def _(candidate, rng):
    xs = [np.array([1.0, 2.0, 3.0]), np.array([[0.0, 0.0], [5.0, -5.0]]), rng.normal(size=(4, 6)),
          rng.normal(size=(2, 3, 5)) * 3]
    for x in xs:
        s = _softmax(x)
        g = rng.normal(size=x.shape)
        on = f"s = softmax(x) for x of shape {x.shape}"
        got = call(candidate, s.copy(), g.copy(), on=on)
        expect_close(got, s * (g - (g * s).sum(axis=-1, keepdims=True)), on=on, what="gradient")


def _cross_entropy(logits, targets):
    m = logits.max(axis=-1, keepdims=True)
    logp = logits - m - np.log(np.exp(logits - m).sum(axis=-1, keepdims=True))
    return float(-logp[np.arange(len(targets)), targets].mean())


@exercise("2.3.2", hint="exp of a large logit overflows: shift each row by a constant first (the softmax does "
                        "not change), and work with log-probabilities",
          answer_hint="with m the row max, logsumexp(row) = m + log(sum(exp(row - m))); the loss is the mean over "
                      "rows of logsumexp(row) - row[target]",
          forbid=["course.tensor.functional.cross_entropy", "course.tensor.functional.log_softmax"],
          task="write a stable cross-entropy in NumPy")
def _(candidate, rng):
    cases = [(np.array([[2.0, 1.0, 0.1]]), np.array([0])),
             (np.array([[1e4, -1e4, 0.0], [-1e4, -1e4, -1e4]]), np.array([1, 2])),  # exp would overflow
             (rng.normal(size=(8, 10)) * 4, rng.integers(0, 10, size=8))]
    for logits, targets in cases:
        on = f"logits of shape {logits.shape} (largest |logit| {np.abs(logits).max():.3g}), targets {targets.tolist()}"
        got = call(candidate, logits.copy(), targets.copy(), on=on)
        expect(np.size(got) == 1, f"expected the loss as one number, got {np.size(got)} values on {on}")
        expect(np.all(np.isfinite(np.asarray(got, dtype=np.float64))), f"the loss is not finite on {on}")
        expect_close(got, _cross_entropy(logits, targets), on=on, what="loss", rtol=1e-6)


@exercise("2.3.3", hint="rows are the true classes and columns the predicted ones; every example adds 1 to "
                        "one cell, even when several land on the same cell",
          answer_hint="matrix = np.zeros((n_classes, n_classes), dtype=int); np.add.at(matrix, (y_true, y_pred), 1)")
def _(candidate, rng):
    cases = [(np.array([0, 1, 2, 2, 1]), np.array([0, 2, 2, 2, 1]), 3),
             (np.array([1, 1]), np.array([0, 0]), 4)]
    y = rng.integers(0, 10, size=60)
    cases.append((y, np.where(rng.random(60) < 0.7, y, rng.integers(0, 10, size=60)), 10))
    for y_true, y_pred, n in cases:
        on = f"y_true={y_true.tolist()[:8]}..., y_pred={y_pred.tolist()[:8]}..., n_classes={n}"
        got = call(candidate, y_true.copy(), y_pred.copy(), n, on=on)
        expected = np.zeros((n, n), dtype=np.int64)
        np.add.at(expected, (y_true, y_pred), 1)
        expect_close(got, expected, on=on, what="confusion matrix")


@exercise("2.3.4", hint="draw the mask from the generator you are given, zero each element with probability "
                        "p, and scale what you keep so that the mean is unchanged",
          answer_hint="x * (rng.random(x.shape) >= p) / (1 - p)",
          forbid=["course.tensor.functional.dropout", "course.nn.Dropout"], task="write dropout in NumPy")
def _(candidate, rng):
    shape = (400, 500)
    for p in (0.1, 0.5, 0.8):
        # random values of both signs: an answer that ignores x, or picks by value, cannot pass
        x = rng.uniform(0.5, 2.0, size=shape) * rng.choice([-1.0, 1.0], size=shape)
        on = f"a random x of shape {shape}, p={p}, rng=np.random.default_rng(0)"
        got = np.asarray(call(candidate, x.copy(), p, np.random.default_rng(0), on=on), dtype=np.float64)
        expect(got.shape == x.shape, f"the output has shape {got.shape}, expected {x.shape} on {on}")
        kept = got != 0
        expect(abs((~kept).mean() - p) < 0.01,
               f"expected a fraction {p} of zeros, got {(~kept).mean():.3f} on {on}")
        for part, rows in (("first", slice(0, 100)), ("last", slice(300, 400))):
            expect(abs((~kept[rows]).mean() - p) < 0.03,
                   f"the zeros are not spread at random: a fraction {(~kept[rows]).mean():.3f} of the {part} "
                   f"100 rows is zero, expected about {p} on {on}")
        expect(np.allclose(got[kept], x[kept] / (1 - p)),
               f"expected each kept element to be x / (1 - p), got {got[kept][:3].round(4).tolist()} "
               f"where x is {x[kept][:3].round(4).tolist()} on {on}")
        again = np.asarray(call(candidate, x.copy(), p, np.random.default_rng(0), on=on), dtype=np.float64)
        expect(again.shape == x.shape and np.array_equal(again != 0, kept),
               f"two calls with generators seeded alike zeroed different elements on {on}: draw the mask from "
               f"the rng you are given (not np.random or a generator of your own)")
        other = np.asarray(call(candidate, x.copy(), p, np.random.default_rng(1), on=on), dtype=np.float64)
        expect(other.shape == x.shape and not np.array_equal(other != 0, kept),
               f"generators seeded differently (0 and 1) zeroed the same elements on {on}: draw the mask from "
               f"the rng you are given")
    y = rng.normal(size=(3, 4))
    on = "a (3, 4) input with p=0"
    got = call(candidate, y.copy(), 0.0, np.random.default_rng(0), on=on)
    expect_close(got, y, on=on, what="output (p=0 must change nothing)")


from . import part2_modules  # noqa: E402,F401  (the checks of 2.2.5 and 2.2.6: importing registers them)
