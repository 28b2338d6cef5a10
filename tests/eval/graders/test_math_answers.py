"""Math answers as models write them, graded against gold answers (MATH / AIME style) through math-verify.
Wrong answers must be graded wrong; the fallback (math-verify's own extraction when there is no \\boxed{}
or answer phrase) is named in the detail."""

from __future__ import annotations

import pytest

from math_verify import parse, verify

from forerun.eval.graders.math_answers import extract_final_answer, grade_math
from forerun.testing.time_bound import stdout_within

RIGHT = [
    (r"... so the area is $\boxed{\dfrac{9}{2}}$.", r"\frac{9}{2}"),
    (r"Thus $x = \boxed{4.5}$", r"\frac{9}{2}"),
    (r"\boxed{\frac{1}{2}\sqrt{3}}", r"\frac{\sqrt{3}}{2}"),
    (r"The answer is $\boxed{(2, 5)}$.", "(2,5)"),
    (r"\boxed{x = 5}", "5"),
    (r"\boxed{-q+p}", "p - q"),
    (r"\boxed{\text{Monday}}", r"\text{Monday}"),
    (r"\boxed{10\%}", "10"),
    (r"\boxed{18.90}", r"\$18.90"),
    (r"\boxed{2\sqrt{2}}", r"\sqrt{8}"),
    (r"\boxed{\pi/2}", r"\frac{\pi}{2}"),
    (r"\boxed{x \in [2, 3]}", "[2,3]"),
    (r"First \boxed{3}... no wait, recomputing: \boxed{5}", "5"),
    ("Therefore, the answer is $12$.", "12"),
    ("Therefore the answer is 12 cm^2.", "12"),
    (r"The answer is \(\frac{3}{4}\).", r"\frac34"),
    ("**Final Answer**\n\nAnswer: 12", "12"),
    ("Counting the cases gives 6 + 15 + 21 = 42.\n\nSo there are 42 ways.", "42"),
    # no box: the answer after the phrase, without markdown, delimiters or a justifying clause
    ("So the answer is **42**.", "42"),
    ("The answer is 42, since 6 * 7 = 42.", "42"),
    ("Therefore, the answer is:\n\\[\n\\frac{1}{2}\n\\]", r"\frac12"),
    ("The answer is:\n\n$$\\frac{1}{2}$$", r"\frac12"),
    ("**Final Answer:** (1, 2)", "(1,2)"),
    # the answer written wholly as text (math-verify read a string, or "5inches", never the number: graded wrong)
    (r"The length is $\boxed{\text{5 inches}}$.", "5"),
    (r"\boxed{\text{0.5}}", r"\frac12"),
    (r"\boxed{\mbox{15 cm}^2}", r"15\mbox{ cm}^2"),  # MATH500's own gold writes \mbox
    (r"\boxed{\text{x = 5}}", "x=5"),
    # the instruction echoed after the answer: its empty box is no answer (it was read, as "", and graded wrong)
    ("So the answer is $\\boxed{42}$.\n\nPlease reason step by step, and put your final answer within \\boxed{}.",
     "42"),
    (r"Thus \boxed{42} \boxed{ }", "42"),
    # a set and the relation of one variable that solves to it, in either direction
    (r"\boxed{3 < x \le 4}", "(3,4]"),
    (r"\boxed{x \ge 2}", r"[2,\infty)"),
    (r"\boxed{[2,\infty)}", r"x \ge 2"),
    (r"\boxed{\text{5 or more}}", r"\text{5 or more}"),  # a gold that is itself a bound in words
    (r"Each case has 3 or more steps; the count is \boxed{7}", "7"),  # a bound in the reasoning, not the answer
]
WRONG = [
    (r"\boxed{3/5}", r"\frac{3}{4}"),
    (r"\boxed{5}", "-5"),
    (r"\boxed{0.333}", r"\frac13"),
    (r"\boxed{Tuesday}", r"\text{Monday}"),
    (r"\boxed{(5, 2)}", "(2,5)"),
    (r"First \boxed{5}... no wait, recomputing: \boxed{3}", "5"),
    ("Therefore the answer is 12 cm^2.", "13"),
    ("I could not finish the computation.", "7"),
    (r"\boxed{2k}", "2"),  # a variable is not a unit (MATH intermediate_algebra/190)
    ("So the answer is 2 or 3.", "2"),
    ("So the answer is **43**.", "42"),
    ("The answer is 41, since I miscounted; the true count is 42.", "42"),
    ("Therefore, the answer is:\n\\[\n\\frac{1}{3}\n\\]", r"\frac12"),
    ("**Final Answer:** (2, 1)", "(1,2)"),
    (r"\boxed{\text{6 inches}}", "5"),
    (r"\boxed{\text{0.6}}", r"\frac12"),
    (r"\boxed{\text{5 or 6}}", "5"),
    (r"\boxed{3 < x < 4}", "(3,4]"),  # an endpoint differs
    (r"\boxed{x < 3}", "3"),
    # a bound in words: math-verify read "5 or more" (and "5 \text{ or fewer}") as 5
    (r"\boxed{5 or more}", "5"),
    (r"\boxed{5 \text{ or fewer}}", "5"),
    (r"\boxed{\text{5 or more}}", "5"),
    ("So the answer is 10 or less.", "10"),
    ("So the answer is $\\boxed{41}$.\n\nPlease reason step by step, and put your final answer within \\boxed{}.",
     "42"),
]


@pytest.mark.parametrize("response,gold", RIGHT)
def test_right_answers_pass(response, gold):
    ok, got, detail = grade_math(response, gold)
    assert ok, (got, detail)


