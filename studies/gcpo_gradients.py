"""GCPO's stated mechanism, tested directly: does a group's disagreement signal track the noise of its
policy-gradient update?

GCPO (arXiv 2605.21801) damps groups whose responses disagree geometrically while their rewards carry little
signal, on the premise that such groups give noisy updates. This script measures, per prompt group of a testbed
warm start (sampled at T = 1, G completions per prompt):

* the per-sample GRPO update u_i = A_i * grad_theta lpm_i (A_i the GRPO advantage, lpm_i the mean token log-prob of
  completion i: the direction the PPO-clip loss takes at ratio 1), over all parameters of the tiny model;
* the group's gradient noise ``noise`` = sum_i ||u_i - mean_g u||^2 / (G - 1) (trace of the sample covariance),
  and its signal-to-noise ratio ``snr`` = ||mean_g u||^2 / (noise / G);
* the candidate signals: semantic entropy (answer clusters, lpm-softmax weights; SEED-GRPO), cosine dispersion
  and barycentric transport of the completion-mean last hidden states, raw and batch-centred
  (:func:`calibrl.advantages.gcpo.gcpo_advantages`' own numbers), reward dispersion rd, GCPO's damping evidence
  D * (1 - rd), and the scale GCPO applies;

and prints Spearman's rank correlation of each signal with ``noise`` and ``snr`` over the mixed groups (groups
with both outcomes; the others have A = 0 and no update), and on tasks with prompt tiers (``scratchpad``,
``forms``) the median SNR and the mean signals of each tier. A signal that should damp noisy groups must correlate
positively with ``noise`` (negatively with ``snr``); GCPO's scale must do the opposite.

Usage: ``python -m studies.gcpo_gradients [--tasks stochastic_reasoning scratchpad forms] [--groups 128] [--seeds 0 1 2]``
(warm starts from the cache, trained when missing; about a minute per task and seed once they exist). Writes
``--out`` (JSON) if given: the correlations, and under ``"measures"`` every group's noise, SNR, tier, mixed flag
and signals per task and seed (the raw data :func:`rho_table` rebuilds docs/results/gcpo.md's table from).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch

SIGNALS = ("semantic_entropy", "cd", "cd_centred", "bot", "bot_centred", "rd", "cd_x_1_minus_rd",
           "cd_centred_x_1_minus_rd", "gcpo_scale", "gcpo_scale_centred")


def per_sample_gradients(model, tokenizer, prompts: list[str], completions: list[str]):
    """(flattened grad of lpm_i [N, P], lpm [N], completion-mean last hidden states [N, D]) for each
    prompt + completion + EOS, one backward pass each."""
    params = [p for p in model.parameters() if p.requires_grad]
    grads, lpms, embeddings = [], [], []
    for prompt, completion in zip(prompts, completions):
        p_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        c_ids = tokenizer(completion, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        ids = torch.tensor([p_ids + c_ids])
        model.zero_grad(set_to_none=True)
        hidden = model.model(input_ids=ids).last_hidden_state  # [1, L, D] (the backbone output GCPO pools)
        logits = model.lm_head(hidden)[0, len(p_ids) - 1:-1]  # predicts the completion tokens
        token_lp = torch.log_softmax(logits.float(), -1).gather(1, torch.tensor(c_ids)[:, None]).squeeze(1)
        lpm = token_lp.mean()
        lpm.backward()
        grads.append(torch.cat([p.grad.reshape(-1) for p in params]).clone())
        lpms.append(lpm.item())
        embeddings.append(hidden[0, len(p_ids):].detach().mean(0))
    return torch.stack(grads), torch.tensor(lpms), torch.stack(embeddings)


def group_measures(task: str, *, groups: int, k: int, seed: int) -> dict[str, np.ndarray]:
    from calibrl.advantages.gcpo import gcpo_advantages, semantic_entropy
    from calibrl.advantages.grpo import grpo_advantages
    from calibrl.testbed import tasks as tb
    from calibrl.testbed.warmstart import WarmStartConfig, load_warm_start, sample_completions, warm_start
    from calibrl.trl.rollout import answer_ids

    torch.manual_seed(seed)
    model, tokenizer = load_warm_start(warm_start(task, WarmStartConfig.for_task(task)))
    model.train(False)
    spec = tb.get_task(task)
    prompts = [r["prompt"] for r in tb.build_rows(task, groups, split="eval", seed=0)]
    res = sample_completions(model, tokenizer, prompts, n=k, max_new_tokens=spec.max_completion_length, seed=seed)
    rewards = torch.tensor(tb.make_reward(task, seed=seed)(res["prompt"], res["completion"]), dtype=torch.float64)
    group_index = torch.as_tensor(np.asarray(res["prompt_index"]), dtype=torch.long)
    grads, lpm, emb = per_sample_gradients(model, tokenizer, list(res["prompt"]), list(res["completion"]))
    adv = grpo_advantages(rewards=rewards, group_index=group_index, n_groups=groups).to(torch.float32)
    updates = adv[:, None] * grads  # [N, P]
    noise, snr = np.zeros(groups), np.zeros(groups)
    for g in range(groups):
        u = updates[group_index == g].double()
        mean = u.mean(0)
        noise[g] = float(((u - mean) ** 2).sum() / (len(u) - 1))
        snr[g] = float((mean ** 2).sum() / (noise[g] / len(u))) if noise[g] > 0 else np.nan
    answers = [tb.parse(task, p, c)["choice"] for p, c in zip(res["prompt"], res["completion"])]
    ids = torch.tensor(answer_ids(answers, group_index.tolist()))
    se = semantic_entropy(group_index=group_index, n_groups=groups, answer_ids=ids, logprob_mean=lpm)
    out = {"noise": noise, "snr": snr, "semantic_entropy": se.numpy(),
           "tier": np.array([tb.prompt_tier(task, p) or "" for p in prompts]),
           "mixed": np.array([0 < float(rewards[group_index == g].sum()) < k for g in range(groups)])}
    for suffix, center in (("", False), ("_centred", True)):
        _, info = gcpo_advantages(rewards=rewards, group_index=group_index, n_groups=groups, embeddings=emb,
                                  logprob_mean=lpm, center=center, group_values=True)
        values = {name: t.numpy() for name, t in info["groups"].items()}
        out["cd" + suffix], out["bot" + suffix] = values["cd"], values["bot"]
        out["gcpo_scale" + suffix] = values["scale"]
        out["rd"] = values["rd"]
        out[f"cd{suffix}_x_1_minus_rd"] = values["cd"] * (1 - np.clip(values["rd"] / 0.5, 0, 1))
    return out


def correlations(measures: dict[str, np.ndarray]) -> dict[str, dict[str, float]]:
    from scipy.stats import spearmanr

    mixed = measures["mixed"] & np.isfinite(measures["snr"])
    table = {}
    for name in SIGNALS:
        x = measures[name][mixed]
        row = {"n_groups": int(mixed.sum())}
        for target in ("noise", "snr"):
            rho, p = spearmanr(x, measures[target][mixed])
            row[f"rho_{target}"], row[f"p_{target}"] = float(rho), float(p)
        table[name] = row
    return table


def tier_summary(measures: dict[str, np.ndarray]) -> dict[str, dict[str, float]]:
    """Per prompt tier (tasks with tiers), over its mixed groups: their count, the median gradient SNR and noise,
    and the mean of each signal. Empty for tasks without tiers."""
    mixed = measures["mixed"] & np.isfinite(measures["snr"])
    out = {}
    for tier in sorted(set(measures["tier"].tolist()) - {""}):
        sel = mixed & (measures["tier"] == tier)
        median = (lambda key: float(np.median(measures[key][sel])) if sel.any() else np.nan)  # noqa: E731
        row = {"n_groups": int(sel.sum()), "median_snr": median("snr"), "median_noise": median("noise")}
        row.update({name: float(measures[name][sel].mean()) if sel.any() else np.nan for name in SIGNALS})
        out[tier] = row
    return out


# docs/results/gcpo.md's table: (signal, row label); its columns are the tasks' rho with noise and with SNR
DOC_ROWS = (("semantic_entropy", "semantic entropy (SEED-GRPO)"), ("cd", "cosine dispersion CD"),
            ("cd_centred", "CD, batch-centred"), ("bot", "barycentric transport BoT"),
            ("rd", "reward dispersion rd"), ("cd_x_1_minus_rd", "CD x (1 - rd) (GCPO's damping evidence)"),
            ("gcpo_scale", "GCPO scale (default reading)"), ("gcpo_scale_centred", "GCPO scale, batch-centred"))


def measures_to_json(measures: dict[str, np.ndarray]) -> dict[str, list]:
    """One task and seed's per-group measures as JSON lists (NaN as null)."""
    out = {}
    for name, values in measures.items():
        if values.dtype.kind in "fc":
            out[name] = [None if not np.isfinite(v) else float(v) for v in values.tolist()]
        else:
            out[name] = values.tolist()
    return out


