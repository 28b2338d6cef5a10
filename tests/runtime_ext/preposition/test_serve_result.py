"""How a served request's Δ reads the engine's reported cache hit (serve_result.as_restored)."""

from forerun.runtime_ext.preposition.serve_result import as_restored


def test_a_restored_pre_position_keeps_the_planned_delta():
    # state 100 tokens, entry 10 of which 10 pre-paid (Δ = 0): the engine recomputes the last token for its logits
    assert as_restored(0, "r", 100, 10, 109) == (0, "r")
    assert as_restored(0, "r", 100, 10, 110) == (0, "r")
    # entry 10 extending a pre-paid 7 (Δ = 3): 107 tokens restored
    assert as_restored(3, "r", 100, 10, 107) == (3, "r")


def test_a_dropped_pre_position_reports_the_tokens_prefilled_again():
    delta, why = as_restored(0, "r", 100, 10, 100)  # only the state was restored
    assert delta == 10 and why.startswith("r; ") and "100 of 110 tokens restored (Δ = 10)" in why
    delta, _ = as_restored(0, "r", 100, 10, 104)  # part of the entry survived
    assert delta == 6
    delta, _ = as_restored(3, "r", 100, 10, 60)  # even the state was partly evicted: the whole entry again
    assert delta == 10


def test_a_fall_through_the_engine_restored_more_of_reports_what_it_prefilled():
    """An entry that is a strict prefix of a pre-positioned one matches none (Δ = the whole entry), yet the pinned
    KV holds all but its last token: Δ was overstated (helper X's noticed item)."""
    delta, why = as_restored(3, "r", 100, 3, 102)  # all of the 3-token entry but its last token, prefilled for logits
    assert delta == 1 and "held 2 of its tokens" in why
    assert as_restored(10, "r", 100, 10, 104)[0] == 6  # 4 of 10 held though none was planned
    assert as_restored(3, "r", 100, 10, 109)[0] == 1  # extends a pre-paid 7; the cache held 9
    # a cold request keeps the baseline's Δ, whatever the cache happened to hold
    assert as_restored(10, "r", 100, 10, 104, fell_through=False) == (10, "r")
