"""CalibratedGRPOTrainer on the tiny char-level model: advantages, reference, decision term, telemetry, recipes.

Every run is a few optimizer steps of a ~0.2M-parameter model with 8-token completions (about a second each).
"""

from __future__ import annotations

import math

import pytest
import torch

import trl  # noqa: E402,F401

from datasets import Dataset  # noqa: E402

from calibrl import RolloutBatch, compute_advantages  # noqa: E402
from calibrl.models import build_tiny_model  # noqa: E402
from calibrl.trl.telemetry import calibration_metrics  # noqa: E402
from calibrl.trl import CalibratedGRPOConfig, CalibratedGRPOTrainer, extract_answer  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore")

DECISION_CLASSES = list("abcdefghij")


@pytest.fixture(autouse=True)
def _one_torch_thread():
    """The tiny model runs fastest on one thread (and the suite shares 2 cores); restored afterwards."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _dataset(n: int = 32) -> Dataset:
    return Dataset.from_list([{"prompt": f"{i:02d}+{i % 7}=", "answer": str(i + i % 7)} for i in range(n)])


def parity_reward(prompts, completions, **kwargs):
    """1 when the completion's first character has an even code point: about half the samples of a random model."""
    return [float(bool(c) and ord(c[0]) % 2 == 0) for c in completions]


def decision_reward(prompts, completions, **kwargs):
    """Decision = last of the classes in the completion; correct when it is in the first half of the classes."""
    out = []
    for c in completions:
        positions = [(c.rfind(k), k) for k in DECISION_CLASSES if k in c]
        out.append(float(bool(positions) and max(positions)[1] in DECISION_CLASSES[:5]))
    return out


def _config(tmp_path, **kw) -> CalibratedGRPOConfig:
    base = dict(
        output_dir=str(tmp_path / "out"), per_device_train_batch_size=8, num_generations=4, max_completion_length=8,
        max_steps=2, logging_steps=1, report_to="none", use_cpu=True, learning_rate=1e-3, save_strategy="no",
        seed=0, disable_tqdm=True, bf16=False,  # fp32 end to end, so log-probs compare at 1e-5
    )
    base.update(kw)
    return CalibratedGRPOConfig(**base)


class Recorder(CalibratedGRPOTrainer):
    """Records, at every advantage step, the raw generation output and an INDEPENDENT recomputation of each
    completion's mean token log-prob (plain model forward + log_softmax, not TRL's fused helper)."""

    def _calibrl_replace_advantages(self, output):
        record = {"output": {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in output.items()}}
        with torch.no_grad():
            ids = torch.cat([output["prompt_ids"], output["completion_ids"]], 1)
            att = torch.cat([output["prompt_mask"], output["completion_mask"]], 1)
            logits = self.model(input_ids=ids, attention_mask=att).logits.float()
            record["logits"] = logits  # [B, P+C, V] the model's final logits
            p, c = output["prompt_ids"].size(1), output["completion_ids"].size(1)
            logp = torch.log_softmax(logits[:, p - 1 : p + c - 1] / self.temperature, -1)
            tok = logp.gather(-1, output["completion_ids"].unsqueeze(-1)).squeeze(-1)
            m = output["completion_mask"].float()
            record["lpm"] = (tok * m).sum(1) / m.sum(1).clamp(min=1)
        record["completions"] = list(self._calibrl_completions)
        out = super()._calibrl_replace_advantages(output)
        record["rollout"] = self.last_rollout
        record["advantages_out"] = out["advantages"].clone()
        record["final"] = {k: v for k, v in out.items() if k.startswith("calibrl_")}
        self.records.append(record)
        return out

    def __init__(self, *a, **k):
        self.records = []
        super().__init__(*a, **k)


def _trainer(tmp_path, cls=Recorder, reward=parity_reward, dataset=None, eval_dataset=None, **kw):
    model, tok = build_tiny_model(seed=0)
    return cls(model=model, reward_funcs=reward, args=_config(tmp_path, **kw), train_dataset=dataset or _dataset(),
               eval_dataset=eval_dataset, processing_class=tok)


def _logged(trainer, key):
    return [h[key] for h in trainer.state.log_history if key in h]


# ---------------------------------------------------------------------------------------------------- estimators


