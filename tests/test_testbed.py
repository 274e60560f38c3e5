"""Built-in testbed tasks: prompts, rewards, known probabilities, Bayes ceilings, SFT data, exact sampling scores."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from calibrl.testbed import tasks as tb
from calibrl.tasks.registry import available_datasets, available_rewards, get_dataset_loader, get_reward


def test_registered_names():
    for task in tb.TASKS:
        assert f"testbed/{task}" in available_datasets()
        assert f"testbed/{task}" in available_rewards()
    ds = get_dataset_loader("testbed/decision")(split="eval", n=20)
    assert len(ds) == 20 and set(ds.column_names) >= {"prompt", "answer", "p_true", "classes", "prompt_id"}
    assert ds[0]["classes"] == ["Y", "N"]


def test_the_task_registry_reaches_the_testbed_only_through_the_provider_the_package_adds():
    """In a fresh interpreter the testbed's tasks resolve by name (the package root adds their provider), and
    without that provider the registry's own lookups import no testbed module (the lower layer never reaches up)."""
    import subprocess
    import sys

    probe = ("import sys\n"
             "from calibrl.tasks import registry\n"
             "assert registry.get_reward('testbed/addition') is not None\n"
             "del sys.modules['calibrl.testbed.tasks']\n"
             "registry._PROVIDERS.clear()\n"
             "registry.available_datasets(); registry.get_reward('math')\n"
             "print(sorted(m for m in sys.modules if m.startswith('calibrl.testbed')))\n")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "['calibrl.testbed']"  # the package, imported by the first lookup's provider


def test_ideal_sampler_frontier_matches_monte_carlo_at_a_temperature():
    """The ideal sampler at T = 0.5 (answers drawn with probability proportional to q^2, reasoning always right),
    simulated on every code: its mean q and the AUROC of q against drawn outcomes match ideal_sampler; sharpening
    raises accuracy and lowers the AUROC (the structural trade-off of the stochastic tasks)."""
    from calibrl.metrics import auroc

    rng = np.random.default_rng(0)
    codes = np.repeat(np.arange(10_000), 4)
    ss = np.array([sum(int(c) for c in f"{code:04d}") for code in codes])
    likely_c = np.array(tb.STOCHASTIC_C)[ss % 8]
    w_likely, w_other = likely_c ** 2, ((1 - likely_c) / 9) ** 2
    p_likely = w_likely / (w_likely + 9 * w_other)
    q = np.where(rng.random(codes.size) < p_likely, likely_c, (1 - likely_c) / 9)
    drawn = rng.random(q.size) < q
    accuracy, frontier_auroc = tb.ideal_sampler("stochastic_reasoning", 0.5)
    assert q.mean() == pytest.approx(accuracy, abs=0.005)
    assert auroc(q, drawn) == pytest.approx(frontier_auroc, abs=0.01)
    curve = [tb.ideal_sampler("stochastic_reasoning", t) for t in (1.0, 0.7, 0.5, 0.3, 0.0)]
    assert all(a1 < a2 and u1 > u2 for (a1, u1), (a2, u2) in zip(curve, curve[1:]))
    assert curve[0][1] == tb.bayes_auroc("stochastic_reasoning") and curve[-1][1] == pytest.approx(
        tb.bayes_auroc("stochastic_reasoning", policy="greedy"))
    assert all(np.isnan(tb.ideal_sampler(t, 1.0)).all() for t in ("addition", "scratchpad", "forms"))


@pytest.mark.parametrize("task", tb.TASKS)
def test_rows_are_seeded_distinct_and_splits_disjoint(task):
    a = tb.build_rows(task, 500, split="train", seed=0)
    b = tb.build_rows(task, 500, split="train", seed=0)
    assert a == b
    prompts = [r["prompt"] for r in a]
    assert len(set(prompts)) == len(prompts)
    for split in ("eval", "test"):
        other = {r["prompt"] for r in tb.build_rows(task, 300, split=split, seed=0)}
        assert not other & set(prompts), split


def test_decision_columns_match_definition():
    for row in tb.build_rows("decision", 200):
        ss = sum(int(c) for c in row["prompt"][:4])
        assert row["prompt"].endswith("=") and len(row["prompt"]) == 5
        assert row["answer"] == f"{ss:02d}"
        assert row["p_true"] == [0.1, 0.2, 0.3, 0.4, 0.6, 0.7, 0.8, 0.9][ss % 8]


