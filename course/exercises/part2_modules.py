"""Checks of the modules that lesson 2.2 has the learner write on `course.nn.Module`: a Sequential
(2.2.5) and loading a state by name (2.2.6). `part2` imports this module, which registers them."""

import numpy as np

from . import call, exercise, expect, expect_close
from ._core import class_names


def _forward_of(layers, x):
    for layer in layers:
        x = layer(x)
    return x


@exercise("2.2.5", hint="a Module finds parameters only in attributes that hold a Parameter or a Module; "
                        "forward hands x to the layers in the order they were given",
          answer_hint="after super().__init__(), store layer i with setattr(self, str(i), layer); in forward, "
                      "loop over self.named_children() and pass x through each",
          forbid=["course.nn.Sequential"], task="write a Sequential on nn.Module")
def _(candidate, rng):
    import course.nn as nn
    from course.tensor import Tensor

    ancestors = class_names(candidate) or []
    expect("course.nn:Module" in ancestors,
           "pass your class itself (not an instance), written as a subclass of nn.Module")
    expect("course.nn:Sequential" not in ancestors,
           "your class is built on nn.Sequential, which is what this exercise asks you to write: "
           "subclass nn.Module")
    first, second = nn.Linear(3, 5, rng=rng), nn.Linear(5, 2, rng=rng)
    layers = [first, nn.ReLU(), second]
    on = "Sequential(Linear(3, 5), ReLU(), Linear(5, 2))"
    seq = call(candidate, *layers, on=on)
    expect(getattr(seq, "training", None) is True,
           f"a new module starts in training mode (`training` is True), yours does not on {on}: "
           f"call super().__init__() first in __init__")
    names = [n for n, _ in seq.named_parameters()]
    wanted = ["0.weight", "0.bias", "2.weight", "2.bias"]
    expect(names == wanted, f"named_parameters() gives {names}, expected {wanted} on {on}")
    expect(all(p is q for p, q in zip(seq.parameters(), [first.weight, first.bias, second.weight, second.bias])),
           f"the parameters should be the layers' own Parameters, not copies, on {on}")
    x = Tensor(rng.normal(size=(4, 3)).astype(np.float32))
    got = call(seq, x, on=f"{on} called on a (4, 3) batch")
    expect(got is not None, f"calling your module returned None on {on}: forward must return the output")
    expect(isinstance(got, Tensor), f"calling your module returned a {type(got).__name__}, expected a Tensor, "
                                     f"on {on}")
    expect_close(got.data, _forward_of(layers, x).data, on=f"{on} called on a (4, 3) batch", rtol=1e-5,
                 atol=1e-6, what="output")
    seq.eval()
    expect(all(not m.training for m in layers), f"seq.eval() should switch every layer to eval mode on {on}")

    inner = [nn.Linear(2, 3, rng=rng), nn.Tanh()]
    head = nn.Linear(3, 1, rng=rng)
    on = "Sequential(Sequential(Linear(2, 3), Tanh()), Linear(3, 1))"
    nested = call(candidate, call(candidate, *inner, on=on), head, on=on)
    names = [n for n, _ in nested.named_parameters()]
    wanted = ["0.0.weight", "0.0.bias", "1.weight", "1.bias"]
    expect(names == wanted, f"named_parameters() gives {names}, expected {wanted} on {on}")
    x = Tensor(rng.normal(size=(5, 2)).astype(np.float32))
    got = call(nested, x, on=on)
    expect(isinstance(got, Tensor), f"calling your module returned {type(got).__name__}, expected a Tensor, "
                                     f"on {on}")
    expect_close(got.data, head(_forward_of(inner, x)).data, on=on, rtol=1e-5, atol=1e-6, what="output")

    on = "Sequential() (no layers)"
    empty = call(candidate, on=on)
    got = call(empty, x, on=on)
    expect(got is x or (isinstance(got, Tensor) and np.array_equal(got.data, x.data)),
           f"with no layers the module should return its input unchanged on {on}")


def _small_model(rng):
    import course.nn as nn

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.hidden = nn.Linear(3, 4, rng=rng)
            self.out = nn.Linear(4, 2, rng=rng)

        def forward(self, x):
            return self.out(self.hidden(x).relu())

    return Net()


@exercise("2.2.6", hint="look every name and shape over before copying anything; then give each parameter "
                        "its own copy of the array, in the parameter's dtype",
          answer_hint="params = dict(module.named_parameters()); list the missing, unexpected and misshapen names "
                      "and raise ValueError(...) naming them if any; then p.data = np.array(state[name], "
                      "dtype=p.data.dtype) for each parameter",
          forbid=["course.nn.Module.load_state_dict"], task="load the state yourself")
def _(candidate, rng):
    from . import CheckFailed

    model = _small_model(rng)
    params = dict(model.named_parameters())
    state = {name: rng.normal(size=p.shape) for name, p in params.items()}  # float64 arrays
    on = "a state of float64 arrays for a float32 model"
    call(candidate, model, {k: v.copy() for k, v in state.items()}, on=on, returns=False)
    for name, p in params.items():
        expect(p.data.dtype == np.float32,
               f"parameter {name} became {p.data.dtype} on {on}: a parameter keeps its dtype (float32)")
        expect_close(p.data, state[name].astype(np.float32), on=f"{on}, parameter {name}", what="values")

    given = {k: v.astype(np.float32) for k, v in state.items()}
    on = "a state of float32 arrays, changed after loading"
    call(candidate, model, given, on=on, returns=False)
    for v in given.values():
        v += 1.0
    for name, p in params.items():
        expect(np.allclose(p.data, state[name].astype(np.float32)),
               f"parameter {name} changed when the array it was loaded from changed afterwards, on {on}: "
               f"give each parameter its own copy")

    names = list(params)
    wrong_shape = {**state, names[-1]: np.zeros((7,))}
    missing = {k: v for k, v in state.items() if k != names[1]}
    unexpected = {**state, "head.weight": np.zeros((2, 4))}
    for bad, name, case in [(missing, names[1], f"a state without {names[1]!r}"),
                            (unexpected, "head.weight", "a state with an extra 'head.weight'"),
                            (wrong_shape, names[-1], f"a state whose {names[-1]!r} has shape (7,)")]:
        fresh = {k: rng.normal(size=v.shape) for k, v in state.items()}
        call(candidate, model, fresh, on="a valid state", returns=False)
        before = {k: p.data.copy() for k, p in params.items()}
        try:
            candidate(model, {k: np.array(v) for k, v in bad.items()})
        except ValueError as err:
            expect(name in str(err), f"on {case} your ValueError says {str(err)!r}: it should name {name!r}")
        except NotImplementedError:
            raise
        except Exception as err:
            raise CheckFailed(f"on {case} expected a ValueError naming {name!r}, your code raised "
                              f"{type(err).__name__}: {err}") from None
        else:
            raise CheckFailed(f"on {case} expected a ValueError naming {name!r}, your function returned "
                              f"without one")
        for k, p in params.items():
            expect(np.array_equal(p.data, before[k]) and p.data.shape == before[k].shape,
                   f"on {case} parameter {k} was changed before the error: a state that does not fit "
                   f"should change nothing")
