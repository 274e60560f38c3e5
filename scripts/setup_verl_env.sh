#!/usr/bin/env bash
# Create .venv-verl: verl 0.9.1 + calibrl, CPU only, for tests/test_verl.py (the calibrl.verl plugin).
#
# verl is kept out of the main .venv on purpose: verl 0.9.1 pins transformers <5.11 and tensordict <=0.10.0
# (TRL and the main .venv's transformers are newer), and its full dependency tree pulls ray[default], wandb and
# tensorboard, its extras vLLM / SGLang / flash-attn and CUDA torch builds. Here we install verl with --no-deps and
# then exactly the packages that `verl.protocol.DataProto`, `verl.trainer.ppo.core_algos`,
# `verl.trainer.ppo.ray_trainer` (the legacy trainer's compute_advantage) and `verl.trainer.ppo.v1.utils`
# (the V1 trainer, default in 0.9.1) need to import on CPU. No vllm, sglang, flash-attn, megatron, wandb.
#
# Usage:  bash scripts/setup_verl_env.sh [VENV_DIR]     (default .venv-verl; idempotent: a stamp file
#         holding this script's checksum makes a second run a no-op)
# Env:    PYTHON (default python3); TORCH_SPEC, TORCH_INDEX as in scripts/install_torch.sh (the CPU build of
#         torch 2.13.0 unless `nvidia-smi` exists).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${1:-.venv-verl}"
PYTHON="${PYTHON:-python3}"
STAMP="$VENV/.calibrl-verl-stamp"
SUM="$(cat "$0" pyproject.toml | sha256sum | cut -d' ' -f1)"

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$SUM" ] && "$VENV/bin/python" -c \
    "import importlib.util as u; assert u.find_spec('verl') and u.find_spec('calibrl')" 2>/dev/null; then
    echo "setup_verl_env: $VENV is up to date"
    exit 0
fi

start=$(date +%s)
"$PYTHON" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip install -q --disable-pip-version-check)
"${PIP[@]}" --upgrade pip
# 1. torch first, pinned (never unpinned: an unpinned resolve may pull a CUDA build); later steps repeat the
#    installed version so the resolver keeps it.
bash scripts/install_torch.sh "$VENV"
TORCH_SPEC="torch==$("$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("torch"))')"
# 2. verl and TransferQueue (imported by verl's V1 trainer) without their dependency trees.
"${PIP[@]}" --no-deps "verl==0.9.1" "TransferQueue>=0.1.10"
# 3. What those modules import, within verl's pins; torch repeated so the resolver keeps it.
echo "setup_verl_env: an 'ERROR: pip's dependency resolver' about verl's pins below is expected (verl is installed without its dependency tree on purpose)"
"${PIP[@]}" "$TORCH_SPEC" \
    "transformers>=5.5.3,<5.11,!=5.6.0" "tensordict==0.10.0" "numpy>=2" "pyarrow>=19" \
    omegaconf hydra-core codetiming pandas packaging dill ray torchdata datasets pillow peft pylatexenc \
    cachetools fastapi uvicorn aiohttp pyzmq msgspec psutil prometheus_client
# 4. calibrl itself (editable) with its dependencies, as a verl user installs it: the core has no transformers or
#    TRL requirement, so it resolves within verl's pins; dev brings pytest. With CALIBRL_AFTER=<file> (make test,
#    which builds this beside .venv), first wait until that file exists: .venv's install has ended, so the two
#    installs never write the clone's calibrl.egg-info at once (<file>.failed: it failed, stop).
if [ -n "${CALIBRL_AFTER:-}" ]; then
    waited=$(date +%s)
    until [ -e "$CALIBRL_AFTER" ]; do
        [ -e "$CALIBRL_AFTER.failed" ] && { echo "setup_verl_env: the main install failed"; exit 1; }
        sleep 2
    done
    echo "setup_verl_env: waited $(( $(date +%s) - waited )) s for the main install"
fi
"${PIP[@]}" "$TORCH_SPEC" -e ".[dev]"
# the check's import-time notices (engines and accelerators verl does not find on a CPU) are shown only on failure;
# `import verl` alone must register calibrl's estimators (the verl.plugins entry point, no VERL_USE_EXTERNAL_MODULES)
if ! env -u VERL_USE_EXTERNAL_MODULES "$VENV/bin/python" -W ignore -c "import verl, calibrl; \
from verl.trainer.ppo import core_algos, ray_trainer; core_algos.get_adv_estimator_fn('capo'); \
print('setup_verl_env: verl', verl.__version__, 'imports and finds calibrl')" 2>"$VENV/.import-check.log"; then
    cat "$VENV/.import-check.log" >&2; exit 1
fi
echo "$SUM" > "$STAMP"
echo "setup_verl_env: built $VENV in $(( $(date +%s) - start )) s"
