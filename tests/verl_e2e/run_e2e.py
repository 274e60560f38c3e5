"""Run verl 0.9.1's own ``python -m verl.trainer.main_ppo`` on the CPU under Ray with calibrl's estimators.

    .venv-verl/bin/python tests/verl_e2e/run_e2e.py --out runs/verl_e2e [--case capo_legacy ...]

For each case: a tiny random Llama (character tokenizer, built here), a 16-row parquet of ``a+b=`` prompts and the rule
reward of ``e2e_reward.py``; ``main_ppo`` for 2 training steps with 4 prompts x 4 rollouts a step, the FSDP2 actor and
reference engines, the ``hf`` rollout and the patches of ``verl_cpu_runtime.py``, all loaded by verl itself through
``VERL_USE_EXTERNAL_MODULES``. Writes ``<out>/<case>/metrics.jsonl`` (verl's file logger: its step metrics),
``<out>/<case>/record/adv_*.pt`` (each advantage computation, ``e2e_record.py``), ``<out>/<case>/log.txt`` and
``<out>/<case>/result.json`` (exit status, wall and CPU seconds of the run and its Ray processes).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
STEPS = 2
PROMPTS_PER_STEP = 4
ROLLOUTS = 4
PROMPT_LENGTH = 16
RESPONSE_LENGTH = 8

# case -> (trainer, estimator, calibrl parameters)
CASES: dict[str, tuple[str, str, dict]] = {
    "capo_legacy": ("legacy", "capo", {"tau": 0.6, "mask": "quantile", "ref_high_quantile": 0.75,
                                       "ref_low_quantile": 0.25}),
    "grpo_mask_legacy": ("legacy", "grpo_mask", {"mask": "quantile", "ref_high_quantile": 0.75,
                                                 "ref_low_quantile": 0.25}),
    "seed_grpo_legacy": ("legacy", "seed_grpo", {}),
    "capo_v1": ("v1", "capo", {"tau": 0.6, "mask": "quantile", "ref_high_quantile": 0.75, "ref_low_quantile": 0.25}),
    "grpo_mask_v1": ("v1", "grpo_mask", {"mask": "quantile", "ref_high_quantile": 0.75, "ref_low_quantile": 0.25}),
    "seed_grpo_v1": ("v1", "seed_grpo", {}),
}

CHARS = list("0123456789+= ")
SPECIALS = ["<pad>", "<s>", "</s>"]
CHAT_TEMPLATE = ("{% for m in messages %}{{ m['content'] }}{% endfor %}"
                 "{% if add_generation_prompt %} {% endif %}")


def build_model(folder: Path, *, seed: int = 0) -> Path:
    """A character tokenizer (digits, '+', '=', space) and a 2-layer random Llama in ``folder`` (HF format)."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    folder.mkdir(parents=True, exist_ok=True)
    vocab = {tok: i for i, tok in enumerate(SPECIALS + CHARS)}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<pad>"))
    core.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", bos_token="<s>", eos_token="</s>")
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(folder)
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=len(vocab), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         tie_word_embeddings=False, pad_token_id=vocab["<pad>"], bos_token_id=vocab["<s>"],
                         eos_token_id=vocab["</s>"])
    LlamaForCausalLM(config).save_pretrained(folder)
    return folder


def build_data(folder: Path, *, rows: int = 16, seed: int = 0) -> tuple[Path, Path]:
    """``train.parquet`` (``rows`` prompts ``a+b=``) and ``val.parquet`` (4 of them) in verl's RLHF format."""
    import numpy as np
    import pandas as pd

    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    records = []
    for i in range(rows):
        a, b = (int(x) for x in rng.integers(0, 10, size=2))
        records.append({
            "data_source": "calibrl_e2e",
            "prompt": [{"role": "user", "content": f"{a}+{b}="}],
            "ability": "arithmetic",
            "reward_model": {"style": "rule", "ground_truth": str((a + b) % 10)},
            "extra_info": {"index": i, "split": "train"},
        })
    train, val = folder / "train.parquet", folder / "val.parquet"
    pd.DataFrame(records).to_parquet(train)
    pd.DataFrame(records[:4]).to_parquet(val)
    return train, val


