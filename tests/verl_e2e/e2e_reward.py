"""Rule reward of the end-to-end rehearsal (tests/verl_e2e): verl's ``custom_reward_function`` signature.

The toy task: the prompt is ``a+b=``, the ground truth the last digit of ``a + b``. The answer is the first digit of
the response (None without one). A randomly initialised model rarely gives the right digit, so the score is 1 when
the answer has the parity of the ground truth: about half the completions of a prompt score 1 and most groups are
mixed, which is what CAPO's correct/incorrect split and the noise mask need to be exercised.
"""

from __future__ import annotations

import re
from typing import Any

_DIGIT = re.compile(r"\d")


def first_digit(text: str) -> str | None:
    """The first decimal digit in ``text``, else None."""
    match = _DIGIT.search(text)
    return match.group(0) if match else None


def compute_score(data_source: str, solution_str: str, ground_truth: str, extra_info: Any = None,
                  **_: Any) -> dict[str, Any]:
    """``{"score": 1.0 if the answer's parity is the ground truth's else 0.0, "answer": first digit or None}``."""
    answer = first_digit(solution_str)
    score = float(answer is not None and int(answer) % 2 == int(ground_truth) % 2)
    return {"score": score, "answer": answer}