def test_decision_reward_rate_matches_p():
    # For a fixed prompt, answering Y is rewarded with probability p(x) and N with 1 - p(x): fresh draws per call.
    reward = tb.make_reward("decision", seed=0)
    n = 4000
    for prompt in ("0000=", "1000=", "3000=", "7000=", "9999="):
        ss = sum(int(c) for c in prompt[:4])
        p = tb.DECISION_P[ss % 8]
        yes = np.mean(reward([prompt] * n, [f"{ss:02d}:Y"] * n))
        no = np.mean(reward([prompt] * n, [f"{ss:02d}:N"] * n))
        se = np.sqrt(p * (1 - p) / n)
        assert abs(yes - p) < 5 * se + 1e-3, (prompt, yes, p)
        assert abs(no - (1 - p)) < 5 * se + 1e-3, (prompt, no, p)
        # wrong reasoning or a broken format is never rewarded
        assert sum(reward([prompt] * 50, [f"{(ss + 1) % 37:02d}:Y"] * 50)) == 0
        assert sum(reward([prompt] * 50, ["??"] * 50)) == 0


def test_true_policy_reward_rate_matches_expectation():
    # The true-p policy (the SFT distribution) earns E[p^2 + (1-p)^2]; check on sampled completions.
    rng = np.random.default_rng(0)
    rows = tb.build_rows("decision", 3000, split="train")
    comps = [tb.sample_true_completion("decision", r, rng) for r in rows]
    rewards = tb.make_reward("decision", seed=1)([r["prompt"] for r in rows], comps)
    p = np.array([r["p_true"] for r in rows])
    expected = np.mean(p ** 2 + (1 - p) ** 2)
    assert abs(np.mean(rewards) - expected) < 0.03
    # and the empirical Y rate of the true policy per p matches p
    said_yes = np.array([c.endswith("Y") for c in comps])
    for value in (0.1, 0.4, 0.9):
        sel = p == value
        assert abs(said_yes[sel].mean() - value) < 0.06


def test_stochastic_reasoning_reward_and_probabilities():
    reward = tb.make_reward("stochastic_reasoning", seed=0)
    prompt = "1234?"  # ss = 10, c = STOCHASTIC_C[2] = 0.4, likely digit 0
    c = tb.STOCHASTIC_C[10 % 8]
    n = 4000
    likely = np.mean(reward([prompt] * n, ["10;0"] * n))
    other = np.mean(reward([prompt] * n, ["10;7"] * n))
    assert abs(likely - c) < 0.03
    assert abs(other - (1 - c) / 9) < 0.02
    assert tb.true_success_probability("stochastic_reasoning", prompt, "10;0") == pytest.approx(c)
    assert tb.true_success_probability("stochastic_reasoning", prompt, "11;0") == 0.0
    # the outcome distribution sums to one over the ten answers
    total = sum(tb.true_success_probability("stochastic_reasoning", prompt, f"10;{d}") for d in range(10))
    assert total == pytest.approx(1.0)


def test_addition_reward_is_deterministic():
    reward = get_reward("testbed/addition")
    assert reward(["12+34+56="], ["46+56=102"]) == [1.0]
    assert reward(["12+34+56="], ["46+56=103"]) == [0.0]
    assert reward(["12+34+56="], ["nonsense"]) == [0.0]
    # conversational completions are read too
    assert reward(["12+34+56="], [[{"role": "assistant", "content": "46+56=102"}]]) == [1.0]
    for row in tb.build_rows("addition", 50):
        comp = tb.sample_true_completion("addition", row, np.random.default_rng(0))
        assert tb.parse("addition", row["prompt"], comp)["reasoning_ok"]
        assert tb.true_success_probability("addition", row["prompt"], comp) == 1.0


