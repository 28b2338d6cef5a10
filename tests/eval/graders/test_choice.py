"""Multiple-choice letter extraction on outputs written the way models write them.  Each case is a whole
response (or its ending) and the letter a careful human grader would read from it; None: no choice made."""

from __future__ import annotations

import pytest

from forerun.eval.graders.choice import extract_choice, grade_choice
from forerun.testing.time_bound import stdout_within

CASES = [
    # explicit final-answer statements, in the phrasings the issue found unread (3 of 8) and others
    ("Let me compute the energy levels...\n\nThe answer is (b).", "B"),
    ("Checking each value: only 42 satisfies both equations.\n\nB) 42 is the only value that works.", "B"),
    ("So the product is even.\nanswer: c", "C"),
    ("Final answer: B", "B"),
    ("Therefore the correct choice is \\boxed{B}.", "B"),
    ("\\boxed{b}", "B"),
    ("\\boxed{\\text{(D) } 3.2\\,\\text{eV}}", "D"),
    ("\\boxed{\\textbf{(C)}}", "C"),
    ("So the correct option is $\\boxed{\\mathbf{C}}$.", "C"),  # the letter in a font macro (got no letter)
    ("\\boxed{\\mathrm{B}}", "B"),
    ("Hence \\fbox{D}", "D"),
    ("The answer is \\textbf{B}.", "B"),  # after an answer phrase too
    ("**Answer:** $\\text{C}$", "C"),
    ("So the answer is \\(\\mathrm{D}\\).", "D"),
    ("Final Answer: The final answer is $\\boxed{D}$. I hope it is correct.", "D"),
    ("**Answer:** D", "D"),
    ("**Answer: (a)**", "A"),
    ("The correct answer is **C**.", "C"),
    ("So the answer is: **(c)**", "C"),
    ("Answer: (A) 3.2 eV", "A"),
    ("I'll go with B.", "B"),
    ("I'd go with C.", "C"),
    ("The answer is \"C\".", "C"),
    ("So the answer is 'd'.", "D"),
    ("Answer: [B]", "B"),
    ("The answer is “A”, not B.", "A"),
    ("Option A is wrong because the sign flips. So I'd say C is the correct answer.", "C"),
    ("Reasoning about the reaction...\nC", "C"),
    ("...hence\n\n**D**", "D"),
    # the LAST explicit statement wins (the model changes its mind)
    ("At first glance the answer is (A). Wait, I forgot the factor of 2, so the answer is (C).", "C"),
    ("\\boxed{A}\n\nHmm, re-checking: the spin is 1/2, not 1. Final answer: B", "B"),
    # negations do not count ...
    ("Option A is wrong.", None),
    ("It is not A.", None),
    ("A is incorrect, B is incorrect, and D is incorrect.", None),
    ("We can rule out (A), and (B) fails the boundary condition.", None),
    ("Not A. Not B. Not D.", None),
    # ... when an explicit answer follows, or the negation is about another letter
    ("Option A is wrong. Option C is correct.", "C"),
    ("The answer is B, not A.", "B"),
    # a conclusion or a final line that sets one other letter aside before its sentence ends
    ("It is B, not C.", "B"),
    ("It is C, not B.", "C"),
    ("Working through it...\nB, not C.", "B"),
    ("so B (not A).", "B"),
    ("It is B, not C or D.", None),  # two letters set aside: not a single conclusion
    ("It is B, not C, and D is wrong too.", None),
    ("The correct option is D, not A", "D"),
    ("Answer: Option A is wrong, so the answer must be B", "B"),
    ("A is incorrect since the entropy decreases; therefore (C).", "C"),
    # a negation of the next letter is not one of the letter before it
    ("The answer is (C) and not (D).", "C"),
    ("The answer is A and not B", "A"),
    ("Answer: C (not A)", "C"),
    ("(A) and (B) are wrong.", None),
    # a justification after the letter negates something else, not the letter (these got no letter)
    ("The correct answer is C because the reaction is not spontaneous.", "C"),
    ("The answer is B since the other options are not possible.", "B"),
    ("Therefore the answer is (A) as the function is not continuous at 0.", "A"),
    ("\\boxed{D} because option A is incorrect", "D"),
    ("B is correct because A is not.", "B"),
    ("Option A is wrong because the sign flips.", None),
    ("A is not correct because the sign flips.", None),
    ("(A) as well as (B) are incorrect.", None),  # "as well as" joins letters, it justifies nothing
    ("Options such as (C) are not valid here.", None),
    # "X is correct" states the choice as "option X is correct" does
    ("Therefore, D is correct.", "D"),
    ("D is not correct.", None),
    ("D is the answer.", "D"),  # and "X is the answer" (got no letter)
    ("(B) is the answer", "B"),
    ("B is not the answer.", None),
    # "it's X." ends an elimination as "so X." does (got no letter)
    ("Not A. It's D.", "D"),
    ("Neither A nor B; it's C.", "C"),
    ("It is A good question.", None),
    ("It's not B.", None),
    # a restated option list after the answer is not a final-line answer; a label after a list still is
    ("The answer is C.\n\nA. 5\nB. 6\nC. 7\nD. 8", "C"),
    ("Options:\nA) 5\nB) 6\nC) 7\nD) 8\n\nB", "B"),
    ("Checking them in turn.\nB. 6", "B"),
    # a response that only repeats the options chooses none (its last label read D: right whenever D was gold)
    ("A) 1\nB) 2\nC) 3\nD) 4", None),
    ("Question: what is 1+1?\nA) 1\nB) 2\nC) 3\nD) 4\nAnswer:", None),
    ("(A) 1\n\n(B) 2\n\n(C) 3\n\n(D) 4", None),
    ("A) too small\nB) too large\nC) about right\nD) too small", None),
    # ... but a list that keeps one option, or a mention outside the list, still names it
    ("A) wrong, too small\nB) wrong\nC) correct\nD) wrong", "C"),
    ("I think (B) fits.\nA) 1\nB) 2\nC) 3\nD) 4", "B"),
    # an explanation after a colon or dash that has its own subject does not negate the letter (got no letter)
    ("The answer is B: the others fail", "B"),
    ("The answer is (B): the other options are wrong.", "B"),
    ("Answer: B - A is wrong", "B"),
    ("The answer is B: A fails the boundary condition.", "B"),
    ("(A): incorrect\n(B): correct\n(C): incorrect\n(D): incorrect", "B"),  # its own verdict: still a negation
    ("A: incorrect", None),
    ("A - wrong", None),
    # a negation before a colon that opens an answer statement is about the earlier answer (read B, or none)
    ("So the answer is B.\n\nWait, that is wrong: the answer is C.", "C"),
    ("My first guess was wrong: the answer is C.", "C"),
    ("Hmm, not quite - the correct option is D.", "D"),
    ("That was incorrect: C", None),
    ("I do not think the answer is A.", None),
    # an elimination ending on its conclusion (got no letter) ...
    ("A is wrong, C is wrong, D is wrong, so B", "B"),
    ("A is wrong, C is wrong and D is wrong, leaving B.", "B"),
    ("Not A, not C, not D. Therefore, (B).", "B"),
    ("A fails, C fails and D fails, which leaves B", "B"),
    ("A and D are too large and C is negative, so it must be B.", "B"),
    # ... but never a guess: no conclusion, several letters, a negated or lowercase one
    ("A is wrong, C is wrong, D is wrong.", None),
    ("A is wrong, so B or C.", None),
    ("Hence B and C both fit.", None),
    ("So B is wrong too.", None),
    ("so b.", None),
    ("The answer is C, so B is wrong.", "C"),
    # an answer statement naming two letters is a hedge, no choice (it read the first: right whenever either was)
    ("The answer is B or C.", None),
    ("The answer is (A) and (C)", None),  # the mention "(C)" does not stand alone either
    ("Answer: B/C", None),
    ("The answer is A, B, or D.", None),
    ("\\boxed{B, C}", None),
    ("I would pick (A) or (C).", None),
    ("**B** or **C**", None),
    # ... but a second letter that is negated, or only compared, leaves the first
    ("The answer is B, and C is wrong.", "B"),
    ("The answer is B and not C.", "B"),
    ("Answer: C (not A or B)", "C"),
    ("Comparing (A) and (B), (B) is larger", "B"),
    ("The answer is (D) both A and B", "D"),
    ("The answer is B or C, but B fits better, so B.", "B"),
    # the instruction echoed: its example box is not an answer (it read A, right whenever A was gold)
    ("The answer is (C).\n\nThink step by step, then give the letter of the correct option within \\boxed{}, "
     "for example \\boxed{A}.", "C"),
    ("Think step by step, then give the letter of the correct option within \\boxed{}, for example \\boxed{A}.",
     None),
    ("e.g. \\boxed{B}", None),
    # mentions without a statement
    ("I think it's (D)", "D"),
    ("the answer is a number, so (B)", "B"),
    # a function's argument is not an option (a response cut before its answer read B, A, C from these)
    ("By Bayes, P(A|B) = P(B|A)P(A)/P(B). Computing P(B) first requires", None),
    ("Let f(a) = 3 and f(b) = 5, so f(b) - f(a) = 2. Then", None),
    ("The probability P(C) is the", None),
    ("Comparing (A) with P(C), option (A) is larger", "A"),
    # letters that are not options, and no answer at all
    ("Answer: E", None),
    ("I cannot tell without more information.", None),
    ("A good approach is to compare the orbitals.", None),
]


@pytest.mark.parametrize("text,want", CASES, ids=[f"case{i}" for i in range(len(CASES))])
def test_letter_read_from_realistic_outputs(text, want):
    assert extract_choice(text, 4) == want


def test_five_option_questions_and_grading():
    assert extract_choice("The answer is (E).", 5) == "E" and extract_choice("The answer is (E).", 4) is None
    assert grade_choice("The answer is (b).", "B") == (True, "B", "letter")
    assert grade_choice("The answer is (b).", "C")[0] is False
    assert grade_choice("Option A is wrong.", "A") == (False, None, "no letter")  # a negation is not a choice


def test_a_long_run_of_spaces_after_an_answer_phrase_is_read_at_once():
    """'The answer is' then thousands of spaces (a degenerate generation) took cubic time (30 s for 2000
    spaces); read in a subprocess that must end in 20 s, and the letter after the spaces still counts."""
    code = ("from forerun.eval.graders.choice import extract_choice\n"
            "print(extract_choice('The answer is' + ' ' * 4000 + '!'), extract_choice('Answer:' + ' ' * 4000 + 'C'))")
    assert stdout_within(code, 20, "reading 'The answer is' + 4000 spaces").split() == ["None", "C"]
