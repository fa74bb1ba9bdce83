"""The engine's public extension points: `operation` (an op with its own backward) and the
dispatch point where implementations are swapped."""

import numpy as np
import pytest

import course.tensor.functional as F
from course.tensor import Tensor, dispatch, gradcheck, matmul, operation

pytestmark = pytest.mark.part2


def cube(x):
    """A custom operation written as a learner would: forward and backward side by side."""
    data = x.data ** 3

    def backward(g):
        return g * 3 * x.data ** 2

    return operation("cube", data, (x,), backward)


def scaled_sum(a, b, scale=2.0):
    """Two inputs, one of them optional: backward returns one gradient per input."""
    data = a.data * scale + (b.data if b is not None else 0)
    return operation("scaled_sum", data, (a, b), lambda g: (g * scale, g if b is not None else None))


def test_a_custom_operation_matches_finite_differences():
    rng = np.random.default_rng(0)
    assert gradcheck(cube, rng.normal(size=(3, 4)))
    assert gradcheck(lambda a, b: scaled_sum(a, b, 0.5), rng.normal(size=3), rng.normal(size=3))
    x = Tensor(np.ones(3), requires_grad=True)
    scaled_sum(x, None).sum().backward()
    np.testing.assert_allclose(x.grad, 2.0)


def test_a_custom_operation_used_twice_accumulates():
    x = Tensor(np.array([1.0, 2.0]), requires_grad=True)
    y = cube(x)
    z = y + y  # b = a + a
    w = z + z  # c = b + b
    w.sum().backward()
    np.testing.assert_allclose(x.grad, 4 * 3 * x.data ** 2)


def test_the_result_records_its_op_and_inputs_only_when_needed():
    x = Tensor(np.ones(2), requires_grad=True)
    y = cube(x)
    assert y.op == "cube" and y.inputs == (x,) and y.requires_grad
    c = cube(Tensor(np.ones(2)))
    assert not c.requires_grad and c.inputs == ()
    assert [t.op for t in y.topological_order()] == ["", "cube"]


def test_a_backward_of_the_wrong_shape_or_count_is_named():
    x = Tensor(np.ones((2, 3)), requires_grad=True)
    wrong_shape = operation("squash", x.data.sum(0), (x,), lambda g: g)  # forgot to broadcast back
    with pytest.raises(RuntimeError, match=r"'squash' returned a gradient of shape \(3,\) for input 0, which has shape \(2, 3\)"):
        wrong_shape.sum().backward()
    wrong_count = operation("pair", x.data * 2, (x, x), lambda g: g * 2)
    with pytest.raises(RuntimeError, match="'pair' returned 1 gradients for its 2 inputs"):
        wrong_count.sum().backward()


def test_a_backward_holds_no_reference_to_its_result():
    import gc
    import weakref

    x = Tensor(np.ones(3), requires_grad=True)
    y = F.softmax(cube(x))
    ref = weakref.ref(y)
    gc.disable()
    try:
        del y
        assert ref() is None, "an operation's result was kept alive by a reference cycle"
    finally:
        gc.enable()


def test_dispatch_swaps_an_implementation_inside_the_block_only():
    calls = []

    def my_softmax(x, axis=-1):
        calls.append(x.shape)
        return F.softmax.default(x, axis)

    x = Tensor(np.arange(6.0).reshape(2, 3))
    expected = F.softmax(x).data
    with dispatch.override({"softmax": my_softmax}):
        assert dispatch.current("softmax") is my_softmax
        np.testing.assert_allclose(F.softmax(x).data, expected)
        with dispatch.override({"softmax": F.softmax.default}):  # overrides nest
            F.softmax(x)
        assert dispatch.current("softmax") is my_softmax
        F.softmax(x)
    F.softmax(x)
    assert calls == [(2, 3), (2, 3)]
    assert dispatch.current("softmax") is F.softmax.default


def test_matmul_goes_through_the_dispatch_point():
    seen = []

    def counting_matmul(a, b):
        seen.append((a.shape, b.shape))
        return matmul.default(a, b)

    a, b = Tensor(np.ones((2, 3))), Tensor(np.ones((3, 4)))
    with dispatch.override({"matmul": counting_matmul}):
        c = a @ b
    assert seen == [((2, 3), (3, 4))] and c.shape == (2, 4)
    assert {"matmul", "linear", "softmax", "layer_norm", "scaled_dot_product_attention"} <= set(dispatch.names())


def test_dispatch_names_an_unknown_operation():
    with pytest.raises(KeyError, match="no operation named 'sofmax'; the known ones are .*softmax"):
        with dispatch.override({"sofmax": lambda x: x}):
            pass
