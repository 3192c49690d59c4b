"""Figures and a static report for exported runs: what a person opens to judge a run.

    python -m searchr1.report results/cpu_main_float32_s0 [RUN...] [--study results/study_em.png]

Per run folder it writes `eval_em.png` (held-out EM with 95% Wilson intervals per evaluation), `training.png`
(reward, answer rate, searches per trajectory and step time over steps) and `report.html`: one file with no
server and no network (the plots inline as base64, the step table, the evaluation table with exact McNemar tests
against the first evaluation, and a browser of the held-out trajectories in plain inline JS). `--study` adds one
figure with every main-study run's evaluations side by side. Everything is read from the run's own files
(`metrics.jsonl`, `predictions/`), so `make results` regenerates it from what is committed.
"""
from __future__ import annotations

import argparse
import base64
import html
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

from searchr1 import metrics as K
from searchr1.stats import paired_predictions, wilson

EVAL_FIG, TRAIN_FIG, REPORT, SHOT = "eval_em.png", "training.png", "report.html", "report.png"
SHOT_W, SHOT_H = 1400, 2400  # the screenshot's window: figures, both tables and the first trajectories
# (metric, axis label) of the training panels, in the order they are drawn and tabulated
TRAIN_PANELS = ((K.REWARD, "training reward"), (K.ANSWER_RATE, "answer rate"),
                (K.SEARCHES, "searches per trajectory"), (K.STEP_S, "step time (s)"))
TURN = re.compile(r"<(think|search|information|answer)>(.*?)</\1>", re.S)


def read_run(run: Path) -> dict:
    """The run's training lines, evaluation lines and predictions per evaluation step."""
    path = run / "metrics.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: missing (not a training run folder)")
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    train = [r for r in records if r.get(K.KIND) == "train"]
    evals = [r for r in records if r.get(K.KIND) == "eval"]
    preds = {}
    for e in evals:
        f = run / "predictions" / f"step_{int(e[K.STEP]):06d}.jsonl"
        if f.is_file():
            preds[int(e[K.STEP])] = [json.loads(line) for line in f.read_text().splitlines() if line.strip()]
    return {"name": run.name, "train": train, "evals": evals, "preds": preds}


def _plt():
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on a cluster node or in CI
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: Path) -> None:
    # no Software/date metadata: the committed PNGs change only when the numbers do
    fig.savefig(path, dpi=100, metadata={"Software": None})
    _plt().close(fig)


def _em_points(evals: list[dict]):
    steps = [int(e[K.STEP]) for e in evals]
    k = [int(e[K.EVAL_EM_COUNT]) for e in evals]
    n = [int(e[K.EVAL_N]) for e in evals]
    em = [100 * a / max(b, 1) for a, b in zip(k, n)]
    ci = [wilson(a, b) for a, b in zip(k, n)]
    lo = [max(0.0, m - 100 * c[0]) for m, c in zip(em, ci)]  # rounding can put the bound past the point
    hi = [max(0.0, 100 * c[1] - m) for m, c in zip(em, ci)]
    return steps, em, (lo, hi)


def eval_figure(run: dict, path: Path) -> bool:
    if not run["evals"]:
        return False
    plt = _plt()
    fig, ax = plt.subplots(figsize=(5, 3.4))
    steps, em, err = _em_points(run["evals"])
    ax.errorbar(steps, em, yerr=err, marker="o", capsize=4)
    for s, m in zip(steps, em):
        ax.annotate(f"{m:.1f}%", (s, m), textcoords="offset points", xytext=(6, 4), fontsize=8)
    ax.set(xlabel="step", ylabel="held-out EM (%)", title=f"{run['name']}: held-out EM, 95% Wilson", ylim=(0, None))
    fig.tight_layout()
    _save(fig, path)
    return True


