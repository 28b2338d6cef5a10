"""Bad input to every `forerun` command: a non-zero exit, exactly one line on stderr, never a traceback.

Each case runs the entry point with the tiny model wherever a model is needed and checks the one line names
the problem.  The cases in REAL_PROCESS run the real `forerun` in a subprocess (at least one per command,
and the engine error that exits 1 with the engine's worker still alive); the others call `main(argv)` in
the test process with stdout and stderr captured at the file descriptors (tests/cli/conftest.py).
"""

from __future__ import annotations

import contextlib
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from forerun.programs.records import RecordWriter
from forerun.runtime_ext.standin.server import unused_port
from forerun.testing.synthetic_records import synthetic_node_records


def write_node_records(path, records) -> int:
    return RecordWriter(path).write_nodes(records)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("bad_input")
    records = root / "records.jsonl"
    write_node_records(records, synthetic_node_records(n_prompts=3, seed=1))
    two_classes = root / "two_classes.jsonl"
    write_node_records(two_classes, synthetic_node_records(n_prompts=3, seed=2, classes=("reject", "accept")))
    (root / "malformed.jsonl").write_text('{"prompt_id": \n')
    (root / "classifier.json").write_text("{not json")
    (root / "a_file.txt").write_text("x")
    (root / "a_dir").mkdir()
    os.mkfifo(root / "a_fifo")  # opening it to write blocks until a reader comes
    os.mkfifo(root / "a_fifo.png")
    for folder, name in (("plots_fifo", "fig4_latency_vs_entry.png"), ("report_fifo", "summary.json")):
        (root / folder).mkdir()  # an output folder holding a FIFO where the command writes one of its files
        os.mkfifo(root / folder / name)
    (root / "plots_dir" / "fig6_amortization.png").mkdir(parents=True)
    (root / "one_item_run.jsonl").write_text('{"key": "math500|greedy|p0|1"}\n')
    from forerun.classifiers.certainty import CertaintyClassifier, CertaintyConfig

    fitted = CertaintyClassifier(CertaintyConfig(features=("cut_fraction", "node_id"))).fit(
        synthetic_node_records(n_prompts=3, seed=1))  # the library trains on any record field
    fitted.save(root / "record_field_classifier.json")
    return root


def unwritable(root: Path) -> str | None:
    """A path the command cannot write, even as root (os.access says yes to root, so probe for real)."""
    locked = root / "locked"
    locked.mkdir(exist_ok=True)
    locked.chmod(0o500)
    for candidate in (locked / "out.jsonl", Path("/sys/forerun-probe.jsonl"), Path("/proc/version")):
        try:
            with open(candidate, "ab"):
                pass
        except OSError:
            return str(candidate)
        if candidate.parent == locked:
            candidate.unlink()
    return None


NO_SUCH = "/no/such/model"
MISSING_PARENT = "/no-such-directory-forerun/out"
TINY_PREPOSITION = ["--model", "tiny", "--requests", "1", "--trace-updates", "0", "--calib-windows", "0",
                    "--status-windows", "0", "--agentic-turns", "0", "--energy-iterations", "0"]
"""A `bench preposition` that takes seconds: a bad output path found only after it still fails fast."""