def overrides(*, trainer: str, estimator: str, params: dict, model: Path, train: Path, val: Path,
              out: Path) -> list[str]:
    """The hydra overrides of one case (docs/verl.md, "verl end to end on the CPU", explains each group)."""
    a = "actor_rollout_ref"
    args = [
        # Ray on the CPU: one fake GPU for verl's placement group; enough CPUs that every actor gets scheduled
        "+ray_kwargs.ray_init.num_gpus=1", "ray_kwargs.ray_init.num_cpus=16", "trainer.n_gpus_per_node=1",
        "trainer.nnodes=1", f"trainer.use_v1={trainer == 'v1'}", "trainer.device=cpu",
        "+ray_kwargs.ray_init.include_dashboard=False",
        # the V1 trainer's TransferQueue: one storage actor instead of 8 (each a process importing verl)
        "transfer_queue.backend.SimpleStorage.num_data_storage_units=1",
        # data and model
        f"data.train_files={train}", f"data.val_files={val}", f"data.train_batch_size={PROMPTS_PER_STEP}",
        f"data.max_prompt_length={PROMPT_LENGTH}", f"data.max_response_length={RESPONSE_LENGTH}",
        "data.dataloader_num_workers=0", "data.shuffle=False", f"{a}.model.path={model}",
        f"+{a}.model.override_config.attn_implementation=sdpa", f"{a}.model.use_remove_padding=False",
        # FSDP2 actor and reference on the CPU (FSDP1 needs a device id)
        f"{a}.actor.strategy=fsdp2", f"{a}.ref.strategy=fsdp2", f"{a}.actor.optim.lr=1e-3",
        f"{a}.actor.ppo_mini_batch_size={PROMPTS_PER_STEP}", f"{a}.actor.ppo_micro_batch_size_per_gpu=8",
        f"{a}.actor.use_kl_loss=True", f"{a}.actor.kl_loss_coef=0.0", f"{a}.actor.entropy_coeff=0",
        f"{a}.actor.fsdp_config.param_offload=False", f"{a}.actor.fsdp_config.optimizer_offload=False",
        f"{a}.rollout.log_prob_micro_batch_size_per_gpu=8", f"{a}.ref.log_prob_micro_batch_size_per_gpu=8",
        # rollout: HF generate behind verl's server interface (verl_cpu_runtime.HFReplica)
        f"{a}.rollout.name=hf", f"{a}.rollout.n={ROLLOUTS}", f"{a}.rollout.tensor_model_parallel_size=1",
        f"{a}.rollout.temperature=1.0", f"{a}.rollout.agent.num_workers=1", f"{a}.rollout.free_cache_engine=False",
        f"{a}.rollout.checkpoint_engine.backend=naive", f"{a}.rollout.enforce_eager=True",
        # reward and estimator
        "reward.num_workers=1", "reward.custom_reward_function.path=pkg://e2e_reward",
        "reward.custom_reward_function.name=compute_score",
        f"algorithm.adv_estimator={estimator}", "algorithm.use_kl_in_reward=False",
        *[f"+algorithm.calibrl.{k}={v}" for k, v in params.items()],
        # two steps, no validation, no checkpoints; verl's metrics to the console and to a JSONL file
        f"trainer.total_training_steps={STEPS}", "trainer.total_epochs=1", "trainer.val_before_train=False",
        "trainer.test_freq=-1", "trainer.save_freq=-1", "trainer.logger=[console,file]",
        "trainer.project_name=calibrl_e2e", f"trainer.experiment_name={estimator}_{trainer}",
        f"trainer.default_local_dir={out / 'checkpoints'}",
    ]
    return args


