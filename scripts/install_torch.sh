#!/usr/bin/env bash
# Install the torch build calibrl is tested with into a virtual environment: the CPU build on a machine without an
# NVIDIA GPU (so pip does not fetch gigabytes of CUDA libraries), the default PyPI build (CUDA) where `nvidia-smi`
# exists.
#
# Usage:  bash scripts/install_torch.sh VENV_DIR
# Env:    TORCH_SPEC   override the requirement (default torch==2.13.0+cpu without a GPU or TORCH_INDEX, else
#                      torch==2.13.0)
#         TORCH_INDEX  install from this index only (e.g. https://download.pytorch.org/whl/cu128)
#
# Without TORCH_INDEX the configured indexes are tried first (a mirror or a local wheel may already carry the CPU
# build); a `+cpu` requirement they cannot satisfy is then taken from the PyPI CPU index of PyTorch.
set -euo pipefail
VENV="${1:?usage: install_torch.sh VENV_DIR}"
CPU_INDEX="https://download.pytorch.org/whl/cpu"
if [ -z "${TORCH_SPEC:-}" ]; then
    # with TORCH_INDEX the index decides the build
    if [ -n "${TORCH_INDEX:-}" ] || command -v nvidia-smi >/dev/null 2>&1; then TORCH_SPEC="torch==2.13.0"
    else TORCH_SPEC="torch==2.13.0+cpu"; fi
fi
PIP=("$VENV/bin/python" -m pip install -q --disable-pip-version-check)

if "$VENV/bin/python" -c "import importlib.metadata as m, sys; from pip._vendor.packaging.requirements import Requirement as R; \
r = R(sys.argv[1]); sys.exit(0 if r.specifier.contains(m.version('torch'), prereleases=True) else 1)" \
    "$TORCH_SPEC" 2>/dev/null; then
    exit 0  # already installed
fi
echo "installing $TORCH_SPEC${TORCH_INDEX:+ from $TORCH_INDEX}"
if [ -n "${TORCH_INDEX:-}" ]; then
    "${PIP[@]}" "$TORCH_SPEC" --index-url "$TORCH_INDEX"
elif ! "${PIP[@]}" "$TORCH_SPEC" 2>/dev/null; then
    case "$TORCH_SPEC" in
        *+cpu*) echo "  not on the configured indexes: taking it from $CPU_INDEX"
                "${PIP[@]}" "$TORCH_SPEC" --index-url "$CPU_INDEX" ;;
        *) "${PIP[@]}" "$TORCH_SPEC" ;;  # again, this time showing pip's error
    esac
fi
