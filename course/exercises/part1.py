"""Checks of part 1 (micrograd): derivatives (1.1), backpropagation (1.2), a neural net (1.3)."""

import math

import numpy as np

from course.exercises import call, exercise, expect, expect_close


def _value():
    from course.micrograd import Value  # imported here: course.exercises loads no part at import
    return Value


def _fmt(xs):
    return "[" + ", ".join(f"{x:.3g}" for x in xs) + "]"


def _expect_value(got, on):
    Value = _value()
    expect(isinstance(got, Value),
           f"expected a Value (from course.micrograd), got {type(got).__name__} on {on}")


# ---- 1.1 derivatives ----

_OWN_DIFFERENCE = dict(forbid=["course.tensor.gradcheck.numerical_gradient"],
                       task="estimate it with your own finite difference")


@exercise("1.1.1", hint="step to both sides of x, and use the h you are given (the check also passes h=0.01)",
          answer_hint="(f(x + h) - f(x - h)) / (2 * h)", **_OWN_DIFFERENCE)
def _(candidate, rng):
    functions = [("t**3", lambda t: t ** 3, lambda t: 3 * t ** 2),
                 ("sin(t)", math.sin, math.cos),
                 ("exp(t / 2)", lambda t: math.exp(t / 2), lambda t: 0.5 * math.exp(t / 2))]
    for x in [0.0, 1.5, -2.0, *rng.uniform(-3, 3, size=4)]:
        for name, f, df in functions:
            on = f"f(t) = {name} at x={x:.3g}"
            got = call(candidate, f, x, on=on)
            expect_close(got, df(x), on=on, rtol=1e-4, atol=1e-6, what="derivative")
    # With a large step the central difference differs from a one-sided one: check that one.
    for x in [1.0, -0.5]:
        h = 0.01
        on = f"f(t) = t**3 at x={x:.3g} with h={h}"
        got = call(candidate, lambda t: t ** 3, x, h=h, on=on)
        expect_close(got, 3 * x ** 2 + h ** 2, on=on, rtol=1e-6, what="central difference")


def _central_partials(f, xs, h):
    grads = []
    for i in range(len(xs)):
        up, down = list(xs), list(xs)
        up[i] += h
        down[i] -= h
        grads.append((f(up) - f(down)) / (2 * h))
    return grads


def _expect_partials(got, n, on):
    expect(isinstance(got, (list, tuple)) or (isinstance(got, np.ndarray) and got.ndim == 1),
           f"expected a list of {n} partial derivatives, got a {type(got).__name__} on {on}")
    expect(len(got) == n, f"expected a list of {n} partial derivatives, got {len(got)} on {on}")
    return list(got)


@exercise("1.1.2", hint="nudge one input at a time to both sides, keep the others fixed, work on copies "
                        "of xs, and use the h you are given (the check also passes h=0.1)",
          answer_hint="for each i: up, down = list(xs), list(xs); up[i] += h; down[i] -= h; "
                      "append (f(up) - f(down)) / (2 * h)", **_OWN_DIFFERENCE)
def _(candidate, rng):
    functions = [("a*b + c**2", lambda v: v[0] * v[1] + v[2] ** 2,
                  lambda v: [v[1], v[0], 2 * v[2]]),
                 ("a*exp(b) - c", lambda v: v[0] * math.exp(v[1]) - v[2],
                  lambda v: [math.exp(v[1]), v[0] * math.exp(v[1]), -1.0])]
    points = [[1.0, 2.0, 3.0], [-1.5, 0.5, 0.0]] + [[float(v) for v in rng.uniform(-2, 2, size=3)]
                                                    for _ in range(3)]
    for xs in points:
        for name, f, grad in functions:
            on = f"f(a, b, c) = {name} at {_fmt(xs)}"
            given = list(xs)
            got = _expect_partials(call(candidate, f, given, on=on), len(xs), on)
            expect(given == xs, f"your function changed the list xs it was given (to {given!r}, from {xs!r}) on "
                                f"{on}: nudge a copy")
            expect_close(got, grad(xs), on=on, rtol=1e-4, atol=1e-6, what="partial derivatives")
    # With a large step the central difference is not the exact derivative, nor a one-sided step.
    cubic = ("a**3 + a*b**2 - 2*c**3", lambda v: v[0] ** 3 + v[0] * v[1] ** 2 - 2 * v[2] ** 3)
    for xs in [[1.0, -2.0, 0.5], [float(v) for v in rng.uniform(-2, 2, size=3)]]:
        h = 0.1
        on = f"f(a, b, c) = {cubic[0]} at {_fmt(xs)} with h={h}"
        given = list(xs)
        got = _expect_partials(call(candidate, cubic[1], given, h=h, on=on), len(xs), on)
        expect(given == xs, f"your function changed the list xs it was given on {on}: nudge a copy")
        expect_close(got, _central_partials(cubic[1], xs, h), on=on, rtol=1e-6, atol=1e-9,
                     what="central differences")


