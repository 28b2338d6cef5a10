import numpy as np

from forerun.eval.harness.eos import cut_at_eos


def test_the_response_ends_at_its_first_eos_of_any_kind():
    assert cut_at_eos([5, 7, 3, 9, 2], (2, 3)) == [5, 7, 3]
    assert cut_at_eos([2, 5], (2,)) == [2]
    assert cut_at_eos([5, 7], (2,)) == [5, 7] and cut_at_eos([], (2,)) == []
    out = cut_at_eos(np.array([4, 1, 6]), np.array([1]))  # engine outputs may be numpy ids
    assert out == [4, 1] and all(type(t) is int for t in out)