# (command, argv, what the one line must say); {root} is the fixture folder; exit 2 unless noted in CODE_1
CASES = [
    # generate
    ("generate", ["generate", "--prompt", ""], "--prompt must not be empty"),
    ("generate", ["generate"], "--prompt"),
    ("generate", ["generate", "--prompt", "x", "--model", NO_SUCH], "does not exist"),
    ("generate", ["generate", "--prompt", "x", "--model", "tiny", "--dtype", "int8"], "dtype must be one of"),
    ("generate", ["generate", "--prompt", "x", "--temperature", "-1"], "--temperature"),
    ("generate", ["generate", "--prompt", "x", "--top-p", "nan"], "--top-p"),
    ("generate", ["generate", "--prompt", "x", "--model", "tiny", "--top-p", "2"], "--top-p must be in (0, 1]"),
    ("generate", ["generate", "--prompt", "x", "--seed", "-5"], "--seed"),
    ("generate", ["generate", "--prompt", "x", "--seed", str(2**64 + 1)], "--seed"),  # aliased seed 1 before
    ("generate", ["generate", "--model", "tiny", "--max-tokens", "2", "--prompt", "word " * 3000],
     "exceeds the model context"),  # and nothing from transformers (a too-long-sequence warning) on stderr
    ("generate", ["generate", "--prompt", "x", "--model", "tiny", "--max-tokens", "5000"],
     "--max-tokens 5000: prompt ("),
    # a command-line argument whose bytes are not UTF-8 (Python decodes them to lone surrogates): was an internal
    # error from the tokenizer (exit 1) or "'utf-8' codec can't encode character '\\udcff'" naming no option
    ("generate", ["generate", "--model", "tiny", "--prompt", "a\udcffb"],
     "argument --prompt: not UTF-8 text (byte 0xff at offset 1)"),
    ("sample", ["sample", "--model", "tiny", "--prompt", "ab\udcc3"],
     "argument --prompt: not UTF-8 text (byte 0xc3 at offset 2)"),
    ("calibrate gate", ["calibrate", "gate", "--model", "tiny", "--answer-lead", "\udcfe"],
     "argument --answer-lead: not UTF-8 text (byte 0xfe at offset 0)"),
    ("eval", ["eval", "--datasets", "math500", "--methods", "greedy", "--system", "be \udcff", "--out",
              "{root}/never.jsonl"], "argument --system: not UTF-8 text (byte 0xff at offset 3)"),  # and no run file
    ("generate", ["generate", "--prompt", "x", "--backend", "localhost:1"], "http://"),
    ("generate", ["generate", "--prompt", "x", "--backend", "http://127.0.0.1:1/p?x=1"], "no query or fragment"),
    ("generate", ["generate", "--prompt", "x", "--backend", "http://127.0.0.1:0"],
     "'http://127.0.0.1:0': the port is not a number from 1 to 65535"),  # was: a connection to port 80, exit 1
    ("generate", ["generate", "--prompt", "x", "--backend", "http://[::1"], "'http://[::1': Invalid IPv6 URL"),
    ("generate", ["generate", "--prompt", "x", "--backend", "http://user:hunter2@127.0.0.1:1"], "with credentials"),
    # a host no name lookup takes: was the HTTP client's or the socket's error, exit 1 as a server failure
    # ('request failed: URL has an invalid label.') or a line naming neither --backend nor the URL
    ("generate", ["generate", "--prompt", "x", "--backend", "http://.:1"], "argument --backend: 'http://.:1': '.' is not"),
    ("generate", ["generate", "--prompt", "x", "--backend", "http://a..b:1"], "'a..b' is not a host name (an empty"),
    ("generate", ["generate", "--prompt", "x", "--backend", "http://" + "a" * 64 + ":1"], "a label over 63 characters"),
    ("generate", ["generate", "--prompt", "x", "--backend", "http://\udcff:1"], "'\\udcff' is not a host name"),
    ("generate", ["generate", "--prompt", "x", "--backend", "http://a\x01b:1"],
     "argument --backend: 'http://a\\x01b:1' contains a control character"),
    # sample
    ("sample", ["sample", "--dataset", "nope", "--model", "tiny"], "unknown dataset 'nope'"),
    ("sample", ["sample", "--dataset", "math500", "--index", "100000", "--model", "tiny"], "--index 100000"),
    ("sample", ["sample", "--dataset", "math500", "--index", "-1"], "--index"),
    ("sample", ["sample", "--dataset", "math500", "--data-dir", "/no/such/dir"], "is not a directory"),
    ("sample", ["sample", "--prompt", "x", "--dataset", "math500"], "not allowed with"),
    ("sample", ["sample", "--prompt", ""], "--prompt must not be empty"),
    ("sample", ["sample", "--prompt", "x", "--sampler", "gibbs"], "invalid choice"),
    ("sample", ["sample", "--prompt", "x", "--n", "0"], "--n"),
    ("sample", ["sample", "--prompt", "x", "--alpha", "nan"], "--alpha"),
    ("sample", ["sample", "--prompt", "x", "--n", "6", "--block", "4"], "--block B must divide --n n=6"),
    ("sample", ["sample", "--prompt", "x", "--model", "tiny", "--n", "4", "--alpha", "1e-320"],
     "alpha 1e-320 is too small: τ = 1/α overflows to inf"),  # was: exit 1 from the first call, after the load
    ("sample", ["sample", "--prompt", "x", "--model", "tiny", "--n", "4", "--alpha", "2e6"],
     "τ (1/α) = 5e-07 is below 1e-06"),  # was: a chain whose MH ratio used log p0 as log q_τ (a greedy request)
    ("sample", ["sample", "--prompt", "x", "--model", "tiny", "--n", "99999"], "--n 99999: prompt"),
    ("bench presto", ["bench", "presto", "--model", "tiny", "--prompts", "1", "--n", "4096"], "--n 4096: prompt"),
    ("sample", ["sample", "--prompt", "x", "--model", NO_SUCH], "does not exist"),
    ("sample", ["sample", "--prompt", "x", "--records", MISSING_PARENT], "does not exist (create it first)"),
    ("sample", ["sample", "--prompt", "x", "--records", "{root}/a_dir"], "is a directory"),
    ("sample", ["sample", "--prompt", "x", "--records", "{root}/a_fifo"], "is a FIFO, not a regular file"),  # hung
    ("sample", ["sample", "--prompt", "x", "--presto", "--traversal", "predictive", "--classifier", "/no/clf.json"],
     "cannot read classifier file"),
    # an empty --classifier (an unset shell variable) was taken for "not given": the shipped classifier, silently
    ("sample", ["sample", "--prompt", "x", "--presto", "--traversal", "predictive", "--classifier", ""],
     "argument --classifier: expected a file path, got ''"),
    ("bench presto", ["bench", "presto", "--traversals", "predictive", "--classifier", ""],
     "argument --classifier: expected a file path, got ''"),
    ("eval", ["eval", "--datasets", "math500", "--methods", "presto-power-mh-predictive", "--classifier", ""],
     "argument --classifier: expected a file path, got ''"),
    ("sample", ["sample", "--prompt", "x", "--presto", "--traversal", "predictive", "--classifier",
                "{root}/classifier.json"], "not valid JSON"),
    # bench presto
    ("bench presto", ["bench", "presto", "--dataset", "nope"], "unknown dataset 'nope'"),
    ("bench presto", ["bench", "presto", "--prompts", "0"], "--prompts"),
    ("bench presto", ["bench", "presto", "--prompts", "100000", "--model", "tiny"], "asked for 100000"),
    ("bench presto", ["bench", "presto", "--npf", "0"], "--npf"),
    ("bench presto", ["bench", "presto", "--samplers", "gibbs"], "invalid choice"),
    ("bench presto", ["bench", "presto", "--records", MISSING_PARENT], "does not exist (create it first)"),
    ("bench presto", ["bench", "presto", "--records", "{root}/a_dir"], "is a directory"),
    ("bench presto", ["bench", "presto", "--model", NO_SUCH, "--prompts", "1"], "does not exist"),
    # bench engine
    ("bench engine", ["bench", "engine", "--suffixes", "0"], "--suffixes"),
    ("bench engine", ["bench", "engine", "--root-tokens", "0"], "--root-tokens"),
    ("bench engine", ["bench", "engine", "--suffix-tokens", "-1"], "--suffix-tokens"),
    ("bench engine", ["bench", "engine", "--decode-tokens", "x"], "--decode-tokens"),
    ("bench engine", ["bench", "engine", "--repeats", "0"], "--repeats"),
    ("bench engine", ["bench", "engine", "--root-tokens", "10", "--suffixes", "20"], "distinct cuts"),
    ("bench engine", ["bench", "engine", "--model", NO_SUCH], "does not exist"),
    ("bench engine", ["bench", "engine", "--model", "tiny", "--root-tokens", "4000"], "exceed the model context"),
    # bench work-split
    ("bench work-split", ["bench", "work-split", "--model", "tiny", "--rows", "1", "--repeats", "1", "--tokens",
                          "5000"], "--tokens 5000: prompt ("),  # was: the engine's refusal, exit 1, no option named
    # bench reference
    ("bench reference", ["bench", "reference"], "--reference"),
    ("bench reference", ["bench", "reference", "--reference", "/no/such/power_samp_utils.py"], "No such file"),
    ("bench reference", ["bench", "reference", "--reference", "{root}/records.jsonl"], "--reference"),
    ("bench reference", ["bench", "reference", "--reference", "/x.py", "--K", "0"], "--K"),
    ("bench reference", ["bench", "reference", "--reference", "/x.py", "--alpha", "1e-320"],
     "alpha 1e-320 is too small: τ = 1/α overflows to inf"),  # was: found by the reference's code, after the load
    # session demo
    ("session demo", ["session", "demo", "--tau", "nan"], "--tau"),
    # a negative number argparse did not know for one ('-inf', '-1e-3'): was 'expected one argument'
    ("session demo", ["session", "demo", "--tau", "-inf"],
     "argument --tau: expected a number >= 0 (or inf: the gate never fires), got -inf"),
    ("generate", ["generate", "--prompt", "x", "--temperature", "-1e-3"],
     "argument --temperature: expected a number >= 0, got -1e-3"),
    ("session demo", ["session", "demo", "--threads", "100000"], "--threads"),
    ("session demo", ["session", "demo", "--threads", "0"], "--threads"),
    ("session demo", ["session", "demo", "--model", NO_SUCH], "does not exist"),
    ("session demo", ["session", "demo", "--dtype", "int8"], "dtype must be one of"),
    # bench preposition
    ("bench preposition", ["bench", "preposition", "--plots", MISSING_PARENT], "does not exist (create it first)"),
    ("bench preposition", ["bench", "preposition", "--plots", "{root}/a_file.txt"], "is not a directory"),
    ("bench preposition", ["bench", "preposition", "--plots", "{root}/plots_fifo", *TINY_PREPOSITION],
     "plots_fifo/fig4_latency_vs_entry.png is a FIFO, not a regular file"),  # was: after the whole benchmark
    ("bench preposition", ["bench", "preposition", "--plots", "{root}/plots_dir", *TINY_PREPOSITION],
     "plots_dir/fig6_amortization.png is a directory"),  # was: after the whole benchmark
    ("eval report", ["eval", "report", "{root}/one_item_run.jsonl", "--out", "{root}/report_fifo"],
     "report_fifo/summary.json is a FIFO, not a regular file"),  # was: hung on the FIFO
    ("bench preposition", ["bench", "preposition", "--rhos", "1,nan"], "--rhos"),
    ("bench preposition", ["bench", "preposition", "--rhos", "0"], "--rhos"),
    ("eval", ["eval", "--datasets", "math500", "--samples", "100000000000000", "--out", "{root}/samples.jsonl"],
     "--samples 100000000000000: at most 100000"),  # was: unbounded time and memory before the model loaded
    ("eval", ["eval", "--datasets", "math500", "--methods", "best-of-n", "--best-of", "100000000000000", "--model", "tiny",
              "--out", "{root}/bestof.jsonl"], "--best-of N must be in [1, 65536]"),  # was: hung after the model loaded
    ("bench work-split", ["bench", "work-split", "--rows", "1", "100000000000000", "--model", "tiny"],
     "--rows must be in [1, 65536]"),  # was: hung building 1e14 requests
    ("eval", ["eval", "--datasets", "math500", "--methods", "power-smc", "--smc-particles", "100000000000000", "--model", "tiny",
              "--out", "{root}/smc.jsonl"], "--smc-particles must be in [1, 65536]"),
    # was: ~34 s of benchmark, then a numpy warning and "lam value too large" naming no option
    ("bench preposition", ["bench", "preposition", "--rhos", "1e308,1"], "--rhos: ρ = 1e+308 with --trace-updates"),
    ("bench preposition", ["bench", "preposition", "--rhos", "4000", "--trace-updates", "32"], "at most 100000"),
    ("bench preposition", ["bench", "preposition", "--r-max", "5"], "--r-max"),
    ("bench preposition", ["bench", "preposition", "--tau", "nan"], "--tau"),
    ("bench preposition", ["bench", "preposition", "--trace-interval", "-1"], "--trace-interval"),
    ("bench preposition", ["bench", "preposition", "--requests", "0"], "--requests"),
    # a trace interval the real-time replay cannot sleep: was 'internal error: OverflowError: timestamp out of range'
    ("bench preposition", ["bench", "preposition", "--trace-interval", "1e308"], "1e+308 s is over 3600 s"),
    ("bench preposition", ["bench", "preposition", "--model", "tiny", "--requests", "1", "--trace-updates", "1",
                           "--calib-windows", "0", "--status-windows", "0", "--agentic-turns", "0",
                           "--energy-iterations", "0", "--trace-idle-factor", "1e308"],
     "trace_idle_factor 1e+308: a mean update interval of"),
    ("bench preposition", ["bench", "preposition", "--threads", "100000"], "--threads"),
    ("bench preposition", ["bench", "preposition", "--model", NO_SUCH], "does not exist"),
    # calibrate gate
    ("calibrate gate", ["calibrate", "gate", "--window-len", "1"], "--window-len"),
    ("calibrate gate", ["calibrate", "gate", "--windows", "0"], "--windows"),
    ("calibrate gate", ["calibrate", "gate", "--tau", "nan"], "--tau"),
    ("calibrate gate", ["calibrate", "gate", "--r-max", "nan"], "--r-max"),
    ("calibrate gate", ["calibrate", "gate", "--plot", MISSING_PARENT + ".png"], "does not exist (create it first)"),
    ("calibrate gate", ["calibrate", "gate", "--plot", "{root}/a_dir"], "is a directory"),
    ("calibrate gate", ["calibrate", "gate", "--plot", "{root}/a_fifo.png"], "is a FIFO, not a regular file"),
    ("calibrate gate", ["calibrate", "gate", "--plot", "{root}/figure.txt"], "expected a file ending in .png"),
    ("calibrate gate", ["calibrate", "gate", "--threads", "100000"], "--threads"),
    ("calibrate gate", ["calibrate", "gate", "--model", NO_SUCH], "does not exist"),
    # a trend window too long for the model's context: was the session's line, naming neither option
    ("calibrate gate", ["calibrate", "gate", "--model", "tiny", "--windows", "2", "--window-len", "500"],
     "--window-len 500 with an --answer-lead of 0 characters: a trend window does not fit the model: appending"),
    ("calibrate gate", ["calibrate", "gate", "--model", "tiny", "--windows", "2", "--answer-lead", "x" * 3000],
     "--window-len 12 with an --answer-lead of 3000 characters: a trend window does not fit the model"),
    # classifier train
    ("classifier train", ["classifier", "train", "--records", "/no/such.jsonl", "--out", "{root}/m.json"],
     "cannot read records file"),
    ("classifier train", ["classifier", "train", "--records", "{root}/malformed.jsonl", "--out", "{root}/m.json"],
     "not valid JSON"),
    ("classifier train", ["classifier", "train", "--records", "{root}/records.jsonl", "--out", "{root}/a_dir"],
     "is a directory"),
    ("classifier train", ["classifier", "train", "--records", "{root}/records.jsonl", "--out", "{root}/a_fifo"],
     "is a FIFO, not a regular file"),
    ("classifier train", ["classifier", "train", "--records", "{root}/records.jsonl", "--out", MISSING_PARENT],
     "does not exist (create it first)"),
    ("classifier train", ["classifier", "train", "--records", "{root}/two_classes.jsonl", "--out", "{root}/m.json"],
     "allow-missing-classes"),
    ("classifier train", ["classifier", "train", "--records", "{root}/records.jsonl", "--out", "{root}/m.json",
                          "--epsilon", "nan"], "epsilon"),
    ("classifier train", ["classifier", "train", "--records", "{root}/records.jsonl", "--out", "{root}/m.json",
                          "--sampler", "nope"], "samplers found"),
    ("classifier train", ["classifier", "train", "--records", "{root}/records.jsonl"], "--out"),
    # an empty file argument (an unset shell variable): was read as the current directory ('.: cannot read records
    # file (Is a directory)'), and an empty ceiling --classifier silently used the shipped classifier
    ("classifier train", ["classifier", "train", "--records", "", "--out", "{root}/m.json"],
     "argument --records: expected a file path, got ''"),
    ("classifier ceiling", ["classifier", "ceiling", "--records", "{root}/records.jsonl", ""],
     "argument --records: expected a file path, got ''"),
    ("classifier ceiling", ["classifier", "ceiling", "--records", "{root}/records.jsonl", "--classifier", ""],
     "argument --classifier: expected a file path, got ''"),
    # classifier cv
    ("classifier cv", ["classifier", "cv", "--records", "/no/such.jsonl"], "cannot read records file"),
    ("classifier cv", ["classifier", "cv", "--records", ""], "argument --records: expected a file path, got ''"),
    ("classifier cv", ["classifier", "cv", "--records", "{root}/records.jsonl", "--folds", "1"],
     "argument --folds: expected an integer >= 2, got 1"),
    ("classifier cv", ["classifier", "cv", "--records", "{root}/records.jsonl", "--folds", "50"], "distinct prompt_id"),
    ("classifier cv", ["classifier", "cv", "--records", "{root}/records.jsonl", "--l2-penalty", "-1"],
     "--l2-penalty must be a positive finite number"),
    ("classifier cv", ["classifier", "cv", "--records", "{root}/records.jsonl", "--features", "nope"], "nope"),
    ("classifier cv", ["classifier", "cv", "--records", "{root}/records.jsonl", "--seed", "4294967296"],
     "argument --seed: expected a seed in [0, 2**32 - 1]"),  # was scikit-learn's message, the option unnamed
    ("classifier cv", ["classifier", "cv", "--records", "{root}/records.jsonl", "--seed", "-1"], "--seed"),
    ("classifier train", ["classifier", "train", "--records", "{root}/records.jsonl", "--out", "{root}/m.json",
                          "--features", "cut_fraction,block,transition"], "block, transition are not known to the"),
    ("sample", ["sample", "--prompt", "x", "--presto", "--traversal", "predictive", "--classifier",
                "{root}/record_field_classifier.json"], "node_id are not known to the samplers"),
    # an option the command does not have: named by that command, not by `forerun`
    ("session demo", ["session", "demo", "--nosuch"], "unrecognized arguments: --nosuch (see forerun session demo"),
    ("bench presto", ["bench", "presto", "--prompts", "1", "stray"], "unrecognized arguments: stray"),
    ("classifier train", ["classifier", "train", "--records", "x", "--out", "y", "--nosuch"], "unrecognized"),
    # the command itself
    ("forerun", ["smaple"], "invalid choice"),
    ("forerun", ["bench"], "required"),
]
CASE_IDS = [f"{c}:{' '.join(a[1:] if c != 'forerun' else a)[:60]}".encode("ascii", "backslashreplace").decode()
            for c, a, _ in CASES]  # escaped as pytest escapes an id (request.node.callspec.id)