@exercise("1.1.3", hint="the chain rule multiplies the outer derivative, taken at g(x), by the inner one; "
                        "return a function of x (a def inside yours, or a lambda)",
          answer_hint="return lambda x: df(g(x)) * dg(x)")
def _(candidate, rng):
    pairs = [("f(u) = u**2, g(x) = sin(x)", lambda u: 2 * u, math.sin, math.cos,
              lambda x: 2 * math.sin(x) * math.cos(x)),
             ("f(u) = exp(u), g(x) = 3x + 1", math.exp, lambda x: 3 * x + 1, lambda x: 3.0,
              lambda x: 3 * math.exp(3 * x + 1)),
             ("f(u) = tanh(u), g(x) = x**2", lambda u: 1 - math.tanh(u) ** 2, lambda x: x ** 2,
              lambda x: 2 * x, lambda x: (1 - math.tanh(x ** 2) ** 2) * 2 * x)]
    for name, df, g, dg, expected in pairs:
        dfg = call(candidate, df, g, dg, on=name)
        expect(callable(dfg), f"expected a function of x, got {type(dfg).__name__} on {name}")
        for x in [0.0, 0.7, -1.2, *rng.uniform(-1.5, 1.5, size=3)]:
            on = f"{name} at x={x:.3g}"
            got = call(dfg, x, on=on)
            expect_close(got, expected(x), on=on, rtol=1e-6, atol=1e-12, what="derivative")


_BY_HAND = dict(forbid=["course.micrograd.Value.backward"], task="apply the chain rule by hand")


@exercise("1.1.4", hint="three links in the chain: the square, tanh, and 2x - 1; multiply their local "
                        "derivatives, each taken at its own input",
          answer_hint="with u = 2x - 1: 2 tanh(u) (1 - tanh(u)**2) * 2", **_BY_HAND)
def _(candidate, rng):
    for x in [0.0, 0.5, 1.0, -1.0, *rng.uniform(-2, 2, size=5)]:
        t = math.tanh(2 * x - 1)
        on = f"L(x) = tanh(2x - 1)**2 at x={x:.3g}"
        got = call(candidate, x, on=on)
        # float32 work is right too: 1 - tanh**2 loses digits where tanh is near +-1, up to about 6e-7 in
        # all, far below any mistake (inputs differ when grading)
        expect_close(got, 4 * t * (1 - t * t), on=on, rtol=1e-5, atol=1e-6, what="dL/dx")


# ---- 1.2 backpropagation ----

@exercise("1.2.1", hint="what is the derivative of exp? The chain rule then multiplies it by out_grad",
          answer_hint="math.exp(x) * out_grad", forbid=["course.micrograd.Value.backward"],
          task="write the backward step by hand")
def _(candidate, rng):
    for x, g in [(0.0, 1.0), (1.0, 2.0), (-2.0, 0.5), *zip(rng.uniform(-3, 3, 4), rng.normal(size=4))]:
        on = f"x={x:.3g}, out_grad={g:.3g}"
        got = call(candidate, x, g, on=on)
        expect_close(got, math.exp(x) * g, on=on, rtol=1e-5, atol=1e-7, what="gradient of x")


@exercise("1.2.2", hint="differentiate a**b once with b held fixed (a power) and once with a held fixed "
                        "(a**b = exp(b log a)); multiply both by out_grad",
          answer_hint="grad_a = b * a**(b - 1) * out_grad and grad_b = a**b * math.log(a) * out_grad",
          forbid=["course.micrograd.Value.backward"], task="write the backward step by hand")
def _(candidate, rng):
    cases = [(2.0, 3.0, 1.0), (0.5, -1.0, 2.0), (3.0, 0.5, -1.0)]
    cases += list(zip(rng.uniform(0.2, 3, 4), rng.uniform(-2, 2, 4), rng.normal(size=4)))
    for a, b, g in cases:
        on = f"a={a:.3g}, b={b:.3g}, out_grad={g:.3g}"
        got = call(candidate, a, b, g, on=on)
        expect(isinstance(got, (tuple, list)) or (isinstance(got, np.ndarray) and got.shape == (2,)),
               f"expected a pair (grad_a, grad_b), got a {type(got).__name__} ({got!r:.60}) on {on}")
        expect(len(got) == 2, f"expected a pair (grad_a, grad_b), got {len(got)} values on {on}")
        expect_close(got[0], b * a ** (b - 1) * g, on=on, rtol=1e-5, atol=1e-7, what="grad_a")
        expect_close(got[1], a ** b * math.log(a) * g, on=on, rtol=1e-5, atol=1e-7, what="grad_b")


