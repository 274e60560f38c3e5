"""The pre-registered study of docs/testbed.md on the ``scratchpad`` task (:mod:`studies.protocol_analysis`).

    python -m studies.protocol pilot --out runs/protocol     # GRPO, 2 seeds, 400 steps; prints the pilot's verdict
    python -m studies.protocol arms --out runs/protocol      # every arm x 5 seeds (only after a positive pilot)
    python -m studies.protocol analyze --out runs/protocol   # targets, stopping points, endpoints, intervals, rule
    python -m studies.protocol pilot --task scratchpad_unfixable --out runs/protocol_unfixable   # the second pilot

Runs land in ``<out>/<arm>/seed<k>/`` (history.json with the eval-set curve, eval_set_samples.npz with the test
samples of every evaluation); a run whose history.json exists is not run again. ``pilot`` writes
``<out>/pilot.json`` and ``<out>/pilot.png`` (the gap and accuracy curves of the pilot runs); with ``--save FILE``
the pilot's record (curves, verdict, tier tables) is also merged into FILE under the task's name (the committed
data of docs/results/protocol.md: ``docs/results/protocol_results.json``, whose tables :func:`pilot_tables`
rebuilds).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from studies import protocol_analysis as P


def _warm_path(config: P.ProtocolConfig) -> str:
    from calibrl.testbed.warmstart import WarmStartConfig, warm_start

    return str(warm_start(config.task, WarmStartConfig.for_task(config.task),
                          log=lambda m: print(m, flush=True)))


def _run(config: P.ProtocolConfig, arms, seeds, out: Path) -> None:
    from calibrl.testbed.runner import run_jobs

    jobs = [j for j in P.build_jobs(config, arms=arms, seeds=seeds, runs_dir=out, warm_path=_warm_path(config))
            if not (Path(j["run_dir"]) / "history.json").exists()]
    start = time.time()
    last = {}

    def progress(msg: dict) -> None:
        key = (msg["key"], msg["seed"])
        if "metrics" in msg or time.time() - last.get(key, 0) > 60:
            last[key] = time.time()
            extra = ""
            if "metrics" in msg:
                m = msg["metrics"]
                extra = (f" accuracy {m['expected_accuracy']:.3f} auroc {m['auroc']:.3f} ceiling gap "
                         f"{P.ceiling_gap(m):.3f} entropy {m['entropy']:.3f}")
            print(f"[{time.time() - start:6.0f} s] {msg['key']} seed {msg['seed']} step {msg['step']}/{msg['total']}"
                  f"{extra}", flush=True)

    print(f"{len(jobs)} run(s) to do", flush=True)
    if jobs:
        run_jobs(jobs, workers=config.workers, on_progress=progress)


def _histories(out: Path, arm: str, seeds) -> list[list[dict]]:
    return [json.loads((out / arm / f"seed{s}" / "history.json").read_text())["history"] for s in seeds]


def _times(out: Path, arm: str, seeds) -> list[dict]:
    """Each seed's UTC start and end of its run (history.json's)."""
    from calibrl.testbed.runner import run_times

    return [run_times(json.loads((out / arm / f"seed{s}" / "history.json").read_text())) for s in seeds]


def pilot(config: P.ProtocolConfig, out: Path) -> dict:
    _run(config, [P.REFERENCE_ARM], config.pilot_seeds, out)
    histories = _histories(out, P.REFERENCE_ARM, config.pilot_seeds)
    verdict = P.pilot_verdict(histories, min_gap_growth=config.min_gap_growth)
    verdict["curves"] = [[{k: r[k] for k in ("step", "expected_accuracy", "auroc", "auroc_ceiling",
                                             "auroc_per_prompt", "entropy")} for r in h] for h in histories]
    verdict["times"] = _times(out, P.REFERENCE_ARM, config.pilot_seeds)
    verdict["config"] = {"task": config.task, "steps": config.steps, "eval_every": config.eval_every,
                         "eval_prompts": config.eval_prompts, "test_prompts": config.test_prompts,
                         "eval_samples": config.eval_samples, "learning_rate": config.learning_rate,
                         "pilot_seeds": list(config.pilot_seeds)}
    (out / "pilot.json").write_text(json.dumps(verdict, indent=1))
    _plot_pilot(verdict, out / "pilot.png")
    for seed, growth, curve in zip(config.pilot_seeds, verdict["gap_growth"], verdict["curves"]):
        print(f"seed {seed}: ceiling gap {P.ceiling_gap(curve[0]):.3f} -> {P.ceiling_gap(curve[-1]):.3f} "
              f"(growth {growth:+.3f}); accuracy {curve[0]['expected_accuracy']:.3f} -> "
              f"{curve[-1]['expected_accuracy']:.3f}")
    verdict["tiers"] = tier_breakdown(config, out)
    verdict["test_tiers"] = {str(s): test_tier_curve(config, out, s) for s in config.pilot_seeds}
    (out / "pilot.json").write_text(json.dumps(verdict, indent=1))
    print("premise reproduced" if verdict["reproduced"] else "premise NOT reproduced at this scale", flush=True)
    return verdict


def tier_breakdown(config: P.ProtocolConfig, out: Path) -> list[dict]:
    """Per tier (easy / medium / hard) of the eval prompts: accuracy, mean confidence exp(lpm) of right and of
    wrong samples, and AUROC, for the warm start (evaluated again with the runs' sampling seed) and each pilot
    run's last evaluation (its final_samples.npz)."""
    import numpy as np
    import torch

    from calibrl import metrics as M
    from calibrl.testbed import tasks as tb
    from calibrl.testbed.evaluate import evaluate
    from calibrl.testbed.warmstart import load_warm_start

    torch.set_num_threads(1)
    rows = tb.build_rows(config.task, config.eval_prompts, split="eval", seed=0)
    model, tokenizer = load_warm_start(_warm_path(config))
    _, start = evaluate(model, tokenizer, config.task, [r["prompt"] for r in rows], n=config.eval_samples,
                        seed=10_000)  # the runner's evaluation seed: the runs' step-0 samples
    sources = [("warm start", start)] + [
        (f"GRPO seed {s}, step {config.steps}",
         dict(np.load(out / P.REFERENCE_ARM / f"seed{s}" / "final_samples.npz"))) for s in config.pilot_seeds]
    table = []
    for name, samples in sources:
        tier = np.array([rows[i]["tier"] for i in samples["prompt_index"]])
        for t, _, _ in tb.SCRATCHPAD_TIERS:
            sel = tier == t
            right, conf = samples["correct"][sel].astype(bool), np.exp(samples["logprob_mean"][sel])
            both = 0 < right.sum() < right.size
            table.append({"run": name, "tier": t, "accuracy": float(right.mean()),
                          "confidence_right": float(conf[right].mean()) if right.any() else None,
                          "confidence_wrong": float(conf[~right].mean()) if (~right).any() else None,
                          "n_wrong": int((~right).sum()),
                          "auroc": float(M.auroc(conf, right)) if both else None})
    print(f"{'run':24s} {'tier':7s} {'accuracy':>8s} {'conf right':>10s} {'conf wrong':>10s} {'AUROC':>6s}")
    for r in table:
        cells = [f"{r[k]:.3f}" if r[k] is not None else "-" for k in ("confidence_right", "confidence_wrong", "auroc")]
        print(f"{r['run']:24s} {r['tier']:7s} {r['accuracy']:8.3f} {cells[0]:>10s} {cells[1]:>10s} {cells[2]:>6s}")
    return table


def test_tier_curve(config: P.ProtocolConfig, out: Path, seed: int) -> list[dict]:
    """Per test evaluation of a pilot run (its eval_set_samples.npz) and tier of the test prompts: the step,
    accuracy (drawn outcomes), and mean confidence exp(lpm) of right and of wrong samples (None when there are
    none)."""
    import numpy as np

    from calibrl.testbed import tasks as tb

    rows = tb.build_rows(config.task, config.test_prompts, split="test", seed=0)
    curve = []
    with np.load(out / P.REFERENCE_ARM / f"seed{seed}" / "eval_set_samples.npz") as data:
        steps = sorted({int(k.split("/")[1][4:]) for k in data.files if k.startswith("test/step")})
        for step in steps:
            pid = data[f"test/step{step}/prompt_index"]
            right = data[f"test/step{step}/correct"].astype(bool)
            conf = np.exp(data[f"test/step{step}/logprob_mean"])
            tier = np.array([rows[i]["tier"] for i in pid])
            for t in dict.fromkeys(r["tier"] for r in rows):
                sel = tier == t
                r, c = right[sel], conf[sel]
                curve.append({"step": step, "tier": t, "accuracy": float(r.mean()),
                              "confidence_right": float(c[r].mean()) if r.any() else None,
                              "confidence_wrong": float(c[~r].mean()) if (~r).any() else None})
    return curve


def pilot_tables(verdict: dict, *, every: int = 100) -> str:
    """docs/results/protocol.md's tables of one pilot from its record (pilot.json): per seed the eval-set curve's
    start and end (and the ceiling gap at step ``every``); per tier of the eval prompts, the warm start and each
    run's last evaluation; per tier of the test prompts, each seed's evaluations every ``every`` steps."""
    def f(v, digits=3):
        return "-" if v is None else f"{v:.{digits}f}"

    lines = ["| seed | eval accuracy, first -> last step | pooled AUROC | ceiling gap, first -> step "
             f"{every} -> last (growth) | per-prompt AUROC | per-token entropy |", "|---|---|---|---|---|---|"]
    for seed, curve, growth in zip(verdict["config"]["pilot_seeds"], verdict["curves"], verdict["gap_growth"]):
        a, b = curve[0], curve[-1]
        mid = next((r for r in curve if r["step"] == every), b)
        gap = [P.ceiling_gap(r) for r in (a, mid, b)]
        lines.append(f"| {seed} | {f(a['expected_accuracy'])} -> {f(b['expected_accuracy'])} | {f(a['auroc'])} -> "
                     f"{f(b['auroc'])} | {gap[0]:.3f} -> {gap[1]:.3f} -> {gap[2]:.3f} ({growth:+.3f}) | "
                     f"{f(a['auroc_per_prompt'])} -> {f(b['auroc_per_prompt'])} | {f(a['entropy'])} -> "
                     f"{f(b['entropy'])} |")
    lines += ["", "| run | tier | accuracy | confidence right | confidence wrong | AUROC within tier |",
              "|---|---|---:|---:|---:|---:|"]
    lines += [f"| {r['run']} | {r['tier']} | {f(r['accuracy'])} | {f(r['confidence_right'])} | "
              f"{f(r['confidence_wrong'])} | {f(r['auroc'])} |" for r in verdict["tiers"]]
    for seed, curve in verdict["test_tiers"].items():
        order = ("easy", "medium", "hard")
        tiers = sorted(dict.fromkeys(r["tier"] for r in curve), key=lambda t: (order.index(t) if t in order else 3, t))
        lines += ["", f"| seed {seed}, step | " + " | ".join(f"{t}: accuracy, confidence right / wrong" for t in tiers)
                  + " |", "|---:|" + "---|" * len(tiers)]
        by_step: dict[int, dict[str, dict]] = {}
        for r in curve:
            by_step.setdefault(r["step"], {})[r["tier"]] = r
        for step, row in by_step.items():
            if step % every == 0:
                cells = [f"{f(row[t]['accuracy'], 2)}, {f(row[t]['confidence_right'])} / "
                         f"{f(row[t]['confidence_wrong'])}" for t in tiers]
                lines.append(f"| {step} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _plot_pilot(verdict: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from calibrl.evaluation.styles import series_style

    color = series_style("GRPO").color  # one method, GRPO's colour; the seeds by marker and line style
    seeds = (verdict.get("config") or {}).get("pilot_seeds") or list(range(len(verdict["curves"])))
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    for i, (seed, curve) in enumerate(zip(seeds, verdict["curves"])):
        steps = [r["step"] for r in curve]
        style = dict(color=color, marker="os"[i % 2], linestyle=("-", "--")[i % 2], label=f"GRPO seed {seed}")
        axes[0].plot(steps, [r["expected_accuracy"] for r in curve], **style)
        axes[1].plot(steps, [r["auroc_ceiling"] - r["auroc"] for r in curve], **style)
        axes[2].plot(steps, [r["entropy"] for r in curve], **style)
    axes[0].set(title="Accuracy (eval prompts)", xlabel="step", ylabel="accuracy (higher is better)")
    axes[1].set(title="Ceiling gap: AUROC ceiling - AUROC", xlabel="step", ylabel="gap (lower is better)")
    axes[2].set(title="Per-token entropy of the samples", xlabel="step", ylabel="nats per token")
    for ax in axes:
        ax.grid(alpha=0.3)
    axes[1].legend(loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2, frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("phase", choices=["pilot", "arms", "analyze"])
    parser.add_argument("--out", type=Path, default=Path("runs/protocol"))
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--task", default=P.PROTOCOL_TASK, choices=[P.PROTOCOL_TASK, P.SECOND_PILOT_TASK],
                        help="scratchpad (the first protocol) or scratchpad_unfixable (the second pilot)")
    parser.add_argument("--save", type=Path, default=None,
                        help="pilot: also merge its record into this JSON file under the task's name")
    options = parser.parse_args()
    config = P.ProtocolConfig.for_task(options.task, workers=options.workers)
    options.out.mkdir(parents=True, exist_ok=True)
    if options.phase == "pilot":
        verdict = pilot(config, options.out)
        print(pilot_tables(verdict))
        if options.save:
            saved = json.loads(options.save.read_text()) if options.save.exists() else {}
            saved[config.task] = verdict
            options.save.write_text(json.dumps(saved, indent=1))
            print(f"written: {options.save} ({config.task})")
        return
    verdict_path = options.out / "pilot.json"
    if not verdict_path.exists() or not json.loads(verdict_path.read_text())["reproduced"]:
        sys.exit("the protocol runs its arms only after a pilot that reproduces the premise "
                 f"(see {verdict_path}; run `python -m studies.protocol pilot` first)")
    arms = list(config.arms)
    if options.phase == "arms":
        _run(config, arms, config.seeds, options.out)
    folders = {arm: {s: options.out / arm / f"seed{s}" for s in config.seeds} for arm in arms}
    missing = [str(d) for runs in folders.values() for d in runs.values() if not (d / "history.json").exists()]
    if missing:
        sys.exit(f"analyze: {len(missing)} run(s) missing, e.g. {missing[0]} (run the arms phase first)")
    histories = {arm: {s: json.loads((d / "history.json").read_text())["history"] for s, d in runs.items()}
                 for arm, runs in folders.items()}
    result = P.analyze(histories, folders, config=config)
    (options.out / "analysis.json").write_text(json.dumps(result, indent=1, default=str))
    print(json.dumps(result["targets"]), json.dumps(result["success"]))
    print(f"written: {options.out / 'analysis.json'}")


if __name__ == "__main__":
    main()
