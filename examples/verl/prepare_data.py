r"""Write verl's RL parquet files for the CAPO recipe from calibrl's dataset loaders.

    python examples/verl/prepare_data.py --out ~/data/capo            # from the hub (needs the network)
    python examples/verl/prepare_data.py --out DIR --path deepscaler=FILE --path aime24=FILE ...   # local copies

train.parquet: the first ``--train-limit`` (20,000, the CAPO paper's count; which 20k it used is not published)
usable DeepScaleR problems, in hub order. val.parquet: the evaluation benchmarks (``--val``, default AIME24,
AIME25 and MATH500). Each row is in the format verl's RLHFDataset and reward loop read:

    data_source   the calibrl benchmark name ("deepscaler", "aime24", ...)
    prompt        [{"role": "user", "content": "<problem>\nPlease reason step by step, and put your final answer
                  within \boxed{}."}]  (calibrl's "chat" math template; verl applies the tokenizer's chat template)
    ability       "math"
    reward_model  {"style": "rule", "ground_truth": <gold answer>}
    extra_info    {"task": "math", "prompt_id": ..., "index": row number}

(rows made by calibrl.tasks.datasets.to_verl_rows; ``python -m calibrl.tasks.datasets NAME OUT.parquet`` exports a
single dataset the same way).

Rewards: calibrl.tasks.rewards.verl_compute_score (math-verify on the last \boxed{} answer), configured with
``reward.custom_reward_function.path=pkg://calibrl.tasks.rewards``
``reward.custom_reward_function.name=verl_compute_score``
(run_capo.sh does this).
"""

from __future__ import annotations

import argparse
from pathlib import Path


def verl_rows(name: str, *, path: str | None, limit: int | None) -> list[dict]:
    """Dataset ``name`` (calibrl's loader, chat template) in verl's row format (calibrl.tasks.datasets.to_verl_rows)."""
    from calibrl.tasks.datasets import to_verl_rows
    from calibrl.tasks.registry import get_dataset_loader

    kwargs = {"path": path} if path else {}
    return to_verl_rows(get_dataset_loader(name)(limit=limit, template="chat", **kwargs))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="output directory for train.parquet and val.parquet")
    parser.add_argument("--train", default="deepscaler", help="training dataset (calibrl name)")
    parser.add_argument("--train-limit", type=int, default=20000)
    parser.add_argument("--val", default="aime24,aime25,math500", help="comma-separated evaluation datasets")
    parser.add_argument("--path", action="append", default=[], metavar="NAME=FILE",
                        help="read dataset NAME from a local JSON/JSONL/Parquet file in the hub's format")
    args = parser.parse_args(argv)

    import pandas as pd

    paths = dict(item.split("=", 1) for item in args.path)
    out = Path(args.out).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    train = verl_rows(args.train, path=paths.get(args.train), limit=args.train_limit)
    val = [row for name in args.val.split(",") if name for row in verl_rows(name, path=paths.get(name), limit=None)]
    pd.DataFrame(train).to_parquet(out / "train.parquet")
    pd.DataFrame(val).to_parquet(out / "val.parquet")
    print(f"wrote {len(train)} train rows and {len(val)} val rows to {out}")


if __name__ == "__main__":
    main()