def _ops_in(root):
    from course.micrograd import topological_order
    return {v._op for v in topological_order(root)}


@exercise("1.2.3", hint="write tanh with exponentials (its definition uses e^x and e^-x), then build that "
                        "with x.exp(), +, -, * and / only",
          answer_hint="e = (2 * x).exp(); return (e - 1) / (e + 1)",
          forbid=["course.micrograd.Value.tanh", "course.micrograd.Value.sigmoid"],
          task="build tanh from x.exp() and arithmetic")
def _(candidate, rng):
    from course.micrograd import topological_order
    Value = _value()
    points = [0.0, 0.5, -1.0, 2.0, *rng.uniform(-3, 3, size=4)]
    results = []
    for x0 in points:  # the values first, at every point: a wrong formula is named as such
        on = f"x = Value({x0:.3g})"
        x = Value(x0)
        y = call(candidate, x, on=on)
        _expect_value(y, on)
        # arithmetic records "+", "*" and "**n" (division is ** -1); a leaf records ""
        other = sorted(op for op in _ops_in(y) if op not in ("", "+", "*", "exp") and not op.startswith("**"))
        expect(not other, f"your expression uses {', '.join(other)} on {on}: build tanh from x.exp() and "
                          f"arithmetic only")
        expect_close(y.data, math.tanh(x0), on=on, rtol=1e-9, atol=1e-12, what="value")
        expect(any(v is x for v in topological_order(y)),
               f"your result is not computed from x with Value operations on {on} (was it made "
               f"from x.data?): backward() cannot reach x")
        results.append((x0, x, y, on))
    for x0, x, y, on in results:
        y.backward()
        expect_close(x.grad, 1 - math.tanh(x0) ** 2, on=on, rtol=1e-7, atol=1e-12,
                     what="gradient d tanh(x)/dx (after backward)")


def _check_order(order, root, on):
    from course.micrograd import topological_order
    expect(isinstance(order, (list, tuple)), f"expected a list of Values, got {type(order).__name__} on {on}")
    expected = topological_order(root)
    position = {}
    for i, v in enumerate(order):
        expect(id(v) not in position, f"a Value appears twice in your order on {on}")
        position[id(v)] = i
    expect(len(order) == len(expected),
           f"expected {len(expected)} Values in the order, got {len(order)} on {on}")
    expect(all(id(v) in position for v in expected), f"your order misses some Values of the graph on {on}")
    for v in order:
        for child in v._prev:
            expect(position[id(child)] < position[id(v)],
                   f"an input comes after the Value made from it (op {v._op!r}) on {on}")


@exercise("1.2.4", hint="count every appearance of a Value in a _prev (a + a uses a twice), walk with a "
                        "stack rather than recursion, and reverse the list at the end",
          answer_hint="count the uses; ready = [root]; pop a ready Value, append it, decrease each input's "
                      "count (once per appearance) and push the inputs that reach 0; return the list reversed",
          forbid=["course.micrograd.topological_order"], task="write Kahn's algorithm")
def _(candidate, rng):
    Value = _value()
    a, b = Value(2.0, label="a"), Value(-3.0, label="b")
    c = a * b + a
    graphs = [("a single Value", a), ("c = a*b + a", c), ("b = a + a; c = b + b", (a + a) + (a + a))]
    d = c
    for k in range(int(rng.integers(5, 10))):
        d = (d * b + c).tanh() if k % 2 else d + a
    graphs.append(("a random expression of a, b, c", d))
    x = Value(0.5)
    chain = x
    for _ in range(20_000):
        chain = chain * 1.0
    graphs.append(("a chain of 20,000 multiplications", chain))
    for on, root in graphs:
        order = call(candidate, root, on=on)
        _check_order(order, root, on)


# ---- 1.3 a neural net ----

def _scores_and_labels(rng, n):
    Value = _value()
    scores = [Value(float(s)) for s in rng.normal(scale=1.5, size=n)]
    labels = [int(v) for v in rng.choice([-1, 1], size=n)]
    return scores, labels


@exercise("1.3.1", hint="one hinge term per example, built from the score Values (so backward reaches them), "
                        "then the mean",
          answer_hint="sum((1 - y * s).relu() for s, y in zip(scores, labels)) * (1 / len(scores))")