@pytest.mark.parametrize("task", ["decision", "stochastic_reasoning"])
def test_bayes_auroc_matches_monte_carlo(task):
    from calibrl.metrics import auroc

    rng = np.random.default_rng(0)
    rows = tb.build_rows(task, 8000, split="train")  # 8,000 of the 10,000 codes: close to uniform
    comps = [tb.sample_true_completion(task, r, rng) for r in rows]
    q = np.array([tb.true_success_probability(task, r["prompt"], c) for r, c in zip(rows, comps)])
    drawn = rng.random(len(q)) < q
    assert abs(auroc(q, drawn) - tb.bayes_auroc(task)) < 0.02
    assert tb.bayes_auroc(task, policy="greedy") < tb.bayes_auroc(task)
    assert np.isnan(tb.bayes_auroc("addition"))


@pytest.mark.parametrize("task", tb.TASKS)
def test_sft_dataset_follows_the_format(task):
    ds = tb.sft_dataset(task, 200)
    assert set(ds.column_names) == {"prompt", "completion"}
    ok = [tb.parse(task, p, c)["reasoning_ok"] for p, c in zip(ds["prompt"], ds["completion"])]
    assert all(ok)


def test_sample_completions_scores_exactly():
    from calibrl.models import build_tiny_model
    from calibrl.testbed.warmstart import sample_completions

    torch.manual_seed(0)
    model, tok = build_tiny_model(seed=0)
    ids = [tok.convert_tokens_to_ids(c) for c in ("Y", "N")]
    res = sample_completions(model, tok, ["1234=", "5678="], n=3, max_new_tokens=5, class_token_ids=ids, seed=0)
    assert len(res["completion"]) == 6 and list(res["prompt_index"]) == [0, 0, 0, 1, 1, 1]
    # recompute the mean log-prob of each completion by hand (completion tokens + EOS when it was emitted)
    for prompt, comp, lpm, n_tok in zip(res["prompt"], res["completion"], res["logprob_mean"], res["n_tokens"]):
        c_ids = tok(comp, add_special_tokens=False).input_ids
        if n_tok == len(c_ids) + 1:
            c_ids = c_ids + [tok.eos_token_id]
        assert len(c_ids) == n_tok
        p_ids = tok(prompt, add_special_tokens=False).input_ids
        full = torch.tensor([p_ids + c_ids])
        with torch.no_grad():
            logp = torch.log_softmax(model(full).logits[0, :-1].float(), -1)
        tok_lp = logp[torch.arange(len(p_ids) - 1, full.shape[1] - 1), torch.tensor(c_ids)]
        assert tok_lp.mean().item() == pytest.approx(lpm, abs=1e-4)
    cp = res["class_probs"]
    has = ~np.isnan(cp[:, 0])
    assert np.allclose(cp[has].sum(1), 1.0)
    # the same seed gives the same samples
    again = sample_completions(model, tok, ["1234=", "5678="], n=3, max_new_tokens=5, seed=0)
    assert again["completion"] == res["completion"]


def test_decision_copy_task_copies_the_conclusion_and_rewards_the_decision():
    rows = tb.build_rows("decision_copy", 400, split="train")
    assert all(r["prompt"].endswith("^") and r["classes"] == ["Y", "N"] for r in rows)
    assert not {r["prompt"] for r in rows} & {r["prompt"] for r in tb.build_rows("decision_copy", 200, split="test")}
    rng = np.random.default_rng(0)
    says_yes = []
    for r in rows:
        c = tb.sample_true_completion("decision_copy", r, rng)
        parsed = tb.parse("decision_copy", r["prompt"], c)
        assert parsed["format_ok"] and parsed["reasoning_ok"] and parsed["choice"] == parsed["conclusion"]
        says_yes.append((parsed["choice"] == "Y") - r["p_true"])
    assert abs(np.mean(says_yes)) < 0.05  # the conclusion is drawn with probability p(x)
    prompt = rows[0]["prompt"]
    p = rows[0]["p_true"]
    ss = rows[0]["answer"]
    # the decision (last class token) is what is graded, whatever the reasoning concluded
    assert tb.true_success_probability("decision_copy", prompt, f"{ss}:N>Y") == pytest.approx(p)
    assert tb.true_success_probability("decision_copy", prompt, f"{ss}:Y>N") == pytest.approx(1 - p)
    wrong_sum = f"{(int(ss) + 1) % 100:02d}:Y>Y"
    assert tb.true_success_probability("decision_copy", prompt, wrong_sum) == 0.0
    assert tb.bayes_auroc("decision_copy") == pytest.approx(tb.bayes_auroc("decision"))