def measures_from_json(record: dict[str, list]) -> dict[str, np.ndarray]:
    """Inverse of :func:`measures_to_json` (null back to NaN)."""
    out = {}
    for name, values in record.items():
        if name in ("tier", "mixed"):
            out[name] = np.array(values, dtype=bool if name == "mixed" else str)
        else:
            out[name] = np.array([np.nan if v is None else v for v in values], dtype=float)
    return out


def rho_table(measures: dict[str, dict[str, dict[str, list]]]) -> str:
    """docs/results/gcpo.md's table from the saved per-group measures ``{task: {seed: measures_to_json(...)}}``:
    per task, Spearman's rho of each signal with the group's noise and SNR over its mixed groups, mean over seeds
    with (min, max)."""
    tasks = list(measures)
    header = "| signal | " + " | ".join(f"{t}: rho with noise | rho with SNR" for t in tasks) + " |"
    lines = [header, "|---|" + "---|---|" * len(tasks)]
    tables = {t: [correlations(measures_from_json(m)) for m in measures[t].values()] for t in tasks}
    for name, label in DOC_ROWS:
        cells = []
        for t in tasks:
            for target in ("noise", "snr"):
                v = [table[name][f"rho_{target}"] for table in tables[t]]
                cells.append(f"{np.mean(v):+.2f} ({min(v):+.2f}, {max(v):+.2f})")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", nargs="+", default=["stochastic_reasoning", "scratchpad"])
    parser.add_argument("--groups", type=int, default=128)
    parser.add_argument("--k", type=int, default=8)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2],
                        help="sampling seeds: each draws new completions (and rewards) from the same warm start")
    parser.add_argument("--out", type=Path)
    options = parser.parse_args()
    torch.set_num_threads(1)
    results = {}
    raw: dict[str, dict[str, dict]] = {}
    for task in options.tasks:
        results[task] = {}
        for seed in options.seeds:
            measures = group_measures(task, groups=options.groups, k=options.k, seed=seed)
            raw.setdefault(task, {})[str(seed)] = measures_to_json(measures)
            table = correlations(measures)
            results[task][seed] = table
            tiers = tier_summary(measures)
            if tiers:
                results[task][f"{seed}_tiers"] = tiers
                print(f"\n{task}, seed {seed}, by tier (mixed groups): count, median SNR, median noise, mean signals")
                for tier, row in tiers.items():
                    print(f"{tier:10s} " + " ".join(f"{k}={v:.3g}" for k, v in row.items()))
            n = next(iter(table.values()))["n_groups"]
            print(f"\n{task}, seed {seed}: {n} mixed groups of {options.k}; Spearman rho with the group's gradient "
                  "noise and SNR")
            print(f"{'signal':28s} {'rho(noise)':>10s} {'p':>8s} {'rho(snr)':>10s} {'p':>8s}")
            for name, row in table.items():
                print(f"{name:28s} {row['rho_noise']:10.3f} {row['p_noise']:8.3f} {row['rho_snr']:10.3f} "
                      f"{row['p_snr']:8.3f}")
        print(f"\n{task}: mean rho over seeds {options.seeds} (min, max)")
        for name in SIGNALS:
            cells = []
            for target in ("noise", "snr"):
                values = [results[task][s][name][f"rho_{target}"] for s in options.seeds]
                cells.append(f"{np.mean(values):+.2f} ({min(values):+.2f}, {max(values):+.2f})")
            print(f"{name:28s} noise {cells[0]:>22s}   snr {cells[1]:>22s}")
    if options.out:
        config = {"tasks": options.tasks, "groups": options.groups, "k": options.k, "seeds": options.seeds}
        options.out.parent.mkdir(parents=True, exist_ok=True)
        options.out.write_text(json.dumps({"config": config, "correlations": results, "measures": raw}))
    print("\n" + rho_table(raw))


if __name__ == "__main__":
    main()
