"""ONNX files in minitf (lesson 3.4): every operator read against NumPy, course graphs through
to_onnx and back, the errors a bad file gets, and (with the `reference` extra) models exported by
PyTorch run as onnxruntime runs them, and course graphs run by onnxruntime as Session runs them."""

import math
import warnings

import numpy as np
import pytest

import course.minitf as tf
from course.minitf.onnx_import import CONVERTERS

onnx = pytest.importorskip("onnx", reason="the onnx package is not installed (a dependency of the course)")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from test_part3_gradients import check_grads  # noqa: E402  (tests/ is on the path, as known_wrong is)

pytestmark = pytest.mark.part3

ORT_REASON = "onnxruntime is not installed (optional `reference` extra)"
TORCH_REASON = "PyTorch is not installed (optional `reference` extra)"


# ---------------------------------------------------------------- single-operator files

R = np.random.default_rng(0)
A23 = R.normal(size=(2, 3)).astype(np.float32)
B3 = R.normal(size=3).astype(np.float32)
P23 = R.uniform(0.5, 2.0, size=(2, 3)).astype(np.float32)
X234 = R.normal(size=(2, 3, 4)).astype(np.float32)
W45 = R.normal(size=(4, 5)).astype(np.float32)
X2345 = R.normal(size=(2, 3, 4, 5)).astype(np.float32)
Y2356 = R.normal(size=(2, 3, 5, 6)).astype(np.float32)
G4 = R.normal(size=4).astype(np.float32)
TABLE = R.normal(size=(10, 4)).astype(np.float32)
IDS = np.array([[1, 9, 1], [0, 3, -1]], np.int64)
MASK = R.random(size=(2, 3)) > 0.5
I64 = lambda *v: np.array(v, np.int64)  # noqa: E731


