"""nbval's markers live in cell tags, where a learner never sees them: no lesson shows a
`# NBVAL_...` comment, authors may still write one (building and re-executing a notebook turn it
into the tag), `python -m course notebooks --tags-only` converts without running anything, and
assigning and grading keep the tags."""

import re
import shutil
from pathlib import Path

import nbformat
import pytest

from course import grading, notebooks

pytestmark = pytest.mark.foundation
ROOT = Path(__file__).resolve().parent.parent
ANY_MARKER = re.compile(r"^[ \t]*#[ \t]*(?:NBVAL_|PYTEST_VALIDATE_)\w*", re.M)


@pytest.mark.parametrize("path", notebooks.all_notebooks(ROOT), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_no_code_cell_shows_an_nbval_comment(path):
    nb = nbformat.read(str(path), as_version=4)
    for i, cell in enumerate((c for c in nb.cells if c.cell_type == "code"), 1):
        found = ANY_MARKER.search(cell.source)
        assert not found, (f"code cell {i} shows the test marker {found.group(0).strip()!r}: run "
                           f"`python -m course notebooks --tags-only {path.relative_to(ROOT).as_posix()}`")


def _cell(source, **metadata):
    cell = nbformat.v4.new_code_cell(source, metadata=metadata)
    cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text="12.5 ms\n")]
    return cell


def test_marker_comments_become_tags_and_only_their_lines_go():
    nb = nbformat.v4.new_notebook(cells=[
        _cell("# NBVAL_IGNORE_OUTPUT\nt = time()\nprint(t)"),
        _cell("#NBVAL_SKIP\n# a comment that stays\nx = 1", tags=["hide-input"]),
        _cell("x = 2\n  # NBVAL_CHECK_OUTPUT  \nprint(x)"),
        _cell("# NBVAL_IGNORE_OUTPUT\n# NBVAL_RAISES_EXCEPTION\n1 / 0", tags=["nbval-ignore-output"]),
        _cell("s = '# NBVAL_SKIP is only a marker on a line of its own'  # NBVAL_SKIP"),
        nbformat.v4.new_markdown_cell("# NBVAL_SKIP\nprose is never touched"),
    ])
    assert notebooks.markers_to_tags(nb) == 4
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert [c.source for c in code] == ["t = time()\nprint(t)", "# a comment that stays\nx = 1", "x = 2\nprint(x)",
                                        "1 / 0", "s = '# NBVAL_SKIP is only a marker on a line of its own'  # NBVAL_SKIP"]
    assert [c.metadata.get("tags") for c in code] == [
        ["nbval-ignore-output"], ["hide-input", "nbval-skip"], ["nbval-check-output"],
        ["nbval-ignore-output", "nbval-raises-exception"], None]
    assert all(c.outputs[0]["text"] == "12.5 ms\n" for c in code)
    assert nb.cells[-1].source == "# NBVAL_SKIP\nprose is never touched"
    again = nbformat.writes(nb)
    assert notebooks.markers_to_tags(nb) == 0 and nbformat.writes(nb) == again


def test_an_unknown_marker_is_named():
    nb = nbformat.v4.new_notebook(cells=[_cell("x = 1"), _cell("# NBVAL_IGNORE\nprint(x)")])
    with pytest.raises(ValueError, match=r"code cell 2 of lesson.ipynb has the marker NBVAL_IGNORE, which nbval "
                                         r"does not know: the markers are NBVAL_CHECK_OUTPUT, NBVAL_IGNORE_OUTPUT"):
        notebooks.markers_to_tags(nb, where="lesson.ipynb")


def test_tags_only_converts_in_place_without_running_and_is_idempotent(tmp_path, capsys):
    from course.__main__ import main

    marked, plain = tmp_path / "part" / "marked.ipynb", tmp_path / "part" / "plain.ipynb"
    marked.parent.mkdir()
    # Outputs no run would give: a run would replace them, and the command must not run anything.
    nbformat.write(nbformat.v4.new_notebook(cells=[_cell("# NBVAL_IGNORE_OUTPUT\nprint(time())")]), str(marked))
    nbformat.write(nbformat.v4.new_notebook(cells=[_cell("print(1)")]), str(plain))
    checkpoint = tmp_path / "part" / ".ipynb_checkpoints" / "marked-checkpoint.ipynb"
    checkpoint.parent.mkdir()
    shutil.copy(marked, checkpoint)
    plain_bytes, checkpoint_bytes = plain.read_bytes(), checkpoint.read_bytes()

    main(["notebooks", "--tags-only", str(tmp_path)])
    assert "1 cells in 1 of 2 notebooks changed" in capsys.readouterr().out
    cell = nbformat.read(str(marked), as_version=4).cells[0]
    assert cell.source == "print(time())" and cell.metadata["tags"] == ["nbval-ignore-output"]
    assert cell.outputs[0]["text"] == "12.5 ms\n" and cell.execution_count is None
    assert plain.read_bytes() == plain_bytes and checkpoint.read_bytes() == checkpoint_bytes
    converted = marked.read_bytes()
    main(["notebooks", "--tags-only", str(marked)])
    assert "0 cells in 0 of 1 notebooks changed" in capsys.readouterr().out
    assert marked.read_bytes() == converted


