"""The built-in testbed: calibration-aware RL on a laptop, with known outcome probabilities.

A tiny char-level model learns small tasks whose true success probabilities are known, so every confidence can be
checked against the truth. The flow, one file per step:

    tasks       three tasks generated in code (decision, stochastic_reasoning, addition): prompts, rewards, the
                exact success probability of any completion; registered as ``testbed/<task>`` datasets/rewards
    model       the 0.2M-parameter char-level Llama and its tokenizer, saved and loaded like a hub model
    warmstart   one SFT warm start per task (TRL SFTTrainer), chosen by evaluation and cached on disk;
                exact-score sampling (``sample_completions``)
    methods     what is compared: the methods (one CalibratedGRPOConfig setting each) and ``DemoConfig``,
                the budget they all share
    runner      one training run per method x seed from its warm start (CalibratedGRPOTrainer), in worker
                processes
    evaluate    the metrics of a model: sampled completions, outcomes from the true distribution, AUROC, ECE,
                decision calibration
    demo        ``calibrl demo``: warm starts -> runs -> ``results.json`` + report
    report      tables (mean ± std over seeds), training curves and reliability diagrams, as markdown + PNGs

The studies built on it (the demo over several seeds, the pre-registered protocol, the real-model studies) are the
repository's ``studies`` package, not part of calibrl: ``python -m studies.testbed`` and docs/benchmarks.md.

Importing the package imports none of them (``calibrl.tasks.registry`` imports ``tasks`` when a registry is read);
import the module you need, e.g. ``from calibrl.testbed.demo import run_demo``.
"""
