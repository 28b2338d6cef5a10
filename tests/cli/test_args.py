import argparse

import pytest

from forerun.cli.args import nonnegative_float, nonnegative_int, positive_float, positive_int


def test_accepts_in_range():
    assert positive_int("3") == 3 and nonnegative_int("0") == 0
    assert positive_float("0.5") == 0.5 and nonnegative_float("0") == 0.0


@pytest.mark.parametrize("fn,text", [(positive_int, "0"), (nonnegative_int, "-1"), (positive_float, "0"),
                                     (nonnegative_float, "-0.1"), (positive_float, "nan"), (positive_int, "x")])
def test_rejects_with_a_message(fn, text):
    with pytest.raises(argparse.ArgumentTypeError, match="expected"):
        fn(text)
