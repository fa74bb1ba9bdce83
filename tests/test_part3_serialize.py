"""Saving, loading and the inference runtime."""

import ast
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import course.minitf as tf
from course.minitf import runtime

pytestmark = pytest.mark.part3


def trained_graph():
    rng = np.random.default_rng(0)
    g = tf.Graph()
    with g.as_default():
        x = tf.placeholder((None, 2), name="x")
        w = tf.Variable(rng.normal(size=(2, 4)), name="layer/w")
        b = tf.Variable(np.zeros(4), name="layer/b")
        probs = tf.softmax(tf.relu(x @ w + b) * 2.0, name="probs")
        loss = -tf.reduce_mean(tf.log(probs))
        tf.GradientDescentOptimizer(0.1).minimize(loss)
    return g


def test_save_load_round_trip(tmp_path, rng):
    g = trained_graph()
    tf.save(g, tmp_path / "model")
    spec = json.loads((tmp_path / "model" / "graph.json").read_text())
    assert spec["nodes"][0] == {"name": "x", "op": "placeholder", "inputs": [], "attrs": {"shape": [None, 2]},
                                "shape": [None, 2]}
    h = tf.load(tmp_path / "model")
    assert [n.name for n in h.nodes] == [n.name for n in g.nodes]
    assert [n.op for n in h.nodes] == [n.op for n in g.nodes]
    assert [n.shape for n in h.nodes] == [n.shape for n in g.nodes]
    xv = rng.normal(size=(5, 2))
    np.testing.assert_array_equal(tf.Session(h).run("probs", {"x": xv}), tf.Session(g).run("probs", {"x": xv}))
    tf.Session(h).run("GradientDescent", {"x": xv})  # a loaded graph still trains
    assert not np.array_equal(h.get("layer/w").value, g.get("layer/w").value)


def test_round_trip_of_an_optimized_graph(tmp_path, rng):
    g = tf.optimize(trained_graph(), ["probs"])
    tf.save(g, tmp_path / "m")
    h = tf.load(tmp_path / "m")
    assert h.count_ops() == g.count_ops()
    xv = rng.normal(size=(3, 2))
    np.testing.assert_array_equal(tf.Session(h).run("probs", {"x": xv}), tf.Session(g).run("probs", {"x": xv}))


def test_runtime_runs_a_saved_compiled_graph(tmp_path, rng):
    g = trained_graph()
    small = tf.optimize(g, ["probs"])
    tf.save(small, tmp_path / "served")
    sess = tf.InferenceSession(tmp_path / "served")
    assert sess.input_shapes == {"x": (None, 2)}
    xv = rng.normal(size=(7, 2))
    np.testing.assert_allclose(sess.run("probs", {"x": xv}), tf.Session(g).run("probs", {"x": xv}), rtol=1e-12)
    (p,) = sess.run(["probs"], {"x": xv})
    assert p.shape == (7, 4)


def test_runtime_does_not_import_the_training_machinery():
    tree = ast.parse(Path(runtime.__file__).read_text())
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            imported.add(node.module or "")
            imported.update(a.name for a in node.names)
        elif isinstance(node, ast.Import):
            imported.update(a.name for a in node.names)
    for name in ("autodiff", "gradients", "train", "session", "compiler", "graph"):
        assert not any(name in m for m in imported), name


def test_serving_a_saved_graph_loads_no_training_module(tmp_path):
    # Not only the source of runtime.py: a fresh interpreter that serves a saved graph never
    # loads the gradients, the optimizer, the Session or the compiler.
    tf.save(tf.eliminate_dead_code(trained_graph(), ["probs"]), tmp_path / "m")
    code = ("import sys, numpy as np\n"
            "from course.minitf.runtime import InferenceSession\n"
            f"InferenceSession({str(tmp_path / 'm')!r}).run('probs', {{'x': np.zeros((3, 2))}})\n"
            "print(' '.join(sorted(m for m in sys.modules if m.startswith('course.minitf'))))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert "course.minitf.runtime" in loaded
    for training in ("autodiff", "train", "session", "compiler"):
        assert f"course.minitf.{training}" not in loaded, training


def test_runtime_refuses_training_operations(tmp_path):
    tf.save(trained_graph(), tmp_path / "full")
    with pytest.raises(ValueError, match="assign_sub"):
        tf.InferenceSession(tmp_path / "full")


def test_runtime_errors_name_the_problem(tmp_path):
    tf.save(tf.eliminate_dead_code(trained_graph(), ["probs"]), tmp_path / "m")
    sess = tf.InferenceSession(tmp_path / "m")
    with pytest.raises(ValueError, match="'x'.*not fed"):
        sess.run("probs", {})
    with pytest.raises(ValueError, match=r"'x'.*\(None, 2\).*\(3, 5\)"):
        sess.run("probs", {"x": np.zeros((3, 5))})
    with pytest.raises(KeyError, match="'nope'"):
        sess.run("nope", {"x": np.zeros((3, 2))})


def test_unknown_operation_in_a_saved_file_is_named(tmp_path):
    tf.save(tf.eliminate_dead_code(trained_graph(), ["probs"]), tmp_path / "m")
    path = tmp_path / "m" / "graph.json"
    spec = json.loads(path.read_text())
    spec["nodes"][-1]["op"] = "teleport"
    path.write_text(json.dumps(spec))
    with pytest.raises(ValueError, match="'teleport'.*'probs'"):
        tf.load(tmp_path / "m")
    with pytest.raises(ValueError, match="'teleport'"):
        tf.InferenceSession(tmp_path / "m")


# ----- damaged files are named -------------------------------------------------------------------
def _saved(tmp_path):
    tf.save(trained_graph(), tmp_path / "model")
    return tmp_path / "model"


@pytest.mark.parametrize("open_it", [tf.load, tf.InferenceSession])
def test_a_truncated_graph_json_is_named(tmp_path, open_it):
    path = _saved(tmp_path)
    text = (path / "graph.json").read_text()
    (path / "graph.json").write_text(text[: len(text) // 2])
    with pytest.raises(ValueError, match=r"model/graph.json is not a readable saved graph \(truncated or corrupt\?\)"):
        open_it(path)


@pytest.mark.parametrize("damage", [lambda b: b[: len(b) // 2], lambda b: b"not a zip file at all"])
@pytest.mark.parametrize("open_it", [tf.load, tf.InferenceSession])
def test_a_truncated_or_corrupt_arrays_file_is_named(tmp_path, open_it, damage):
    path = _saved(tmp_path)
    (path / "arrays.npz").write_bytes(damage((path / "arrays.npz").read_bytes()))
    with pytest.raises(ValueError, match=r"model/arrays.npz is not readable \(truncated or corrupt\?\)") as err:
        open_it(path)
    assert "allow_pickle" not in str(err.value)  # NumPy's advice would send the learner the wrong way


def test_a_missing_arrays_file_is_named(tmp_path):
    path = _saved(tmp_path)
    (path / "arrays.npz").unlink()
    with pytest.raises(FileNotFoundError, match="model/arrays.npz is missing"):
        tf.InferenceSession(path)


@pytest.mark.parametrize("open_it", [tf.load, tf.InferenceSession])
def test_a_dangling_input_is_named_not_a_key_error(tmp_path, open_it):
    path = _saved(tmp_path)
    spec = json.loads((path / "graph.json").read_text())
    spec["nodes"] = [n for n in spec["nodes"] if n["name"] != "layer/w"]
    (path / "graph.json").write_text(json.dumps(spec))
    with pytest.raises(ValueError, match="node '.*' reads 'layer/w', which is not saved before it"):
        open_it(path)