def single_op_file(path, op_type, feeds, attrs=None, constants=None, results=(A23,), opset=20, input_order=None):
    """An ONNX file with one node: `feeds` become graph inputs, `constants` initializers; the
    node reads them in `input_order` (names); its outputs are declared like the arrays `results`."""
    constants = constants or {}
    order = input_order or list(feeds) + list(constants)
    inputs = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(v.dtype), list(v.shape))
              for n, v in feeds.items()]
    outputs = [f"y{k}" for k in range(len(results))]
    node = helper.make_node(op_type, order, outputs, name=f"the_{op_type.lower()}", **(attrs or {}))
    graph = helper.make_graph([node], "one-op", inputs,
                              [helper.make_tensor_value_info(o, helper.np_dtype_to_tensor_dtype(r.dtype), list(r.shape))
                               for o, r in zip(outputs, results)],
                              initializer=[numpy_helper.from_array(np.asarray(v), n) for n, v in constants.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=9)
    onnx.save(model, str(path))
    return path


def _erf(x):
    return np.vectorize(math.erf)(x).astype(x.dtype)


def _gelu(x):
    return 0.5 * x * (1 + _erf(x / np.float32(math.sqrt(2))))


def _gelu_tanh(x):
    return 0.5 * x * (1 + np.tanh(np.float32(math.sqrt(2 / math.pi)) * (x + np.float32(0.044715) * x ** 3)))


def _softmax(x, axis):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def _layer_norm(x, scale, bias, axis):
    axes = tuple(range(axis % x.ndim, x.ndim))
    mean = x.mean(axis=axes, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=axes, keepdims=True)
    return (x - mean) / np.sqrt(var + 1e-5) * scale + bias



# id -> (op_type, feeds, constants, attrs, opset, expected outputs from NumPy)
OP_CASES = {
    "Add": ("Add", {"a": A23, "b": B3}, {}, {}, 20, [A23 + B3]),
    "Sub": ("Sub", {"a": A23, "b": B3}, {}, {}, 20, [A23 - B3]),
    "Mul": ("Mul", {"a": A23, "b": B3}, {}, {}, 20, [A23 * B3]),
    "Div": ("Div", {"a": A23, "b": P23}, {}, {}, 20, [A23 / P23]),
    "Pow": ("Pow", {"a": P23, "b": B3}, {}, {}, 20, [P23 ** B3]),
    "Pow_constant": ("Pow", {"a": A23}, {"two": np.float32(2.0)}, {}, 20, [A23 ** 2]),
    "Neg": ("Neg", {"a": A23}, {}, {}, 20, [-A23]),
    "Sqrt": ("Sqrt", {"a": P23}, {}, {}, 20, [np.sqrt(P23)]),
    "Relu": ("Relu", {"a": A23}, {}, {}, 20, [np.maximum(A23, 0)]),
    "Tanh": ("Tanh", {"a": A23}, {}, {}, 20, [np.tanh(A23)]),
    "Sigmoid": ("Sigmoid", {"a": A23}, {}, {}, 20, [1 / (1 + np.exp(-A23))]),
    "Erf": ("Erf", {"a": X234}, {}, {}, 20, [_erf(X234)]),
    "Gelu": ("Gelu", {"a": X234}, {}, {}, 20, [_gelu(X234)]),
    "Gelu_tanh": ("Gelu", {"a": X234}, {}, {"approximate": "tanh"}, 20, [_gelu_tanh(X234)]),
    "Softmax": ("Softmax", {"a": X234}, {}, {}, 20, [_softmax(X234, -1)]),
    "Softmax_axis1": ("Softmax", {"a": X234}, {}, {"axis": 1}, 13, [_softmax(X234, 1)]),
    # before opset 13, Softmax flattens the axes from `axis` on
    "Softmax_opset11": ("Softmax", {"a": X234}, {}, {"axis": 1}, 11, [_softmax(X234, (1, 2))]),
    "MatMul": ("MatMul", {"a": A23.T.copy(), "b": A23}, {}, {}, 20, [A23.T @ A23]),
    "MatMul_batched": ("MatMul", {"a": X234, "b": W45}, {}, {}, 20, [X234 @ W45]),
    "MatMul_4d": ("MatMul", {"a": X2345, "b": Y2356}, {}, {}, 20, [X2345 @ Y2356]),
    "MatMul_vector": ("MatMul", {"a": G4, "b": W45}, {}, {}, 20, [G4 @ W45]),
    "Gemm": ("Gemm", {"a": A23}, {"w": W45[:, :3].copy(), "c": G4}, {"transB": 1}, 13,
             [A23 @ W45[:, :3].T + G4]),
    "Gemm_alpha_beta_transA": ("Gemm", {"a": A23.T.copy()}, {"w": W45[:3, :], "c": W45[0]},
                               {"transA": 1, "alpha": 0.5, "beta": 2.0}, 13, [0.5 * (A23 @ W45[:3]) + 2 * W45[0]]),
    "ReduceMean": ("ReduceMean", {"a": X234}, {"axes": I64(-1)}, {}, 18, [X234.mean(-1, keepdims=True)]),
    "ReduceMean_attribute": ("ReduceMean", {"a": X234}, {}, {"axes": [0, 2], "keepdims": 0}, 13,
                             [X234.mean((0, 2))]),
    "ReduceSum": ("ReduceSum", {"a": X234}, {"axes": I64(1)}, {"keepdims": 0}, 13, [X234.sum(1)]),
    "ReduceSum_all": ("ReduceSum", {"a": X234}, {}, {}, 13, [X234.sum(keepdims=True)]),
    "LayerNormalization": ("LayerNormalization", {"a": X234}, {"scale": G4, "bias": G4[::-1].copy()},
                           {"epsilon": 1e-5}, 17, [_layer_norm(X234, G4, G4[::-1], -1)]),
    "LayerNormalization_axis1_no_bias": ("LayerNormalization", {"a": X234}, {"scale": X234[0]}, {"axis": 1},
                                         17, [_layer_norm(X234, X234[0], 0, 1)]),
    "Transpose": ("Transpose", {"a": X234}, {}, {"perm": [1, 2, 0]}, 20, [X234.transpose(1, 2, 0)]),
    "Transpose_default": ("Transpose", {"a": X234}, {}, {}, 20, [X234.transpose()]),
    "Reshape": ("Reshape", {"a": X234}, {"shape": I64(0, -1, 2)}, {}, 20, [X234.reshape(2, 6, 2)]),
    "Unsqueeze": ("Unsqueeze", {"a": A23}, {"axes": I64(0, -1)}, {}, 20, [A23[None, :, :, None]]),
    "Unsqueeze_attribute": ("Unsqueeze", {"a": A23}, {}, {"axes": [1]}, 11, [A23[:, None]]),
    "Squeeze": ("Squeeze", {"a": A23[None, :, None]}, {"axes": I64(0, 2)}, {}, 20, [A23]),
    "Squeeze_all": ("Squeeze", {"a": A23[None, :, None]}, {}, {}, 20, [A23]),
    "Concat": ("Concat", {"a": A23, "b": P23}, {}, {"axis": 1}, 20, [np.concatenate([A23, P23], 1)]),
    "Slice": ("Slice", {"a": X234}, {"starts": I64(1, -3), "ends": I64(99, -1), "axes": I64(1, 2)}, {}, 20,
              [X234[:, 1:, -3:-1]]),
    "Gather": ("Gather", {"table": TABLE, "ids": IDS}, {}, {}, 20, [TABLE[IDS]]),
    "Gather_axis1": ("Gather", {"a": X234}, {"i": np.int64(-1)}, {"axis": 1}, 20, [X234[:, -1]]),
    "Identity": ("Identity", {"a": A23}, {}, {}, 20, [A23]),
    "Cast": ("Cast", {"a": A23 * 3}, {}, {"to": TensorProto.INT64}, 20, [(A23 * 3).astype(np.int64)]),
    "Cast_double": ("Cast", {"a": A23}, {}, {"to": TensorProto.DOUBLE}, 20, [A23.astype(np.float64)]),
    "Where": ("Where", {"c": MASK, "a": A23, "b": B3}, {}, {}, 20, [np.where(MASK, A23, B3)]),
    "Shape": ("Shape", {"a": X234}, {}, {}, 20, [I64(2, 3, 4)]),
    "Equal": ("Equal", {"a": np.round(A23)}, {"zero": np.float32(0)}, {}, 20, [np.round(A23) == 0]),
    "Greater": ("Greater", {"a": A23, "b": B3}, {}, {}, 20, [A23 > B3]),
    "Less": ("Less", {"a": A23, "b": B3}, {}, {}, 20, [A23 < B3]),
}
SPLITS = {
    "Split": ("Split", {"a": X234}, {"split": I64(1, 3)}, {"axis": 2}, 13, [X234[..., :1], X234[..., 1:]]),
    "Split_equal": ("Split", {"a": X234}, {}, {"axis": 2, "num_outputs": 2}, 18, [X234[..., :2], X234[..., 2:]]),
}
OP_CASES.update(SPLITS)


def _write_case(tmp_path, case):
    op_type, feeds, constants, attrs, opset, expected = OP_CASES[case]
    order = None
    if op_type == "LayerNormalization" and "bias" not in constants:
        order = ["a", "scale"]
    path = single_op_file(tmp_path / f"{case}.onnx", op_type, feeds, attrs, constants, results=expected,
                          opset=opset, input_order=order)
    return path, feeds, expected


@pytest.mark.parametrize("case", sorted(OP_CASES))
def test_each_operator_against_numpy(tmp_path, case):
    path, feeds, expected = _write_case(tmp_path, case)
    served = tf.InferenceSession(path).run(None, feeds)
    graph, inputs, outputs = tf.from_onnx(path)
    assert [i.name for i in inputs] == list(feeds) and [o.name for o in outputs] == [f"y{k}" for k in range(len(expected))]
    ran = tf.Session(graph).run(outputs, dict(zip(inputs, feeds.values())))
    for got in (served, ran):
        for g, want in zip(got, expected):
            assert g.shape == want.shape and g.dtype == want.dtype, (g.shape, want.shape, g.dtype, want.dtype)
            np.testing.assert_allclose(g, want, rtol=1e-6, atol=1e-6)


def test_the_operators_of_the_brief_are_all_read():
    wanted = ("MatMul Gemm Add Sub Mul Div Pow Sqrt Neg Relu Tanh Sigmoid Erf Gelu Softmax ReduceMean ReduceSum "
              "LayerNormalization Transpose Reshape Unsqueeze Squeeze Concat Gather Constant Identity Cast Where").split()
    assert set(wanted) <= set(CONVERTERS)
    tested = {case[0] for case in OP_CASES.values()} | {"Constant"}  # Constant: test_a_constant_node_...
    assert set(CONVERTERS) - {"Exp", "Log", "Dropout"} <= tested


def test_a_constant_node_and_the_names_of_every_kind_of_value(tmp_path):
    nodes = [helper.make_node("Constant", [], ["c"], value=numpy_helper.from_array(B3)),
             helper.make_node("Mul", ["x", "w"], ["scaled"], name="mul_node"),
             helper.make_node("Add", ["scaled", "c"], ["out"], name="add_node"),
             helper.make_node("Relu", ["out"], ["second"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                              [helper.make_tensor_value_info("second", TensorProto.FLOAT, [2, 3]),
                               helper.make_tensor_value_info("out", TensorProto.FLOAT, [2, 3])],
                              initializer=[numpy_helper.from_array(P23, "w")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "m.onnx")
    g, inputs, outputs = tf.from_onnx(tmp_path / "m.onnx")
    assert [(n.name, n.op) for n in g.nodes] == [("x", "placeholder"), ("w", "constant"), ("c", "constant"),
                                                 ("scaled", "mul"), ("out", "add"), ("second", "relu")]
    assert [o.name for o in outputs] == ["second", "out"]  # the file's order, not the graph's
    assert g.get("x").shape == (2, 3) and g.get("x").attrs["dtype"] == "float32"
    second, out = tf.Session(g).run(outputs, {inputs[0]: A23})
    np.testing.assert_allclose(out, A23 * P23 + B3, rtol=1e-6)
    np.testing.assert_allclose(second, np.maximum(A23 * P23 + B3, 0), rtol=1e-6)


# ---------------------------------------------------------------- gradients of the new operations

GRAD_CASES = {
    "matmul_batched": (lambda a, b: a @ b, [(2, 3, 4), (4, 2)]),
    "matmul_both_batched": (lambda a, b: a @ b, [(2, 3, 4), (1, 4, 2)]),
    "transpose_perm": (lambda a: tf.transpose(a, [2, 0, 1]) * np.arange(24.0).reshape(4, 2, 3), [(2, 3, 4)]),
    "sqrt": (lambda a: tf.sqrt(a * a + 1.0), [(2, 3)]),
    "erf": (lambda a: tf.erf(a) * np.arange(6.0).reshape(2, 3), [(2, 3)]),
    "gelu": (lambda a: tf.gelu(a) * np.arange(6.0).reshape(2, 3), [(2, 3)]),
    "gelu_tanh": (lambda a: tf.gelu(a, approximate="tanh") * np.arange(6.0).reshape(2, 3), [(2, 3)]),
    "layer_norm": (lambda x, s, b: tf.layer_norm(x, s, b) * np.arange(12.0).reshape(3, 4), [(3, 4), (4,), (4,)]),
    "layer_norm_axis1": (lambda x, s, b: tf.layer_norm(x, s, b, axis=1) * np.arange(24.0).reshape(2, 3, 4),
                         [(2, 3, 4), (3, 4), (4,)]),
    "reshape": (lambda a: tf.reshape(a, (3, -1)) * np.arange(6.0).reshape(3, 2), [(2, 3)]),
    "expand_squeeze": (lambda a: tf.squeeze(tf.expand_dims(a, [0, 3]) * np.arange(6.0).reshape(1, 2, 3, 1), [0]),
                       [(2, 3)]),
    "concat": (lambda a, b: tf.concat([a, b, a], axis=1) * np.arange(16.0).reshape(2, 8), [(2, 3), (2, 2)]),
    "slice": (lambda a: tf.slice_along(a, [1, -3], [9, -1], [0, 1]) * np.arange(4.0).reshape(2, 2), [(3, 4)]),
    "gather": (lambda t: tf.gather(t, np.array([[1, 4, 1], [0, -1, 1]])) * np.arange(2.0), [(5, 2)]),
    "gather_axis1": (lambda t: tf.gather(t, np.array([2, 0, 2]), axis=1) * np.arange(9.0).reshape(3, 3), [(3, 4)]),
    "where": (lambda a, b: tf.where(np.array([[True, False, True]]), a, b) * np.arange(6.0).reshape(2, 3),
              [(2, 3), (3,)]),
    "identity_cast": (lambda a: tf.cast(tf.identity(a), "float64") * np.arange(6.0).reshape(2, 3), [(2, 3)]),
}


@pytest.mark.parametrize("case", sorted(GRAD_CASES))
def test_gradient_matches_finite_differences(case, rng):
    build, shapes_ = GRAD_CASES[case]
    check_grads(build, shapes_, rng)


def test_shape_errors_of_the_new_operations_name_both_shapes():
    g = tf.Graph()
    with g.as_default():
        a, b = tf.placeholder((2, 3, 4), name="a"), tf.placeholder((5, 2), name="b")
        with pytest.raises(ValueError, match=r"\(2, 3, 4\) and \(5, 2\).*inner sizes 4 and 5"):
            a @ b
        with pytest.raises(ValueError, match=r"leading \(batch\) axes \(2,\) and \(3,\)"):
            a @ tf.placeholder((3, 4, 1))
        with pytest.raises(ValueError, match=r"\(2, 3, 4\) \(24 values\) cannot be reshaped to \(5, 5\)"):
            tf.reshape(a, (5, 5))
        with pytest.raises(ValueError, match=r"concat along axis 0.*\(2, 3, 4\), \(2, 4, 4\) differ on axis 1"):
            tf.concat([a, tf.placeholder((2, 4, 4))], axis=0)
        with pytest.raises(ValueError, match=r"perm \[0, 1\] is not an order of the 3 axes"):
            tf.transpose(a, [0, 1])


# ---------------------------------------------------------------- course graphs through to_onnx and back

def mlp_graph(dtype=np.float64):
    rng = np.random.default_rng(0)
    g = tf.Graph()
    with g.as_default():
        x = tf.placeholder((None, 2), name="x")
        w = tf.Variable(rng.normal(size=(2, 8)).astype(dtype), name="layer/w")
        b = tf.Variable(np.zeros(8, dtype), name="layer/b")
        h = tf.tanh(x @ w + b, name="hidden")
        v = tf.Variable(rng.normal(size=(8, 3)).astype(dtype), name="out/w")
        probs = tf.softmax(tf.relu(h @ v) * 2.0 - tf.sigmoid(h @ v) / 3.0, name="probs")
        mean_log = tf.reduce_mean(tf.log(probs + 1.0), axis=1, keepdims=True, name="mean_log")
        loss = -tf.reduce_mean(tf.log(probs))
        tf.GradientDescentOptimizer(0.1).minimize(loss)
    return g, ["probs", "mean_log"], {"x": rng.normal(size=(5, 2)).astype(dtype)}


def block_graph(dtype=np.float32):
    """A pre-LN transformer block on token ids, written with minitf's own operations."""
    rng = np.random.default_rng(1)
    B, T, C, H = 2, 4, 8, 2
    p = lambda *s: (rng.normal(size=s) * 0.3).astype(dtype)  # noqa: E731
    g = tf.Graph()
    with g.as_default():
        ids = tf.placeholder((B, T), name="ids")
        x = tf.gather(tf.constant(p(11, C), name="wte"), ids, name="embed") + tf.constant(p(T, C), name="wpe")
        h = tf.layer_norm(x, tf.constant(1 + p(C)), tf.constant(p(C)), name="ln_1")
        qkv = h @ tf.constant(p(C, 3 * C), name="c_attn")
        heads = []
        for k in range(3):
            part = tf.slice_along(qkv, [k * C], [(k + 1) * C], [2])
            heads.append(tf.transpose(tf.reshape(part, (B, T, H, C // H)), [0, 2, 1, 3]))
        q, kk, v = heads
        att = q @ tf.transpose(kk, [0, 1, 3, 2]) * (1.0 / math.sqrt(C // H))
        causal = tf.equal(tf.constant(np.tril(np.ones((T, T), dtype))), 1.0)
        att = tf.softmax(tf.where(causal, att, tf.constant(np.asarray(-1e9, dtype))), name="att")
        y = tf.reshape(tf.transpose(att @ v, [0, 2, 1, 3]), (B, T, C))
        x = x + y @ tf.constant(p(C, C), name="c_proj")
        m = tf.gelu(tf.layer_norm(x, tf.constant(1 + p(C)), tf.constant(p(C)), name="ln_2") @ tf.constant(p(C, 4 * C)))
        out = tf.add(x, m @ tf.constant(p(4 * C, C)), name="out")
        tf.reduce_sum(tf.sqrt(tf.square(tf.squeeze(tf.expand_dims(out, [0]), [0])) + 1.0), axis=-1, name="norms")
    return g, ["out", "norms"], {"ids": np.array([[1, 2, 3, 4], [10, 0, 0, 7]], np.int64)}


GRAPHS = {"mlp": mlp_graph, "mlp_float32": lambda: mlp_graph(np.float32), "block": block_graph}
# The float type of each graph's file: float32 weights make a float32 file, although Session computes
# `h * 2.0` in float64 (2.0 is a float64 constant): the results agree up to float32 rounding.
FILE_DTYPE = {"mlp": np.float64, "mlp_float32": np.float32, "block": np.float32}


def _close(got, want, dtype):
    assert got.dtype == dtype and got.shape == want.shape, (got.dtype, dtype, got.shape, want.shape)
    tol = 1e-12 if dtype == np.float64 else 2e-5
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


@pytest.mark.parametrize("optimized", [False, True], ids=["as built", "optimized"])
@pytest.mark.parametrize("which", sorted(GRAPHS))
def test_course_graphs_round_trip_through_onnx(tmp_path, which, optimized):
    g, outputs, feeds = GRAPHS[which]()
    if optimized:
        g = tf.optimize(g, outputs)
        assert "fused" in g.count_ops()
    want = tf.Session(g).run(outputs, feeds)
    path = tf.to_onnx(g, outputs, tmp_path / "m.onnx")
    back, inputs, outs = tf.from_onnx(path)
    assert [i.name for i in inputs] == list(feeds) and [o.name for o in outs] == outputs
    got = tf.Session(back).run(outs, dict(zip(inputs, feeds.values())))
    served = tf.InferenceSession(path).run(outputs, feeds)
    for a, b, w in zip(got, served, want):
        _close(a, w, FILE_DTYPE[which])
        np.testing.assert_array_equal(a, b)


def test_to_onnx_declares_the_inputs_asked_for(tmp_path):
    g, outputs, feeds = mlp_graph()
    with g.as_default():
        tf.placeholder((3,), name="unused")
    model = onnx.load(tf.to_onnx(g, ["probs"], tmp_path / "m.onnx", inputs=["unused", "x"]))
    assert [i.name for i in model.graph.input] == ["unused", "x"]
    dims = model.graph.input[1].type.tensor_type.shape.dim
    assert dims[0].dim_param == "x_dim0" and dims[1].dim_value == 2
    with pytest.raises(ValueError, match="the outputs need the placeholder 'x', which is not among the inputs"):
        tf.to_onnx(g, ["probs"], tmp_path / "m.onnx", inputs=["unused"])


def test_to_onnx_refuses_training_and_gradient_nodes(tmp_path):
    g, outputs, feeds = mlp_graph()
    with pytest.raises(ValueError, match="node 'GradientDescent.*' is a training operation"):
        tf.to_onnx(g, ["GradientDescent"], tmp_path / "m.onnx")
    with pytest.raises(ValueError, match=r"\((unbroadcast|broadcast_like)\) only computes gradients"):
        tf.to_onnx(g, [n for n in g.nodes if n.op == "unbroadcast"][:1], tmp_path / "m.onnx")


# ---------------------------------------------------------------- the file shipped with the course

def test_the_shipped_pytorch_model_gives_pytorchs_outputs():
    from course.data import onnx_example

    path, x, y_torch = onnx_example()
    graph, inputs, outputs = tf.from_onnx(path)
    assert [i.name for i in inputs] == ["x"] and [o.name for o in outputs] == ["y"]
    got = tf.Session(graph).run(outputs[0], {inputs[0]: x})
    np.testing.assert_allclose(got, y_torch, rtol=1e-4, atol=1e-5)
    small = tf.optimize(graph, outputs)
    assert len(small) < len(graph)
    np.testing.assert_allclose(tf.Session(small).run("y", {"x": x}), got, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(tf.InferenceSession(path).run("y", {"x": x}), got, rtol=1e-6, atol=1e-7)


def test_gradients_flow_through_the_imported_block(rng):
    # An imported graph is an ordinary graph: tf.gradients differentiates it (in float64 here, for
    # finite differences), through layer_norm, slice, reshape, transpose, where, softmax and gelu.
    from course.data import onnx_example

    path, x, _ = onnx_example()
    graph, inputs, outputs = tf.from_onnx(path)
    for node in graph.nodes:
        if node.op == "constant" and node.value.dtype == np.float32:
            node.value = node.value.astype(np.float64)
    weights = rng.normal(size=(2, 8, 16))
    with graph.as_default():
        loss = tf.reduce_sum(tf.square(outputs[0]) * weights)
        dx = tf.gradients(loss, inputs[0])
    sess = tf.Session(graph)
    x = x.astype(np.float64)
    got = sess.run(dx, {inputs[0]: x})
    assert got.shape == x.shape and np.abs(got).max() > 0.1
    for _ in range(8):
        i = tuple(int(rng.integers(0, n)) for n in x.shape)
        up, down = x.copy(), x.copy()
        up[i] += 1e-6
        down[i] -= 1e-6
        numeric = (sess.run(loss, {inputs[0]: up}) - sess.run(loss, {inputs[0]: down})) / 2e-6
        assert np.isclose(got[i], numeric, rtol=1e-5, atol=1e-6), (i, got[i], numeric)


def test_serving_an_onnx_file_loads_no_training_module(tmp_path):
    import subprocess
    import sys

    from course.data import onnx_example

    path, x, _ = onnx_example()
    code = ("import sys, numpy as np\n"
            "from course.minitf.runtime import InferenceSession\n"
            f"InferenceSession({str(path)!r}).run('y', {{'x': np.zeros((2, 8, 16), np.float32)}})\n"
            "print(' '.join(sorted(m for m in sys.modules if m.startswith('course.minitf'))))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert "course.minitf.onnx_import" in loaded
    for training in ("autodiff", "train", "session", "compiler", "onnx_export"):
        assert f"course.minitf.{training}" not in loaded, training


# ---------------------------------------------------------------- errors

def test_an_unsupported_operator_names_the_node_its_type_and_the_opset(tmp_path):
    path = single_op_file(tmp_path / "m.onnx", "Floor", {"a": A23}, opset=17)
    for open_it in (tf.from_onnx, tf.InferenceSession):
        with pytest.raises(ValueError, match=r"m.onnx: node 'the_floor' \(Floor, opset 17\) is not supported by "
                                             r"minitf: it reads .*Gemm"):
            open_it(path)


def test_an_operator_of_another_domain_is_named(tmp_path):
    node = helper.make_node("FusedGemm", ["a", "a"], ["y0"], name="ms_gemm", domain="com.microsoft")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("a", TensorProto.FLOAT, [2, 2])],
                              [helper.make_tensor_value_info("y0", TensorProto.FLOAT, [2, 2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    onnx.save(model, tmp_path / "m.onnx")  # the checker cannot check an unknown domain: skip it here
    with pytest.raises(ValueError, match=r"node 'ms_gemm' \(FusedGemm, opset 17\) is in the operator domain "
                                         r"'com.microsoft'"):
        tf.from_onnx(tmp_path / "m.onnx")


def dynamic_reshape_file(path):
    # What an exporter writes for x.view(x.size(0), -1) with a dynamic batch: Shape, Gather, Concat, Reshape.
    nodes = [helper.make_node("Shape", ["x"], ["shape"]),
             helper.make_node("Gather", ["shape", "zero"], ["batch"], axis=0),
             helper.make_node("Unsqueeze", ["batch", "axes0"], ["batch1"]),
             helper.make_node("Concat", ["batch1", "minus_one"], ["target"], axis=0),
             helper.make_node("Reshape", ["x", "target"], ["y"], name="flatten")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 12])],
                              initializer=[numpy_helper.from_array(np.int64(0), "zero"),
                                           numpy_helper.from_array(I64(0), "axes0"),
                                           numpy_helper.from_array(I64(-1), "minus_one")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_a_dynamic_shape_is_refused_naming_the_input(tmp_path):
    path = dynamic_reshape_file(tmp_path / "dyn.onnx")
    for open_it in (tf.from_onnx, tf.InferenceSession):
        with pytest.raises(ValueError, match=r"dyn.onnx: the graph has dynamic shapes.*node 'shape' \(Shape, opset "
                                             r"17\) needs the shape of 'x'.*the input 'x' \(shape \('batch', 3, 4\)\)"
                                             r".*input_shapes=\{'x'"):
            open_it(path)
    # with the size given, the same file runs (and the shape computation folds away)
    g, inputs, outputs = tf.from_onnx(path, input_shapes={"x": (2, 3, 4)})
    np.testing.assert_array_equal(tf.Session(g).run(outputs[0], {inputs[0]: X234}), X234.reshape(2, 12))
    with pytest.raises(KeyError, match="no input named 'z'"):
        tf.from_onnx(path, input_shapes={"z": (1,)})


def test_a_dynamic_batch_that_needs_no_static_value_runs(tmp_path):
    node = helper.make_node("Gemm", ["x", "w"], ["y"], transB=1)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 2])],
                              initializer=[numpy_helper.from_array(A23, "w")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "m.onnx")
    sess = tf.InferenceSession(tmp_path / "m.onnx")
    assert sess.input_shapes == {"x": (None, 3)} and sess.input_names == ["x"] and sess.output_names == ["y"]
    for n in (1, 7):
        x = np.ones((n, 3), np.float32)
        np.testing.assert_allclose(sess.run("y", {"x": x}), x @ A23.T, rtol=1e-6)
    y64 = sess.run("y", {"x": np.ones((2, 3))})  # float64 fed to a float32 file: computed as the file says
    assert y64.dtype == np.float32


def _exported(tmp_path):
    g, outputs, feeds = mlp_graph()
    return tf.to_onnx(g, outputs, tmp_path / "m.onnx")


@pytest.mark.parametrize("open_it", [tf.from_onnx, tf.InferenceSession])
def test_a_truncated_file_is_named(tmp_path, open_it):
    path = _exported(tmp_path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match=r"m.onnx is not a (readable|valid) ONNX model \(truncated or corrupt\?\)"):
        open_it(path)


@pytest.mark.parametrize("open_it", [tf.from_onnx, tf.InferenceSession])
def test_a_file_that_is_not_onnx_is_named(tmp_path, open_it):
    path = tmp_path / "notes.onnx"
    path.write_text('{"format": "minitf-graph", "nodes": []}\n')
    with pytest.raises(ValueError, match=r"notes.onnx is not .*ONNX model"):
        open_it(path)
    folder = tmp_path / "saved.onnx"
    folder.mkdir()
    with pytest.raises(ValueError, match="saved.onnx is a folder, not an ONNX file"):
        open_it(folder)
    with pytest.raises(FileNotFoundError, match="no ONNX file at .*missing.onnx"):
        open_it(tmp_path / "missing.onnx")


def test_a_node_reading_a_missing_value_is_named(tmp_path):
    node = helper.make_node("Add", ["a", "ghost"], ["y0"], name="adder")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("a", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y0", TensorProto.FLOAT, [2])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "m.onnx")
    with pytest.raises(ValueError, match=r"m.onnx is not a valid ONNX model.*ghost"):
        tf.from_onnx(tmp_path / "m.onnx")


# ---------------------------------------------------------------- against onnxruntime and PyTorch

@pytest.mark.reference
@pytest.mark.parametrize("case", sorted(OP_CASES))
def test_the_numpy_meaning_of_each_operator_is_onnxruntimes(tmp_path, case):
    ort = pytest.importorskip("onnxruntime", reason=ORT_REASON)
    path, feeds, expected = _write_case(tmp_path, case)
    for got, want in zip(ort.InferenceSession(str(path)).run(None, feeds), expected):
        assert got.shape == want.shape and got.dtype == want.dtype
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.reference
@pytest.mark.parametrize("optimized", [False, True], ids=["as built", "optimized"])
@pytest.mark.parametrize("which", sorted(GRAPHS))
def test_onnxruntime_runs_course_graphs_as_session_does(tmp_path, which, optimized):
    ort = pytest.importorskip("onnxruntime", reason=ORT_REASON)
    g, outputs, feeds = GRAPHS[which]()
    if optimized:
        g = tf.optimize(g, outputs)
    want = tf.Session(g).run(outputs, feeds)
    path = tf.to_onnx(g, outputs, tmp_path / "m.onnx")
    got = ort.InferenceSession(str(path)).run(outputs, feeds)
    for a, w in zip(got, want):
        _close(a, w, FILE_DTYPE[which])
    if which == "mlp_float32":
        # asked for, the file is float64 (the Session computed the first layer in float32, so they agree
        # to float32 rounding; not for the block: onnxruntime has no float64 Erf, which its Gelu uses)
        path = tf.to_onnx(g, outputs, tmp_path / "m64.onnx", dtype="float64")
        feeds64 = {k: v.astype(np.float64) for k, v in feeds.items()}
        for a, w in zip(ort.InferenceSession(str(path)).run(outputs, feeds64), want):
            assert a.dtype == np.float64
            np.testing.assert_allclose(a, w, rtol=1e-6, atol=1e-6)


def _torch_models(torch):
    nn = torch.nn

    class Block(nn.Module):
        """minGPT's pre-LN block: x + attn(ln_1(x)), then x + mlp(ln_2(x)), causal self-attention."""

        def __init__(self, n_embd=16, n_head=2, block_size=8):
            super().__init__()
            self.n_head = n_head
            self.ln_1, self.ln_2 = nn.LayerNorm(n_embd), nn.LayerNorm(n_embd)
            self.c_attn, self.c_proj = nn.Linear(n_embd, 3 * n_embd), nn.Linear(n_embd, n_embd)
            self.mlp = nn.Sequential(nn.Linear(n_embd, 4 * n_embd), nn.GELU(), nn.Linear(4 * n_embd, n_embd))
            self.register_buffer("bias", torch.tril(torch.ones(block_size, block_size)).view(1, 1, block_size, block_size))

        def forward(self, x):
            B, T, C = x.size()
            q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
            q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
            att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf")).softmax(dim=-1)
            y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
            x = x + self.c_proj(y)
            return x + self.mlp(self.ln_2(x))

    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 16), nn.Sigmoid(),
                        nn.Linear(16, 4), nn.Softmax(dim=-1))
    return {"mlp": (mlp.eval(), (3, 6)), "block": (Block().eval(), (2, 8, 16)),
            "block_tanh_gelu": (_with_tanh_gelu(Block().eval(), nn), (1, 5, 16))}


def _with_tanh_gelu(block, nn):
    block.mlp[1] = nn.GELU(approximate="tanh")
    return block


@pytest.mark.reference
@pytest.mark.parametrize("dynamo", [True, False], ids=["torch.export", "torchscript"])
@pytest.mark.parametrize("which", ["mlp", "block", "block_tanh_gelu"])
def test_models_exported_by_pytorch_run_as_onnxruntime_runs_them(tmp_path, which, dynamo):
    torch = pytest.importorskip("torch", reason=TORCH_REASON)
    ort = pytest.importorskip("onnxruntime", reason=ORT_REASON)
    if dynamo:
        pytest.importorskip("onnxscript", reason="PyTorch's torch.export-based ONNX exporter needs onnxscript")
    model, shape = _torch_models(torch)[which]
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(1))
    path = tmp_path / f"{which}.onnx"
    options = {"dynamo": True} if dynamo else {"dynamo": False, "opset_version": 17}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (x,), str(path), input_names=["x"], output_names=["y"], **options)
    want = ort.InferenceSession(str(path)).run(None, {"x": x.numpy()})[0]
    with torch.no_grad():
        np.testing.assert_allclose(want, model(x).numpy(), rtol=1e-4, atol=1e-5)  # the export itself is right
    graph, inputs, outputs = tf.from_onnx(path)
    got = tf.Session(graph).run(outputs[0], {inputs[0]: x.numpy()})
    assert got.dtype == np.float32 and got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    optimized = tf.optimize(graph, outputs)
    np.testing.assert_allclose(tf.Session(optimized).run("y", {"x": x.numpy()}), want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(tf.InferenceSession(path).run("y", {"x": x.numpy()}), want, rtol=1e-5, atol=1e-5)
    # and back out: the course's file of the imported model runs in onnxruntime too
    again = tf.to_onnx(optimized, ["y"], tmp_path / "again.onnx")
    np.testing.assert_allclose(ort.InferenceSession(str(again)).run(None, {"x": x.numpy()})[0], want,
                               rtol=1e-5, atol=1e-5)


@pytest.mark.reference
def test_pytorch_exports_with_a_dynamic_batch(tmp_path):
    # The TorchScript exporter writes x.view(B, T, ...) as Shape -> Gather -> Concat -> Reshape: refused,
    # naming the input, until its size is given. torch.export writes the open batch as a -1 in the
    # target shape: that file runs at any batch size.
    torch = pytest.importorskip("torch", reason=TORCH_REASON)
    ort = pytest.importorskip("onnxruntime", reason=ORT_REASON)
    models = _torch_models(torch)
    block, shape = models["block"]
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(2))
    path = tmp_path / "block.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(block, (x,), str(path), input_names=["x"], output_names=["y"], dynamo=False,
                          opset_version=17, dynamic_axes={"x": {0: "batch"}})
    with pytest.raises(ValueError, match=r"dynamic shapes.*\(Shape, opset 17\).*the input 'x' \(shape \('batch', 8, 16\)\)"):
        tf.from_onnx(path)
    graph, inputs, outputs = tf.from_onnx(path, input_shapes={"x": tuple(shape)})
    want = ort.InferenceSession(str(path)).run(None, {"x": x.numpy()})[0]
    np.testing.assert_allclose(tf.Session(graph).run(outputs[0], {inputs[0]: x.numpy()}), want, rtol=1e-5, atol=1e-5)

    pytest.importorskip("onnxscript", reason="PyTorch's torch.export-based ONNX exporter needs onnxscript")
    for which in ("block", "mlp"):
        model, shape = models[which]
        path = tmp_path / f"{which}_dynamo.onnx"
        batch = torch.export.Dim("batch")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(model, (torch.randn(*shape),), str(path), input_names=["x"], output_names=["y"],
                              dynamo=True, dynamic_shapes=({0: batch},))
        server = tf.InferenceSession(path)
        assert server.input_shapes["x"][0] is None
        for n in (1, 5):
            xb = np.random.default_rng(n).normal(size=(n,) + tuple(shape[1:])).astype(np.float32)
            want = ort.InferenceSession(str(path)).run(None, {"x": xb})[0]
            np.testing.assert_allclose(server.run("y", {"x": xb}), want, rtol=1e-5, atol=1e-5)


def test_every_unsupported_operator_is_named_at_once(tmp_path):
    nodes = [helper.make_node("Floor", ["a"], ["f"], name="down"), helper.make_node("Relu", ["f"], ["r"], name="ok"),
             helper.make_node("Ceil", ["r"], ["c"], name="up"), helper.make_node("Floor", ["c"], ["y0"], name="again")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("a", TensorProto.FLOAT, [2, 3])],
                              [helper.make_tensor_value_info("y0", TensorProto.FLOAT, [2, 3])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "m.onnx")
    with pytest.raises(ValueError, match=r"node 'down' \(Floor, opset 17\) is not supported by minitf; in all the "
                                         r"file uses 2 operators that minitf does not implement, in 3 nodes: Ceil, "
                                         r"Floor: it reads"):
        tf.from_onnx(tmp_path / "m.onnx")
