"""The warm-started real model, ``builtin:smollm2-135m-warm`` (:mod:`calibrl.testbed.warm_real`): its figures
before any RL, and the RL pilot of docs/protocols/warm_realmodel.md (written before the pilot's runs).

    python -m calibrl.testbed.warm_real --out calibrl/warm/smollm2-135m-warm     # the warm start (about 21 min)
    calibrl generate --model builtin:smollm2-135m-warm --dataset arithmetic --out /tmp/warm_before.jsonl
    python -m studies.warm_realmodel --pack-before /tmp/warm_before.jsonl --started-utc ... --finished-utc ...
    python -m studies.warm_realmodel --run pilot              # the CPU pilot: 2 arms x 2 seeds, resumable
    scripts/warm_realmodel_gpu.sh                             # the full study on one GPU (when one is lent)
    python -m studies.warm_realmodel                                             # docs/results/warm_realmodel.md

Data (docs/results/warm_realmodel/): ``before_rl.jsonl.gz`` and ``before_rl.json`` (the ``calibrl generate`` run
at its defaults: 400 ``test`` problems x 16 samples, T = 1; its command and UTC start and end), ``adapter.json``
(the shipped adapter's training record), and one ``<design>_<arm>_seed<s>.json.gz`` per finished run (every
held-out evaluation with its per-sample arrays, the run's settings and UTC start and end). The page is written
whole from them (``python -m studies.reproduce --only warm_realmodel --check``).

The figures are ``calibrl eval``'s (:func:`calibrl.evaluation.scoring.evaluate_samples`, 1,000 prompt-bootstrap
replicates, seed 0; the confidence-source table included). The RL runs' endpoint is the powered study's
(:func:`studies.realmodel_powered.endpoint`: the protocol's matched pairs, per-seed paired intervals, the
hierarchical interval over seeds and prompts; 2,000 replicates, seed 0).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
DATA_DIR = ROOT / "docs" / "results" / "warm_realmodel"
BEFORE_SAMPLES = DATA_DIR / "before_rl.jsonl.gz"
BEFORE_RUN = DATA_DIR / "before_rl.json"
ADAPTER_RECORD = DATA_DIR / "adapter.json"
VALIDATION_SAMPLES = DATA_DIR / "validation_pilot.jsonl.gz"  # the pilot the settings were chosen on
VALIDATION_RUN = DATA_DIR / "validation_pilot.json"
PAGE = ROOT / "docs" / "results" / "warm_realmodel.md"
PROTOCOL = "docs/protocols/warm_realmodel.md"
MODEL = "builtin:smollm2-135m-warm"
RUNS = Path("runs/warm_realmodel")
N_BOOT, SEED = 2000, 0

# the protocol's designs ("Arms", "Budget", "Seeds"; "premise": its amendment): every run's RealModelRunConfig
# fields, its arms and seeds.
# "pilot": what 2 CPU cores allow in a session, reported as a pilot; "full": the study, on one GPU when one is lent.
COMMON = {"model": MODEL, "dataset": "arithmetic", "prompts_per_step": 4, "num_generations": 8,
          "max_completion_length": 8, "learning_rate": 3e-4, "levels": (1, 2, 3, 4), "train_prompts": 2000,
          "eval_split": "test", "eval_batch_prompts": 50, "lora_r": 16, "threads": 1}
DESIGNS = {
    "pilot": {"runs": {**COMMON, "steps": 16, "eval_prompts": 100, "eval_k": 4, "eval_every": 8},
              "arms": ("grpo", "capo_mask"), "seeds": (0, 1)},
    "full": {"runs": {**COMMON, "steps": 60, "eval_prompts": 400, "eval_k": 4, "eval_every": 20},
             "arms": ("grpo", "capo", "capo_mask"), "seeds": (0, 1, 2, 3, 4)},
    # the amendment of 2026-11-29 (night): does GRPO raise held-out accuracy at all in 48 steps? (CPU, exploratory)
    "premise": {"runs": {**COMMON, "steps": 48, "eval_prompts": 100, "eval_k": 4, "eval_every": 16},
                "arms": ("grpo",), "seeds": (0, 1)},
}
# a rehearsal of either design at tiny size (the device script's check on the CPU): never packed into the data
TINY = {"steps": 2, "eval_prompts": 4, "eval_k": 2, "eval_every": 2, "train_prompts": 16, "eval_batch_prompts": 4}
LABELS = {"grpo": "GRPO", "capo_mask": "CAPO + frozen mask (tau 0.6)", "capo": "CAPO (tau 0.6)"}


# --------------------------------------------------------------------------------------------------- before RL


def before_figures(samples, levels: np.ndarray) -> dict:
    """``calibrl eval``'s figures of the warm start's samples (overall, with the confidence sources and the
    bootstrap) and accuracy / AUROC per level."""
    from calibrl.evaluation.scoring import evaluate_samples
    from calibrl.evaluation.settings import EvalSettings
    from calibrl.metrics import auroc
    from calibrl.selection import answer_clusters

    ids = answer_clusters(samples.answers, samples.prompt_index)
    result = evaluate_samples(samples, label="warm", answer_ids=ids,
                              settings=EvalSettings(methods=(), bootstrap=1000, seed=0))
    by_level = {}
    for level in sorted(set(levels.tolist())):
        rows = levels == level
        y, s = samples.correct[rows], samples.logprob_mean[rows]
        by_level[int(level)] = {"n": int(rows.sum()), "accuracy": float(y.mean()),
                                "mean_confidence": float(np.exp(s).mean()),
                                "auroc": float(auroc(s, y)) if 0 < y.sum() < len(y) else None}
    return {"overall": result.metrics, "by_level": by_level}


def _levels_of(samples) -> np.ndarray:
    """Each sample's level, from the task's own rows (the prompt ids of ``load_arithmetic``'s split)."""
    from calibrl.tasks.synthetic import load_arithmetic

    ids = [str(p) for p in samples.prompt_ids]
    split, seed = ids[0].split("-")[1], int(ids[0].split("-")[2])
    size = max(int(p.rsplit("-", 1)[1]) for p in ids) + 1
    level_of = {r["prompt_id"]: r["level"] for r in load_arithmetic(split, size=size, seed=seed)}
    return np.array([level_of[str(p)] for p in samples.prompt_ids.tolist()])


def evaluation_noise(samples, *, sizes=((100, 4), (200, 4), (400, 4), (400, 16)), n_boot: int = 1000,
                     seed: int = 0) -> list[dict]:
    """The warm start's own noise at the protocol's evaluation sizes: for (prompts G, samples per prompt k), the
    standard deviation of the pooled AUROC of exp(mean log-prob) over ``n_boot`` evaluations of G prompts drawn
    with replacement from the committed ones, each keeping its first k samples (the prompt bootstrap of one
    evaluation of that size). Two arms evaluated on the same prompts differ by at most sqrt(2) times it when
    their errors are unrelated; pairing only lowers it."""
    from calibrl.metrics import auroc

    rng = np.random.default_rng(seed)
    pidx = samples.prompt_index
    order = np.argsort(pidx, kind="stable")
    starts = np.searchsorted(pidx[order], np.arange(samples.n_prompts))
    out = []
    for g, k in sizes:
        rows_of = np.stack([order[starts[p]:starts[p] + k] for p in range(samples.n_prompts)])  # [P, k]
        values = []
        for _ in range(n_boot):
            rows = rows_of[rng.integers(0, samples.n_prompts, size=g)].ravel()
            values.append(auroc(samples.logprob_mean[rows], samples.correct[rows]))
        sd = float(np.nanstd(values, ddof=1))
        out.append({"prompts": g, "k": k, "samples": g * k, "auroc_sd": sd, "difference_sd": sd * 2 ** 0.5})
    return out


# --------------------------------------------------------------------------------------------------- the pilot


def run_design(design: str, arms: list[str], seeds: list[int], *, runs: Path = RUNS, records: Path = DATA_DIR,
               device: str = "cpu", tiny: bool = False) -> list[Path]:
    """Every (arm, seed) of ``design`` not packed yet, one after the other, each resumable from its newest
    checkpoint (rerun the same command); each finished run is packed into ``records`` at once as
    ``<design>_<arm>_seed<s>.json.gz``. ``tiny``: the design at :data:`TINY` size (a rehearsal)."""
    from calibrl.testbed.realmodel import RealModelRunConfig, train_real_model

    fields = {**DESIGNS[design]["runs"], **(TINY if tiny else {})}
    written = []
    for seed in seeds:
        for arm in arms:
            record = records / f"{design}_{arm}_seed{seed}.json.gz"
            if record.exists():
                print(f"{design} {arm} seed {seed}: packed earlier, skipped", flush=True)
                continue
            config = RealModelRunConfig(method=arm, seed=seed, device=device, **fields)
            result = train_real_model(config, runs / design / f"seed{seed}" / arm, checkpoints=True,
                                      print_fn=lambda line: print(line, flush=True))
            pack_run(result, record)
            written.append(record)
            print(f"{design} {arm} seed {seed}: {result['seconds']:.0f} s; packed {record}", flush=True)
    return written


def pack_run(result: dict, path: Path) -> None:
    """One finished run's raw record: settings, UTC start and end, every evaluation with its per-sample arrays."""
    from studies.data_files import save_data

    evaluations = [{k: r.get(k) for k in ("step", "n_samples", "accuracy", "auroc", "ece", "samples")}
                   for r in result["records"]]
    save_data({"method": result["method"], "config": result["config"], "started_utc": result["started_utc"],
               "finished_utc": result["finished_utc"], "seconds": result["seconds"],
               "resumed_from": result["resumed_from"], "evaluations": evaluations}, path)


def load_design(design: str, folder: Path = DATA_DIR) -> dict[tuple[str, int], dict]:
    """The packed runs of ``design``: (arm, seed) -> record."""
    from studies.data_files import load_data

    out = {}
    for path in sorted(folder.glob(f"{design}_*_seed*.json.gz")):
        doc = load_data(path)
        out[(doc["method"], int(doc["config"]["seed"]))] = doc
    return out


def accuracy_moves(runs: dict[tuple[str, int], dict], arm: str = "grpo") -> list[dict]:
    """The protocol's check of the premise: per seed, ``arm``'s held-out accuracy at its final evaluation minus at
    its start, with the paired interval (the same prompts; prompts resampled, 2,000 replicates)."""
    from calibrl.metrics.paired import paired_bootstrap_difference
    from studies.realmodel_analysis import EVALUATION_METRICS

    arrays, score, _, _ = EVALUATION_METRICS["accuracy"]
    out = []
    for (a, seed), doc in sorted(runs.items(), key=lambda kv: kv[0][1]):
        if a != arm:
            continue
        first, last = doc["evaluations"][0], doc["evaluations"][-1]
        d = paired_bootstrap_difference(score, arrays(last["samples"]), arrays(first["samples"]),
                                        prompt_ids_a=last["samples"]["prompt_id"],
                                        prompt_ids_b=first["samples"]["prompt_id"], n_boot=N_BOOT, seed=SEED)
        out.append({"seed": seed, "from": first["accuracy"], "to": last["accuracy"], "step": last["step"],
                    "difference": d.point, "low": d.low, "high": d.high})
    return out


def design_endpoint(runs: dict[tuple[str, int], dict], *, arm: str = "capo_mask", reference: str = "grpo",
                    metric: str = "auroc") -> dict | None:
    """The protocol's primary endpoint (or a secondary one) on the seeds that have both arms:
    :func:`studies.realmodel_powered.endpoint` (the matched pairs, per-seed paired intervals, the hierarchical
    interval over seeds and prompts); None without such a seed."""
    from studies.realmodel_powered import endpoint

    seeds = sorted(s for (a, s) in runs if a == arm and (reference, s) in runs)
    if not seeds:
        return None
    return endpoint(runs, arm=arm, reference=reference, metric=metric, seeds=seeds, n_boot=N_BOOT, seed=SEED)


# --------------------------------------------------------------------------------------------------- the page


def _ci(low_high, signed: bool = False) -> str:
    form = "+.3f" if signed else ".3f"
    return f"[{low_high[0]:{form}}, {low_high[1]:{form}}]"


def _level_table(by_level: dict) -> list[str]:
    lines = ["| level | samples | accuracy | mean confidence | AUROC |", "|---:|---:|---:|---:|---:|"]
    for level, m in by_level.items():
        auc = "" if m["auroc"] is None else f"{m['auroc']:.3f}"
        lines.append(f"| {level} | {m['n']:,} | {m['accuracy']:.3f} | {m['mean_confidence']:.3f} | {auc} |")
    return lines


def report(before: dict | None, run: dict | None, adapter: dict | None, pilot: dict[tuple[str, int], dict],
           validation: tuple[dict, dict] | None = None) -> str:
    lines = ["# The warm-started real model: `builtin:smollm2-135m-warm`", "",
             "Protocol of the RL runs, committed before them: [../protocols/warm_realmodel.md]"
             "(../protocols/warm_realmodel.md).",
             "Data: `docs/results/warm_realmodel/` (the adapter's record `adapter.json`, the samples before RL "
             "`before_rl.jsonl.gz` with `before_rl.json`, the validation pilot's `validation_pilot.jsonl.gz` with "
             "`validation_pilot.json`, one `<design>_<arm>_seed<s>.json.gz` per RL run). This page is written whole by "
             "`python -m studies.warm_realmodel` and rebuilt by `python -m studies.reproduce --only warm_realmodel`.",
             ""]
    if validation is not None:
        figures, vrun = validation
        o, t = figures["overall"], vrun["training"]
        lines += ["## Choosing the settings (the `validation` split)", "",
                  f"A first warm start of {t['steps']} steps of {t['batch']} problems at LoRA rank {t['rank']}, learning "
                  f"rate {t['lr']:g} (trained {t['start']} to {t['end']} UTC, {t['train_seconds'] / 60:.1f} minutes; "
                  f"{t['loop']}), sampled on {o['n_prompts']} `validation` problems x {o['n_samples'] // o['n_prompts']} "
                  f"at T = 1: accuracy {o['accuracy']:.3f} {_ci(o['bootstrap']['accuracy'])}, AUROC "
                  f"{o['auroc']:.3f} {_ci(o['bootstrap']['auroc'])}, mean confidence {o['mean_confidence']:.3f}. "
                  "Below the regime's 0.3, so the shipped warm start trains 2.4 times as many steps, at rank 8 for a "
                  "file of a few MB (fixed from this run alone, before any sample of the `test` split was drawn).",
                  "", *_level_table(figures["by_level"]), ""]
    if adapter is not None:
        c = adapter["config"]
        lines += ["## The warm start", "",
                  f"SmolLM2-135M-Instruct, LoRA r {c['lora_r']} (alpha {c['lora_alpha']}) on every linear projection, "
                  f"{c['steps']} steps of {c['batch']} `arithmetic` train problems (levels 1-4), learning rate "
                  f"{c['learning_rate']:g} (warm-up, linear decay), answer tokens only "
                  f"(`python -m calibrl.testbed.warm_real`). Trained {adapter['start']} to {adapter['end']} UTC: "
                  f"{adapter['train_seconds'] / 60:.1f} minutes on {c['threads']} CPU threads; loss "
                  f"{adapter['loss_by_20_steps'][0]:.2f} over the first 20 steps, "
                  f"{adapter['loss_by_20_steps'][-1]:.2f} over the last.", ""]
    if before is not None:
        o = before["overall"]
        b = o["bootstrap"]
        lines += ["## Before RL", "",
                  f"`{run['command']}` ({run['started_utc']} to {run['finished_utc']} UTC): {o['n_samples']:,} samples "
                  f"of {o['n_prompts']} held-out `test` problems, T = 1. Intervals: 95%, {1000:,} prompt-bootstrap "
                  "replicates.", "",
                  "| figure | value | 95% interval |", "|---|---:|---|",
                  f"| accuracy (mean@16) | {o['accuracy']:.3f} | {_ci(b['accuracy'])} |",
                  f"| AUROC of exp(mean log-prob) | {o['auroc']:.3f} | {_ci(b['auroc'])} |",
                  f"| ECE (10 bins) | {o['ece']:.3f} | {_ci(b['ece'])} |",
                  f"| Brier | {o['brier']:.3f} | {_ci(b['brier'])} |",
                  f"| smooth ECE | {o['smooth_ece']:.3f} | |",
                  f"| mean confidence | {o['mean_confidence']:.3f} | |", "",
                  "Confidence sources (`calibrl eval`'s table):", "",
                  "| source | n | AUROC | 95% interval | PRR | ECE | smooth ECE | Brier |",
                  "|---|---:|---:|---|---:|---:|---:|---:|"]
        for kind, m in o["confidence_sources"].items():
            iv = m.get("intervals", {}).get("auroc")

            def f(x):
                return "" if x is None else f"{x:.3f}"
            lines.append(f"| {kind} | {m['n']:,} | {f(m['auroc'])} | {_ci(iv) if iv else ''} | {f(m.get('prr'))} | "
                         f"{f(m.get('ece'))} | {f(m.get('smooth_ece'))} | {f(m.get('brier'))} |")
        lines += ["", "By level (`calibrl.tasks.synthetic`'s table of levels):", "", *_level_table(before["by_level"]),
                  "", "The noise of one evaluation (`evaluation_noise`: the standard deviation of the pooled AUROC over "
                  "1,000 draws of G of these prompts with replacement, each with its first k samples; the protocol's "
                  "power is worked out from it):", "",
                  "| prompts G | k | samples | sd of the AUROC | sd of a difference of two (unpaired bound) |",
                  "|---:|---:|---:|---:|---:|"]
        for row in before["noise"]:
            lines.append(f"| {row['prompts']} | {row['k']} | {row['samples']:,} | {row['auroc_sd']:.3f} | "
                         f"{row['difference_sd']:.3f} |")
        lines.append("")
    lines += ["## The RL pilot", ""]
    if not pilot:
        lines += ["No pilot run is committed yet: `python -m studies.warm_realmodel --run pilot` runs it.", ""]
        return "\n".join(lines)
    lines += ["| arm | seed | step | samples | accuracy | AUROC | ECE | UTC start - end |",
              "|---|---:|---:|---:|---:|---:|---:|---|"]
    for (arm, seed), doc in sorted(pilot.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        for e in doc["evaluations"]:
            lines.append(f"| {LABELS.get(arm, arm)} | {seed} | {e['step']} | {int(e['n_samples'])} | {e['accuracy']:.3f} | "
                         f"{e['auroc']:.3f} | {e['ece']:.3f} | {doc['started_utc']} - {doc['finished_utc']} |")
    moves = accuracy_moves(pilot)
    if moves:
        lines += ["", "The premise (the protocol's check): GRPO's held-out accuracy from its start to its final "
                  "evaluation, paired on the same prompts: " + "; ".join(
                      f"seed {m['seed']}: {m['from']:.3f} -> {m['to']:.3f} at step {m['step']}, "
                      f"{m['difference']:+.3f} {_ci((m['low'], m['high']), True)}" for m in moves) + "."]
        raised = [m["seed"] for m in moves if m["low"] > 0]
        if not raised:
            lines[-1] += (" GRPO raised held-out accuracy in no seed (no interval above 0): by the protocol, the premise "
                          "\"RL raises accuracy\" was not met in this budget, and the endpoint below does not test the "
                          "seeds' claim.")
        else:
            lines[-1] += f" Raised (interval above 0) in seed(s) {', '.join(map(str, raised))}."
    found = design_endpoint(pilot)
    if found is not None:
        lines += ["", "The protocol's primary endpoint on the pilot: CAPO + mask's final evaluation against GRPO's of "
                  "nearest held-out accuracy, the difference in AUROC (paired per seed, prompts resampled; over seeds "
                  "the hierarchical interval, seeds and prompts resampled, 2,000 replicates). A pilot: no verdict.", "",
                  "| seed | CAPO + mask step (accuracy) | GRPO step (accuracy) | difference | 95% interval |",
                  "|---|---|---|---:|---|"]
        for r in found["seeds"]:
            lines.append(f"| {r['seed']} | {r['step']} ({r['accuracy']:.3f}) | {r['reference_step']} "
                         f"({r['reference_accuracy']:.3f}) | {r['difference']:+.3f} | {_ci((r['low'], r['high']), True)} |")
        lines.append(f"| all ({len(found['seeds'])}) | | | {found['difference']:+.3f} | "
                     f"{_ci((found['low'], found['high']), True)} |")
    lines.append("")
    return "\n".join(lines)


def premise_section(premise: dict[tuple[str, int], dict], pilot: dict[tuple[str, int], dict]) -> list[str]:
    """The amendment's exploratory check (design ``premise``): GRPO's evaluations over 48 steps, its accuracy
    change with the paired interval, and whether each run's step-16 evaluation repeats the pilot's."""
    if not premise:
        return []
    lines = ["## Exploratory: does GRPO raise accuracy in 48 steps? (amendment of 2026-11-29, night)", "",
             "GRPO alone, the pilot's settings and held-out prompts, 48 steps (`python -m studies.warm_realmodel --run "
             "premise`). Exploratory: it bears on whether the full design's budget can reach the claim's regime, not "
             "on the claim.", "",
             "| seed | step | samples | accuracy | AUROC | ECE | UTC start - end |",
             "|---:|---:|---:|---:|---:|---:|---|"]
    for (arm, seed), doc in sorted(premise.items(), key=lambda kv: kv[0][1]):
        for e in doc["evaluations"]:
            lines.append(f"| {seed} | {e['step']} | {int(e['n_samples'])} | {e['accuracy']:.3f} | {e['auroc']:.3f} | "
                         f"{e['ece']:.3f} | {doc['started_utc']} - {doc['finished_utc']} |")
    moves = accuracy_moves(premise)
    met = [m["seed"] for m in moves if m["low"] > 0]
    lines += ["", "GRPO's held-out accuracy from step 0 to its last evaluation, paired on the same prompts: "
              + "; ".join(
        f"seed {m['seed']}: {m['from']:.3f} -> {m['to']:.3f} at step {m['step']}, {m['difference']:+.3f} "
        f"{_ci((m['low'], m['high']), True)}" for m in moves) + "."]
    if met:
        lines[-1] += f" By the amendment's rule the premise is met in seed(s) {', '.join(map(str, met))}."
    else:
        lines[-1] += (" By the amendment's rule the premise is met in no seed (no interval above 0): at this "
                      "recipe's pace, 60 steps are likely too few to reach the regime the seeds' claim is about from "
                      "this start.")
    same = []
    for (arm, seed), doc in sorted(premise.items(), key=lambda kv: kv[0][1]):
        mine = next((e for e in doc["evaluations"] if e["step"] == 16), None)
        theirs = next((e for e in pilot.get((arm, seed), {}).get("evaluations", []) if e["step"] == 16), None)
        if mine is not None and theirs is not None:
            equal = all(np.array_equal(np.asarray(mine["samples"][k]), np.asarray(theirs["samples"][k]))
                        for k in theirs["samples"])
            same.append(f"seed {seed}: {'the same samples' if equal else 'different samples'} "
                        f"(accuracy {mine['accuracy']:.3f} against the pilot's {theirs['accuracy']:.3f})")
    if same:
        lines += ["", "The runs' mechanics: each run's step-16 evaluation against the pilot's GRPO run of the same "
                  "seed (the same first 16 steps): " + "; ".join(same) + "."]
    lines.append("")
    return lines


def rebuild(folder: Path = DATA_DIR) -> str:
    """The page from the committed data."""
    from studies.data_files import load_packed_samples

    before = run = adapter = validation = None
    if (folder / VALIDATION_SAMPLES.name).exists():
        samples = load_packed_samples(folder / VALIDATION_SAMPLES.name)
        validation = (before_figures(samples, _levels_of(samples)),
                      json.loads((folder / VALIDATION_RUN.name).read_text()))
    if (folder / BEFORE_SAMPLES.name).exists():
        samples = load_packed_samples(folder / BEFORE_SAMPLES.name)
        before = {**before_figures(samples, _levels_of(samples)), "noise": evaluation_noise(samples)}
        run = json.loads((folder / BEFORE_RUN.name).read_text())
    if (folder / ADAPTER_RECORD.name).exists():
        adapter = json.loads((folder / ADAPTER_RECORD.name).read_text())
    pilot = load_design("pilot", folder)
    page = report(before, run, adapter, pilot, validation)
    extra = premise_section(load_design("premise", folder), pilot)
    return page + ("\n".join(extra) if extra else "")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pack-before", type=Path, help="a finished calibrl generate JSONL of the warm start")
    parser.add_argument("--started-utc")
    parser.add_argument("--finished-utc")
    parser.add_argument("--command", default=f"calibrl generate --model {MODEL} --dataset arithmetic")
    parser.add_argument("--run", choices=tuple(DESIGNS), help="run (or resume) this design's runs")
    parser.add_argument("--arms", default=None, help="comma-separated (default: the design's)")
    parser.add_argument("--seeds", default=None, help="comma-separated (default: the design's)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--tiny", action="store_true", help="--run at tiny size, into --records (a rehearsal)")
    parser.add_argument("--runs", type=Path, default=RUNS, help="run folders (default %(default)s)")
    parser.add_argument("--records", type=Path, default=DATA_DIR, help="where finished runs are packed")
    args = parser.parse_args(argv)
    if args.pack_before:
        from calibrl.models import warm_adapter_path
        from studies.data_files import pack_generate_run

        if not (args.started_utc and args.finished_utc):
            parser.error("--pack-before needs --started-utc and --finished-utc")
        pack_generate_run(args.pack_before, BEFORE_SAMPLES, BEFORE_RUN,
                          times={"started_utc": args.started_utc, "finished_utc": args.finished_utc},
                          command=args.command)
        shutil.copyfile(warm_adapter_path(MODEL) / "record.json", ADAPTER_RECORD)
        print(f"wrote {BEFORE_SAMPLES}, {BEFORE_RUN} and {ADAPTER_RECORD}")
        return 0
    if args.run:
        if args.tiny and args.records.resolve() == DATA_DIR.resolve():
            parser.error("--tiny needs --records elsewhere than the study's data folder")
        design = DESIGNS[args.run]
        arms = args.arms.split(",") if args.arms else list(design["arms"])
        seeds = [int(x) for x in args.seeds.split(",")] if args.seeds else list(design["seeds"])
        run_design(args.run, arms, seeds, runs=args.runs, records=args.records, device=args.device, tiny=args.tiny)
        return 0  # the page is written by the plain command (processes running side by side would race on it)
    PAGE.write_text(rebuild())
    print(f"wrote {PAGE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
