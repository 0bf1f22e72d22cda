#!/usr/bin/env bash
# The device machine's checks in one run: the trainer on CUDA, ours next to TRL's.
#
# That machine has torch, transformers and peft but no vLLM (its wheel is over the 64 MiB a
# run may carry) and no registry, so this installs wheels carried in .whl/ (git-ignored) and
# rolls out with transformers (`rollout_engine: hf`) on both sides. Fill .whl/ here first:
#   pip wheel --no-deps --no-build-isolation -w .whl .        # agentgym itself
#   pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 -d .whl \
#     gymnasium farama-notifications jsonschema jsonschema-specifications referencing rpds-py \
#     docstring-parser pydantic pydantic-core annotated-types typing-inspection sqlalchemy \
#     greenlet trl datasets dill multiprocess jmespath typing-extensions  # what that image lacks (~12 MB)
# and copy the warm-started quickstart model there (made here on the CPU, cached, so the GPU's
# minutes go to timing, not to SFT):
#   AGENTGYM_CACHE=$PWD/.gpucache python bench/trainer_bench.py --shape quickstart \
#     --warm-start 1500 --system-prompt "Use the calculate tool, then give the number." --skip-step --skip-sync
# Runs, ours vs TRL, each with a malformed call ending the episode on both sides (the same
# workload): the CPU headline's workload (the warm-started quickstart model, which calls the
# tool), then real GRPO steps of a Qwen2.5-0.5B-shaped model (random weights), then the same
# with 8x the episodes; each log lands in $OUT.
set -uo pipefail
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
OUT=${OUT:-/tmp/gpu-check}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site AGENTGYM_CACHE=$PWD/.gpucache
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 - <<'PY'
import importlib.metadata as md, torch
print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name())
print(", ".join(f"{p} {md.version(p)}" for p in ("transformers", "peft", "trl", "accelerate",
                                                   "datasets", "pyarrow", "agentgym")))
PY
run() {  # NAME SECONDS ARGS...: one bench run, its log kept whole in $OUT, its figures here
    local name=$1 limit=$2; shift 2
    echo "== $name: trainer_bench.py $*"
    timeout "$limit" python3 bench/trainer_bench.py --skip-sync --engine hf --device cuda "$@" \
        >"$OUT/$name.log" 2>&1
    echo "exit $?"
    grep -A6 "^(a) seconds per GRPO step" "$OUT/$name.log" || tail -20 "$OUT/$name.log"
}
run quickstart 130 --shape quickstart --warm-start 1500 --malformed-ends-episode \
    --system-prompt "Use the calculate tool, then give the number." --trl-completion-length 144 --steps 8
run qwen05b 140 --shape qwen2.5-0.5b --malformed-ends-episode
run qwen05b-64 130 --shape qwen2.5-0.5b --tasks-per-step 8 --num-generations 8 --malformed-ends-episode
