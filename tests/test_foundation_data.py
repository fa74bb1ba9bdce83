import numpy as np
import pytest

from course.data import load_digits, load_shakespeare, make_moons

pytestmark = pytest.mark.foundation


def test_moons_are_seeded_and_balanced():
    X, y = make_moons(101, noise=0.1, seed=3)
    X2, y2 = make_moons(101, noise=0.1, seed=3)
    assert X.shape == (101, 2) and y.shape == (101,)
    assert np.array_equal(X, X2) and np.array_equal(y, y2)
    assert set(np.unique(y)) == {0, 1} and abs(int(y.sum()) - 50) <= 1
    assert not np.array_equal(X, make_moons(101, noise=0.1, seed=4)[0])


def test_moons_reject_too_few_points():
    with pytest.raises(ValueError, match="at least 2"):
        make_moons(1)


def test_digits_ship_with_the_package():
    images, labels = load_digits()
    assert images.shape == (1797, 8, 8) and labels.shape == (1797,)
    assert images.min() == 0 and images.max() == 16
    assert set(np.unique(labels)) == set(range(10))


def test_shakespeare_ships_with_the_package():
    text = load_shakespeare()
    assert len(text) == 1_036_483
    assert len(set(text)) == 76
