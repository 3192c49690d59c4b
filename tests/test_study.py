"""The study's tables from exported run folders: per-run paired tests, the pooled tests, controls, evaluations;
and the README's table is the one the committed results give."""
import json
from pathlib import Path

import pytest

from launch import compose_config
from searchr1.evaluation import write_predictions
from searchr1.rundir import config_yaml
from searchr1.stats import binom_two_sided
from searchr1.study import markdown, study

ROOT = Path(__file__).resolve().parent.parent


def _run(root: Path, name: str, overrides: list[str], before: list[bool], after: list[bool], dtype="float32",
         minutes=(0, 12)) -> Path:
    run = root / f"cpu_{name}"
    (run / "predictions").mkdir(parents=True)
    cfg = compose_config(["+experiment=search_r1_cpu", f"run_name={name}", *overrides])
    (run / "config.yaml").write_text(config_yaml(cfg))
    for step, outcome in ((10, before), (25, after)):
        write_predictions(run / "predictions" / f"step_{step:06d}.jsonl",
                          [{"id": f"q{i}", "em": float(x), "searches": 1} for i, x in enumerate(outcome)])
    evals = [{"kind": "eval", "step": s, "eval/searches": v} for s, v in ((10, 1.9), (25, 1.0))]
    (run / "metrics.jsonl").write_text("".join(json.dumps(e) + "\n" for e in evals))
    (run / "summary.json").write_text(json.dumps({"seed": cfg.seed, "compute_dtype": {"trainer": dtype, "engine": dtype}}))
    (run / "status.json").write_text(json.dumps({"started_at": f"2026-12-03T10:{minutes[0]:02d}:00+00:00",
                                                 "ended_at": f"2026-12-03T10:{minutes[1]:02d}:00+00:00"}))
    return run


def test_runs_pool_by_dtype_and_the_criteria_are_read_off(tmp_path):
    n = 40
    # seed 0: 12 gained, 2 lost; seed 1: 8 gained, 1 lost; a bf16 run: 5 gained, 5 lost
    _run(tmp_path, "main_s0", ["seed=0"], [False] * 12 + [True] * 2 + [False] * 26, [True] * 12 + [False] * 2 + [False] * 26)
    _run(tmp_path, "main_s1", ["seed=1"], [False] * 8 + [True] * 1 + [True] * 31, [True] * 8 + [False] * 1 + [True] * 31)
    _run(tmp_path, "main_bf16", ["seed=0"], [False] * 5 + [True] * 5 + [False] * 30, [True] * 5 + [False] * 5 + [False] * 30,
         dtype="bfloat16")
    _run(tmp_path, "flipped_s0", ["seed=0", "reward.scale=-1"], [True] * 4 + [False] * 36, [False] * n)
    ev = tmp_path / "cpu_end_nosearch"
    ev.mkdir()
    cfg = compose_config(["+experiment=search_r1_cpu", "mode=eval", "run_name=end_nosearch",
                          f"checkpoint={tmp_path}/runs/main_s0/checkpoints/step_000025"])
    (ev / "config.yaml").write_text(config_yaml(cfg))
    (ev / "eval_summary.json").write_text(json.dumps({"em_count": 0, "n": n, "searches_per_question": 0.0,
                                                      "compute_dtype": "float32"}))
    write_predictions(ev / "predictions.jsonl", [{"id": f"q{i}", "em": 0.0} for i in range(n)])

    s = study(tmp_path)
    runs = {r["run"]: r for r in s["runs"]}
    assert runs["cpu_main_s0"]["kind"] == "main" and runs["cpu_flipped_s0"]["kind"] == "control"
    assert (runs["cpu_main_s0"]["only_b"], runs["cpu_main_s0"]["only_a"], runs["cpu_main_s0"]["minutes"]) == (12, 2, 12.0)
    assert runs["cpu_main_bf16"]["dtype"] == "bfloat16" and runs["cpu_main_s1"]["seed"] == 1
    fp32 = s["pooled"]["float32"]
    assert (fp32["runs"], fp32["only_b"], fp32["only_a"]) == (2, 20, 3)
    assert fp32["p_value"] == pytest.approx(binom_two_sided(20, 23))
    assert s["pooled"]["all"]["runs"] == 3 and s["pooled"]["all"]["runs_up"] == 2
    assert s["pooled"]["bfloat16"]["criteria"]["every run p < 0.05"] is False
    assert s["control_does_not_rise"] is True
    (ev_row,) = s["evaluations"]
    assert ev_row["base"] == "cpu_main_s0" and (ev_row["vs_base_only_a"], ev_row["vs_base_only_b"]) == (12, 0)
    table = markdown(s)
    assert "| `cpu_main_s0` | float32 | 0 | 2/40" in table and "12 / 2" in table and "control: reward x -1" in table