REAL_PROCESS = {
    "generate:--prompt x --model tiny --max-tokens 5000",  # found before any decode, the engine's worker alive
    "generate:--model tiny --prompt a\\udcffb",  # the bytes reach the process as its argv
    "eval:--datasets math500 --methods greedy --system be \\udcff --out {roo",
    "generate:--model tiny --max-tokens 2 --prompt word word word word wor",
    "sample:--prompt x --model /no/such/model",
    "bench presto:presto --model /no/such/model --prompts 1",
    "bench engine:engine --suffixes 0",
    "bench work-split:work-split --model tiny --rows 1 --repeats 1 --tokens 5000",
    "bench reference:reference",
    "session demo:demo --model /no/such/model",
    "bench preposition:preposition --plots {root}/a_file.txt",
    "calibrate gate:gate --model /no/such/model",
    "classifier train:train --records {root}/malformed.jsonl --out {root}/m.json",
    "classifier cv:cv --records /no/such.jsonl",
    "classifier ceiling:ceiling --records {root}/records.jsonl --classifier ",  # the empty argument through a real argv
    "forerun:smaple",
    "eval report:report {root}/one_item_run.jsonl --out {root}/report_fifo",  # a FIFO hangs its writer
}
"""Cases that run the real `forerun` in a subprocess: one or more per command."""


