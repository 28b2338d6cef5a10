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


UNKNOWN = ["--no-such-option"]
COMMA_LISTS = [  # every option whose value is a comma-separated list: (argv before the list, option, items, argv after:
    # what a run that skipped the empty item refuses next, so that it fails at once rather than runs)
    (["eval", "--out", "{tmp}/r.jsonl", "--datasets"], "--datasets", ["math500", "mmlu"], ["--gpqa-shuffle-seed", "5"]),
    (["eval", "--out", "{tmp}/r.jsonl", "--datasets", "math500", "--methods"], "--methods", ["greedy", "power-mh"],
     ["--beta", "2"]),
    (["eval", "--out", "{tmp}/r.jsonl", "--datasets", "math500", "--seed"], "--seed", ["1", "2"], UNKNOWN),
    (["eval", "--out", "{tmp}/r.jsonl", "--datasets", "math500", "--n"], "--n", ["4", "math500=8"], UNKNOWN),
    (["generate", "--prompt", "x", "--backend"], "--backend", ["http://127.0.0.1:1", "http://127.0.0.1:2"], UNKNOWN),
    (["bench", "preposition", "--rhos"], "--rhos", ["1", "2"], UNKNOWN),
    (["classifier", "train", "--records", "{tmp}/r.jsonl", "--out", "{tmp}/c.json", "--features"], "--features",
     ["cut_fraction", "depth"], UNKNOWN),
]


@pytest.mark.parametrize("empty", ["{a},,{b}", "{a},", ",{a}", "{a}, ,{b}"])
@pytest.mark.parametrize("prefix,option,items,after", COMMA_LISTS, ids=[c[1] for c in COMMA_LISTS])
def test_an_empty_item_of_a_comma_separated_list_is_refused_naming_the_option(
        prefix, option, items, after, empty, tmp_path, run_forerun_in_process, assert_one_line_error):
    """'--methods greedy,,power-mh', '--datasets math500,' (an unset $MORE in 'math500,$MORE'), ... skipped the
    empty item and ran what was left, exit 0: less than was asked, without a word."""
    value = empty.format(a=items[0], b=items[1])
    argv = [a.replace("{tmp}", str(tmp_path)) for a in prefix] + [value] + after
    proc = run_forerun_in_process(argv)
    assert_one_line_error(proc, "is empty", 2)
    assert option in proc.stderr and repr(value) in proc.stderr
    assert not (tmp_path / "r.jsonl").exists() and not (tmp_path / "c.json").exists()


def test_list_options_split_their_value_in_one_place():
    """Every comma-separated option goes through `comma_items` (cli/args.py): no other module of the command line
    splits a value on commas itself (where an empty item would be skipped again)."""
    from pathlib import Path

    import forerun.cli as cli

    splitting = [p.name for p in Path(cli.__file__).parent.glob("*.py")
                 if 'split(",")' in p.read_text() or "split(',')" in p.read_text()]
    assert splitting == ["args.py"]
