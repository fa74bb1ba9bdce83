import pytest

from course.viz import graphs

pytestmark = pytest.mark.foundation


def test_unknown_objects_are_refused_clearly():
    with pytest.raises(TypeError, match="cannot draw a int"):
        graphs.draw_graph(3)


def test_a_missing_dot_prints_one_hint(monkeypatch, capsys):
    import graphviz

    monkeypatch.setattr(graphs.shutil, "which", lambda name, path=None: None)
    drawing = graphs.Drawing(graphviz.Digraph(), 0)
    assert drawing._repr_png_() is None
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and "apt-get install graphviz" in out and "pip install graphviz-pure" in out
    with pytest.raises(RuntimeError, match="not installed"):
        drawing.save("unused.png")


def _which(found):
    """A stand-in for shutil.which that finds only the programs in `found` (name -> path)."""
    return lambda name, path=None: found.get(name)


def test_the_system_dot_is_preferred(monkeypatch):
    monkeypatch.setattr(graphs.shutil, "which", _which({"dot": "/usr/bin/dot", "graphviz-pure": "/venv/bin/graphviz-pure"}))
    assert graphs.find_dot() == "/usr/bin/dot"


def test_graphviz_pure_draws_where_there_is_no_system_dot(monkeypatch):
    monkeypatch.setattr(graphs.shutil, "which", _which({"graphviz-pure": "/venv/bin/graphviz-pure"}))
    assert graphs.find_dot() == "/venv/bin/graphviz-pure"
    ran = []

    class Done:
        returncode, stdout, stderr = 0, b"\x89PNG fake", b""

    monkeypatch.setattr(graphs.subprocess, "run", lambda args, **kw: ran.append(args) or Done())
    import graphviz

    assert graphs.Drawing(graphviz.Digraph(), 0, rankdir="LR")._repr_png_() == b"\x89PNG fake"
    assert ran == [["/venv/bin/graphviz-pure", "-Tpng"]]


def test_graphviz_pure_is_found_next_to_python_when_path_lacks_it(monkeypatch):
    # A kernel of a virtual environment that was never activated: the scripts folder is not on PATH.
    def which(name, path=None):
        return "/venv/bin/graphviz-pure" if name == "graphviz-pure" and path is not None else None

    monkeypatch.setattr(graphs.shutil, "which", which)
    assert graphs.find_dot() == "/venv/bin/graphviz-pure"


def test_a_program_that_fails_is_named_with_its_message(monkeypatch):
    class Done:
        returncode, stdout, stderr = 1, b"", b"Error: <stdin>: syntax error in line 2"

    monkeypatch.setattr(graphs.subprocess, "run", lambda args, **kw: Done())
    with pytest.raises(RuntimeError, match="graphviz-pure could not draw the graph: Error: <stdin>: syntax error"):
        graphs.render("digraph {", program="/venv/bin/graphviz-pure")


def test_an_unknown_rankdir_is_named():
    from course.micrograd import Value

    with pytest.raises(ValueError, match="rankdir must be None, 'LR', 'TB'.*not 'down'"):
        graphs.draw_graph(Value(1.0), rankdir="down")


def _png_size(data):
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


needs_dot = pytest.mark.skipif(not graphs.dot_available(),
                               reason="neither graphviz's dot nor graphviz-pure is installed")


@needs_dot
def test_a_deep_graph_is_drawn_top_to_bottom_so_its_numbers_stay_readable():
    from course.micrograd import Value

    x = Value(0.5, label="x")
    y = x
    for _ in range(12):
        y = (y * 1.1).tanh()
    y.backward()
    auto = _png_size(graphs.draw_graph(y)._repr_png_())
    sideways = _png_size(graphs.draw_graph(y, rankdir="LR")._repr_png_())
    assert sideways[0] > graphs.MAX_WIDTH_PX            # left to right it would be shrunk by the browser
    assert auto[0] <= graphs.MAX_WIDTH_PX < sideways[0]
    assert auto[1] > auto[0]                             # drawn top to bottom instead
    assert "rankdir=LR" in graphs.draw_graph(y).source   # the source stays the same on every machine


@needs_dot
def test_a_small_graph_stays_left_to_right(tmp_path):
    from course.micrograd import Value

    a, b = Value(2.0, label="a"), Value(3.0, label="b")
    c = a * b
    c.backward()
    drawing = graphs.draw_graph(c)
    width, height = _png_size(drawing._repr_png_())
    assert width > height
    path = drawing.save(tmp_path / "c.png")
    assert _png_size(path.read_bytes()) == (width, height)