def test_every_command_has_a_real_process_case():
    assert REAL_PROCESS <= set(CASE_IDS)
    assert {c for c, _, _ in CASES} == {i.split(":")[0] for i in REAL_PROCESS}


@pytest.mark.parametrize("command,argv,needle", CASES, ids=CASE_IDS)
def test_bad_input_is_one_line(command, argv, needle, files, request, run_forerun, run_forerun_in_process,
                               assert_one_line_error):
    run = run_forerun if request.node.callspec.id in REAL_PROCESS else run_forerun_in_process
    proc = run([a.format(root=files) for a in argv])
    assert_one_line_error(proc, needle)
    assert "hunter2" not in proc.stderr  # a password in a URL is never echoed
    if command != "forerun":
        assert proc.stderr.split("\r")[-1].startswith(f"forerun {command}:"), proc.stderr
    assert not Path(MISSING_PARENT).parent.exists()  # a missing parent directory is never created
    assert not (files / "never.jsonl").exists()


@pytest.mark.parametrize("argv", [
    ["sample", "--prompt", "x", "--model", "tiny", "--n", "4", "--K", "2", "--records", "{path}"],
    ["bench", "presto", "--model", "tiny", "--prompts", "1", "--n", "4", "--K", "2", "--records", "{path}"],
    ["classifier", "train", "--records", "{root}/records.jsonl", "--out", "{path}"],
    ["calibrate", "gate", "--model", "tiny", "--windows", "2", "--plot", "{path}.png"],
], ids=["sample --records", "bench presto --records", "classifier train --out", "calibrate gate --plot"])
def test_an_unwritable_output_path_is_refused_before_any_work(argv, files, request, run_forerun,
                                                              run_forerun_in_process, assert_one_line_error):
    path = unwritable(files)
    if path is None:
        pytest.skip("no unwritable path on this machine")
    if argv[-1] == "{path}.png":
        path = str(Path(path).with_suffix(".png"))
        argv = argv[:-1] + [path]
    run = run_forerun if request.node.callspec.id == "classifier train --out" else run_forerun_in_process
    proc = run([a.format(root=files, path=path) for a in argv])
    assert_one_line_error(proc, "not writable")


