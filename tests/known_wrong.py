"""The one runner for the KNOWN_WRONG tables of tests/test_partN_exercises*.py: each table maps an
exercise id to (wrong answer, words its failure message must contain) pairs."""

from course.exercises import check


def cases(table):
    """(exercise id, wrong answer, words) for every entry of a KNOWN_WRONG table, in id order."""
    return [(i, wrong, words) for i in sorted(table) for wrong, words in table[i]]


def assert_fails_saying(exercise_id, wrong, words):
    """The check rejects `wrong` with a message holding every one of `words`, and did not crash."""
    result = check(exercise_id, wrong)
    assert result.status == "failed", result.message
    for word in words:
        assert word in result.message, result.message
    assert "could not use" not in result.message, result.message  # a check that crashed on the value
