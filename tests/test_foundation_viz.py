import pytest

from course.viz import graphs

pytestmark = pytest.mark.foundation


def test_unknown_objects_are_refused_clearly():
    with pytest.raises(TypeError, match="cannot draw a int"):
        graphs.draw_graph(3)


def test_a_missing_dot_prints_one_hint(monkeypatch, capsys):
    import graphviz

    monkeypatch.setattr(graphs.shutil, "which", lambda name: None)
    drawing = graphs.Drawing(graphviz.Digraph(), 0)
    assert drawing._repr_png_() is None
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and "apt-get install graphviz" in out
    with pytest.raises(RuntimeError, match="not installed"):
        drawing.save("unused.png")