def environment(*, out: Path) -> dict[str, str]:
    """The environment of ``main_ppo``: the plugin, the CPU runtime and the recorder loaded by verl in every
    process (workers inherit it from the Ray node this process starts)."""
    env = dict(os.environ)
    env.update({
        "VERL_USE_EXTERNAL_MODULES": "verl_cpu_runtime,calibrl.verl,e2e_record",
        "VERL_PLATFORM": "cpu", "VERL_ENGINE_DEVICE": "cuda", "VERL_ENGINE_VENDOR": "nvidia",
        "PYTHONPATH": os.pathsep.join([str(HERE), str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep),
        "CALIBRL_E2E_RECORD": str(out / "record"), "VERL_FILE_LOGGER_PATH": str(out / "metrics.jsonl"),
        "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
        "RAY_DEDUP_LOGS": "0", "RAY_USAGE_STATS_ENABLED": "0", "HYDRA_FULL_ERROR": "1",
        "VERL_USE_EXTERNAL_PLUGINS": "none", "WANDB_MODE": "disabled",
        # no idle Python workers started ahead for the driver (Ray starts num_cpus of them, 16 here, each importing
        # ray on the two cores the actors need): alone on this machine the run took 105 s of wall and 130 s of CPU
        # without them, 125 s and 142 s with them
        "RAY_prestart_worker_first_driver": "0",
    })
    env.pop("RAY_ADDRESS", None)
    return env


def run_case(name: str, *, out: Path, python: str = sys.executable, timeout: float = 900.0) -> dict:
    """Run case ``name`` in ``out/name`` (fresh); returns its result.json content."""
    trainer, estimator, params = CASES[name]
    case = out / name
    if case.exists():
        shutil.rmtree(case)
    (case / "record").mkdir(parents=True)
    model = build_model(out / "model")
    train, val = build_data(out / "data")
    cmd = [python, "-m", "verl.trainer.main_ppo",
           *overrides(trainer=trainer, estimator=estimator, params=params, model=model, train=train, val=val,
                      out=case)]
    (case / "command.txt").write_text(" ".join(cmd) + "\n")
    env = environment(out=case)
    start = time.time()
    with open(case / "log.txt", "w") as log, CPUMeter(marker=env["CALIBRL_E2E_RECORD"]) as meter:
        proc = subprocess.Popen(cmd, cwd=case, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            rc = -9
        finally:
            meter.sample()
            _stop_ray(proc, env=env)
    result = {"case": name, "trainer": trainer, "estimator": estimator, "params": params, "returncode": rc,
              "wall_s": round(time.time() - start, 1), "cpu_s": round(meter.cpu_s, 1)}
    (case / "result.json").write_text(json.dumps(result, indent=1) + "\n")
    return result


def run_processes(*, marker: str) -> list:
    """This machine's processes whose environment holds ``CALIBRL_E2E_RECORD=<marker>``: the run's driver and every
    Ray process it started (the node's GCS and raylet, workers, actors), and nothing else."""
    import psutil

    found = []
    for p in psutil.process_iter():
        try:
            if p.pid != os.getpid() and p.environ().get("CALIBRL_E2E_RECORD") == marker:
                found.append(p)
        except (psutil.AccessDenied, psutil.NoSuchProcess, psutil.ZombieProcess):
            continue
    return found


class CPUMeter:
    """CPU seconds (user + system) of every process of a run (:func:`run_processes`), sampled every ``period``
    seconds: the sum over processes of the last value seen (a process that ends between two samples loses at most
    one period)."""

    def __init__(self, *, marker: str, period: float = 1.0) -> None:
        self.marker, self.period = marker, period
        self._seen: dict[tuple[int, float], float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def sample(self) -> None:
        for p in run_processes(marker=self.marker):
            try:
                t = p.cpu_times()
                self._seen[(p.pid, p.create_time())] = t.user + t.system
            except Exception:  # noqa: BLE001 - the process ended meanwhile
                continue

    def _loop(self) -> None:
        while not self._stop.wait(self.period):
            self.sample()

    @property
    def cpu_s(self) -> float:
        return sum(self._seen.values())

    def __enter__(self) -> "CPUMeter":
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()


def _stop_ray(proc: subprocess.Popen, *, env: dict) -> None:
    """End the run's driver and the Ray node it started: every process of :func:`run_processes`, by id (SIGTERM,
    then SIGKILL after 10 s). Ray processes of other runs on the machine are left alone."""
    import psutil

    marker = env["CALIBRL_E2E_RECORD"]
    if proc.poll() is None:
        proc.terminate()
    procs = run_processes(marker=marker)
    for p in procs:
        try:
            p.terminate()
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(procs, timeout=10)
    for p in alive:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "runs" / "verl_e2e")
    parser.add_argument("--case", action="append", choices=sorted(CASES), help="default: every case")
    args = parser.parse_args(argv)
    args.out = args.out.resolve()
    failed = 0
    for name in args.case or list(CASES):
        result = run_case(name, out=args.out)
        print(json.dumps(result), flush=True)
        failed += result["returncode"] != 0
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