@pytest.mark.parametrize("task", sorted(tb._BY_NAME))
def test_answer_keys_group_completions_of_equal_success_probability(task):
    """Answer selection on the testbed votes over answer_keys: two completions of one prompt share a key exactly
    when the world rewards them with the same probability, so a voted answer's drawn outcomes estimate its
    success probability. Checked on sampled true completions plus corrupted ones (wrong sum, unparsable)."""
    from calibrl.testbed.evaluate import answer_keys

    rng = np.random.default_rng(0)
    checked = 0
    for row in tb.build_rows(task, 40, split="test", seed=0):
        prompt = row["prompt"]
        completions = [tb.sample_true_completion(task, row, rng) for _ in range(12)]
        completions += [("9" + c[1:]) if c[:1] != "9" else ("8" + c[1:]) for c in completions[:4]]  # first digit off
        completions += ["???"]
        parsed = [tb.parse(task, prompt, c) for c in completions]
        keys = answer_keys(task, parsed)
        q = [tb.true_success_probability(task, prompt, c) for c in completions]
        for i in range(len(keys)):
            for j in range(len(keys)):
                if keys[i] == keys[j]:
                    assert q[i] == pytest.approx(q[j]), (task, completions[i], completions[j])
                    checked += 1
    assert checked > 40 * 16
    assert answer_keys(task, [tb.parse(task, "0000?", "???")]) == ["-"]


def test_forms_task_surface_forms_tiers_and_rewards():
    """testbed/forms: three spellings of one value (one answer for calibrl's grader), near misses on learnable
    prompts, far-wrong values on hard ones, a coin-flip reward on noise prompts."""
    from calibrl.selection.answers import answers_equivalent
    from calibrl.trl.rollout import answer_ids_for

    prompt = "1234~"  # learnable, digit sum 10
    for text, form in (("10", 0), ("10.0", 1), ("+10", 2)):
        assert tb.parse("forms", prompt, text) == {"format_ok": True, "reasoning_ok": True, "choice": "10",
                                                     "form": form}
        assert tb.true_success_probability("forms", prompt, text) == 1.0
        assert answers_equivalent(text, "10")  # the grader's equivalence agrees with the task's
    for bad in ("+10.0", "010", "10.00", "100", "x", ""):
        assert not tb.parse("forms", prompt, bad)["format_ok"], bad
        assert tb.true_success_probability("forms", prompt, bad) == 0.0
    assert tb.true_success_probability("forms", prompt, "11.0") == 0.0
    assert tb.true_success_probability("forms", "8123~", "3") == tb.FORMS_NOISE_P  # noise: any value
    assert tb.true_success_probability("forms", "8123~", "3.00") == 0.0  # but not a malformed one
    assert [tb.prompt_tier("forms", p) for p in ("3999~", "4000~", "6999~", "7000~")] == [
        "learnable", "hard", "hard", "noise"]
    assert tb.prompt_tier("stochastic_reasoning", "1234?") is None
    # SEED-GRPO's clusters in training merge the forms: one meaning, whatever the spelling
    assert answer_ids_for(["10", "10.0", "+10", "11"], group_ids=[0] * 4, classes=None, last_line=True) == [0, 0, 0, 1]

    # the noise tier's reward is a fresh draw at rate 0.5; the learnable tiers' rewards are deterministic
    reward = tb.make_reward("forms", seed=0)
    draws = reward(["8123~"] * 4000, ["14"] * 4000)
    assert abs(np.mean(draws) - 0.5) < 0.03
    assert reward(["1234~", "1234~"], ["10", "9"]) == [1.0, 0.0]