def test_build_and_execute_turn_the_comment_into_the_tag(tmp_path, monkeypatch):
    (tmp_path / "notebooks").mkdir()
    monkeypatch.setattr(notebooks, "ROOT", tmp_path)
    path = notebooks.build(tmp_path / "notebooks" / "1-x" / "1.1-x.ipynb", [
        ("md", "# 1.1 A lesson"), ("code", "# NBVAL_IGNORE_OUTPUT\nprint('timing')"), ("code", "print(2)")])
    code = [c for c in nbformat.read(str(path), as_version=4).cells if c.cell_type == "code"]
    assert code[1].source == "print('timing')" and code[1].metadata["tags"] == ["nbval-ignore-output"]
    assert "tags" not in code[2].metadata

    # An author adds a marked cell to a built lesson: re-executing it moves the marker, and runs it.
    nb = nbformat.read(str(path), as_version=4)
    nb.cells.append(nbformat.v4.new_code_cell("# NBVAL_SKIP\nprint(3)"))
    nb.cells = [c for c in nb.cells if c.source != notebooks.install_source()]  # no install cell: nothing to install here
    nbformat.write(nb, str(path))
    notebooks.execute(path, timeout=120)
    code = [c for c in nbformat.read(str(path), as_version=4).cells if c.cell_type == "code"]
    assert [c.metadata.get("tags") for c in code] == [["nbval-ignore-output"], None, ["nbval-skip"]]
    assert code[2].source == "print(3)" and code[2].outputs[0]["text"] == "3\n"


def test_assigning_keeps_the_lessons_and_their_tags_as_they_are(tmp_path):
    grading.assign(["1"], tmp_path)
    lessons = [p for p in notebooks.lesson_paths(ROOT, "notebooks") if p.parent.name == "1-micrograd"]
    assert lessons
    for lesson in lessons:  # the same cells, tags and outputs; the install cell pinned, the version stamped
        given = nbformat.read(str(tmp_path / "1-micrograd" / lesson.name), as_version=4)
        ours = nbformat.read(str(lesson), as_version=4)
        assert [c.metadata for c in given.cells] == [c.metadata for c in ours.cells]
        assert [c.get("outputs") for c in given.cells] == [c.get("outputs") for c in ours.cells]
        unpinned = lambda c: notebooks.BADGE_RE.sub("BADGE", c.source)  # the badge: the same lesson, at a commit
        assert [unpinned(c) for c in given.cells if not notebooks.is_install_cell(c.source)] == \
            [unpinned(c) for c in ours.cells if not notebooks.is_install_cell(c.source)]
        assert given.metadata["course"]["version"] and given.metadata["kernelspec"] == ours.metadata["kernelspec"]
    readme = (tmp_path / "README.md").read_text()
    upgrade, install = readme.find("python -m pip install --upgrade pip"), readme.find('pip install "course[lab]')
    assert 0 <= upgrade < install, "the students' README should upgrade pip before installing the course"


def test_a_submission_from_a_handout_with_marker_comments_needs_no_second_look():
    """A lesson handed out before the markers became tags still has the comments: that is no change."""
    tagged = _cell("import threading\nprint(threading.active_count())", tags=["nbval-ignore-output"])
    lesson = nbformat.v4.new_notebook(cells=[tagged])
    old_handout = nbformat.v4.new_notebook(cells=[_cell("# NBVAL_IGNORE_OUTPUT\n" + tagged.source)])
    assert grading.review_notes(old_handout, lesson) == []
    changed = nbformat.v4.new_notebook(cells=[_cell("# NBVAL_IGNORE_OUTPUT\nimport threading\nthreading.Thread()")])
    assert grading.review_notes(changed, lesson) == ["code cell 1 leaves code running"]
