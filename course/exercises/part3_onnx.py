"""Checks for the exercises of lesson 3.4 (models from elsewhere: ONNX). Loaded with part3.py."""

import numpy as np

from course.exercises import CheckFailed, call, exercise, expect, expect_close


# ---------------------------------------------------------------- 3.4.1

@exercise("3.4.1", hint="transpose A and B first when asked, then multiply; alpha scales the product only and beta "
                        "scales C only, and C may be absent",
          answer_hint="a2 = a.T if trans_a else a; b2 = b.T if trans_b else b; y = alpha * (a2 @ b2); "
                      "return y if c is None else y + beta * c")
def _(candidate, rng):
    a = rng.normal(size=(3, 4))
    b = rng.normal(size=(4, 5))
    c = rng.normal(size=5)
    cases = [
        ("plain A @ B + C", (a, b, c), {}, a @ b + c),
        ("trans_b=True (B given as (N, K), as PyTorch's Linear weight)", (a, b.T.copy(), c), {"trans_b": True},
         a @ b + c),
        ("trans_a=True", (a.T.copy(), b, c), {"trans_a": True}, a @ b + c),
        ("alpha=0.5, beta=2.0", (a, b, c), {"alpha": 0.5, "beta": 2.0}, 0.5 * (a @ b) + 2.0 * c),
        ("no C", (a, b), {"alpha": 3.0}, 3.0 * (a @ b)),
        ("alpha=2.0, beta=0.0 (C ignored)", (a, b, c), {"alpha": 2.0, "beta": 0.0}, 2.0 * (a @ b)),
        ("square matrices, trans_a and trans_b", (a[:3, :3].copy(), b[:3, :3].copy(), c[:3].copy()),
         {"trans_a": True, "trans_b": True, "beta": -1.0}, a[:3, :3].T @ b[:3, :3].T - c[:3]),
    ]
    for on, args, kwargs, want in cases:
        before = [x.copy() for x in args]
        got = call(candidate, *args, on=on, **kwargs)
        expect_close(got, want, on=on)
        expect(all(np.array_equal(x, y) for x, y in zip(args, before)), f"your function changed its inputs on {on}")


# ---------------------------------------------------------------- 3.4.2

@exercise("3.4.2", hint="first copy the input's size wherever the target says 0, then give the -1 whatever size "
                        "makes the number of values the same",
          answer_hint="dims = [input_shape[i] if d == 0 else d for i, d in enumerate(target)]; "
                      "if -1 in dims: dims[dims.index(-1)] = prod(input_shape) // prod(d for d in dims if d != -1)")
def _(candidate, rng):
    cases = [
        ((2, 3, 4), (0, -1), (2, 12)),
        ((2, 3, 4), (0, 0, 2, 2), (2, 3, 2, 2)),
        ((2, 3, 4), (-1, 0), (8, 3)),          # the 0 copies axis 1 of the input, then -1 is 24 / 3
        ((2, 3, 4), (4, 6), (4, 6)),
        ((6,), (-1, 2), (3, 2)),
        ((1, 8, 16), (0, 0, 2, -1), (1, 8, 2, 8)),
        ((5, 1), (-1,), (5,)),
    ]
    for _ in range(3):
        shape = tuple(int(v) for v in rng.integers(2, 6, size=3))
        cases.append((shape, (0, -1), (shape[0], shape[1] * shape[2])))
    for shape, target, want in cases:
        on = f"input shape {shape}, target {target}"
        got = call(candidate, shape, target, on=on)
        try:
            sizes = list(got)
        except TypeError:
            raise CheckFailed(f"expected a tuple of sizes on {on}, got {got!r}") from None
        odd = [d for d in sizes if isinstance(d, bool) or not isinstance(d, (int, np.integer))]
        expect(not odd, f"every size must be an int, got {odd[0]!r} ({type(odd[0]).__name__}) in {got!r} on {on}: "
                        f"np.reshape refuses it" if odd else "")
        got = tuple(int(d) for d in sizes)
        expect(got == want, f"expected {want}, got {got} on {on}")


# ---------------------------------------------------------------- 3.4.3

def _models():
    import course.nn as nn
    import course.tensor.functional as F

    F.manual_seed(3)
    return [
        ("Linear(5, 3)", nn.Sequential(nn.Linear(5, 3)), 5),
        ("Linear(4, 6), ReLU, Linear(6, 2)", nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 2)), 4),
        ("Linear(3, 3), Tanh, Dropout(0.5), Linear(3, 4), ReLU",
         nn.Sequential(nn.Linear(3, 3), nn.Tanh(), nn.Dropout(0.5), nn.Linear(3, 4), nn.ReLU()), 3),
        ("Linear(6, 4, bias=False), Tanh", nn.Sequential(nn.Linear(6, 4, bias=False), nn.Tanh()), 6),
    ]


@exercise("3.4.3", hint="one placeholder (None, in_features) named 'x'; then per layer: a Linear is x @ W.T + b (its "
                        "weight is (out, in), as in PyTorch; the bias may be None), the activations have minitf "
                        "functions, and a Dropout does nothing at inference",
          answer_hint="for layer in model: if Linear: h = h @ tf.constant(layer.weight.data.T) (+ "
                      "tf.constant(layer.bias.data) when there is one); ReLU/Tanh: tf.relu/tf.tanh; "
                      "Dropout: skip. Return (graph, x, h)")
def _(candidate, rng):
    import course.minitf as tf
    from course.tensor import Tensor, no_grad

    for on_model, model, n_in in _models():
        on = f"the model {on_model}"
        model.eval()
        result = call(candidate, model, on=on)
        if not isinstance(result, tuple) or len(result) != 3:
            raise CheckFailed(f"expected (graph, x, output) on {on}, got {result!r:.80}")
        graph, x, y = result
        expect(isinstance(graph, tf.Graph), f"the first item should be the Graph, got {type(graph).__name__} on {on}")
        expect(isinstance(x, tf.Node) and x.op == "placeholder" and x.name == "x",
               f"the second item should be the placeholder named 'x' on {on}, got {x!r:.80}")
        expect(isinstance(y, tf.Node) and y.graph is graph and x.graph is graph,
               f"the output should be a node of the graph you return on {on}")
        feeds = [np.zeros((1, n_in), np.float32), rng.normal(size=(7, n_in)).astype(np.float32)]
        for batch in feeds:
            with no_grad():
                want = model(Tensor(batch)).data
            try:
                got = tf.Session(graph).run(y, {x: batch})
            except Exception as err:
                raise CheckFailed(f"running your graph on {on} with a batch of {len(batch)} raised "
                                  f"{type(err).__name__}: {err}") from None
            expect_close(got, want, on=f"{on}, a batch of {len(batch)}", rtol=1e-5, atol=1e-6, what="output")
