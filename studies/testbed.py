"""The testbed study: every demo method x N seeds from one warm start per task; mean and spread over seeds.

    python -m studies.testbed --seeds 3                # the study (writes docs/results/)
    python -m studies.testbed --seeds 1 --steps 20     # a quick look

Writes to ``--out`` (default docs/results/): ``testbed.md`` (tables per task with mean ± std over seeds, the
warm start, curves and reliability diagrams), ``testbed_curves_*.png`` / ``testbed_reliability_*.png``,
``testbed_results.json`` (every evaluation of every run) and ``headline.md`` (the README's table, with the exact
command). Per-run scratch files go to ``runs/bench_testbed``. A hand-written ``## Findings`` section already in
``--out``/testbed.md is kept when the tables are rebuilt (re-read it against them).

Every method gets the same budget (steps x 16 prompts x 8 samples), the same warm start, the same seeds and the
same evaluation prompts and outcome stream. What was tuned, and on what, is written into the report
(``studies.testbed_study.TUNING_NOTES``).
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # `python studies/testbed.py` as well as `python -m studies.testbed`

from calibrl.testbed.methods import CONTROL_METHODS, DEFAULT_METHODS, DemoConfig  # noqa: E402
# TUNING_NOTES and kept_findings stay reachable from the command's module (the report checks use them)
from studies.testbed_study import TUNING_NOTES, kept_findings, run_study  # noqa: E402,F401


def build_parser() -> argparse.ArgumentParser:
    """The command's flags: the study's budget and methods, where it writes, and which earlier results it merges."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--eval-every", type=int, default=25)
    parser.add_argument("--eval-prompts", type=int, default=128)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--warmstart-steps", type=int, default=1500)
    parser.add_argument("--capo-tau", type=float, default=0.6)
    parser.add_argument("--decision-coef", type=float, default=1.0)
    parser.add_argument("--methods", default=None, help="comma-separated keys (default: the demo's methods)")
    parser.add_argument("--control", action="store_true", help="add the deterministic addition control")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "results")
    parser.add_argument("--runs", type=Path, default=ROOT / "runs" / "bench_testbed")
    parser.add_argument("--merge", type=Path, nargs="*", default=[],
                        help="earlier testbed_results.json files whose runs are merged in (more seeds)")
    parser.add_argument("--report-only", action="store_true",
                        help="train nothing: rebuild the report from the --merge files")
    return parser


def config_from_args(args: argparse.Namespace) -> DemoConfig:
    """The study's DemoConfig: the demo's methods (plus the addition control with ``--control``) and budget."""
    methods = tuple(args.methods.split(",")) if args.methods else DEFAULT_METHODS
    if args.control:
        methods = methods + tuple(m for m in CONTROL_METHODS if m not in methods)
    return DemoConfig(steps=args.steps, eval_every=args.eval_every, eval_prompts=args.eval_prompts,
                      seeds=tuple(range(args.first_seed, args.first_seed + args.seeds)), workers=args.workers,
                      capo_tau=args.capo_tau, decision_coef=args.decision_coef, methods=methods,
                      warmstart_steps=args.warmstart_steps)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.report_only and not args.merge:
        parser.error("--report-only needs --merge FILE...")
    invoked = "python -m studies.testbed " + " ".join(shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:]))
    run_study(config_from_args(args), out=args.out, runs=args.runs, merge=args.merge, report_only=args.report_only,
              command=invoked)
    print((args.out / "headline.md").read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