def _(candidate, rng):
    Value = _value()
    cases = [([Value(2.0), Value(-0.5), Value(0.3)], [1, -1, -1])]
    cases += [_scores_and_labels(rng, n) for n in (1, 5, 12)]
    for scores, labels in cases:
        on = f"scores {_fmt([s.data for s in scores])}, labels {labels}"
        loss = call(candidate, scores, labels, on=on)
        _expect_value(loss, on)
        margins = [1 - y * s.data for s, y in zip(scores, labels)]
        expect_close(loss.data, sum(max(0.0, m) for m in margins) / len(scores), on=on, what="loss")
        loss.backward()
        grads = [(-y / len(scores) if m > 0 else 0.0) for m, y in zip(margins, labels)]
        expect_close([s.grad for s in scores], grads, on=on, what="gradients of the scores")


@exercise("1.3.2", hint="an example is right when the sign of its score agrees with its label; return a "
                        "fraction, not a count",
          answer_hint="sum((s.data > 0) == (y > 0) for s, y in zip(scores, labels)) / len(labels)")
def _(candidate, rng):
    Value = _value()
    # a fixed case where counting positive scores is not the accuracy: random ones may not tell them apart
    cases = [([Value(2.0), Value(-0.5), Value(0.3), Value(-1.0)], [1, -1, 1, 1])]
    cases += [([Value(0.0), Value(1.0), Value(-2.0)], [-1, 1, -1])]  # a score of 0 is not positive
    cases += [_scores_and_labels(rng, n) for n in (1, 7, 20)]
    for scores, labels in cases:
        on = f"scores {_fmt([s.data for s in scores])}, labels {labels}"
        got = call(candidate, scores, labels, on=on)
        right = sum((s.data > 0) == (y > 0) for s, y in zip(scores, labels))
        zero_positive = sum((s.data >= 0) == (y > 0) for s, y in zip(scores, labels))
        expect(zero_positive == right or np.ndim(got) != 0 or not np.isclose(float(got), zero_positive / len(labels)),
               f"a score of 0 counted as positive on {on}: it is not, so it predicts -1")
        expect_close(got, right / len(labels), on=on, what="accuracy")


@exercise("1.3.3", hint="keep it a Value: square the parameters themselves, not their .data, so that "
                        "backward reaches them",
          answer_hint="alpha * sum(p * p for p in params)")
def _(candidate, rng):
    Value = _value()
    for values in [[1.0, -2.0], [0.5], list(rng.normal(size=6))]:
        for alpha in [1e-4, 0.5]:
            params = [Value(float(v)) for v in values]
            on = f"params {_fmt(values)}, alpha={alpha}"
            penalty = call(candidate, params, alpha, on=on)
            _expect_value(penalty, on)
            expect_close(penalty.data, alpha * sum(v * v for v in values), on=on, what="penalty")
            penalty.backward()
            expect_close([p.grad for p in params], [2 * alpha * v for v in values], on=on,
                         what="gradients of the parameters")


@exercise("1.3.4", hint="move each parameter's .data against its gradient, in place; leave .grad alone",
          answer_hint="for p in params: p.data -= lr * p.grad")
def _(candidate, rng):
    Value = _value()
    for values, grads, lr in [([1.0, -2.0], [0.5, -1.0], 0.1),
                              (list(rng.normal(size=5)), list(rng.normal(size=5)), 0.03)]:
        params = []
        for v, g in zip(values, grads):
            p = Value(float(v))
            p.grad = float(g)
            params.append(p)
        on = f"params {_fmt(values)}, grads {_fmt(grads)}, lr={lr}"
        call(candidate, params, lr, on=on, returns=False)  # it changes the parameters, returns nothing
        expect_close([p.data for p in params], [v - lr * g for v, g in zip(values, grads)], on=on,
                     what="parameters after the step")
        expect_close([p.grad for p in params], grads, on=on, what="grads (the step should not change them)")


@exercise("1.3.5", hint="square each difference, built from the prediction Values, then take the mean",
          answer_hint="sum((p - t) ** 2 for p, t in zip(predictions, targets)) * (1 / len(predictions))")
def _(candidate, rng):
    Value = _value()
    cases = [([1.0, 2.0], [0.0, 2.5]), (list(rng.normal(size=6)), list(rng.normal(size=6)))]
    for preds, targets in cases:
        values = [Value(float(p)) for p in preds]
        targets = [float(t) for t in targets]
        on = f"predictions {_fmt(preds)}, targets {_fmt(targets)}"
        loss = call(candidate, values, targets, on=on)
        _expect_value(loss, on)
        n = len(preds)
        expect_close(loss.data, sum((p - t) ** 2 for p, t in zip(preds, targets)) / n, on=on, what="loss")
        loss.backward()
        expect_close([v.grad for v in values], [2 * (p - t) / n for p, t in zip(preds, targets)], on=on,
                     what="gradients of the predictions")
