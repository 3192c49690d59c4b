"""The benchmarks run as the README says, on the current config groups (a bench that no longer composes is found
here, not by the next person who needs its numbers)."""
import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
os.environ.setdefault("WANDB_MODE", "disabled")


def _bench(name: str):
    spec = importlib.util.spec_from_file_location(f"bench_{name}", ROOT / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_rollout_bench_runs_on_the_tiny_model_and_writes_where_it_is_told(tmp_path):
    out = tmp_path / "rollout.json"
    result = _bench("rollout").main(["engine=hf", "model=tiny", "bench.questions=2", "bench.group=2",
                                      "bench.rounds=1", f"bench.out={out}"])
    written = json.loads(out.read_text())
    assert written["trajectories"] == 4 and written["engine"] == "hf" and written["experiment"] == "search_r1_cpu"
    assert len(written["ratio_trajectory_tokens_per_round"]) == 1 and written["ratio_trajectory_tokens"] > 0
    assert written == json.loads(json.dumps(result))


@pytest.mark.parametrize("arg,needle", [("bench.round=1", "did you mean 'bench.rounds'"),
                                        ("bench.questions=few", "bench.questions='few' is not an int")])
def test_rollout_bench_rejects_a_bad_key_before_starting(arg, needle):
    with pytest.raises(SystemExit, match=needle):
        _bench("rollout").main([arg])


def _project_imports(path: Path):
    """Every `from searchr1... import name` in a file, at any depth (the benches import inside functions)."""
    import ast

    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "searchr1":
            for alias in node.names:
                yield node.lineno, node.module, alias.name


@pytest.mark.parametrize("path", sorted((ROOT / "bench").glob("*.py")), ids=lambda p: p.name)
def test_every_project_name_a_bench_imports_exists(path):
    import importlib

    sys.path.insert(0, str(ROOT))
    missing = []
    for line, module, name in _project_imports(path):
        try:
            found = hasattr(importlib.import_module(module), name) or importlib.util.find_spec(f"{module}.{name}")
        except ModuleNotFoundError:
            found = False
        if not found:
            missing.append(f"{path.name}:{line}: from {module} import {name}")
    assert not missing, "\n".join(missing)


def test_cpu_profile_classes_and_turns(monkeypatch):
    """The profile bench's pieces (its full run loads the real model: minutes, so it is not run here). The
    profiler asks torch.distributed for its backend whenever a default group is set; in `make test`'s workers an
    earlier module's in-process engine may have left vLLM's own world there (the bench runs in a process of its
    own), so this test profiles as that process would, without one."""
    import torch
    import torch.nn.functional as F
    from torch.profiler import ProfilerActivity, profile

    bench = _bench("cpu_profile")
    assert [bench.kind(n) for n in ("aten::mm", "_C::onednn_mm", "aten::_scaled_dot_product_flash_attention_for_cpu",
                                    "_C::cpu_attention_with_kv_cache", "aten::mul")] == \
        ["matmul", "matmul", "attention", "attention", "other"]
    assert bench.last_turn([1, 1, 0, 0, 1, 1, 0, 1, 1]) == 7 and bench.last_turn([1, 1]) == 0
    a, w = torch.randn(256, 64), torch.randn(128, 64)
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: False)
    with profile(activities=[ProfilerActivity.CPU], with_flops=True) as prof:
        for _ in range(5):
            F.linear(a, w).relu()
    got = bench.split(prof)
    assert abs(sum(got["op_shares"].values()) - 1) < 0.01 and got["op_shares"]["matmul"] > 0
    assert got["matmul_gflops"] > 0 and got["largest_other"][0]["seconds"] >= got["largest_other"][-1]["seconds"]


