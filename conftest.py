"""pytest configuration for the whole repository: part markers and repeatable runs."""

import os
import re

import pytest

# Notebooks and tests of part N are marked `partN`, so `pytest -m part2` runs one part.
PART_FOLDER = re.compile(r"(?:^|[/\\])(\d)-[a-z]+[/\\]")

os.environ.setdefault("PYTHONHASHSEED", "0")
os.environ.setdefault("COURSE_QUIET", "1")
os.environ.setdefault("TQDM_DISABLE", "1")

try:
    from hypothesis import settings

    settings.register_profile("course", derandomize=True, deadline=None, max_examples=40)
    settings.load_profile("course")
except ImportError:  # hypothesis is part of the dev extra
    pass


def pytest_ignore_collect(collection_path, config):
    """JupyterLab keeps a copy of every notebook it opens in `.ipynb_checkpoints/`: never a test."""
    if ".ipynb_checkpoints" in collection_path.parts:
        return True
    return None


def pytest_collection_modifyitems(config, items):
    for item in items:
        path = str(item.fspath)
        found = PART_FOLDER.search(path)
        if found and path.endswith(".ipynb"):
            item.add_marker(getattr(pytest.mark, f"part{found.group(1)}"))
