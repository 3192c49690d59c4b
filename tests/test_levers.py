"""The dev split's levers against the baseline of the same seed and dtype, from exported run folders; and the
README's table is the one the committed tuning runs give."""
import re
from pathlib import Path

import pytest

from launch import compose_config
from searchr1.evaluation import write_predictions
from searchr1.levers import BEGIN, END, _cli, begin, levers, markdown, overrides, schema_defaults
from searchr1.rundir import config_yaml
from searchr1.stats import binom_two_sided

ROOT = Path(__file__).resolve().parent.parent


def _run(root: Path, name: str, overrides: list[str], evals: dict[int, list[bool]]) -> None:
    run = root / f"cpu_dev_{name}"
    (run / "predictions").mkdir(parents=True)
    cfg = compose_config(["+experiment=search_r1_cpu", f"run_name=dev_{name}", *overrides])
    (run / "config.yaml").write_text(config_yaml(cfg))
    for step, outcome in evals.items():
        write_predictions(run / "predictions" / f"step_{step:06d}.jsonl",
                          [{"id": f"q{i}", "em": float(x), "searches": 1} for i, x in enumerate(outcome)])


def test_a_lever_is_paired_with_the_baseline_of_its_seed_and_dtype(tmp_path):
    start, base_end = [1, 0, 0, 0, 0, 0], [1, 1, 0, 0, 0, 0]
    for s in (0, 1):
        _run(tmp_path, f"t1.0_bfloat16_s{s}", [f"seed={s}"], {6: start, 21: base_end})
    # seed 0: 4 gained, 1 lost; seed 1: 2 gained; an evaluation before RL starts (step 5) is not the start
    _run(tmp_path, "lr_bfloat16_s0", ["seed=0", "optim.lr=5e-5"], {5: [0] * 6, 6: start, 21: [0, 1, 1, 1, 1, 0]})
    _run(tmp_path, "lr_bfloat16_s1", ["seed=1", "optim.lr=5e-5", "monitor.answer_drop=0.3"],  # it only warns
         {6: start, 21: [1, 0, 1, 1, 0, 0]})
    _run(tmp_path, "ws_bfloat16_s0", ["seed=0", "warm_start.steps=3"], {3: [0, 1, 0, 0, 0, 0], 18: base_end})
    _run(tmp_path, "lr_float32_s0", ["seed=0", "optim.lr=5e-5"], {6: start, 21: start})
    rows = {(r["lever"], r["dtype"]): r for r in levers(tmp_path)}
    assert set(rows) == {("lr", "bfloat16"), ("ws", "bfloat16"), ("lr", "float32")}  # the baseline is no lever
    lr = rows["lr", "bfloat16"]
    assert lr["seeds"] == [0, 1] and lr["overrides"] == {"optim.lr": 5e-05} and lr["same_start"]
    assert lr["dev_em"] == ["1 -> 4", "1 -> 3"] and lr["baseline_dev_em"] == ["1 -> 2", "1 -> 2"]
    g, e = lr["gain"], lr["end_vs_baseline"]
    assert (g.only_b, g.only_a, g.runs_up) == (6, 1, 2) and g.p_value == pytest.approx(binom_two_sided(6, 7))
    assert (e.only_b, e.only_a) == (3 + 2, 1 + 1)  # only the lever's end / only the baseline's end, both seeds
    ws = rows["ws", "bfloat16"]
    assert not ws["same_start"] and ws["end_step"] == 18 and ws["overrides"] == {"warm_start.steps": 3}
    _run(tmp_path, "own_bfloat16_s0", ["seed=0", "optim.lr=5e-5", "data.dev_size=150"], {6: start, 21: start})
    _run(tmp_path, "own_bfloat16_s1", ["seed=1", "optim.lr=5e-5", "data.dev_size=151"], {6: start, 21: start})
    own = {r["lever"]: r for r in levers(tmp_path)}["own"]  # a value of each seed's own is not seed 0's for all
    assert own["overrides"]["optim.lr"] == 5e-05 and "| `data.dev_size` (one per seed), `optim.lr=5e-05` |" in \
        markdown([own])
    table = markdown(list(rows.values()))
    assert "| `lr` (bfloat16) | `optim.lr=5e-05` | 0, 1 | yes | 1 -> 4, 1 -> 3 of 6 |" in table
    assert "of 6 (end: step 18) |" in table and "pair with: `lr` (float32, 1 run)." in table


def test_the_readme_shows_the_tables_the_committed_tuning_runs_give():
    """Every levers block (the study CPU's, and any other CPU kind's under results/tuning/cpus/) is what its
    committed runs give."""
    readme = (ROOT / "README.md").read_text()
    assert BEGIN in readme and END in readme, "README.md lacks the levers block"
    roots = re.findall(r"<!-- levers:begin \(python -m searchr1.levers (\S+)\) -->", readme)
    assert roots[0] == "results/tuning"
    for root in roots:
        assert (ROOT / root).is_dir(), f"README's levers block names {root}, which is not committed"
        shown = readme.split(begin(root), 1)[1].split(END, 1)[0]
        assert shown == markdown(levers(ROOT / root)), \
            f"README's levers table is stale: python -m searchr1.levers {root} --readme README.md"


def test_the_cli_rewrites_only_the_readme_block_of_its_root(tmp_path):
    for name in ("t1.0_bfloat16_s0", "x_bfloat16_s0"):
        _run(tmp_path, name, ["optim.lr=5e-5"] if name.startswith("x") else [], {6: [1, 0], 21: [1, 1]})
    readme = tmp_path / "README.md"
    first = begin(str(tmp_path))
    readme.write_text(f"intro\n{first}stale table\n{END}\nafter\n")
    assert _cli([str(tmp_path), "--readme", str(readme)]) == 0
    text = readme.read_text()
    assert text.startswith(f"intro\n{first}| lever") and text.endswith(f"{END}\nafter\n") and "stale" not in text
    other = tmp_path / "cpus" / "k"  # a second root writes its own block and leaves the first alone
    other.mkdir(parents=True)
    for name in ("t1.0_bfloat16_s0", "y_bfloat16_s0"):
        _run(other, name, ["optim.lr=1e-5"] if name.startswith("y") else [], {6: [0, 0], 21: [1, 0]})
    marker = begin(f"{tmp_path}/cpus/k")
    readme.write_text(text + f"{marker}stale\n{END}\n")
    assert _cli([f"{tmp_path}/cpus/k/", "--readme", str(readme)]) == 0
    both = readme.read_text()
    assert both.startswith(text) and "`y` (bfloat16) | `optim.lr=1e-05`" in both.split(marker)[1] and "stale" not in both
    readme.write_text("no block here\n")
    with pytest.raises(SystemExit, match="no block .<!-- levers:begin"):
        _cli([str(tmp_path), "--readme", str(readme)])


def test_a_key_the_baseline_predates_counts_only_where_the_lever_leaves_its_default():
    defaults = {"curriculum.rl_copyable": True, "optim.lr": 2e-5}
    base = {"optim.lr": 2e-5, "seed": 0}
    # a key added to the schema after the baseline ran: its default is what the baseline did
    assert overrides(base, {"optim.lr": 2e-5, "curriculum.rl_copyable": False, "seed": 1}, defaults) == \
        {"curriculum.rl_copyable": False}
    assert overrides(base, {"optim.lr": 5e-5, "curriculum.rl_copyable": True}, defaults) == {"optim.lr": 5e-5}
    assert "curriculum.rl_copyable" in schema_defaults()