def test_the_readme_shows_the_table_the_committed_results_give():
    readme = (ROOT / "README.md").read_text()
    from searchr1.study import BEGIN, END

    assert BEGIN in readme and END in readme, "README.md lacks the study block"
    shown = readme.split(BEGIN, 1)[1].split(END, 1)[0]
    assert shown == markdown(study(ROOT / "results"))


def test_the_cli_rewrites_only_the_readme_block(tmp_path):
    from searchr1.study import BEGIN, END, _cli

    _run(tmp_path, "main_s0", ["seed=0"], [False] * 10, [True] * 9 + [False])
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{BEGIN}stale table\n{END}\nafter\n")
    assert _cli([str(tmp_path), "--readme", str(readme)]) == 0
    text = readme.read_text()
    assert text.startswith(f"intro\n{BEGIN}| run |") and text.endswith(f"{END}\nafter\n") and "stale" not in text
    assert text.split(BEGIN, 1)[1].split(END, 1)[0] == markdown(study(tmp_path))
    readme.write_text("no block here\n")
    with pytest.raises(SystemExit, match="no block"):
        _cli([str(tmp_path), "--readme", str(readme)])


def test_runs_made_on_another_cpu_pair_with_their_namesakes(tmp_path):
    from searchr1.study import markdown_replication, replication

    here, there = tmp_path / "cpus" / "kind", tmp_path / "results"
    _run(here, "main_s0", ["seed=0"], [True] * 3 + [False] * 7, [True] * 6 + [False] * 4)
    _run(there, "main_s0", ["seed=0"], [True] * 2 + [False] * 8, [False] * 2 + [True] * 6 + [False] * 2)
    _run(here, "main_s1", ["seed=1"], [False] * 10, [True] + [False] * 9)  # no namesake there: left out
    (row,) = replication(here, there)
    assert row["run"] == "cpu_main_s0" and (row["start_step"], row["end_step"]) == (10, 25)
    # start: q2 right only here; end: q0, q1 right only here, q6, q7 only there
    assert (row["start"]["only_b"], row["start"]["only_a"], row["end"]["only_b"], row["end"]["only_a"]) == (1, 0, 2, 2)
    assert (row["start_same_responses"], row["end_same_responses"]) == (10, 10)  # _run writes no response text
    table = markdown_replication([row], "results")
    assert "| `cpu_main_s0` | 3 -> 6 of 10 | 2 -> 6 | 1 / 0, p = 1 | 2 / 2, p = 1 | 10, 10 of 10 |" in table
    assert "2 right only here, 2 only in `results`" in table
    # another schedule of evaluations is not the same run: refused, naming both
    _run(tmp_path / "odd", "main_s0", ["seed=0"], [False] * 10, [False] * 10)
    (tmp_path / "odd" / "cpu_main_s0" / "predictions" / "step_000025.jsonl").rename(
        tmp_path / "odd" / "cpu_main_s0" / "predictions" / "step_000021.jsonl")
    with pytest.raises(ValueError, match="not at the same steps"):
        replication(tmp_path / "odd", there)


def test_the_readme_shows_the_other_cpu_the_committed_results_give():
    """Every block written by `python -m searchr1.study ROOT --against OTHER` (the main job on another CPU kind, and
    a lever's held-out runs beside that kind's) is what its command gives from the committed files."""
    import re

    from searchr1.study import CPUS_BEGIN, CPUS_END, cpus_begin, markdown_replication, replication

    readme = (ROOT / "README.md").read_text()
    assert CPUS_BEGIN in readme and CPUS_END in readme, "README.md lacks the cpus block"
    blocks = re.findall(r"<!-- cpus:begin \(python -m searchr1.study (\S+) --against (\S+)\) -->", readme)
    assert cpus_begin(*blocks[0]) == CPUS_BEGIN, "the first cpus block is no longer the main job on another CPU"
    for root, other in blocks:
        shown = readme.split(cpus_begin(root, other), 1)[1].split(CPUS_END, 1)[0]
        assert shown == markdown(study(ROOT / root)) + "\n" + markdown_replication(
            replication(ROOT / root, ROOT / other), other), f"README.md's block of {root} against {other} is stale"
