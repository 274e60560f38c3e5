"""studies/deepconf_realmodel.py: the page docs/results/deepconf_realmodel.md is what its committed samples give,
and a difference is worded no more strongly than its intervals allow."""

from __future__ import annotations


import pytest

from studies import deepconf_realmodel as study, reproduce


@pytest.mark.parametrize("intervals, words", [
    ((0.01, 0.10, 0.002, 0.12), "better"),  # both intervals above 0
    ((0.01, 0.10, -0.01, 0.12), "better at 95% only (not after Bonferroni)"),
    ((-0.10, -0.01, -0.12, -0.002), "worse"),
    ((-0.10, -0.01, -0.12, 0.01), "worse at 95% only (not after Bonferroni)"),
    ((-0.05, 0.08, -0.09, 0.11), "not resolved"),
    ((0.0, 0.19, 0.0, 0.25), "not resolved"),  # an interval touching 0 excludes nothing
])
def test_verdict_says_no_more_than_the_intervals(intervals, words):
    assert study.verdict(*intervals, better="better", worse="worse") == words


def test_the_page_is_rebuilt_unchanged_from_the_committed_samples(capsys):
    samples, answer_ids = study.load()
    res = study.analyse(samples, answer_ids)
    # the window and tail are the protocol's 16 tokens, not the 2,048 default: the signals of a long trace differ
    # from its mean (with 2,048 all four would equal it)
    long = samples.n_tokens > 2 * study.WINDOW
    mean = samples.deepconf_signal("deepconf_mean")[long]
    for kind in ("deepconf_tail", "deepconf_min"):
        assert long.any() and (samples.deepconf_signal(kind)[long] != mean).all(), kind

    text = study.rebuild()  # the first run's analysis, and the rerun's beside it
    assert text == study.PAGE.read_text()
    assert res["descriptive"]["prompts_all_wrong"] + res["descriptive"]["prompts_any_right"] == res["descriptive"][
        "n_prompts"]
    pools = {"deepconf_realmodel": reproduce.number_pool(text)}
    assert reproduce.unchecked_numbers("deepconf_realmodel.md", text, pools, own=["deepconf_realmodel"],
                                       by_hand=False) == []
