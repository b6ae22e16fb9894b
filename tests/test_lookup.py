import numpy as np
import pytest

from specdec.core.drafters import LookupDrafter, lookup
from specdec.errors import SpecdecError


def arr(*xs):
    return np.array(xs, dtype=np.int64)


@pytest.mark.parametrize(
    "tokens, k, nmax, nmin, expected",
    [
        (arr(1, 2, 3, 4, 1, 2), 3, 2, 1, [3, 4, 1]),  # bigram [1,2] seen before, followed by 3 4 1
        (arr(1, 2, 3, 4, 1, 2), 1, 2, 1, [3]),
        (arr(5, 6, 7), 3, 2, 1, []),  # nothing repeats
        (arr(1, 9, 1, 8, 1), 2, 1, 1, [8, 1]),  # the most recent earlier '1' wins
        (arr(7, 1, 2, 3, 9, 2, 3), 2, 3, 1, [9, 2]),  # trigram misses, bigram [2,3] hits
        (arr(4, 4, 4), 5, 2, 1, [4]),  # match ends right before the suffix: one token follows
        (arr(3), 2, 2, 1, []),
        (arr(1, 2, 1, 2), 4, 2, 2, [1, 2]),
    ],
)
def test_lookup_table(tokens, k, nmax, nmin, expected):
    assert lookup(tokens, k, nmax, nmin) == expected


def test_bad_ngram_range():
    with pytest.raises(SpecdecError):
        LookupDrafter(ngram_max=1, ngram_min=2)
    with pytest.raises(SpecdecError):
        LookupDrafter(ngram_max=3, ngram_min=0)