def train_figure(run: dict, path: Path) -> bool:
    if not run["train"]:
        return False
    plt = _plt()
    fig, axes = plt.subplots(1, len(TRAIN_PANELS), figsize=(16, 3.4))
    steps = [r[K.STEP] for r in run["train"]]
    for ax, (key, label) in zip(axes, TRAIN_PANELS):
        sft = [(s, r.get(key)) for s, r in zip(steps, run["train"]) if r.get("stage") == "sft" and key in r]
        rl = [(s, r.get(key)) for s, r in zip(steps, run["train"]) if r.get("stage") != "sft" and key in r]
        for pts, lab, style in ((sft, "warm start", "s--"), (rl, "RL", "o-")):
            if pts:
                ax.plot(*zip(*pts), style, markersize=4, label=lab)
        ax.set(xlabel="step", title=label)
    axes[0].legend(fontsize=8)
    fig.suptitle(run["name"], fontsize=10)
    fig.tight_layout()
    _save(fig, path)
    return True


def study_figure(runs: list[dict], path: Path) -> None:
    """Every run's evaluations side by side, offset a little along the steps so the intervals do not overlap."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4))
    shown = [r for r in runs if r["evals"]]
    for i, r in enumerate(shown):
        steps, em, err = _em_points(r["evals"])
        dx = 0.25 * (i - (len(shown) - 1) / 2)
        ax.errorbar([s + dx for s in steps], em, yerr=err, marker="o", capsize=3, label=r["name"])
    ax.set(xlabel="step (where RL starts, after the last RL step)", ylabel="held-out EM (%)",
           title="Held-out EM per evaluation, 95% Wilson intervals", ylim=(0, None))
    ax.legend(fontsize=8)
    fig.tight_layout()
    _save(fig, path)


def schedules_figure(bench_json: Path, path: Path) -> None:
    """bench/schedules.py's runs: steps/hour and the last evaluation's EM (95% Wilson) against the largest lag
    each schedule trained with, one point per schedule."""
    runs = json.loads(Path(bench_json).read_text())["runs"]
    plt = _plt()
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 3.8))
    for i, (name, r) in enumerate(runs.items()):
        lag = max(int(k) for k in r["lag_histogram"])
        x = lag + 0.08 * (i - (len(runs) - 1) / 2)  # schedules of equal lag side by side
        a.plot(x, r["steps_per_hour"], "o", label=name)
        e = r["evals"][-1]
        lo, hi = e["ci95"]
        b.errorbar(x, e["em_pct"], yerr=[[e["em_pct"] - lo], [hi - e["em_pct"]]], marker="o", capsize=4, label=name)
    a.set(xlabel="largest lag trained (policy versions)", ylabel="RL steps per hour", title="Throughput", ylim=(0, None))
    b.set(xlabel="largest lag trained (policy versions)", ylabel="held-out EM (%)",
          title=f"EM after {next(iter(runs.values()))['steps']} steps, 95% Wilson", ylim=(0, None))
    for ax in (a, b):
        ax.set_xticks(sorted({max(int(k) for k in r["lag_histogram"]) for r in runs.values()}))
    b.legend(fontsize=8)
    fig.tight_layout()
    _save(fig, path)


def bench_figures(bench: Path) -> list[Path]:
    """The retrieval and weight-sync benchmarks against their peers, beside their JSON: queries per second of
    each engine (one thread) per corpus and depth, and bytes per step of each codec for the production model."""
    plt, out = _plt(), []
    if (bench / "retrieval.json").is_file():
        corpora = [c for c in json.loads((bench / "retrieval.json").read_text())["corpora"] if "single_query" in c]
        fig, axes = plt.subplots(1, len(corpora), figsize=(6 * len(corpora), 3.6), squeeze=False)
        for ax, c in zip(axes[0], corpora):
            rows = [r for r in c["single_query"]["rows"] if r["threads"] == 1]
            engines = list(rows[0]["engines"])
            for j, e in enumerate(engines):
                ax.bar([i + 0.2 * (j - (len(engines) - 1) / 2) for i in range(len(rows))],
                       [r["engines"][e].get("qps", 0) for r in rows], 0.2, label=e)
            ax.set_xticks(range(len(rows)), [f"top {r['k']}" for r in rows])
            ax.set(ylabel="queries / s (1 thread)", title=f"{c['single_query']['passages']:,} passages")
        axes[0][0].legend(fontsize=8)
        fig.tight_layout()
        _save(fig, bench / "retrieval.png")
        out.append(bench / "retrieval.png")
    if (bench / "weight_sync.json").is_file():
        prod = json.loads((bench / "weight_sync.json").read_text())["production"]
        names = list(prod["formats"])
        fig, ax = plt.subplots(figsize=(9, 3.6))
        ax.barh(names, [prod["formats"][n]["bytes_per_step"] / 1e6 for n in names])
        ax.set(xscale="log", xlabel="MB per step (log)", title=f"{prod['model']}, {prod['receivers']} receivers, "
               f"{100 * prod['changed_frac']:.2f}% of weights changed per step")
        ax.invert_yaxis()
        fig.tight_layout()
        _save(fig, bench / "weight_sync.png")
        out.append(bench / "weight_sync.png")
    return out


def turns(response: str) -> list[list[str]]:
    """The response cut into [kind, text] turns: think / search / information / answer, and any text outside
    the tags as `other` (a malformed trajectory shows what the model wrote)."""
    out, at = [], 0
    for m in TURN.finditer(response):
        if response[at:m.start()].strip():
            out.append(["other", response[at:m.start()].strip()])
        out.append([m.group(1), m.group(2).strip()])
        at = m.end()
    if response[at:].strip():
        out.append(["other", response[at:].strip()])
    return out


def eval_rows(run: dict) -> list[dict]:
    """One row per evaluation, each paired against the first (exact McNemar over the same questions)."""
    rows, first = [], None
    for e in run["evals"]:
        step, k, n = int(e[K.STEP]), int(e[K.EVAL_EM_COUNT]), int(e[K.EVAL_N])
        lo, hi = wilson(k, n)
        row = {"step": step, "em": f"{k}/{n}", "pct": f"{100 * k / max(n, 1):.1f}%",
               "ci": f"{100 * lo:.1f}-{100 * hi:.1f}", "f1": f"{e.get(K.EVAL_F1, 0):.3f}",
               "searches": f"{e.get(K.EVAL_SEARCHES, 0):.2f}", "vs_first": ""}
        preds = run["preds"].get(step)
        if first is None:
            first = (step, run["preds"].get(step))
        elif preds and first[1]:
            p = paired_predictions(first[1], preds)
            row["vs_first"] = f"+{p.only_b} / -{p.only_a} vs step {first[0]}, p = {p.p_value:.2g}"
        rows.append(row)
    return rows


def browser_data(run: dict) -> dict:
    steps = sorted(run["preds"])
    questions: dict[str, dict] = {}
    for s in steps:
        for p in run["preds"][s]:
            q = questions.setdefault(p["id"], {"id": p["id"], "q": p["question"], "gold": p["answers"], "by": {}})
            q["by"][str(s)] = {"em": bool(p["em"]), "searches": int(p["searches"]), "pred": p.get("prediction"),
                               "turns": turns(p["response"])}
    return {"steps": steps, "questions": list(questions.values())}


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 1000 else f"{v:.0f}"
    return html.escape(str(v))


def _table(head: list[str], rows: list[list]) -> str:
    th = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{_fmt(c)}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>"


def _img(path: Path) -> str:
    if not path.is_file():
        return ""
    b64 = base64.b64encode(path.read_bytes()).decode()
    return f'<img alt="{path.name}" src="data:image/png;base64,{b64}">'


def report_html(run: dict, run_dir: Path) -> str:
    steps_rows = [[r[K.STEP], r.get("stage", "rl")] + [r.get(k, "") for k, _ in TRAIN_PANELS]
                  for r in run["train"]]
    ev = eval_rows(run)
    data = json.dumps(browser_data(run), separators=(",", ":")).replace("</", "<\\/")
    page = (_TEMPLATE.replace("{{name}}", html.escape(run["name"]))
            .replace("{{figures}}", _img(run_dir / EVAL_FIG) + _img(run_dir / TRAIN_FIG))
            .replace("{{evals}}", _table(["step", "EM", "EM %", "95% Wilson", "F1", "searches / question",
                                          "gained / lost vs the first evaluation (exact McNemar)"],
                                         [[r["step"], r["em"], r["pct"], r["ci"], r["f1"], r["searches"],
                                           r["vs_first"]] for r in ev]))
            .replace("{{steps}}", _table(["step", "stage"] + [lab for _, lab in TRAIN_PANELS], steps_rows)
                     if steps_rows else "<p>no training steps (an evaluation-only run)</p>"))
    return page.replace("{{data}}", data)  # last: the data holds the trajectories' own text


def write(run_dir: str | Path) -> dict:
    run_dir = Path(run_dir)
    run = read_run(run_dir)
    eval_figure(run, run_dir / EVAL_FIG)
    train_figure(run, run_dir / TRAIN_FIG)
    (run_dir / REPORT).write_text(report_html(run, run_dir))
    return run


def chromium() -> str | None:
    """Debian's headless browser, if installed (the project does not install it: screenshots and the page test
    need it, nothing else does)."""
    return shutil.which("chromium") or shutil.which("chromium-browser")


def render(page: Path, dump_dom: bool = True, png: Path | None = None, fragment: str = "") -> str:
    """The page as a real browser leaves it after its script ran (--dump-dom), or its screenshot (png)."""
    exe = chromium()
    if exe is None:
        raise FileNotFoundError("chromium: not installed (apt-get install chromium)")
    mode = [f"--screenshot={png}", "--hide-scrollbars", f"--window-size={SHOT_W},{SHOT_H}"] if png else ["--dump-dom"]
    r = subprocess.run([exe, "--headless", "--disable-gpu", "--no-sandbox", *mode,
                        page.resolve().as_uri() + (f"#{fragment}" if fragment else "")],
                       capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        raise RuntimeError(f"chromium exited {r.returncode} on {page}: {r.stderr.strip()[-300:]}")
    return r.stdout


def execute_notebook(path: str | Path, out: str | Path | None = None) -> int:
    """Run a notebook headless (nbclient) from its own folder, as a person opening it would, and save it with
    its outputs (to `out`, default in place) so that a repository page shows its figures; returns the number
    of images. The notebook reads the runs under results/ unless SEARCHR1_RUNS names others."""
    import nbformat
    from nbclient import NotebookClient

    path = Path(path)
    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}).execute()
    for cell in nb.cells:  # execution timestamps would change the committed file on every run
        cell.metadata.pop("execution", None)
    nbformat.write(nb, out or path)
    return sum("image/png" in o.get("data", {}) for c in nb.cells for o in c.get("outputs", []))


def _cli(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m searchr1.report", description=__doc__.split("\n")[0])
    ap.add_argument("runs", nargs="+", help="exported run folders (results/cpu_*) or runs/<run>")
    ap.add_argument("--study", help="also write one EM figure of the runs named cpu_main_* (or all given) here")
    ap.add_argument("--screenshot", action="append", default=[], metavar="RUN",
                    help=f"also save RUN/{SHOT} (a headless chromium's view of its report.html)")
    ap.add_argument("--schedules", metavar="JSON", help="also plot bench/schedules.py's JSON (a PNG beside it)")
    ap.add_argument("--bench", metavar="DIR", help="also plot DIR/retrieval.json and DIR/weight_sync.json")
    ap.add_argument("--notebook", help="also execute this notebook in place (its outputs committed)")
    args = ap.parse_args(argv)
    try:
        runs = [write(r) for r in args.runs]
    except (FileNotFoundError, ValueError, KeyError) as e:
        print(f"report: {e}", file=sys.stderr)
        return 2
    for r, d in zip(runs, args.runs):
        print(f"report: {Path(d) / REPORT} ({len(r['train'])} steps, {len(r['evals'])} evaluations)")
    if args.study:
        main = [r for r in runs if r["name"].startswith("cpu_main_")] or runs
        study_figure(main, Path(args.study))
        print(f"report: {args.study} ({len(main)} runs)")
    if args.schedules:
        out = Path(args.schedules).with_suffix(".png")
        schedules_figure(Path(args.schedules), out)
        print(f"report: {out}")
    if args.bench:
        for f in bench_figures(Path(args.bench)):
            print(f"report: {f}")
    if args.notebook:
        print(f"report: {args.notebook} executed ({execute_notebook(args.notebook)} figures)")
    for d in args.screenshot:
        render(Path(d) / REPORT, png=Path(d) / SHOT)
        print(f"report: {Path(d) / SHOT}")
    return 0


# the page's markup, style and script live beside this file (package data), filled in by report_html
_TEMPLATE = Path(__file__).with_name("report_template.html").read_text()

if __name__ == "__main__":
    sys.exit(_cli())