def test_gpu_bench_runs_its_code_on_the_cpu_with_a_tiny_shape(tmp_path):
    """bench/gpu.py --tiny: the learner's step, every codec format (bit-exact on the device it ran on) and the HF
    engine's generation, each beside its baseline, so that the script a lent GPU runs cannot rot."""
    out = tmp_path / "gpu.json"
    report = _bench("gpu").main(["--tiny", "--out", str(out)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(report))
    assert report["machine"]["device"] == "cpu" and report["model"]["parameters"] > 0
    assert report["learner"]["step_s"] > 0 and report["learner"]["ratio_vs_matmul_peak"] > 0
    formats = report["codec"]["formats"]
    assert set(formats) == {"gap8", "rice", "rice_classes"} and all(f["bit_exact"] for f in formats.values())
    assert all(f["changed"] > 0 and f["encode_vs_copy2"] > 0 for f in formats.values())
    assert report["generation"]["new_tokens"] > 0 and report["generation"]["ratio_vs_weight_read_bound"] > 0


def test_retrieval_single_query_section_runs_every_installed_peer(tmp_path):
    """The single-query section on 300 shipped passages, PISA and tantivy beside ours: each peer is either measured
    with its agreement or skipped with the reason (they are the optional `bench` extra). bm25s's numba retrieval
    is left out here: its compilation alone takes most of a minute."""
    bench = _bench("retrieval")
    res = bench.single_query_child({"n": 0, "cap": 300, "tmp": str(tmp_path), "queries": 12, "rounds": 1,
                                    "peers": ["pisa", "tantivy"], "k": [3, 500]})
    assert set(res["engines"]) | set(res["skipped"]) == {"ours", "pisa", "tantivy"}
    assert [(r["k"], r["threads"]) for r in res["rows"]] == [(k, t) for k in (3, 500) for t in bench.SINGLE_THREADS]
    for row in res["rows"]:
        for name, e in row["engines"].items():
            assert e["qps"] > 0 and e["p99_ms"] >= e["p50_ms"] > 0
            if name != "ours":
                assert 0 <= e["agreement"]["mean_topk_overlap"] <= 1 and e["ours_qps_ratio"] > 0


def test_the_schedules_machine_model_by_hand(tmp_path):
    """Three sync steps with phases (generation, training) of (10, 4), (6, 8), (10, 4) s: from the means an
    overlapped step takes max(8.67, 5.33) = 8.67 s; step by step 14 + 8 + 10 = 32 s over 3 steps (the first
    overlaps nothing)."""
    from searchr1 import metrics as K

    run = tmp_path / "sync"
    run.mkdir()
    with open(run / "metrics.jsonl", "w") as f:
        for step, (g, t) in enumerate([(10, 4), (6, 8), (10, 4)], 1):
            f.write(json.dumps({K.KIND: K.TRAIN, K.STEP: step, "stage": "rl", "time/rollout/rollout_s": g,
                                "time/trainer/train_s": t}) + "\n")
    model = _bench("schedules").machine_model(run, {"sync": {"steps": 3, "steps_per_hour": 3600 / 14,
                                                             "useful_work_fraction": 0.5}})
    p = model["predicted"]
    assert p["sync"]["step_s"] == pytest.approx(14.0)
    assert p["overlapped_from_means"]["step_s"] == pytest.approx(26 / 3)
    assert p["overlapped_from_means"]["speedup"] == pytest.approx(14 / (26 / 3))
    assert p["overlapped_step_by_step"]["step_s"] == pytest.approx(32 / 3)
    assert p["overlapped_step_by_step"]["useful_work_fraction"] == pytest.approx(42 / 64)
    assert model["measured"]["sync"]["step_s"] == pytest.approx(14.0)


def test_the_steps_a_run_had_done_at_syncs_wall_time():
    """Steps ending at 10, 20 and 30 RL seconds. Sync's 25 s (25.5 s within the 2% slack) hold 2 of them;
    sync's 60 s (61.2 s) would have held 6 at 10 s a step; a budget shorter than one step still evaluates one."""
    at = _bench("schedules").steps_at_wall
    clock = {1: 10.0, 2: 20.0, 3: 30.0}
    assert (at(clock, 25.0), at(clock, 60.0), at(clock, 30.0), at(clock, 1.0)) == (2, 6, 3, 1)


def test_the_schedules_seeds_pooled_by_hand(tmp_path):
    """Two seeds of sync and pipelined_k1 over 10 questions. Seed 0: sync right on q0-q3, k1 on q0-q1 and q4
    (only sync 2, only k1 1); seed 1: sync right on q0, k1 on q0-q2 (0 / 2). Pooled 2 / 3, p = 1; EM 3 + 3 of 20.
    At equal wall time seed 0's k1 had done 2 steps (its rerun right on q5-q9: 4 / 5), seed 1's all 3: pooled 4 / 7."""
    sdl = _bench("schedules_seeds")

    def write(folder, mode, step, right):
        (folder / mode / "predictions").mkdir(parents=True, exist_ok=True)
        with open(folder / mode / "predictions" / f"step_{step:06d}.jsonl", "w") as f:
            for q in range(10):
                f.write(json.dumps({"id": f"q{q}", "em": int(q in right)}) + "\n")

    runs = {"steps_per_hour": 100.0, "useful_work_fraction": 0.5}
    seed_noise = 1e-7  # float noise in the rerun's loss: it still repeats the first run
    for seed, sync, k1 in ((0, {0, 1, 2, 3}, {0, 1, 4}), (1, {0}, {0, 1, 2})):
        folder = tmp_path / f"s{seed}"
        write(folder, "sync", 0, set())
        write(folder, "sync", 3, sync)
        write(folder, "pipelined_k1", 3, k1)
        wall = {"steps": 3, "run": "pipelined_k1"} if seed else {"steps": 2, "run": "pipelined_k1_wall"}
        if not seed:
            write(folder, "pipelined_k1_wall", 2, {5, 6, 7, 8, 9})
            for mode, steps, loss in (("pipelined_k1", 3, 0.5), ("pipelined_k1_wall", 2, 0.5 + seed_noise)):
                with open(folder / mode / "metrics.jsonl", "w") as f:
                    for step in range(1, steps + 1):
                        f.write(json.dumps({"kind": "train", "step": step, "rollout/reward": 0.25 * step,
                                            "rollout/searches": 1.0, "train/loss": loss * step,
                                            "train/grad_norm": 2.0}) + "\n")
        (folder / "schedules.json").write_text(json.dumps({"steps": 3, "seed": seed, "runs": {
            "sync": runs, "pipelined_k1": {**runs, "speedup_steps_per_hour": 1.5, "useful_work_fraction": 0.8,
                                           "vs_sync_at_equal_wall_time": wall}}}))
    assert sdl.pool_seeds([tmp_path / "s0", tmp_path / "s1"], tmp_path / "out") == 0
    res = json.loads((tmp_path / "out" / "bench" / "schedules_seeds.json").read_text())
    k1 = res["modes"]["pipelined_k1"]
    assert res["seeds"] == [0, 1] and k1["lag"] == 1 and (k1["em_total"], k1["n_total"]) == (6, 20)
    assert [r["vs_sync"] for r in k1["per_seed"]] == [{"only_sync": 2, "only_this": 1, "mcnemar_p": 1.0},
                                                       {"only_sync": 0, "only_this": 2, "mcnemar_p": 0.5}]
    assert (k1["pooled"]["only_a"], k1["pooled"]["only_b"], k1["pooled"]["p"]) == (2, 3, 1.0)
    assert k1["speedup_mean"] == 1.5 and k1["useful_work_fraction_mean"] == 0.8
    assert sdl.table(res).endswith(" points | yes; not rerun |")
    assert k1["per_seed"][0]["at_sync_wall_time"].pop("repeats_first_run")["holds"]
    assert [r["at_sync_wall_time"] for r in k1["per_seed"]] == [
        {"steps": 2, "em": 5, "only_sync": 4, "only_this": 5, "mcnemar_p": 1.0},
        {"steps": 3, "em": 3, "only_sync": 0, "only_this": 2, "mcnemar_p": 0.5}]
    assert k1["at_sync_wall_time"]["em_total"] == 8 and k1["at_sync_wall_time"]["pooled"]["only_a"] == 4
    assert k1["at_sync_wall_time"]["pooled"]["only_b"] == 7 and "at_sync_wall_time" not in res["modes"]["sync"]
    assert "| pipelined_k1 | 1 | 2, 3 | 5, 3 | 8/20" in sdl.table(res)
    # a rerun that sampled otherwise at step 2 is not the first run stopped early
    other = tmp_path / "s0" / "pipelined_k1_wall" / "metrics.jsonl"
    other.write_text(other.read_text().replace('"rollout/reward": 0.5', '"rollout/reward": 0.375'))
    differs = sdl.repeats(tmp_path / "s0" / "pipelined_k1", other.parent)
    assert not differs["holds"] and differs["first_step_differing"] == 2
    assert sdl.same_path({"repeats_first_run": differs}) == "parts at step 2"
    sync = res["modes"]["sync"]
    assert [r["vs_start"]["only_end"] for r in sync["per_seed"]] == [4, 1] and sync["em_total"] == 5
    # 5 discordant of 20: (1.96 + 0.84) * sqrt(0.25 / 20) = 0.313
    assert k1["smallest_detectable_loss_points"] == pytest.approx(31.3, abs=0.1)
    assert (tmp_path / "out" / "bench" / "schedules_seeds.png").stat().st_size > 0
    with pytest.raises(SystemExit, match="seed 0 given twice"):
        sdl.pool_seeds([tmp_path / "s0", tmp_path / "s0"], tmp_path / "out")


def test_the_readme_shows_the_schedules_table_the_committed_seeds_give():
    sdl = _bench("schedules_seeds")
    readme = (ROOT / "README.md").read_text()
    assert sdl.BEGIN in readme and sdl.END in readme, "README.md lacks the schedules block"
    result = sdl.pooled([ROOT / f for f in sdl.COMMITTED])
    assert readme.split(sdl.BEGIN, 1)[1].split(sdl.END, 1)[0] == sdl.table(result) + "\n"


def test_the_reader_bench_reads_one_line_per_prompt_on_the_tiny_model():
    from searchr1.config import ModelConfig, TinyModelConfig
    from searchr1.models import load_model

    reader = _bench("reader")
    model, tok = load_model(ModelConfig(name="tiny", source="tiny", tiny=TinyModelConfig(num_heads=2, num_kv_heads=1)))
    shot = reader.prompt("Doc 1(Title: Paris) Paris is the capital of France.", "Capital of France?", "Paris")
    assert shot.endswith("Answer: Paris\n\n")
    prompts = [shot + reader.prompt("Doc 1(Title: Rome) Rome is in Italy.", q) for q in ("Where is Rome?", "Rome?")]
    answers = reader.read_answers(model, tok, prompts, batch=2)
    assert len(answers) == 2 and all("\n" not in a for a in answers)


def test_the_reach_bench_only_grows_with_more_or_longer_passages(tmp_path):
    """A longer passage keeps the shorter one's text and a third passage keeps the first two, so what one search
    puts in reach can only grow along both axes; the JSON lands where `bench.out` says."""
    out = tmp_path / "reach.json"
    result = _bench("reach").main(["bench.questions=20", f"bench.out={out}"])
    assert json.loads(out.read_text()) == result
    rows = result["rows"]
    for split in ("dev", "train"):
        reach = {(r["top_k"], r["passage_max_tokens"]): r for r in rows if r["split"] == split}
        assert all(r["questions"] == 20 for r in reach.values())
        for (k, n), r in reach.items():
            for (k2, n2), r2 in reach.items():
                if k2 >= k and n2 >= n:
                    assert r2["in_reach"] >= r["in_reach"] and r2["info_tokens"] >= r["info_tokens"], (k, n, k2, n2)


def test_the_reach_bench_reads_the_information_the_agent_inserted_and_splits_the_right_answers():
    reach = _bench("reach")
    from searchr1.agent import INFO_HEAD, INFO_TAIL

    def traj(info, answer):
        return (f"<search> q </search>{INFO_HEAD}{info}{INFO_TAIL}<answer> {answer} </answer>")

    preds = [{"response": traj("Paris is in France.", "Paris"), "answers": ["Paris"], "em": 1.0,
              "question": "Which is larger, Paris or Lyon?", "prediction": "Paris"},
             {"response": traj("Rome is in Italy.", "Milan"), "answers": ["Rome"], "em": 0.0,
              "question": "Which city did the poet from Milan move to?", "prediction": "Milan"},
             {"response": "<information>Oslo</information><answer> Oslo </answer>", "answers": ["Oslo"], "em": 1.0,
              "question": "Where is the Nobel peace prize given?", "prediction": "Oslo"}]
    # the third wrote the tag itself: not information the agent inserted, so its right answer is out of reach
    assert reach.read_information(preds[2]["response"]) == ""
    # the second's wrong answer is a span of its question; the first's right one is too, but a copy there is right
    assert reach.what_was_read(preds) == {"questions": 3, "em": 2, "in_reach": 2, "right_in_reach": 1,
                                          "read_rate": 0.5, "right_out_of_reach": 1, "wrong_from_question": 1,
                                          "copyable": 1}
    assert all(r["right_in_reach"] + r["right_out_of_reach"] == r["em"] for r in reach.read_runs(reach.RUNS))