@contextlib.contextmanager
def _web_server(status, body):
    """A local HTTP server answering every GET with `status` and the HTML `body`; yields its URL."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            self.send_response(status)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("argv", [["generate", "--prompt", "hi"], ["sample", "--prompt", "hi", "--n", "4"],
                                  ["bench", "presto", "--prompts", "1", "--n", "4"]])
def test_server_info_answering_invalid_json_names_the_url(argv, run_forerun_in_process, assert_one_line_error):
    with _web_server(200, b"<html>not json</html>") as url:
        proc = run_forerun_in_process(argv + ["--backend", url])
    assert_one_line_error(proc, f"{url}/server_info answered invalid JSON")


def test_a_backend_that_is_not_an_sglang_server_is_named_so(run_forerun_in_process, assert_one_line_error):
    """Another web server (a 404 page for every path, as `python -m http.server` gives for /server_info): the line says
    the URL is not an SGLang server (it was the 404 page's HTML)."""
    page = b"<!DOCTYPE HTML>\n<html><head><title>Error response</title></head>\n<body><h1>404</h1></body></html>"
    with _web_server(404, page) as url:
        proc = run_forerun_in_process(["generate", "--prompt", "hi", "--backend", url])
    assert_one_line_error(proc, f"{url} is not an SGLang server: GET /server_info and /get_server_info both answered 404")
    assert "<html>" not in proc.stderr.lower()


def test_an_unreachable_backend_is_one_line_naming_the_url(run_forerun_in_process, assert_one_line_error):
    url = f"http://127.0.0.1:{unused_port()}"
    proc = run_forerun_in_process(["sample", "--backend", url, "--prompt", "hi", "--n", "4"])
    assert_one_line_error(proc, url)


@pytest.mark.parametrize("argv,needle", [
    (["classifier", "train", "--records", "{root}/same/records.jsonl", "--out", "{root}/same/records.jsonl"],
     "--out {root}/same/records.jsonl is also the --records input"),
    (["classifier", "train", "--records", "{root}/same/records.jsonl", "--out", "{root}/same/../same/records.jsonl"],
     "is also the --records input"),  # another spelling of the same file
    (["sample", "--prompt", "x", "--model", "tiny", "--n", "4", "--K", "2", "--presto", "--traversal", "predictive",
      "--classifier", "{root}/same/clf.json", "--records", "{root}/same/clf.json"], "is also the --classifier input"),
    (["sample", "--dataset", "math500", "--data-dir", "{root}/same", "--model", "tiny", "--n", "4", "--K", "2",
      "--records", "{root}/same/math500.jsonl"], "is also the --dataset input"),
    (["bench", "presto", "--data-dir", "{root}/same", "--model", "tiny", "--prompts", "1", "--n", "4", "--K", "2",
      "--records", "{root}/same/math500.jsonl"], "is also the --dataset input"),
], ids=["classifier train --out=--records", "classifier train --out=../--records", "sample --records=--classifier",
        "sample --records=dataset", "bench presto --records=dataset"])
def test_an_output_that_is_an_input_is_refused_and_the_input_kept(argv, needle, files, run_forerun_in_process,
                                                                 assert_one_line_error):
    """Was: `classifier train` wrote the classifier over its records, `sample` appended records to its classifier or
    to the dataset file it read."""
    from forerun.classifiers.certainty import CertaintyClassifier, CertaintyConfig
    from forerun.cli.inputs import dataset_paths

    same = files / "same"
    same.mkdir(exist_ok=True)
    (same / "records.jsonl").write_bytes((files / "records.jsonl").read_bytes())
    CertaintyClassifier(CertaintyConfig()).fit(synthetic_node_records(n_prompts=3, seed=1)).save(same / "clf.json")
    (same / "math500.jsonl").write_bytes(dataset_paths("math500", None)[0].read_bytes())  # packaged or shared
    before = {p.name: p.read_bytes() for p in same.iterdir()}
    proc = run_forerun_in_process([a.format(root=files) for a in argv])
    assert_one_line_error(proc, needle.format(root=files), code=2)
    assert {p.name: p.read_bytes() for p in same.iterdir()} == before
