"""Scale-out (issue 9, point 6): RuntimePool slots, chains spread over several servers, the embedded engine
with several chains in flight, and the same chains whatever the concurrency."""

from __future__ import annotations

import json
import threading
import time
from types import SimpleNamespace

import pytest

from forerun.cli.main import main
from forerun.runtime_ext.pool import RuntimePool, open_pool, split_urls
from forerun.runtime_ext.standin.server import StandInServer


class _Rt(SimpleNamespace):
    keys: list = []

    def close(self):
        self.closed = True

    def for_chain(self, key):
        _Rt.keys.append(key)
        return self


def test_lease_respects_the_per_runtime_limit_and_map_keeps_order():
    rts = [_Rt(name="m", location=f"r{i}", determinism_note=None) for i in range(2)]
    pool = RuntimePool(rts, slots=2)
    live = {id(r): 0 for r in rts}
    peak = {id(r): 0 for r in rts}
    lock = threading.Lock()

    def work(rt, x):
        with lock:
            live[id(rt)] += 1
            peak[id(rt)] = max(peak[id(rt)], live[id(rt)])
        time.sleep(0.01)
        with lock:
            live[id(rt)] -= 1
        return x * x

    assert pool.map(work, list(range(12))) == [x * x for x in range(12)]
    assert max(peak.values()) <= 2 and sum(pool.leases) == 12 and min(pool.leases) >= 4
    assert len(set(_Rt.keys[-12:])) == 12  # every chain its own routing key
    with pytest.raises(ZeroDivisionError):
        pool.map(lambda rt, x: 1 / x, [1, 0, 2])
    pool.close()
    assert all(r.closed for r in rts)
    with pytest.raises(ValueError, match="slots"):
        RuntimePool(rts, slots=0)


def test_split_urls():
    assert split_urls(["http://a:1,http://b:2", "http://a:1", " http://c:3 "]) == ["http://a:1", "http://b:2",
                                                                                   "http://c:3"]
    assert split_urls(None) == [] and split_urls("http://a:1") == ["http://a:1"]
    for bad in ("http://a:1,", ",http://a:1", "http://a:1,,http://b:2", ["http://a:1", " "]):
        with pytest.raises(ValueError, match="is empty"):  # was: the empty item dropped, silently
            split_urls(bad)


def test_servers_of_different_models_are_refused():
    with StandInServer(model_path="m1") as a, StandInServer(model_path="m2") as b:
        with pytest.raises(ValueError, match="different models"):
            open_pool(backend_urls=[a.url, b.url], tokenizer=a.tokenizer)


def test_bench_presto_spreads_chains_over_servers_one_at_a_time(capsys):
    argv = ["bench", "presto", "--prompts", "2", "--n", "6", "--K", "3", "--npf", "4", "--json"]
    with StandInServer() as a, StandInServer() as b:
        assert main(argv + ["--backend", f"{a.url},{b.url}"]) == 0
        out = json.loads(capsys.readouterr().out)
        for srv in (a, b):
            assert srv.generate_bodies(), "every server got chains"
    meta = out["meta"]
    assert meta["backend"] == [a.url, b.url] and meta["chains"] == 4 and sum(meta["chains_per_runtime"]) == 4
    assert min(meta["chains_per_runtime"]) >= 1 and meta["chains_per_s"] > 0
    assert out["rows"][0]["identical_chains"] == 2
    with StandInServer() as one:
        assert main(argv + ["--backend", one.url]) == 0
        single = json.loads(capsys.readouterr().out)
    assert single["rows"][0]["per_prompt_speedup"] and single["rows"][0]["calls"] == out["rows"][0]["calls"]


def test_embedded_engine_runs_chains_concurrently_with_the_same_results(capsys):
    argv = ["bench", "presto", "--model", "tiny", "--prompts", "2", "--n", "6", "--K", "3", "--npf", "4", "--json"]
    assert main(argv) == 0
    one = json.loads(capsys.readouterr().out)
    assert main(argv + ["--concurrency", "3"]) == 0
    three = json.loads(capsys.readouterr().out)
    assert three["meta"]["concurrency"] == 3 and one["meta"]["concurrency"] == 1
    for key in ("calls", "identical_chains", "accept_rate"):
        assert three["rows"][0][key] == one["rows"][0][key]  # float64 tiny model: the same chains