@pytest.mark.parametrize("estimator", ["capo", "grpo"])
def test_advantages_equal_compute_advantages_on_independent_inputs(tmp_path, estimator):
    trainer = _trainer(tmp_path, advantage_estimator=estimator)
    trainer.train()
    assert trainer.state.global_step == 2 and len(trainer.records) == 2
    for rec in trainer.records:
        rewards = torch.tensor(parity_reward(None, rec["completions"]))
        lpm = rec["lpm"]
        batch = rec["rollout"]["batch"]
        torch.testing.assert_close(batch.rewards, rewards)
        torch.testing.assert_close(batch.logprob_mean, lpm, atol=1e-5, rtol=1e-5)
        independent = RolloutBatch(rewards=rewards, group_ids=torch.arange(len(rewards)) // 4, logprob_mean=lpm)
        expected = compute_advantages(independent, estimator, **trainer.args.estimator_params())
        torch.testing.assert_close(rec["advantages_out"], expected, atol=1e-5, rtol=1e-5)
        assert rec["advantages_out"].abs().sum() > 0  # the parity reward gives mixed groups
    # the default telemetry is logged through TRL's metrics
    for key in ("calibration/auroc", "calibration/auroc_per_prompt", "calibration/accuracy",
                "calibration/confidence_correct", "calibration/advantage_std"):
        assert _logged(trainer, key), key


@pytest.mark.parametrize("ranks_by", ["reward", "correctness"])
def test_a_registered_estimator_gets_exactly_its_declared_inputs(tmp_path, ranks_by):
    """The trainer reads the registration: ``inputs=()`` without telemetry runs no forward and gathers no log-probs;
    ``ranks_by="correctness"`` hands the correctness reward's own column as ``rewards``, else the weighted total."""
    from calibrl import register_estimator

    seen = []

    @register_estimator(f"test/declared_{ranks_by}", inputs=(), ranks_by=ranks_by, overwrite=True)
    def declared(batch, *, scale: float = 1.0):
        seen.append(batch)
        return scale * (batch.rewards - batch.rewards.mean())

    def bonus(prompts, completions, **kw):
        return [0.25] * len(completions)

    trainer = _trainer(tmp_path, reward=[parity_reward, bonus], advantage_estimator=f"test/declared_{ranks_by}",
                       calibration_logging=False, rollout_logprobs="forward", max_steps=1)
    calls = []
    original = trainer._rollout_forward
    trainer._rollout_forward = lambda *a, **k: calls.append(1) or original(*a, **k)
    trainer.train()
    assert calls == [] and len(seen) == 1
    assert seen[0].logprob_mean is None and seen[0].ref_logprob_mean is None and seen[0].embeddings is None
    correct = torch.tensor(parity_reward(None, trainer.records[0]["completions"]))
    torch.testing.assert_close(seen[0].rewards, correct if ranks_by == "correctness" else correct + 0.25)


def test_grpo_reproduces_stock_grpo_trainer(tmp_path):
    from trl import GRPOConfig, GRPOTrainer

    calibrated = _trainer(tmp_path / "c", advantage_estimator="grpo", max_steps=3)
    calibrated.train()
    for rec in calibrated.records:  # same step: TRL's own advantages vs calibrl's grpo
        torch.testing.assert_close(rec["advantages_out"], rec["rollout"]["trl_advantages"], atol=1e-5, rtol=1e-5)

    model, tok = build_tiny_model(seed=0)
    stock_args = GRPOConfig(
        output_dir=str(tmp_path / "s"), per_device_train_batch_size=8, num_generations=4, max_completion_length=8,
        max_steps=3, logging_steps=1, report_to="none", use_cpu=True, learning_rate=1e-3, save_strategy="no", seed=0,
        disable_tqdm=True, bf16=False,
    )
    stock = GRPOTrainer(model=model, reward_funcs=parity_reward, args=stock_args, train_dataset=_dataset(),
                        processing_class=tok)
    stock.train()
    for key in ("loss", "reward", "grad_norm", "completions/mean_length"):
        a, b = _logged(calibrated, key), _logged(stock, key)
        assert len(a) == len(b) == 3
        assert a == pytest.approx(b, rel=1e-4, abs=1e-6), key


def test_capo_logprobs_recorded_during_generation_match_a_forward(tmp_path):
    """rollout_logprobs="auto" records the sampled tokens' log-probs during generate (no extra forward);
    "forward" recomputes them with TRL's helper: same generations (same seed), same log-probs."""
    runs = {}
    for mode in ("auto", "forward"):
        trainer = _trainer(tmp_path / mode, advantage_estimator="capo", rollout_logprobs=mode, max_steps=1)
        calls = []
        original = trainer._rollout_forward
        trainer._rollout_forward = lambda *a, **k: calls.append(1) or original(*a, **k)
        trainer.train()
        runs[mode] = (trainer.records[0], len(calls))
    (auto, n_auto), (fwd, n_fwd) = runs["auto"], runs["forward"]
    assert n_auto == 0 and n_fwd == 1
    assert torch.equal(auto["output"]["completion_ids"], fwd["output"]["completion_ids"])
    torch.testing.assert_close(auto["rollout"]["batch"].logprob_mean, fwd["rollout"]["batch"].logprob_mean,
                               atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(auto["advantages_out"], fwd["advantages_out"], atol=1e-5, rtol=1e-5)


def test_unscorable_completions_get_zero_advantage(tmp_path):
    def sometimes_none(prompts, completions, **kw):
        return [None if i % 3 == 0 else float(bool(c) and ord(c[0]) % 2 == 0) for i, c in enumerate(completions)]

    trainer = _trainer(tmp_path, reward=sometimes_none, advantage_estimator="capo", max_steps=1)
    trainer.train()
    adv = trainer.records[0]["advantages_out"]
    assert torch.all(adv[::3] == 0)
    assert torch.isfinite(adv).all()


@pytest.mark.parametrize("extra", [
    {"importance_sampling_level": "sequence", "loss_type": "grpo"},  # GSPO
    {"loss_type": "dr_grpo", "advantage_estimator": "gcpo"},
    {"loss_type": "bnpo", "advantage_estimator": "seed_grpo", "steps_per_generation": 2, "num_iterations": 2},
    {"beta": 0.1, "advantage_estimator": "codapo"},
])
def test_trl_options_keep_working(tmp_path, extra):
    trainer = _trainer(tmp_path, max_steps=2, **extra)
    trainer.train()
    assert trainer.state.global_step == 2
    losses = _logged(trainer, "loss")
    assert losses and all(math.isfinite(x) for x in losses)
    if extra.get("beta"):
        assert _logged(trainer, "kl")
        assert trainer.last_rollout["batch"].ref_logprob_mean is not None
    if extra.get("advantage_estimator") == "gcpo":
        batch = trainer.last_rollout["batch"]
        assert batch.embeddings is not None and batch.embeddings.shape == (8, 64)
    if extra.get("advantage_estimator") == "seed_grpo":
        assert trainer.last_rollout["batch"].answer_ids is not None


def test_old_logprobs_used_when_generation_is_out_of_step(tmp_path):
    # steps_per_generation=2 with one accumulation step: TRL keeps old_per_token_logps; calibrl must read them.
    trainer = _trainer(tmp_path, advantage_estimator="capo", steps_per_generation=2, max_steps=2)
    trainer.train()
    rec = trainer.records[0]
    assert "old_per_token_logps" in rec["output"]
    old = rec["output"]["old_per_token_logps"]
    m = rec["output"]["completion_mask"].float()
    torch.testing.assert_close(rec["rollout"]["batch"].logprob_mean, (old * m).sum(1) / m.sum(1).clamp(min=1))


# ---------------------------------------------------------------------------------------------------- reference


def test_capo_mask_loads_reference_with_beta_zero(tmp_path):
    trainer = _trainer(tmp_path, advantage_estimator="capo", capo_mask="quantile", beta=0.0, max_steps=3,
                       learning_rate=5e-3)
    assert trainer.beta == 0.0 and trainer.args.beta == 0.0
    assert trainer.ref_model is not None
    assert not any(p.requires_grad for p in trainer.ref_model.parameters())
    trainer.train()
    first, last = trainer.records[0]["rollout"]["batch"], trainer.records[-1]["rollout"]["batch"]
    # step 1: the policy IS the reference; later the policy moved and the frozen reference did not
    torch.testing.assert_close(first.ref_logprob_mean, first.logprob_mean, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(last.ref_logprob_mean, last.logprob_mean, atol=1e-4)
    assert not _logged(trainer, "kl")  # beta stays 0: no KL term
    assert _logged(trainer, "calibration/estimator/mask_fraction")
    # the mask zeroed some advantages that plain capo would not
    rec = trainer.records[-1]
    plain = compute_advantages(rec["rollout"]["batch"], "capo", tau=0.6)
    masked = rec["advantages_out"]
    assert ((masked == 0) & (plain != 0)).any()


def test_capo_mask_with_peft_uses_adapter_disabled_base(tmp_path):
    import peft  # noqa: F401
    from peft import LoraConfig

    model, tok = build_tiny_model(seed=0)
    trainer = Recorder(
        model=model, reward_funcs=parity_reward, train_dataset=_dataset(), processing_class=tok,
        args=_config(tmp_path, advantage_estimator="capo", capo_mask="fixed", capo_ref_high=1e9, capo_ref_low=1e-9,
                     max_steps=1),
        peft_config=LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", task_type="CAUSAL_LM"),
    )
    assert trainer.beta == 0.0 and trainer.ref_model is None
    trainer.train()
    batch = trainer.records[0]["rollout"]["batch"]
    # a fresh LoRA adapter is zero-initialised: the base and the policy agree at step 1
    torch.testing.assert_close(batch.ref_logprob_mean, batch.logprob_mean, atol=1e-5, rtol=1e-5)


# ---------------------------------------------------------------------------------------------------- decision


def test_decision_term_zeroes_advantage_and_changes_loss(tmp_path):
    losses = {}
    for coef in (0.0, 1.0):
        trainer = _trainer(tmp_path / str(coef), reward=decision_reward, advantage_estimator="grpo",
                           decision_classes=DECISION_CLASSES, decision_loss_coef=coef, max_steps=1)
        trainer.train()
        rec = trainer.records[0]
        adv = rec["advantages_out"]
        positions = rec["final"].get("calibrl_decision_positions")
        assert adv.dim() == 2 and positions is not None
        assert (positions >= 0).any(), "the test needs completions with a decision token"
        rows = (positions >= 0).nonzero(as_tuple=True)[0]
        assert torch.all(adv[rows, positions[rows]] == 0)
        flat = rec["rollout"]["advantages"][rec["rollout"]["process_slice"]]
        other = torch.ones_like(adv, dtype=torch.bool)
        other[rows, positions[rows]] = False
        torch.testing.assert_close(adv[other], flat.unsqueeze(1).expand_as(adv)[other])
        losses[coef] = _logged(trainer, "loss")[0]
        assert _logged(trainer, "calibration/decision_ece")
        assert _logged(trainer, "decision/decision_prob_mean")
    assert losses[1.0] != pytest.approx(losses[0.0], abs=1e-6)


def test_decision_loss_target_reaches_the_loss(tmp_path):
    """decision_loss_target="binary" swaps the wrong rows' term (its own metric name shows it ran) and is refused
    when unknown."""
    logged = {}
    for target in ("onehot_uniform", "binary"):
        trainer = _trainer(tmp_path / target, reward=decision_reward, advantage_estimator="grpo",
                           decision_classes=DECISION_CLASSES, decision_loss_coef=1.0, max_steps=1,
                           decision_loss_target=target)
        trainer.train()
        logged[target] = {key for entry in trainer.state.log_history for key in entry}
    assert "decision/frac_uniform_active" in logged["onehot_uniform"]
    assert "decision/frac_wrong_active" in logged["binary"]
    assert "decision/frac_uniform_active" not in logged["binary"]
    with pytest.raises(ValueError, match="decision_loss_target"):
        _trainer(tmp_path / "bad", decision_classes=DECISION_CLASSES, decision_loss_target="soft")


def test_decision_consistency_gate_reaches_the_loss(tmp_path):
    """With the gate off every wrong row's uniform term is active; with it on (the paper target's default) wrong
    rows whose q(chosen) <= 1/|C| are switched off, which an untrained model (q near uniform) always has."""
    active = {}
    for gate in (True, False):
        trainer = _trainer(tmp_path / str(gate), reward=decision_reward, advantage_estimator="grpo",
                           decision_classes=DECISION_CLASSES, decision_loss_coef=1.0, max_steps=2,
                           decision_consistency_gate=gate)
        trainer.train()
        active[gate] = [v for v in _logged(trainer, "decision/frac_uniform_active") if v == v]
    assert active[False] and all(v == 1.0 for v in active[False])
    assert active[True] and min(active[True]) < 1.0


def test_decision_classes_must_be_single_tokens(tmp_path):
    with pytest.raises(ValueError, match="single token"):
        _trainer(tmp_path, decision_classes=["yes", "no"])


# ---------------------------------------------------------------------------------------------------- eval + misc


def test_eval_dataset_logs_eval_calibration_metrics(tmp_path):
    trainer = _trainer(tmp_path, advantage_estimator="capo", max_steps=2, eval_strategy="steps", eval_steps=2,
                       per_device_eval_batch_size=8, num_generations_eval=4, eval_dataset=_dataset(8))
    trainer.train()
    assert _logged(trainer, "eval_calibration/auroc") or _logged(trainer, "eval_calibration/accuracy")


def test_unknown_estimator_and_wrong_config_fail_clearly(tmp_path):
    with pytest.raises(KeyError, match="registered"):
        _trainer(tmp_path, advantage_estimator="nope")
    from trl import GRPOConfig

    model, tok = build_tiny_model()
    with pytest.raises(TypeError, match="CalibratedGRPOConfig"):
        CalibratedGRPOTrainer(model=model, reward_funcs=parity_reward, args=GRPOConfig(output_dir=str(tmp_path), use_cpu=True),
                              train_dataset=_dataset(), processing_class=tok)
    with pytest.raises(ValueError, match="capo_mask"):
        _config(tmp_path, capo_mask="sometimes")


def test_extract_answer():
    assert extract_answer(r"so \boxed{1} then \boxed{\frac{1}{2}}.") == r"\frac{1}{2}"
    # one code path with the math reward's extraction (calibrl.tasks.rewards.last_boxed)
    assert extract_answer(r"so \fbox{7}") == "7"
    assert extract_answer(r"so \boxed 5") == "5"
    assert extract_answer(r"\boxed{5} then \boxed{") == "5"
    assert extract_answer("reasoning...\nAnswer: B", ["A", "B", "C"]) == "B"
    assert extract_answer("first\n  42  \n\n") == "42"
    assert extract_answer("") == ""


def test_calibration_metrics_hand_values():
    batch = RolloutBatch(
        rewards=[1.0, 0.0, 1.0, 0.0, 1.0, 1.0], group_ids=[0, 0, 0, 0, 1, 1],
        logprob_mean=[-0.1, -0.5, -0.3, -0.2, -0.4, -0.6],
    )
    m = calibration_metrics(batch, advantages=torch.tensor([1.0, -1.0, 0.5, -0.5, 0.0, 0.0]),
                            info={"mask_fraction": 0.25, "note": "text"})
    # pooled: correct {-.1,-.3,-.4,-.6} vs wrong {-.5,-.2}: pairs won = (2 + 1 + 1 + 0) / 8
    assert m["auroc"] == pytest.approx(4 / 8)
    # group 0 only (group 1 has no wrong sample): correct {-.1,-.3} vs wrong {-.5,-.2}: (2 + 1) / 4
    assert m["auroc_per_prompt"] == pytest.approx(3 / 4) and m["auroc_n_prompts"] == 1
    # mean@k, as calibrl eval and the callback: group 0 is 2 / 4 right, group 1 2 / 2 (the row mean would be 4 / 6)
    assert m["accuracy"] == pytest.approx((2 / 4 + 2 / 2) / 2)
    assert m["mixed_group_fraction"] == pytest.approx(0.5)
    assert m["confidence_correct"] == pytest.approx(sum(math.exp(x) for x in (-0.1, -0.3, -0.4, -0.6)) / 4)
    assert m["estimator/mask_fraction"] == 0.25 and "estimator/note" not in m
    assert m["advantage_max"] == 1.0
    d = calibration_metrics(batch, decision_probs=[0.9, 0.8, float("nan"), 0.6, 0.99, 0.995])
    assert d["decision_frac_above_099"] == pytest.approx(1 / 5)
    assert 0.0 <= d["decision_ece"] <= 1.0


# ---------------------------------------------------------------------------------------------------- recipes


def _write_recipe(tmp_path, **sections):
    import yaml

    recipe = {
        "model": {"name_or_path": "builtin:tiny"},
        "dataset": {"name": "test/trl_tiny"},
        "rewards": ["test/trl_parity"],
        "trainer": {"output_dir": str(tmp_path / "run"), "max_steps": 1, "per_device_train_batch_size": 8,
                    "num_generations": 4, "max_completion_length": 6, "use_cpu": True, "bf16": False,
                    "logging_steps": 1, "save_strategy": "no", "advantage_estimator": "capo"},
    }
    recipe.update(sections)
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return path


@pytest.fixture
def _registered():
    from calibrl.tasks.registry import register_dataset, register_reward

    register_dataset("test/trl_tiny", overwrite=True)(lambda split="train", limit=None: _dataset(16))
    register_reward("test/trl_parity", overwrite=True)(parity_reward)


def test_recipe_errors_name_the_key_and_file(tmp_path, _registered):
    from calibrl.trl.recipes import RecipeError, load_recipe

    path = _write_recipe(tmp_path, trainer={"learning_rat": 1e-6})
    with pytest.raises(RecipeError, match=r"recipe\.yaml.*'learning_rat'.*'trainer'.*learning_rate"):
        load_recipe(path)
    with pytest.raises(RecipeError, match="'optimiser'.*top level"):
        load_recipe(_write_recipe(tmp_path, optimiser={}))
    with pytest.raises(RecipeError, match="'dtyp'.*'model'"):
        load_recipe(_write_recipe(tmp_path, model={"name_or_path": "x", "dtyp": "bfloat16"}))
    with pytest.raises(RecipeError, match="missing section 'rewards'"):
        path = _write_recipe(tmp_path)
        text = path.read_text().replace("rewards:\n- test/trl_parity\n", "")
        path.write_text(text)
        load_recipe(path)


def test_train_from_recipe_and_cli(tmp_path, _registered):
    from typer.testing import CliRunner

    from calibrl.cli import app
    from calibrl.trl.train import build_trainer, load_recipe, train

    recipe = load_recipe(_write_recipe(tmp_path))
    assert recipe.model.name_or_path == "builtin:tiny" and recipe.trainer["advantage_estimator"] == "capo"
    trainer = build_trainer(recipe, overrides={"capo_tau": 0.3})
    assert isinstance(trainer, CalibratedGRPOTrainer) and trainer.args.capo_tau == 0.3
    from calibrl.trl.recipes import RecipeError

    with pytest.raises(RecipeError, match="'capo_taux'.*'overrides'"):
        build_trainer(recipe, overrides={"capo_taux": 0.3})

    result = train(recipe, overrides={"output_dir": str(tmp_path / "api")}, progress=False)
    assert result["global_step"] == 1 and "accuracy" in result["summary"]
    assert (tmp_path / "api" / "model.safetensors").exists()

    cli_args = ["train", str(_write_recipe(tmp_path)), "--max-steps", "2", "--output-dir", str(tmp_path / "cli"),
                "--set", "capo_tau=0.5"]
    if len(app.registered_commands) == 1:  # a one-command Typer app takes no command name
        cli_args = cli_args[1:]
    out = CliRunner().invoke(app, cli_args)
    assert out.exit_code == 0, out.output
    assert (tmp_path / "cli" / "model.safetensors").exists()
    bad = CliRunner().invoke(app, [*cli_args[:-2], "--set", "capo_taux=1"])
    assert bad.exit_code == 2 and "capo_taux" in bad.output


def test_cde_omega_is_annealed(tmp_path):
    trainer = _trainer(tmp_path, advantage_estimator="cde", cde_omega_schedule="linear",
                       advantage_params={"omega": 2.0}, max_steps=4)
    seen = []
    original = trainer._step_params
    trainer._step_params = lambda: seen.append(original()["omega"]) or original()
    trainer.train()
    assert seen == pytest.approx([2.0, 1.5, 1.0, 0.5])


# ---------------------------------------------------------------------------------------------------- correctness


def always_one(prompts, completions, **kwargs):
    """A shaping reward every completion earns (like `format` for a boxed wrong answer)."""
    return [1.0] * len(completions)


def test_correctness_is_one_reward_functions_own_value(tmp_path):
    """rewards [parity, always_one]: the total is 1 or 2 (> 0.5 for every completion), but correctness, CAPO's
    pairs and the telemetry follow the first function's own value."""
    trainer = _trainer(tmp_path / "a", reward=[parity_reward, always_one], advantage_estimator="capo", max_steps=1)
    trainer.train()
    rec = trainer.records[0]
    parity = torch.tensor(parity_reward(None, rec["completions"]))
    assert 0 < parity.sum() < len(parity), "the test needs mixed outcomes"
    batch = rec["rollout"]["batch"]
    torch.testing.assert_close(batch.rewards, parity)
    torch.testing.assert_close(rec["rollout"]["rewards"], parity + 1.0)  # the weighted total, for other estimators
    expected = compute_advantages(
        RolloutBatch(rewards=parity, group_ids=torch.arange(len(parity)) // 4, logprob_mean=rec["lpm"]), "capo",
        **trainer.args.estimator_params())
    torch.testing.assert_close(rec["advantages_out"], expected, atol=1e-5, rtol=1e-5)
    assert rec["advantages_out"].abs().sum() > 0
    assert _logged(trainer, "calibration/accuracy")[0] == pytest.approx(parity.mean().item())

    # naming the other function: every completion is correct, no CAPO pair, zero advantages
    other = _trainer(tmp_path / "b", reward=[parity_reward, always_one], advantage_estimator="capo", max_steps=1,
                     correctness_reward="always_one")
    other.train()
    assert torch.all(other.records[0]["advantages_out"] == 0)
    assert _logged(other, "calibration/accuracy")[0] == 1.0
    # grpo keeps the weighted total as its reward
    total = _trainer(tmp_path / "c", reward=[parity_reward, always_one], advantage_estimator="grpo", max_steps=1)
    total.train()
    torch.testing.assert_close(total.records[0]["rollout"]["batch"].rewards,
                               torch.tensor(parity_reward(None, total.records[0]["completions"])) + 1.0)
    with pytest.raises(ValueError, match="correctness_reward"):
        _trainer(tmp_path / "d", reward=[parity_reward, always_one], correctness_reward="nope")


def test_correctness_reward_accepts_registered_names(tmp_path):
    from calibrl.tasks.rewards import format_reward, math_reward

    trainer = _trainer(tmp_path, reward=[math_reward, format_reward], correctness_reward="format")
    assert trainer._correctness_index == 1
    assert _trainer(tmp_path, reward=[math_reward, format_reward])._correctness_index == 0


def test_decision_correctness_ignores_a_shaping_reward(tmp_path):
    trainer = _trainer(tmp_path, reward=[decision_reward, always_one], advantage_estimator="grpo",
                       decision_classes=DECISION_CLASSES, decision_loss_coef=1.0, max_steps=1)
    trainer.train()
    rec = trainer.records[0]
    expected = torch.tensor(decision_reward(None, rec["completions"])) > 0.5
    assert (~expected).any(), "the test needs a wrong decision"
    assert torch.equal(rec["final"]["calibrl_decision_correct"].cpu(), expected)


# ---------------------------------------------------------------------------------------------------- generation


def test_continuous_batching_turns_off_recording_logprobs(tmp_path):
    """TRL 1.16's use_transformers_continuous_batching generates without the hooks calibrl records from: the
    log-probs then come from a forward (recording there crashed with a size mismatch)."""
    # the paged cache is sized to 16 blocks of 16 tokens (room for the 8 completions of 6 + 8 tokens): by default
    # it takes half of the free memory, which on the CPU is half of the machine's RAM
    trainer = _trainer(tmp_path, advantage_estimator="capo", use_transformers_continuous_batching=True, max_steps=1,
                       transformers_continuous_batching_config={"num_blocks": 16, "page_size": 16,
                                                                "max_batch_tokens": 128})
    assert not trainer._can_record_generation_logprobs()
    trainer.train()
    rec = trainer.records[0]
    torch.testing.assert_close(rec["rollout"]["batch"].logprob_mean, rec["lpm"], atol=1e-5, rtol=1e-5)


# ---------------------------------------------------------------------------------------------------- decision spellings


def _space_class_tokenizer():
    """Char tokenizer where " a" ... " j" are single tokens too (as " B" is for Qwen's BPE)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from calibrl.models import CHARACTERS, SPECIAL_TOKENS

    vocab = {token: i for i, token in enumerate(SPECIAL_TOKENS)}
    for token in list(CHARACTERS) + [" " + c for c in DECISION_CLASSES]:
        vocab.setdefault(token, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r" [a-j]|[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                   unk_token="<unk>", padding_side="left", clean_up_tokenization_spaces=False)


def test_decision_classes_match_space_prefixed_tokens(tmp_path):
    tok = _space_class_tokenizer()
    assert tok("Answer: b", add_special_tokens=False)["input_ids"][-1] == tok.convert_tokens_to_ids(" b")
    model, _ = build_tiny_model(tokenizer=tok, seed=0)
    trainer = Recorder(model=model, reward_funcs=decision_reward, processing_class=tok, train_dataset=_dataset(),
                       args=_config(tmp_path, advantage_estimator="grpo", decision_classes=DECISION_CLASSES,
                                    decision_loss_coef=1.0, max_steps=2))
    trainer.train()
    bare = {tok.convert_tokens_to_ids(c): i for i, c in enumerate(DECISION_CLASSES)}
    spaced = {tok.convert_tokens_to_ids(" " + c): i for i, c in enumerate(DECISION_CLASSES)}
    seen_spaced = False
    for rec in trainer.records:
        ids, mask = rec["output"]["completion_ids"], rec["output"]["completion_mask"]
        positions, chosen = rec["final"]["calibrl_decision_positions"], rec["final"]["calibrl_decision_chosen"]
        for row in range(ids.size(0)):
            hits = [t for t in range(ids.size(1)) if mask[row, t] and int(ids[row, t]) in {**bare, **spaced}]
            assert int(positions[row]) == (hits[-1] if hits else -1)
            if hits:
                token = int(ids[row, hits[-1]])
                seen_spaced |= token in spaced
                assert int(chosen[row]) == {**bare, **spaced}[token]
    assert seen_spaced, "the test needs a decision written with the space-prefixed token"
    assert _logged(trainer, "decision/decision_prob_mean")
    # the class probability is the sum of its spellings' probabilities
    logits = torch.randn(3, len(tok))
    probs = torch.softmax(trainer._decision_class_logits(logits), -1)
    full = torch.softmax(logits, -1)
    b_ids, s_ids = list(bare), list(spaced)
    mass = full[:, b_ids] + full[:, s_ids]
    torch.testing.assert_close(probs, mass / mass.sum(-1, keepdim=True))


# ---------------------------------------------------------------------------------------------------- masked rows


def _early_stopping_model():
    """The tiny model with the digits as extra end-of-sequence tokens, so that within 3 tokens some completions end
    and the others are truncated."""
    model, tok = build_tiny_model(seed=0)
    model.generation_config.eos_token_id = [tok.eos_token_id, *tok.convert_tokens_to_ids(list("0123456789"))]
    return model, tok


@pytest.mark.parametrize("extra", [{"advantage_estimator": "capo"},
                                   {"advantage_estimator": "grpo", "scale_rewards": "batch"}])  # TRL's kept
def test_truncated_rows_are_out_of_advantages_and_telemetry(tmp_path, extra):
    model, tok = _early_stopping_model()
    trainer = Recorder(model=model, reward_funcs=parity_reward, processing_class=tok, train_dataset=_dataset(),
                       args=_config(tmp_path, mask_truncated_completions=True, max_completion_length=3, **extra))
    trainer.train()
    seen_masked = False
    for rec in trainer.records:
        batch, adv = rec["rollout"]["batch"], rec["rollout"]["advantages"]
        masked = rec["output"]["completion_mask"].sum(1) == 0
        assert 0 < int(masked.sum()) < len(masked), "the test needs both truncated and finished rows"
        seen_masked = True
        assert torch.equal(batch.lengths == 0, masked)
        assert torch.all(adv[masked] == 0) and torch.all(rec["advantages_out"][masked] == 0)
        kept = ~masked
        rewards = torch.tensor(parity_reward(None, rec["completions"]))
        lpm = rec["lpm"]
        if extra["advantage_estimator"] == "capo":  # the kept rows alone, independent inputs
            alone = RolloutBatch(rewards=rewards[kept], group_ids=(torch.arange(len(rewards)) // 4)[kept],
                                 logprob_mean=lpm[kept])
            torch.testing.assert_close(adv[kept], compute_advantages(alone, "capo", **trainer.args.estimator_params()),
                                       atol=1e-5, rtol=1e-5)
        # telemetry over the rows with tokens only (a masked row's mean log-prob is 0: confidence 1)
        metrics = rec["rollout"]["metrics"]
        correct = rewards > 0.5
        assert metrics["accuracy"] == pytest.approx(float(correct[kept].float().mean()))
        if (correct & kept).any():
            expected = float(lpm[correct & kept].exp().mean())
            assert metrics["confidence_correct"] == pytest.approx(expected, rel=1e-4)
            assert metrics["confidence_correct"] < 1.0
    assert seen_masked


def test_calibration_metrics_skip_rows_without_tokens():
    batch = RolloutBatch(rewards=[1.0, 0.0, 1.0, 1.0], group_ids=[0, 0, 0, 0], logprob_mean=[-0.5, -1.0, 0.0, -0.2],
                         lengths=[3, 2, 0, 4])
    m = calibration_metrics(batch, advantages=torch.tensor([1.0, -1.0, 0.0, 0.5]))
    assert m["accuracy"] == pytest.approx(2 / 3)
    assert m["confidence_correct"] == pytest.approx((math.exp(-0.5) + math.exp(-0.2)) / 2)
    assert m["auroc"] == pytest.approx(1.0)
    assert m["advantage_mean"] == pytest.approx(0.5 / 3)
    # an explicit mask overrides the lengths
    v = calibration_metrics(batch, valid=torch.tensor([True, True, True, False]))
    assert v["confidence_correct"] == pytest.approx((math.exp(-0.5) + 1.0) / 2)


# ---------------------------------------------------------------------------------------------------- logit processing


def _tiny_postprocessing_model(kind: str, tok):
    """A 1-layer model of a family whose causal-LM head post-processes the logits (scale / soft-capping)."""
    import transformers

    common = dict(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                  num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=128,
                  pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    if kind == "granite":
        config = transformers.GraniteConfig(logits_scaling=4.0, **common)
        cls = transformers.GraniteForCausalLM
    elif kind == "gemma2":
        config = transformers.Gemma2Config(final_logit_softcapping=0.5, head_dim=16, **common)
        cls = transformers.Gemma2ForCausalLM
    else:
        config = transformers.CohereConfig(logit_scale=3.0, **common)
        cls = transformers.CohereForCausalLM
    torch.manual_seed(0)
    model = cls(config)
    model.generation_config.pad_token_id = tok.pad_token_id
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.bos_token_id = tok.bos_token_id
    return model


def test_logprobs_recorded_from_the_final_logits(tmp_path):
    """Granite divides the head's output by logits_scaling: the recorded log-probs are the model's, not the head's."""
    _, tok = build_tiny_model(seed=0)
    model = _tiny_postprocessing_model("granite", tok)
    trainer = Recorder(model=model, reward_funcs=parity_reward, processing_class=tok, train_dataset=_dataset(),
                       args=_config(tmp_path, advantage_estimator="capo", max_steps=1))
    calls = []
    original = trainer._rollout_forward
    trainer._rollout_forward = lambda *a, **k: calls.append(1) or original(*a, **k)
    trainer.train()
    assert not calls  # recorded during generation
    rec = trainer.records[0]
    torch.testing.assert_close(rec["rollout"]["batch"].logprob_mean, rec["lpm"], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kind", ["granite", "gemma2", "cohere"])
def test_decision_logits_apply_the_models_logit_postprocessing(kind):
    from calibrl.trl import decision as dec

    _, tok = build_tiny_model(seed=0)
    model = _tiny_postprocessing_model(kind, tok).eval()
    ids = torch.randint(3, len(tok), (3, 9))
    prompt_len, positions, temperature = 4, torch.tensor([0, 2, 4]), 0.7
    with torch.no_grad():
        out = model(input_ids=ids, output_hidden_states=True)
        hidden = out.hidden_states[-1]  # the backbone's output (after the final norm)
        got = dec.decision_logits(hidden, prompt_len=prompt_len, positions=positions,
                                  lm_head=model.get_output_embeddings(), temperature=temperature,
                                  postprocess=dec.logit_postprocessing(model.config))
    expected = out.logits[torch.arange(3), prompt_len + positions - 1].float() / temperature
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_decision_probabilities_of_a_model_that_scales_its_logits(tmp_path):
    """The trainer's decision probability (telemetry, completions table) is read from the model's final logits."""
    _, tok = build_tiny_model(seed=0)
    model = _tiny_postprocessing_model("granite", tok)
    trainer = Recorder(model=model, reward_funcs=decision_reward, processing_class=tok, train_dataset=_dataset(),
                       args=_config(tmp_path, advantage_estimator="grpo", decision_classes=DECISION_CLASSES,
                                    max_steps=1))
    trainer.train()
    rec = trainer.records[0]
    positions, chosen = rec["final"]["calibrl_decision_positions"], rec["final"]["calibrl_decision_chosen"]
    rows = (positions >= 0).nonzero(as_tuple=True)[0]
    assert len(rows) > 0, "the test needs completions with a decision token"
    p = rec["output"]["prompt_ids"].size(1)
    logits = rec["logits"][rows, p + positions[rows] - 1] / trainer.temperature  # [n, V]
    probs = torch.softmax(trainer._decision_class_logits(logits), -1)[torch.arange(len(rows)), chosen[rows]]
    torch.testing.assert_close(rec["rollout"]["decision_probs"][rows], probs, atol=1e-5, rtol=1e-5)


def test_plain_sampling_judged_from_the_generation_config_used(tmp_path):
    """transformers fills an unset top_k from the model's generation config, then its default (50)."""
    trainer = _trainer(tmp_path, advantage_estimator="capo", top_k=None)
    trainer.model.generation_config.top_k = 50
    assert not trainer._can_record_generation_logprobs()
    trainer.model.generation_config.top_k = None  # transformers' own default is 50 too
    assert not trainer._can_record_generation_logprobs()
    explicit = _trainer(tmp_path / "explicit", advantage_estimator="capo")  # TRL's top_k=0 disables top-k
    explicit.model.generation_config.top_k = 50
    explicit.model.generation_config.top_p = 0.9  # TRL's explicit top_p=1.0 wins
    assert explicit._can_record_generation_logprobs()
    explicit.model.generation_config.min_p = 0.1  # TRL's min_p=None: the model's is used
    assert not explicit._can_record_generation_logprobs()


# ---------------------------------------------------------------------------------------------------- SEED answer ids


def test_seed_answer_ids_put_unanswered_completions_in_singletons():
    from calibrl.trl.rollout import answer_ids_for, has_answer

    assert has_answer(r"so \boxed{3}") and not has_answer("so 3")
    assert has_answer("Answer: B", ["A", "B"]) and not has_answer("Answer: B")
    assert not has_answer("no class here", ["A", "B"])
    texts = [r"\boxed{1}", "x\n1", r"\boxed{1}", "x\n1", r"\boxed{2}", "Answer: B", "Answer: B", "nothing"]
    ids = answer_ids_for(texts, group_ids=[0, 0, 0, 0, 1, 1, 1, 1], classes=None)
    assert ids == [0, -1, 0, -1, 1, -1, -1, -1]
    ids = answer_ids_for(texts, group_ids=[0, 0, 0, 0, 1, 1, 1, 1], classes=["A", "B"])
    assert ids == [0, -1, 0, -1, 1, 2, 2, -1]
    assert extract_answer("x\n1") == "1"  # the public extraction keeps its last-line fallback
    # one meaning, three spellings: the grader's equivalence (not string equality) makes SEED's clusters
    texts = [r"\boxed{12}", r"\boxed{12.0}", r"\boxed{\frac{24}{2}}", r"\boxed{13}"]
    assert answer_ids_for(texts, group_ids=[0, 0, 0, 0], classes=None) == [0, 0, 0, 1]


def test_seed_grpo_trainer_passes_negative_ids_for_unanswered(tmp_path):
    trainer = _trainer(tmp_path, advantage_estimator="seed_grpo", max_steps=1)
    trainer.train()
    rec = trainer.records[0]
    ids = rec["rollout"]["batch"].answer_ids.tolist()
    # the tiny model writes no \\boxed{}: every completion is a cluster of its own (id -1), none shares the
    # cluster of its last line
    assert ids == [-1] * len(rec["completions"])


# ---------------------------------------------------------------------------------------------------- completions log


def _completions_tables(trainer):
    import pandas as pd

    folder = trainer.args.output_dir + "/completions"
    return {step: pd.read_parquet(f"{folder}/completions_{step:05d}.parquet") for step in (1, 2)}


@pytest.mark.parametrize("estimator", ["capo", "grpo"])  # recorded during generation / deferred to the loss pass
def test_completions_log_has_calibration_columns(tmp_path, estimator):
    trainer = _trainer(tmp_path, advantage_estimator=estimator, log_completions=True, num_completions_to_print=0)
    trainer.train()
    tables = _completions_tables(trainer)
    for step, rec in zip((1, 2), trainer.records):
        table = tables[step]
        assert {"logprob_mean", "correct", "advantage"} <= set(table.columns)
        assert "decision_prob" not in table.columns
        assert list(table["completion"]) == rec["completions"]
        torch.testing.assert_close(torch.tensor(table["logprob_mean"].to_numpy(), dtype=torch.float32),
                                   rec["lpm"], atol=1e-5, rtol=1e-5)
        assert table["correct"].dtype == bool
        assert list(table["correct"]) == [r > 0.5 for r in parity_reward(None, rec["completions"])]
        assert list(table["correct"]) == rec["rollout"]["correct"].tolist()


def test_completions_log_has_decision_probabilities(tmp_path):
    trainer = _trainer(tmp_path, reward=decision_reward, advantage_estimator="grpo", decision_classes=DECISION_CLASSES,
                       log_completions=True, num_completions_to_print=0)
    trainer.train()
    tables = _completions_tables(trainer)
    for step, rec in zip((1, 2), trainer.records):
        table = tables[step]
        positions = rec["final"]["calibrl_decision_positions"]
        probs = rec["rollout"]["decision_probs"]
        assert (positions >= 0).any() and (positions < 0).any(), "the test needs rows with and without a decision"
        for row in range(len(table)):
            value = table["decision_prob"].iloc[row]
            if positions[row] < 0:
                assert value is None or math.isnan(value)
            else:
                assert 0.0 < value < 1.0 and value == pytest.approx(float(probs[row]), abs=1e-6)


def test_undefined_metrics_are_left_out_of_the_logs(tmp_path):
    """With every completion wrong, the AUROC and confidence_correct are undefined in every batch: TRL 1.16 would
    log them as None; the trainer leaves them out while the defined telemetry keys are still logged."""

    def always_wrong(prompts, completions, **kwargs):
        return [0.0] * len(completions)

    trainer = _trainer(tmp_path, reward=always_wrong, advantage_estimator="capo", max_steps=2)
    trainer.train()
    logged = [h for h in trainer.state.log_history if "calibration/accuracy" in h]
    assert len(logged) == 2 and all(h["calibration/accuracy"] == 0.0 for h in logged)
    for entry in trainer.state.log_history:
        assert "calibration/auroc" not in entry and "calibration/confidence_correct" not in entry
        assert all(v is not None and not (isinstance(v, float) and math.isnan(v)) for v in entry.values()), entry


def test_answer_last_line_clusters_bare_answers():
    """Without \\boxed{} a completion is its own SEED cluster (-1) unless answer_last_line takes its last line."""
    from calibrl.trl.rollout import answer_ids_for

    texts = ["work\n42", "other work\n42", "\\boxed{7}", "x\n41", "\\boxed{7} and 7"]
    groups = [0, 0, 0, 0, 1]
    assert answer_ids_for(texts, group_ids=groups, classes=None) == [-1, -1, 0, -1, 1]
    assert answer_ids_for(texts, group_ids=groups, classes=None, last_line=True) == [0, 0, 1, 2, 3]


# ---------------------------------------------------------------------------------------------------- CAPO frozen mask


def test_capo_quantile_mask_freezes_first_batch_thresholds(tmp_path):
    trainer = _trainer(tmp_path, advantage_estimator="capo", capo_mask="quantile", beta=0.0, max_steps=4,
                       learning_rate=5e-3)
    trainer.train()
    first = trainer.records[0]["rollout"]["batch"]
    log_ppl = -first.ref_logprob_mean
    high = math.exp(float(torch.quantile(log_ppl, 0.75)))
    low = math.exp(float(torch.quantile(log_ppl, 0.25)))
    assert trainer.capo_quantile_mask.thresholds == pytest.approx((high, low), rel=1e-6)
    fractions = set()
    for rec in trainer.records:
        params, batch = rec["rollout"]["params"], rec["rollout"]["batch"]
        # every step uses the first batch's thresholds, whatever its own reference perplexities
        assert (params["ref_high"], params["ref_low"]) == trainer.capo_quantile_mask.thresholds
        fixed = compute_advantages(batch, "capo", mask="fixed", ref_high=params["ref_high"], ref_low=params["ref_low"])
        torch.testing.assert_close(rec["advantages_out"], fixed, atol=1e-6, rtol=1e-6)
        fractions.add(round(rec["rollout"]["info"]["mask_fraction"], 6))
    # later batches have their own quartiles: a per-batch rule would have used other thresholds
    later = -trainer.records[-1]["rollout"]["batch"].ref_logprob_mean
    assert math.exp(float(torch.quantile(later, 0.75))) != pytest.approx(high, rel=1e-6)
    assert len(fractions) > 1  # the frozen thresholds drop a varying fraction (a per-batch quartile: always ~1/4)
    assert _logged(trainer, "capo/ref_ppl_high") == pytest.approx([high] * 4, rel=1e-6)
    assert _logged(trainer, "capo/ref_ppl_low") == pytest.approx([low] * 4, rel=1e-6)


def test_capo_batch_quantile_mask_recomputes_every_batch(tmp_path):
    trainer = _trainer(tmp_path, advantage_estimator="capo", capo_mask="batch_quantile", beta=0.0, max_steps=2)
    trainer.train()
    assert trainer.capo_quantile_mask is None
    highs = []
    for rec in trainer.records:
        batch, info = rec["rollout"]["batch"], rec["rollout"]["info"]
        assert info["ref_high"] == pytest.approx(math.exp(float(torch.quantile(-batch.ref_logprob_mean, 0.75))))
        highs.append(info["ref_high"])
    assert highs[0] != pytest.approx(highs[1])


def test_capo_mask_config_fields(tmp_path):
    with pytest.raises(ValueError, match="capo_ref_quantile_batches"):
        _config(tmp_path, capo_ref_quantile_batches=0)
    params = _config(tmp_path, capo_mask="quantile", capo_ref_quantile_batches=3).estimator_params()
    assert params["mask"] == "quantile" and params["ref_quantile_batches"] == 3 and "ref_high" not in params
    params = _config(tmp_path, capo_mask="fixed", capo_ref_high=3.0).estimator_params()
    assert params["ref_high"] == 3.0 and params["ref_low"] == 1.05
    # grpo_mask (GRPO + CAPO's mask): the mask fields without capo's tau / normalize, and a mask is required
    params = _config(tmp_path, advantage_estimator="grpo_mask", capo_mask="quantile").estimator_params()
    assert params["mask"] == "quantile" and params["ref_quantile_batches"] == 1 and "tau" not in params
    with pytest.raises(ValueError, match="grpo_mask.*capo_mask"):
        _config(tmp_path, advantage_estimator="grpo_mask")


def test_grpo_mask_zeroes_masked_rows_of_the_grpo_advantage(tmp_path):
    import json

    from calibrl.trl.trainer import CAPO_MASK_STATE_FILE

    trainer = _trainer(tmp_path, advantage_estimator="grpo_mask", capo_mask="quantile", beta=0.0, max_steps=2,
                       learning_rate=5e-3, save_strategy="steps", save_steps=2)
    assert trainer.ref_model is not None and trainer.capo_quantile_mask is not None
    trainer.train()
    log_ppl = -trainer.records[0]["rollout"]["batch"].ref_logprob_mean.double()
    high, low = math.exp(float(torch.quantile(log_ppl, 0.75))), math.exp(float(torch.quantile(log_ppl, 0.25)))
    zeroed = 0
    for rec in trainer.records:
        batch, params = rec["rollout"]["batch"], rec["rollout"]["params"]
        assert (params["ref_high"], params["ref_low"]) == pytest.approx((high, low), rel=1e-6)  # frozen
        plain = compute_advantages(batch, "grpo")
        lp, correct = -batch.ref_logprob_mean.double(), batch.rewards > 0.5
        masked = (correct & (lp > math.log(high))) | (~correct & (lp < math.log(low)))
        torch.testing.assert_close(rec["advantages_out"], torch.where(masked, torch.zeros_like(plain), plain))
        assert rec["rollout"]["info"]["mask_fraction"] == pytest.approx(float(masked.double().mean()))
        zeroed += int((masked & (plain != 0)).sum())
    assert zeroed > 0  # some row GRPO would have trained on got advantage 0
    assert _logged(trainer, "capo/ref_ppl_high") == pytest.approx([high] * 2, rel=1e-6)
    assert _logged(trainer, "capo/ref_ppl_low") == pytest.approx([low] * 2, rel=1e-6)
    assert _logged(trainer, "calibration/estimator/mask_fraction")
    (saved,) = json.loads((tmp_path / "out" / "checkpoint-2" / CAPO_MASK_STATE_FILE).read_text())
    assert saved["estimator"] == "grpo_mask" and saved["state"]["ref_ppl_high_low"] == pytest.approx([high, low], rel=1e-6)


# ---------------------------------------------------------------------------------------------------- Clip-Cov / KL-Cov


@pytest.mark.parametrize("loss_type,params", [
    ("clip_cov", {"clip_cov_ratio": 0.1, "clip_cov_lb": -100.0, "clip_cov_ub": 100.0}),
    ("kl_cov", {"kl_cov_ratio": 0.1, "ppo_kl_coef": 0.5}),
])
def test_cov_loss_types_are_calibrls_loss_on_trls_inputs(tmp_path, loss_type, params):
    """loss_type clip_cov / kl_cov: the trainer trains, logs the share of tokens selected, and its loss on a
    generation batch is calibrl.losses.covariance's on log-probs from an independent forward, plus beta * k3 KL
    (steps_per_generation=2 and num_iterations=2: the old log-probs differ from the current ones)."""
    from calibrl.losses.covariance import clip_cov_policy_loss, kl_cov_policy_loss
    from calibrl.losses.ppo import aggregate_loss, kl_k3

    trainer = _trainer(tmp_path, loss_type=loss_type, beta=0.1, steps_per_generation=2, num_iterations=2,
                       max_steps=2, **params)
    trainer.train()
    fractions = _logged(trainer, f"{loss_type}/{loss_type}_fraction")
    assert fractions and all(f > 0 for f in fractions)
    assert _logged(trainer, "kl") and all(math.isfinite(x) for x in _logged(trainer, "loss"))

    rec = trainer.records[-1]
    inputs = {**rec["output"], "advantages": rec["advantages_out"]}
    assert "old_per_token_logps" in inputs
    trainer.model.eval()
    with torch.no_grad():
        torch.manual_seed(5)
        loss = trainer._policy_loss(trainer.model, inputs)
        ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
        att = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1)
        p, c = inputs["prompt_ids"].size(1), inputs["completion_ids"].size(1)
        logits = trainer.model(input_ids=ids, attention_mask=att).logits.float()[:, p - 1: p + c - 1]
        logp = torch.log_softmax(logits / trainer.temperature, -1).gather(-1, inputs["completion_ids"][..., None])[..., 0]
    mask = inputs["completion_mask"].float()
    common = dict(logprobs=logp, old_logprobs=inputs["old_per_token_logps"], advantages=inputs["advantages"],
                  completion_mask=mask)
    torch.manual_seed(5)
    if loss_type == "clip_cov":
        expected, _ = clip_cov_policy_loss(eps_low=0.2, eps_high=0.2, **params, **common)
    else:
        expected, _ = kl_cov_policy_loss(**params, **common)
    expected = expected + 0.1 * aggregate_loss(kl_k3(logp, inputs["ref_per_token_logps"]) * mask, mask)
    torch.testing.assert_close(loss, expected, rtol=1e-4, atol=1e-5)


def test_cov_loss_types_refuse_options_they_do_not_apply(tmp_path):
    with pytest.raises(ValueError, match="importance_sampling_level='sequence' is not applied by loss_type='kl_cov'"):
        _config(tmp_path, loss_type="kl_cov", importance_sampling_level="sequence")
    with pytest.raises(ValueError, match="clip_cov_ratio must be a number in"):
        _config(tmp_path, loss_type="clip_cov", clip_cov_ratio=0.0)
    with pytest.raises(ValueError, match="cov_loss_aggregation must be one of"):
        _config(tmp_path, loss_type="clip_cov", cov_loss_aggregation="mean")


# ---------------------------------------------------------------------------------------------------- DCPO


def test_stated_confidences_split_where_the_code_splits():
    """DCPO's split position from the tiny model's character tokenizer: the tag starts at character 3, the
    token whose accumulated text reaches 3 is token 2 ("\\n"), so the split is token 1; no tag: length - 2."""
    from calibrl.trl.rollout import stated_confidences

    _, tok = build_tiny_model(seed=0)
    texts = ["ab\n<confidence>0.7</confidence>", "abcdef", "x <confidence>high</confidence>"]
    ids = [tok.encode(t, add_special_tokens=False) for t in texts]
    assert [tok.decode([i]) for i in ids[0][:3]] == ["a", "b", "\n"]
    stated, starts = stated_confidences(texts, ids, [len(i) for i in ids], tok)
    assert stated == [0.7, -1.0, -1.0]  # malformed: none stated (-1), but the split is still at the tag
    assert starts == [1, 4, 0]  # "x <": the tag starts at character 2, reached by token 1 (" "): split 0


def test_stated_confidences_with_the_testbed_reader_split_before_the_answer_digit():
    """The testbed's ``ss;A:k``, read by ``verbalized_confidence_span``: "12;3:7" states 0.7 from character 4 (the
    ":"); with one token per character the accumulated text first reaches 4 at token 3 ("3"), so the code's split
    is token 2 (";"). "12;3" and "12;3:" state none: -1 and the no-statement split, length - 2."""
    from calibrl.testbed.tasks import verbalized_confidence_span
    from calibrl.trl.rollout import stated_confidences

    _, tok = build_tiny_model(seed=0)
    texts = ["12;3:7", "12;3", "12;3:", "05;9:0"]
    ids = [tok.encode(t, add_special_tokens=False) for t in texts]
    assert [tok.decode([i]) for i in ids[0]] == ["1", "2", ";", "3", ":", "7"]
    assert verbalized_confidence_span("12;3:7") == (0.7, 4)
    stated, starts = stated_confidences(texts, ids, [len(i) for i in ids], tok, verbalized_confidence_span)
    assert stated == [0.7, -1.0, -1.0, 0.0]
    assert starts == [2, 2, 3, 2]
    # the default reader (the <confidence> tag) finds nothing in these completions
    assert stated_confidences(texts, ids, [len(i) for i in ids], tok) == ([-1.0] * 4, [4, 2, 3, 4])


def test_stated_confidence_reader_names_a_reader_or_fails_when_the_config_is_built(tmp_path):
    from calibrl.tasks.verbalized import confidence_reader, stated_confidence_span
    from calibrl.testbed.tasks import verbalized_confidence_span

    assert confidence_reader("tag") is stated_confidence_span
    assert confidence_reader("calibrl.testbed.tasks:verbalized_confidence_span") is verbalized_confidence_span
    for bad, message in (("digits", "neither a known reader"), ("calibrl.testbed.tasks:nope", "cannot load"),
                         ("no_such_module_x:f", "cannot load"), ("calibrl.testbed.tasks:CONFIDENCE_DIGITS",
                                                                 "is not a function")):
        with pytest.raises(ValueError, match=f"stated_confidence_reader: .*{message}"):
            _config(tmp_path, advantage_estimator="dcpo", stated_confidence_reader=bad)


def _reads_three_tenths_from_character_one(text):
    """A confidence reader for the test below: every completion states 0.3 from its second character."""
    return 0.3, 1


def test_dcpo_reads_the_stated_confidence_with_the_configured_reader(tmp_path):
    trainer = _trainer(tmp_path, advantage_estimator="dcpo", max_steps=1,
                       stated_confidence_reader=f"{__name__}:_reads_three_tenths_from_character_one")
    trainer.train()
    batch = trainer.records[0]["rollout"]["batch"]
    assert torch.all(batch.stated_confidence == torch.tensor(0.3))  # the default tag reader gives -1 here
    # character 1 is reached by the first token (each decodes to at least one character): split max(0 - 1, 0) = 0
    assert torch.all(batch.confidence_start == 0)
    torch.testing.assert_close(trainer.records[0]["advantages_out"][:, : batch.lengths.max()],
                               compute_advantages(batch, "dcpo"))


def test_dcpo_trains_with_per_token_advantages(tmp_path):
    trainer = _trainer(tmp_path, advantage_estimator="dcpo", max_steps=2)
    trainer.train()
    assert trainer.state.global_step == 2
    rec = trainer.records[0]
    batch = rec["rollout"]["batch"]
    assert torch.all(batch.stated_confidence == -1)  # the tiny model states no confidence
    torch.testing.assert_close(batch.confidence_start, (batch.lengths - 2).clamp(min=0))
    expected = compute_advantages(batch, "dcpo")
    out = rec["advantages_out"]
    assert out.shape == rec["output"]["completion_ids"].shape
    torch.testing.assert_close(out[:, : expected.shape[1]], expected)
    assert torch.all(out[:, expected.shape[1]:] == 0)


# ---------------------------------------------------------------------------------------------------- INTUITOR


def test_intuitor_reads_self_certainty_from_an_independent_forward(tmp_path):
    """advantage_estimator intuitor: each completion's self-certainty (chunked through the LM head in the rollout
    forward) equals KL(uniform || softmax(logits / T)) averaged over its tokens from the model's whole logits, and
    the advantages are the estimator's on it."""
    trainer = _trainer(tmp_path, advantage_estimator="intuitor", max_steps=1, temperature=0.7)
    trainer.train()
    rec = trainer.records[0]
    out = rec["output"]
    p, c = out["prompt_ids"].size(1), out["completion_ids"].size(1)
    logp = torch.log_softmax(rec["logits"][:, p - 1: p + c - 1] / 0.7, -1)  # [B, C, V]
    kl = (-logp.mean(-1) - math.log(logp.shape[-1]))  # KL(U || p) = -mean_j log p_j - log V
    m = out["completion_mask"].float()
    expected = (kl * m).sum(1) / m.sum(1).clamp(min=1)
    batch = rec["rollout"]["batch"]
    torch.testing.assert_close(batch.self_certainty, expected, rtol=1e-4, atol=1e-5)
    assert batch.self_certainty.std() > 0
    torch.testing.assert_close(rec["rollout"]["advantages"], compute_advantages(batch, "intuitor"))


def test_the_trainer_takes_the_builtin_tiny_model_by_name(tmp_path):
    """`model="builtin:tiny"`, as recipes name it: the char-level model and its tokenizer, built here (no hub)."""
    trainer = CalibratedGRPOTrainer(model="builtin:tiny", reward_funcs=parity_reward,
                                    args=_config(tmp_path, advantage_estimator="grpo"), train_dataset=_dataset())
    assert type(trainer.model).__name__ == "LlamaForCausalLM"
    assert trainer.processing_class.__class__.__name__ == type(build_tiny_model()[1]).__name__


def test_rollout_reads_the_text_the_reward_grades():
    """A conversational completion with a tool message: DCPO's stated confidence is read from the assistant's text
    alone, the text the correctness reward grades (joining every message would read the tool's tag)."""
    from calibrl.tasks.rewards import completion_text
    from calibrl.trl.rollout import stated_confidences

    said = "so <confidence>0.8</confidence>"
    completion = [{"role": "assistant", "content": said}, {"role": "tool", "content": "<confidence>0.1</confidence>"}]
    assert completion_text(completion) == said

    class CharTokenizer:
        def decode(self, ids):
            return "".join(chr(i) for i in ids)

    ids = [ord(c) for c in said]
    stated, starts = stated_confidences([completion], [ids], [len(ids)], CharTokenizer())
    assert stated == [pytest.approx(0.8)] and 0 < starts[0] <= len(ids)
