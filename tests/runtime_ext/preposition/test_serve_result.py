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
