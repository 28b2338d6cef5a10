import pytest

from forerun.runtime_ext.backends.token_markers import (
    IdsSegment,
    TextSegment,
    parse_marked_text,
    sampling_seed,
    strip_markers,
    token_ids,
)


def test_round_trip_ids_text_and_seed():
    text = "sys: " + token_ids([5, 0, 17]) + sampling_seed(-42) + "tail" + token_ids([])
    segments, seed = parse_marked_text(text)
    assert segments == [TextSegment("sys: "), IdsSegment((5, 0, 17)), TextSegment("tail"), IdsSegment(())]
    assert seed == -42


def test_last_seed_wins_and_no_seed_is_none():
    assert parse_marked_text(sampling_seed(1) + "a" + sampling_seed(2))[1] == 2
    assert parse_marked_text("plain")[1] is None


def test_negative_ids_rejected():
    with pytest.raises(ValueError, match="non-negative"):
        token_ids([1, -3])


def test_malformed_marker_is_an_error():
    broken = token_ids([1, 2])[:-1] + "x"
    with pytest.raises(ValueError, match="malformed"):
        parse_marked_text(broken)


def test_strip_markers_decodes_or_drops():
    text = "a" + token_ids([104, 105]) + sampling_seed(3) + "b"
    assert strip_markers(text) == "ab"
    assert strip_markers(text, decode=lambda ids: bytes(ids).decode()) == "ahib"


def test_logprob_temperatures_directive():
    from forerun.runtime_ext.backends.token_markers import logprob_temperatures, parse_marked_text_directives

    text = logprob_temperatures([0.25, 0.5, 1.0]) + "x" + sampling_seed(9)
    segments, directives = parse_marked_text_directives(text)
    assert segments == [TextSegment("x")]
    assert directives.logprob_temperatures == (0.25, 0.5, 1.0)
    assert directives.seed == 9
    with pytest.raises(ValueError, match="> 0"):
        logprob_temperatures([0.0])


@pytest.mark.parametrize("text", ["Icon: \ue000 end", "data: \ue00072,105\ue001 ok", "\ue002 7\ue003\ue004\ue005",
                                  "\ue000" + "\U000f0001" * 4 + "1\ue001"])
def test_private_use_characters_in_text_are_text(text):
    """User or data text with the marker code points (without this process's key) is neither an error nor ids."""
    segments, seed = parse_marked_text("a" + text + token_ids([7]) + "b")
    assert segments == [TextSegment("a" + text), IdsSegment((7,)), TextSegment("b")] and seed is None
    assert strip_markers(text) == text
