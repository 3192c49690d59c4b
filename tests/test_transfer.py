"""The transfer table: every evaluation set of a training run, first against last evaluation, and the evaluations
of its end checkpoint, from exported files; and the README's block is the one the committed results give."""
from pathlib import Path

from launch import compose_config
from searchr1.evaluation import write_predictions
from searchr1.rundir import config_yaml
from searchr1.transfer import BEGIN, END, markdown, rows

ROOT = Path(__file__).resolve().parent.parent
SETS = "data.eval_sets=[hotpotqa,nq]"


def _preds(path: Path, outcome: list[bool]) -> None:
    write_predictions(path, [{"id": f"q{i}", "em": float(x), "f1": float(x), "searches": 1}
                             for i, x in enumerate(outcome)])


def test_each_set_is_paired_first_against_last_and_against_the_end_checkpoints_evaluations(tmp_path):
    run = tmp_path / "cpu_main_s0"
    (run / "predictions" / "nq").mkdir(parents=True)
    (run / "config.yaml").write_text(config_yaml(compose_config(["+experiment=search_r1_cpu", "run_name=main_s0",
                                                                 SETS])))
    _preds(run / "predictions" / "step_000006.jsonl", [False] * 10)
    _preds(run / "predictions" / "step_000021.jsonl", [True] * 4 + [False] * 6)
    _preds(run / "predictions" / "nq" / "step_000006.jsonl", [True] * 2 + [False] * 8)
    _preds(run / "predictions" / "nq" / "step_000021.jsonl", [False] * 2 + [True] * 3 + [False] * 5)
    ev = tmp_path / "cpu_end_nosearch"
    ev.mkdir()
    ckpt = "runs/reference/main_s0/checkpoints/step_000021"
    (ev / "config.yaml").write_text(config_yaml(compose_config(["+experiment=search_r1_cpu", "mode=eval",
                                                                f"checkpoint={ckpt}", SETS])))
    (ev / "eval_summary.json").write_text("{}")
    _preds(ev / "predictions.jsonl", [False] * 10)
    _preds(ev / "predictions_nq.jsonl", [False] * 2 + [True] + [False] * 7)
    hot, nq = rows(tmp_path)
    assert (hot["set"], hot["gained"], hot["lost"], hot["steps"]) == ("hotpotqa", 4, 0, (6, 21))
    assert (nq["gained"], nq["lost"]) == (3, 2) and nq["p"] == 1.0 and nq["f1"] == (0.2, 0.3)
    assert nq["evals"]["cpu_end_nosearch"].startswith("1/10 (10.0%") and "2 / 0, p = 0.5" in nq["evals"]["cpu_end_nosearch"]
    table = markdown([hot, nq])
    assert "| `cpu_main_s0` | NQ-open | 2/10 (20.0%" in table and "`cpu_end_nosearch` (vs after RL" in table


def test_the_readme_shows_the_table_the_committed_results_give():
    readme = (ROOT / "README.md").read_text()
    assert BEGIN in readme and END in readme, "README.md lacks the sets block"
    assert readme.split(BEGIN, 1)[1].split(END, 1)[0] == markdown(rows(ROOT / "results"))


def test_an_evaluation_runs_export_keeps_every_sets_predictions(tmp_path):
    from searchr1.rundir import export

    run = tmp_path / "end_nosearch"
    (run / "logs").mkdir(parents=True)
    (run / "logs" / "rank0.log").write_text("")
    (run / "eval_summary.json").write_text('{"em": "0/10"}')
    _preds(run / "predictions.jsonl", [False] * 10)
    _preds(run / "predictions_nq.jsonl", [True] + [False] * 9)
    dest = export(run, tmp_path / "cpu_end_nosearch")
    assert (dest / "predictions_nq.jsonl").read_text() == (run / "predictions_nq.jsonl").read_text()


def test_a_runs_last_evaluations_are_paired_with_another_runs_set_by_set(tmp_path):
    from searchr1.transfer import against, markdown_against

    def run(folder: Path, name: str, hot: list[bool], nq: list[bool]) -> Path:
        (folder / "predictions" / "nq").mkdir(parents=True)
        (folder / "config.yaml").write_text(config_yaml(compose_config(["+experiment=search_r1_cpu",
                                                                        f"run_name={name}", SETS])))
        _preds(folder / "predictions" / "step_000006.jsonl", [False] * 10)
        _preds(folder / "predictions" / "step_000021.jsonl", hot)
        _preds(folder / "predictions" / "nq" / "step_000006.jsonl", [False] * 10)
        _preds(folder / "predictions" / "nq" / "step_000021.jsonl", nq)
        return folder

    base = run(tmp_path / "cpu_main_s0", "main_s0", [True] * 3 + [False] * 7, [True] * 2 + [False] * 8)
    run(tmp_path / "mix" / "cpu_mix_s0", "mix_s0", [False] * 2 + [True] * 2 + [False] * 6, [True] * 8 + [False] * 2)
    hot, nq = against(tmp_path / "mix", base)
    # HotpotQA: the base run alone has q0, q1; both have q2; the mix alone has q3
    assert (hot["set"], hot["only_other"], hot["only_run"], hot["p"]) == ("hotpotqa", 2, 1, 1.0)
    assert (nq["only_other"], nq["only_run"]) == (0, 6) and nq["p"] == 0.03125
    assert nq["own"] == "0/10 (0.0%, 0.0-27.8) -> 8/10, 8 / 0, p = 0.0078"
    assert "| `cpu_mix_s0` vs `cpu_main_s0` | NQ-open |" in markdown_against([hot, nq])


def test_the_readme_shows_the_mix_table_the_committed_results_give():
    from searchr1.transfer import MIX_AGAINST, MIX_BEGIN, MIX_END, against, markdown_against

    readme = (ROOT / "README.md").read_text()
    assert MIX_BEGIN in readme and MIX_END in readme, "README.md lacks the mix block"
    assert readme.split(MIX_BEGIN, 1)[1].split(MIX_END, 1)[0] == markdown_against(
        against(ROOT / "results" / "datasets", ROOT / MIX_AGAINST))