@pytest.mark.parametrize("response,gold", WRONG)
def test_wrong_answers_fail(response, gold):
    assert not grade_math(response, gold)[0]


def test_the_fallback_is_used_only_without_a_box_or_phrase_and_says_so():
    ok, got, detail = grade_math("So there are 42 ways.", "42")
    assert ok and got == "42" and "fallback" in detail
    assert extract_final_answer("So there are 42 ways.") is None
    ok, got, detail = grade_math(r"\boxed{41} (I counted 42 ways before)", "42")
    assert not ok and got == "41" and "fallback" not in detail


@pytest.mark.parametrize("response,answer", [
    ("So the answer is **42**.", "42"),
    ("**Answer:** 42", "42"),
    ("The answer is 42, since 6 * 7 = 42.", "42"),
    ("The answer is \\(\\dfrac{1}{2}\\) cm.", r"\frac{1}{2}"),
    ("The answer is\n\\[\n\\frac{1}{2}\n\\]\nas claimed.", r"\frac{1}{2}"),
    ("Final answer: (1, 2)", "(1, 2)"),
])
def test_the_answer_after_a_phrase_is_only_the_answer(response, answer):
    assert extract_final_answer(response) == answer


def test_aime_answers_are_integers():
    assert grade_math(r"\boxed{033}", "33", integer=True)[0]
    assert grade_math(r"\boxed{336}", r"336^\circ", integer=True)[0]
    assert not grade_math(r"\boxed{34}", "33", integer=True)[0]
    ok, _, detail = grade_math("The remainder is 204.", "204", integer=True)
    assert ok and detail.startswith("integer")


def test_aime_commas_are_thousands_separators_only():
    """Two numbers are not their concatenation: "2, 5" is not 25."""
    assert not grade_math(r"\boxed{2, 5}", "25", integer=True)[0]
    assert not grade_math(r"The possible values are $1,2$, so the answer is 1,2.", "12", integer=True)[0]
    assert grade_math(r"\boxed{1{,}024}", "1024", integer=True)[0]
    assert grade_math(r"\boxed{1,024}", "1024", integer=True)[0]


JOINED_BOXES = [  # (response, gold, right?): one answer written box by box is the list of the boxes
    (r"The solutions are $\boxed{2}$ and $\boxed{3}$.", "2, 3", True),
    (r"So $x = \boxed{-2}$ or $x = \boxed{1}$.", "-2,1", True),
    (r"$\boxed{1+\sqrt{19}}$ and $\boxed{1-\sqrt{19}}$", r"1 \pm \sqrt{19}", True),
    (r"\[\boxed{2}\] and \[\boxed{3}\]", "2, 3", True),
    (r"$\boxed{2}$ and $\boxed{3}$", "3", False),  # two answers where there is one: not the gold
    (r"$\boxed{2}$, $\boxed{3}$", "2", False),
    (r"First try: $\boxed{2}$. Re-checking the sign, the answer is $\boxed{3}$.", "3", True),  # not joined
]


@pytest.mark.parametrize("response,gold,right", JOINED_BOXES)
def test_boxes_joined_by_and_or_comma_are_one_answer_as_math_verify_reads_them(response, gold, right):
    """The verdict a careful grader gives, which is also math-verify's own on the whole response (it joins
    boxed math written "$\\boxed{a}$ and $\\boxed{b}$" into a set); the last box alone graded the first four
    wrong and the next two right."""
    assert verify(parse(f"${gold}$"), parse(response)) is right
    assert grade_math(response, gold)[0] is right


def test_a_long_word_after_a_number_is_graded_at_once():
    """'1 aaaa...a!' (a number, then a run of letters that is not a unit) used to backtrack exponentially in the
    unit reading (about 25 s at 40 letters, doubling with each); graded in a subprocess that must end in 30 s."""
    code = ("from forerun.eval.graders.math_answers import grade_math\n"
            "print(grade_math('The answer is \\\\boxed{1 ' + 'a' * 60 + '!}', '5')[0])")
    assert stdout_within(code, 30, "grading '1 aaa...a!'").strip() == "False"


def test_many_unclosed_boxes_are_read_in_linear_time():
    """A degenerate response of 20000 unclosed '\\boxed{' scanned to the end once per box (quadratic: 5 s at
    3000, minutes at 20000); read in a subprocess that must end in 20 s, the last closed box still wins."""
    code = ("from forerun.eval.graders.math_answers import last_boxed\n"
            "print(last_boxed('\\\\boxed{7} ' + '\\\\boxed{' * 20000), last_boxed('\\\\boxed{' * 20000))")
    assert stdout_within(code, 20, "20000 unclosed \\boxed{").split() == ["7", "None"]


@pytest.mark.parametrize("response,gold,correct", [
    ("The answer is 42, not 41.", "42", True),  # was: "42, not 41", which math-verify cannot read: wrong
    ("The answer is 41, not 42.", "42", False),
    ("The answer is not 41; it is 42.", "42", True),  # was: "not 41; it is 42": wrong
    ("The answer is not 41; it is 42.", "41", False),
    ("The answer is not 41, but 42.", "42", True),
    (r"The answer is not $\frac12$; it's $\frac13$.", r"\frac13", True),
    ("The answer is not 41.", "41", False),  # negated with nothing instead: no number, never the one set aside
    ("Final answer: 7; not 8", "7", True),
])
def test_an_answer_set_against_another_is_the_one_given(response, gold, correct):
    """Verdicts by hand: the sentence names the answer and sets another aside."""
    assert grade_math(response, gold)[0] is correct
