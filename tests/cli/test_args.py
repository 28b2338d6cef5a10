import argparse
import subprocess
import sys

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


def test_a_missing_model_path_is_refused_before_torch_is_imported():
    """`forerun ... --model PATH` with no such PATH: one line and exit 2 from the argument phase, without the
    seconds of importing torch (and the entry point's own imports stay free of torch)."""
    code = ("import sys\n"
            "from forerun.cli.main import main\n"
            "assert 'torch' not in sys.modules, 'the entry point imports torch before reading its arguments'\n"
            "code = main(['sample', '--prompt', 'x', '--model', '/no/such/model'])\n"
            "print(code, 'torch' in sys.modules)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.stdout.split() == ["2", "False"], proc.stdout + proc.stderr[-2000:]
    assert proc.stderr.startswith("forerun sample: model path '/no/such/model' does not exist"), proc.stderr
    assert proc.stderr.count("\n") == 1, proc.stderr


def test_a_model_path_is_not_checked_when_a_backend_replaces_the_model():
    from forerun.cli.args import check_model_path

    check_model_path(argparse.Namespace(checks_model_path=True, model="/no/such/model", backend=["http://h:1"]))
    check_model_path(argparse.Namespace(checks_model_path=True, model="tiny", backend=None))
    with pytest.raises(ValueError, match="does not exist"):
        check_model_path(argparse.Namespace(checks_model_path=True, model="/no/such/model", backend=None))