def test_forms_teacher_follows_its_tiers():
    """The SFT teacher: right with probability 0.5 / 0.2 / 0.5 (learnable / hard / noise); a learnable error is
    the sum +-1, a hard error at least 5 away; the three forms equally often."""
    rng = np.random.default_rng(0)
    stats = {tier: [] for tier in ("learnable", "hard", "noise")}
    forms = []
    for row in tb.build_rows("forms", 300, split="train", seed=0):
        ss = int(row["answer"])
        for _ in range(20):
            parsed = tb.parse("forms", row["prompt"], tb.sample_true_completion("forms", row, rng))
            assert parsed["format_ok"]
            value = int(parsed["choice"])
            stats[row["tier"]].append(value - ss)
            forms.append(parsed["form"])
    for tier, right in (("learnable", 0.5), ("hard", 0.2), ("noise", 0.5)):
        d = np.array(stats[tier])
        assert abs((d == 0).mean() - right) < 0.04, tier
        wrong = np.abs(d[d != 0])
        assert (wrong == 1).all() if tier != "hard" else (wrong >= 5).all(), tier
    assert np.allclose(np.bincount(forms) / len(forms), 1 / 3, atol=0.02)
    assert np.isnan(tb.bayes_auroc("forms"))


def test_evaluate_reports_each_tiers_expected_accuracy():
    """On tasks with prompt tiers the evaluation adds expected_accuracy_<tier>: the mean true success probability
    of that tier's samples (their prompt-count-weighted mean is the overall expected accuracy)."""
    from calibrl.testbed.evaluate import evaluate
    from calibrl.models import build_tiny_model

    torch.manual_seed(0)
    model, tok = build_tiny_model(seed=0)
    model.train(False)
    prompts = ["1234~", "4321~", "7777~", "0100~"]  # learnable, hard, noise, learnable
    metrics, samples = evaluate(model, tok, "forms", prompts, n=4, seed=0)
    tiers = np.array(["learnable", "hard", "noise", "learnable"])[samples["prompt_index"]]
    for tier in ("learnable", "hard", "noise"):
        assert metrics[f"expected_accuracy_{tier}"] == pytest.approx(samples["q_true"][tiers == tier].mean())
    assert 2 / 4 * metrics["expected_accuracy_learnable"] + metrics["expected_accuracy_hard"] / 4 + \
        metrics["expected_accuracy_noise"] / 4 == pytest.approx(metrics["expected_accuracy"])
    from calibrl import metrics as M

    assert metrics["aurc"] == pytest.approx(M.aurc(samples["logprob_mean"], samples["correct"]))
    assert metrics["precision_at_50"] == pytest.approx(
        M.precision_at_coverage(samples["logprob_mean"], samples["correct"], [0.5])[0.5])
    untiered, _ = evaluate(model, tok, "stochastic_reasoning", ["1234?"], n=2, seed=0)
    assert not any(k.startswith("expected_accuracy_") for k in untiered)


def test_token_entropy_estimate_weights_each_completion_by_its_tokens():
    """-sum(n_i lpm_i) / sum(n_i): completions of 2 tokens at mean log-prob -1 and 4 at -0.5 give (2 + 2) / 6; a
    plain mean of the completions' means (0.75) would be wrong; no tokens at all: 0."""
    from calibrl.metrics import metric

    def entropy(lpm, n):
        return metric("entropy").compute({"logprob_mean": np.array(lpm), "n_tokens": np.array(n)})

    assert entropy([-1.0, -0.5], [2, 4]) == pytest.approx(4 / 6)
    assert entropy([0.0], [0]) == 0.0


def test_processes_needing_one_warm_start_at_once_train_it_once(tmp_path, monkeypatch):
    """Two callers of warm_start for one config on an empty cache: one trains, the other waits for its lock and
    finds the folder (a stand-in trainer, so the test trains nothing)."""
    import threading
    import time

    from calibrl.testbed import warmstart

    monkeypatch.setenv("CALIBRL_CACHE", str(tmp_path))
    calls = []

    def train(config, out_dir, log=None, progress=None):
        calls.append(out_dir)
        time.sleep(0.5)  # long enough for the other thread to reach the lock
        return {"chosen_step": 0, "chosen_accuracy": 1.0, "target": 0.9, "history": []}

    monkeypatch.setattr(warmstart, "_train_sft", train)
    config = warmstart.WarmStartConfig(task="decision", max_steps=10)
    found: list = []
    threads = [threading.Thread(target=lambda: found.append(warmstart.warm_start("decision", config)))
               for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(calls) == 1 and len(found) == 2 and found[0] == found[1] == warmstart.cache_path(config)
    assert warmstart.warm_start_info(found[0])["chosen_step"] == 0
