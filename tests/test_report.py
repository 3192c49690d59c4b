"""The run report (searchr1/report.py): figures and report.html from a run folder's files, checked in a real
headless browser (Debian's chromium; the project does not install it, so those tests skip without it)."""
import json
import re
import shutil
from pathlib import Path

import pytest

from searchr1 import report
from searchr1.evaluation import read_predictions
from searchr1.stats import paired_predictions

ROOT = Path(__file__).resolve().parents[1]
RUN = ROOT / "results" / "cpu_main_float32_s0"
needs_chromium = pytest.mark.skipif(report.chromium() is None,
                                     reason="chromium is not installed (Debian package `chromium`; not a project dependency)")


def _copy(tmp_path: Path) -> Path:
    run = tmp_path / RUN.name
    run.mkdir()
    shutil.copy(RUN / "metrics.jsonl", run)
    shutil.copytree(RUN / "predictions", run / "predictions")
    return run


def _paired(run: Path):
    """The last held-out evaluation's predictions (the run's HotpotQA files) and its exact McNemar test against the
    first: what the page must show, computed here from the files and not from the page's code."""
    files = sorted((run / "predictions").glob("step_*.jsonl"))
    last = read_predictions(files[-1])
    return last, paired_predictions(read_predictions(files[0]), last)


def test_turns_are_cut_apart():
    r = "<think> a </think>\n<search> q </search>\n\n<information>Doc 1(Title: T) x</information>\nstray<answer> y </answer>"
    assert report.turns(r) == [["think", "a"], ["search", "q"], ["information", "Doc 1(Title: T) x"],
                               ["other", "stray"], ["answer", "y"]]


@needs_chromium
def test_the_browser_shows_the_numbers_of_metrics_jsonl(tmp_path):
    run = _copy(tmp_path)
    report.write(run)
    assert (run / report.EVAL_FIG).stat().st_size > 1000 and (run / report.TRAIN_FIG).stat().st_size > 1000
    dom = report.render(run / report.REPORT)
    text = re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", dom))
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    evals, train = [r for r in lines if r["kind"] == "eval"], [r for r in lines if r["kind"] == "train"]
    for e in evals:  # each evaluation's count, as a row of the evaluation table
        assert f"<td>{e['step']}</td><td>{e['eval/em_count']}/{e['eval/n']}</td>" in dom
    for t in train:  # each step's reward and searches, in its row of the step table
        assert f"<td>{t['step']}</td><td>{t['stage']}</td><td>{t['rollout/reward']:.3g}</td>" in dom
        assert f"<td>{t['rollout/searches']:.3g}</td>" in dom
    # the paired test against the first evaluation, as searchr1.stats computes it from the prediction files
    p = _paired(run)[1]
    assert f"+{p.only_b} / -{p.only_a} vs step {evals[0]['step']}, p = {p.p_value:.2g}" in text
    # the script ran: it built the trajectory browser (every held-out question, turns shown apart)
    n = evals[-1]["eval/n"]
    assert f"{n} of {n} questions shown" in text and dom.count('class="turn search"') >= n // 2
    assert dom.count('class="q right"') == evals[-1]["eval/em_count"]


@needs_chromium
def test_the_filters_select_right_and_gained_questions(tmp_path):
    run = _copy(tmp_path)
    report.write(run)
    evals = report.read_run(run)["evals"]
    first, last = evals[0], evals[-1]
    right = report.render(run / report.REPORT, fragment=f"step={last['step']}&ok=right")
    assert f"{last['eval/em_count']} of 200 questions shown" in right
    gained = report.render(run / report.REPORT, fragment=f"a={first['step']}&b={last['step']}&chg=gained")
    lost = report.render(run / report.REPORT, fragment=f"a={first['step']}&b={last['step']}&chg=lost&step={first['step']}")
    b, p = _paired(run)
    assert p.only_b > 0 and p.only_a > 0, "the committed run has both gained and lost questions to filter"
    assert f"{p.only_b} of 200 questions shown" in gained and f"{p.only_a} of 200 questions shown" in lost
    # lost questions seen at the first evaluation: all right there
    assert lost.count('class="q right"') == p.only_a and 'class="q wrong"' not in lost
    searched_not = report.render(run / report.REPORT, fragment=f"srch=no&step={last['step']}")
    assert f"{sum(not x['searches'] for x in b)} of 200 questions shown" in searched_not


def test_the_committed_report_is_what_the_committed_files_give(tmp_path):
    """The committed report.html (and so its screenshot, report.png) is regenerated from the committed run: its
    text, images left out (their bytes depend on the matplotlib build), equals a fresh one's."""
    run = _copy(tmp_path)
    report.write(run)
    strip = lambda s: re.sub(r"base64,[A-Za-z0-9+/=]+", "", s)  # noqa: E731
    assert strip((RUN / report.REPORT).read_text()) == strip((run / report.REPORT).read_text())
    assert (RUN / report.SHOT).is_file() and (RUN / report.EVAL_FIG).is_file()


def test_the_notebook_runs_headless_on_the_committed_results(tmp_path, monkeypatch):
    """notebooks/analysis.ipynb is committed executed (a repository page shows its figures) and still runs on
    the committed results/ (the smoke run's case is tests/test_loop.py)."""
    committed = json.loads((ROOT / "notebooks" / "analysis.ipynb").read_text())
    outputs = [o for c in committed["cells"] for o in c.get("outputs", [])]
    assert sum("image/png" in o.get("data", {}) for o in outputs) >= 5 and not [o for o in outputs if o.get("ename")]
    monkeypatch.delenv("SEARCHR1_RUNS", raising=False)
    nb = tmp_path / "notebooks" / "analysis.ipynb"
    nb.parent.mkdir()
    shutil.copy(ROOT / "notebooks" / "analysis.ipynb", nb)
    (tmp_path / "results").symlink_to(ROOT / "results")
    (tmp_path / "searchr1").symlink_to(ROOT / "searchr1")
    assert report.execute_notebook(nb) == sum("image/png" in o.get("data", {}) for o in outputs)


def test_the_schedules_figure_is_drawn_from_the_bench_json(tmp_path):
    out = tmp_path / "schedules.png"
    report.schedules_figure(ROOT / "results" / "bench" / "schedules.json", out)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and (ROOT / "results" / "bench" / "schedules.png").is_file()


def test_the_benchmark_figures_are_drawn_from_the_committed_json(tmp_path):
    for name in ("retrieval.json", "weight_sync.json"):
        shutil.copy(ROOT / "results" / "bench" / name, tmp_path)
    assert [p.name for p in report.bench_figures(tmp_path)] == ["retrieval.png", "weight_sync.png"]
    assert all((tmp_path / n).read_bytes()[:4] == b"\x89PNG" for n in ("retrieval.png", "weight_sync.png"))
