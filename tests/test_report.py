"""litlab-report: a real sweep, failed and GAN runs written by hand, and bad input."""

from __future__ import annotations

import base64
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from conftest import REPO, run_cli
from litlab.report import main
from litlab.report.compare import human_duration
from litlab.report.runs import find_runs
from litlab.sweep import best_job, read_jobs

ROW = re.compile(r'<tr class="([^"]*)" data-run="([^"]*)">(.*?)</tr>', re.S)
PNG = re.compile(r'<img src="data:image/png;base64,([A-Za-z0-9+/=]+)" alt="([^"]*)">')


def report(*args: object) -> subprocess.CompletedProcess:
    """python -m litlab.report, as a user runs it."""
    command = [sys.executable, "-m", "litlab.report", *map(str, args)]
    return subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=120)


def table_rows(html: str) -> list[tuple[str, str, str]]:
    """(css classes, run name, row html) of each table row, top to bottom."""
    return ROW.findall(html)


def md_rows(md: str) -> list[str]:
    """The Markdown table's body lines."""
    return [line for line in md.splitlines() if line.startswith("| ")][1:]


def write_run(folder: Path, summary: dict, overrides: list[str] = ()) -> Path:
    """A run folder written by hand: summary.json and .hydra/overrides.yaml."""
    (folder / ".hydra").mkdir(parents=True)
    (folder / "summary.json").write_text(json.dumps({"task": "train", **summary}))
    (folder / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))
    return folder


def write_png(path: Path, seed: int) -> bytes:
    """A small random RGB PNG (a stand-in sample grid); returns its bytes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    pixels = np.random.default_rng(seed).integers(0, 256, (18, 36, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(path)
    return path.read_bytes()


@pytest.fixture(scope="module")
def sweep(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real two-job learning-rate sweep folder, trained by the project's CLI."""
    logs = tmp_path_factory.mktemp("logs")
    result = run_cli(
        "-m",
        "model.optimizer.lr=0.001,0.01",
        "trainer.max_epochs=1",
        "logger=csv",
        "extras.print_config=false",
        "callbacks.progress_bar=null",
        f"paths.log_dir={logs}",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    (folder,) = (logs / "train" / "multirun").glob("*/*")
    return folder


def objective(run_dir: Path) -> float:
    return json.loads((run_dir / "summary.json").read_text())["objective"]["value"]


def test_sweep_report_ranks_runs_and_embeds_plots(sweep):
    result = report(sweep)
    assert result.returncode == 0, result.stderr[-3000:]
    html_path, md_path = sweep / "report.html", sweep / "report.md"
    assert result.stdout.split() == [str(html_path), str(md_path)]
    html, md = html_path.read_text(), md_path.read_text()

    values = {job: objective(sweep / job) for job in ("0", "1")}
    ranked = sorted(values, key=lambda job: values[job])  # val/loss (digits'): lower is better
    rows = table_rows(html)
    assert [name for _, name, _ in rows] == ranked
    assert ["best" in css.split() for css, _, _ in rows] == [True, False]
    assert "★ best" in rows[0][2] and "★" not in rows[1][2]
    for job, lr in (("0", "0.001"), ("1", "0.01")):
        (row,) = [r for _, name, r in rows if name == job]
        assert f"model.optimizer.lr={lr}</code>" in row and f"{values[job]:.4g}" in row

    lines = md_rows(md)
    assert [line.split(" | ")[1] for line in lines] == [f"`{ranked[0]}` ★ best", f"`{ranked[1]}`"]
    assert "`model.optimizer.lr=0.001`" in "".join(lines) and "`model.optimizer.lr=0.01`" in md
    assert (
        "val/loss [digits, val=144], min (lower is better)" in md
        and f"**Best run:** {ranked[0]}:" in md
    )

    images = {alt: base64.b64decode(data) for data, alt in PNG.findall(html)}
    assert {
        "val/acc against epochs trained",
        "train/loss_step against epochs trained",
    } <= images.keys()
    assert "val/loss vs model.optimizer.lr" in images  # the sweep plot, of the objective
    assert all(png.startswith(b"\x89PNG\r\n\x1a\n") for png in images.values())
    assert "http://" not in html and "https://" not in html
    assert "<script" not in html and "<link" not in html


def test_failed_and_valueless_runs_sort_last(sweep, tmp_path, capsys):
    folder = tmp_path / "sweep"
    shutil.copytree(sweep, folder, ignore=shutil.ignore_patterns("*.ckpt", "report.*"))
    error = "RuntimeError: CUDA out of memory. " + "Tried to allocate 2.00 GiB. " * 8
    failed = {"status": "failed", "error": error, "metrics": {}, "durations_s": {"total": 3.0}}
    # a failed run sorts last even with the best objective value
    write_run(
        folder / "2", {**failed, "objective": {"metric": "val/acc", "mode": "max", "value": 1}}
    )
    write_run(folder / "3", {"status": "running"}, ["model.optimizer.lr=0.1"])

    main([str(folder)])
    assert capsys.readouterr().out.split()[0] == str(folder / "report.html")
    html, md = (folder / "report.html").read_text(), (folder / "report.md").read_text()
    rows = table_rows(html)
    assert [name for _, name, _ in rows][2:] == ["3", "2"]
    assert "best" in rows[0][0].split() and objective(folder / rows[0][1]) < 1
    assert (
        f'title="{error}"' in rows[3][2]
        and "failed: RuntimeError: CUDA out of memory" in rows[3][2]
    )
    # only ranked runs are numbered: a number on an unranked row read as a rank (review 152)
    assert [row.split("|")[1].strip() for row in md_rows(md)] == ["1", "2", "", ""]
    last = md_rows(md)[-1]
    assert last.startswith("|  | `2` |") and "failed: RuntimeError: CUDA out of memory" in last
    assert "3.0 s" in last and "…" in last and error.strip() not in last  # shortened
    assert "4 (2 completed, 1 failed, 1 running)" in md


def test_the_objective_ranked_by_is_the_one_most_runs_have_a_value_for(tmp_path, capsys):
    """Two scored classifier runs beside three GAN runs that failed before any FID: ranked by
    val/fid (the most common objective, counted over every run) the report had no best; the
    objective is now counted over the runs that have a value."""
    acc = {"metric": "val/acc", "mode": "max"}
    for name, value in [("a", 0.8), ("b", 0.9)]:
        summary = {"status": "completed", "metrics": {"val/acc": value}}
        write_run(tmp_path / name, {**summary, "objective": {**acc, "value": value}})
    fid = {"metric": "val/fid", "mode": "min", "value": None}
    for name in ["c", "d", "e"]:
        write_run(tmp_path / name, {"status": "failed", "error": "x", "objective": fid})
    main([str(tmp_path)])
    rows = table_rows((tmp_path / "report.html").read_text())
    assert [name for _, name, _ in rows][:2] == ["b", "a"] and "best" in rows[0][0].split()


def gan_summary(fid: float, **metrics: float) -> dict:
    """A GAN run's summary: FID (lower is better) is its objective."""
    objective = {"metric": "val/fid", "mode": "min", "value": fid}
    return {"status": "completed", "metrics": {"val/fid": fid, **metrics}, "objective": objective,
            "durations_s": {"fit": 1.0}}  # fmt: skip


def test_gan_runs_show_their_sample_grids(tmp_path, capsys):
    folder = tmp_path / "gans"
    a = write_run(folder / "a", gan_summary(50.0, **{"g/loss": 1.0}), ["model=dcgan", "seed=1"])
    b = write_run(folder / "b", gan_summary(40.0, **{"d/loss": 0.5}), ["model=dcgan", "seed=2"])
    a_final = write_png(a / "samples" / "final.png", seed=0)
    a_tested = write_png(a / "samples" / "test.png", seed=4)  # the ranked (best) weights'
    a_step = write_png(a / "samples" / "g_step_0000500.png", seed=1)
    b_old = write_png(b / "samples" / "g_step_0000500.png", seed=2)
    b_new = write_png(b / "samples" / "g_step_0001000.png", seed=3)
    out = tmp_path / "out"

    main([str(folder), "--out", str(out)])
    assert capsys.readouterr().out.split() == [str(out / "report.html"), str(out / "report.md")]
    assert not (folder / "report.html").exists()
    html = (out / "report.html").read_text()
    assert [name for _, name, _ in table_rows(html)] == ["b", "a"]  # lower FID is better
    images = {alt: base64.b64decode(data) for data, alt in PNG.findall(html)}
    assert images["samples of a"] == a_tested and images["samples of b"] == b_new
    assert {a_step, a_final, b_old}.isdisjoint(images.values())
    assert "<figcaption>a (final weights)<br><code>seed=1</code></figcaption>" in html
    assert "<figcaption>b (G step 1000)<br><code>seed=2</code></figcaption>" in html
    md = (out / "report.md").read_text()
    # The objective is the best epoch's; the other columns say which values they are: a GAN's
    # losses are one batch's (the last step logged), not an epoch's mean (review 152: "last
    # epoch")
    assert (
        "| objective (val/fid, min) | val/fid (last validation) | g/loss (last logged step) "
        "| d/loss (last logged step) |" in md
    )


def test_missing_keys_broken_files_and_no_curves(tmp_path, capsys):
    write_run(tmp_path / "bare", {"status": "completed"})
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "summary.json").write_text("{not json")
    main([str(tmp_path)])
    html = (tmp_path / "report.html").read_text()
    assert [name for _, name, _ in table_rows(html)] == ["bare", "broken"]
    assert "unreadable: summary.json:" in html and "No run has csv/metrics.csv" in html
    assert "none: no run that did not fail has an objective value" in html


def test_a_report_of_several_folders_leaves_each_folders_own_report(tmp_path, capsys):
    """`litlab.report A B` wrote into A, over A's own report, titled A alone; now into a folder
    of its own beside them, titled by both."""
    for name in ("a", "b"):
        write_run(tmp_path / "sweeps" / name, {"status": "completed"})
        main([str(tmp_path / "sweeps" / name)])
    own = (tmp_path / "sweeps" / "a" / "report.md").read_text()
    capsys.readouterr()
    main([str(tmp_path / "sweeps" / "a"), str(tmp_path / "sweeps" / "b")])
    assert (tmp_path / "sweeps" / "a" / "report.md").read_text() == own
    both = tmp_path / "sweeps" / "report-a+b"
    assert capsys.readouterr().out.split() == [str(both / "report.html"), str(both / "report.md")]
    assert (both / "report.md").read_text().startswith("# litlab report: a + b\n")


def test_job_folders_in_numeric_order(tmp_path):
    for job in (10, 2, 1, 0):
        write_run(tmp_path / str(job), {"status": "completed"})
    assert [run.name for run in find_runs([tmp_path])] == ["0", "1", "2", "10"]


@pytest.mark.parametrize(
    "seconds, text", [(None, ""), (4.26, "4.3 s"), (245, "4 min 05 s"), (7625, "2 h 07 min")]
)
def test_human_duration(seconds, text):
    assert human_duration(seconds) == text


@pytest.mark.parametrize(
    "make, needle",
    [
        (lambda tmp: tmp / "nope", "no such folder"),
        (lambda tmp: tmp, "no run folders (with summary.json) under"),
    ],
    ids=["missing-path", "no-runs"],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path, make, needle):
    result = report(make(tmp_path))
    assert result.returncode == 2
    assert "Traceback" not in result.stderr + result.stdout
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("litlab-report: error:") and needle in line


def test_columns_say_which_weights_their_values_are_of(tmp_path, capsys):
    """The objective is the best epoch's value; the summary's metrics are the last epoch's
    (val/*, train/*) and the tested weights' (test/*): the titles say so."""

    def summary(best: str | None, tested: str | None, last: str | None = None) -> dict:
        objective = {"metric": "val/acc", "mode": "max", "value": 0.9}
        metrics = {"val/acc": 0.8, "test/acc": 0.85}
        return {"status": "completed", "metrics": metrics, "objective": objective,
                "best_checkpoint": best, "tested_checkpoint": tested,
                "last_checkpoint": last, "durations_s": {"fit": 1.0}}  # fmt: skip

    write_run(tmp_path / "1", summary("/r/1/best.ckpt", "/r/1/best.ckpt"))
    write_run(tmp_path / "2", summary(None, None), ["test=false"])
    main([str(tmp_path)])
    md = (tmp_path / "report.md").read_text()
    assert "| test/acc (best checkpoint or final weights) | val/acc (last validation) |" in md
    # callbacks.model_checkpoint=null: no best checkpoint, the last one is tested
    (tmp_path / "2" / "summary.json").write_text(
        json.dumps({"task": "train", **summary(None, "/r/2/last.ckpt", "/r/2/last.ckpt")})
    )
    main([str(tmp_path)])
    md = (tmp_path / "report.md").read_text()
    assert "| test/acc (best checkpoint or last checkpoint) | val/acc (last validation) |" in md
    # eval.py's run: the checkpoint it was given (it read "final weights")
    evaluated = {"task": "eval", "status": "completed", "metrics": {"test/acc": 0.85},
                 "checkpoint": "/r/1/best.ckpt"}  # fmt: skip
    (tmp_path / "2" / "summary.json").write_text(json.dumps(evaluated))
    main([str(tmp_path)])
    md = (tmp_path / "report.md").read_text()
    assert "| test/acc (best checkpoint or given checkpoint) |" in md
    assert "`2 (eval)`" in md  # a test of a checkpoint, not a third training run
    # train=false without a checkpoint (a GAN's FID floor): untrained, not "final", weights
    untrained = {**summary(None, None), "durations_s": {"test": 1.0}}
    (tmp_path / "2" / "summary.json").write_text(json.dumps(untrained))
    main([str(tmp_path)])
    md = (tmp_path / "report.md").read_text()
    assert "| test/acc (best checkpoint or untrained weights) |" in md


def test_curves_keep_one_point_per_step_after_a_resume(tmp_path):
    """A run killed without a checkpoint at that point logs steps 25-27 again after resume=:
    the curve keeps the later values, in step order, and does not fold back."""
    from litlab.report.runs import read_curves

    rows = ["step,train/loss_step"]  # (no epoch column: the x axis is the step)
    rows += [f"{s},{1.0 / s}" for s in range(20, 28)]  # the killed run
    rows += [f"{s},{2.0 / s}" for s in range(25, 30)]  # resumed from the step-25 checkpoint
    (tmp_path / "metrics.csv").write_text("\n".join(rows) + "\n")
    steps, values = read_curves(tmp_path / "metrics.csv")["train/loss_step"]
    assert steps == list(range(20, 30))
    assert values == [1.0 / s for s in range(20, 25)] + [2.0 / s for s in range(25, 30)]


def test_curves_are_drawn_against_the_epochs_trained(tmp_path):
    """Curves were drawn against Lightning's step: runs of another batch size, process count
    or GAN (D's and G's steps) never lined up (batch 128's 2 epochs ended where batch 32's
    first epoch was half done). Now an epoch's end is at e + 1, its steps in between, and a
    run stopped part-way through its last epoch ends part-way."""
    from litlab.report.runs import read_curves

    def curves(batches: int, epochs: float, steps_per_epoch: int | None = None) -> dict:
        rows, total = ["step,epoch,train/loss_step,val/acc,test/acc"], int(batches * epochs)
        for step in range(total):  # as Lightning logs them: the k-th batch at step k - 1
            epoch = step // batches
            rows.append(f"{step},{epoch},{1 / (step + 1)},,")
            if (step + 1) % batches == 0:
                rows.append(f"{step},{epoch},,{(step + 1) / total},")
        rows.append(f"{total},{epochs:.0f},,,0.9")  # the test: at the next epoch, one step on
        path = tmp_path / f"{batches}-{epochs}.csv"
        path.write_text("\n".join(rows) + "\n")
        return read_curves(path, steps_per_epoch)

    small, large = curves(40, 2), curves(10, 2)  # batch 32 and batch 128: 40 and 10 steps
    # the first epoch's 20th of 40 batches half way (it was one step short: 19/39)
    for run in (small, large):
        assert run["val/acc"][0] == [1.0, 2.0]
        assert run["train/loss_step"][0][-1] == 2.0
    assert small["train/loss_step"][0][19] == large["train/loss_step"][0][4] == 0.5
    stopped = curves(10, 1.5)  # stopped half-way through its second epoch
    assert stopped["val/acc"][0] == [1.0]
    assert stopped["train/loss_step"][0][-1] == 1.5
    # stopped in its first epoch: it ended at 1.0 (nothing told the epoch's length) unless
    # summary.json's steps_per_epoch does
    for known, end in ((None, 1.0), (10, 0.4)):
        assert curves(10, 0.4, known)["train/loss_step"][0][-1] == pytest.approx(end)
    assert curves(10, 1.5, 10)["train/loss_step"][0][-1] == 1.5  # the same when it was known


def test_accuracies_rank_only_against_accuracies_on_the_same_data(tmp_path, capsys):
    """val/acc of a digits run (144 validation images) and of a Fashion-MNIST run, or on another
    validation share, are other numbers: the report ranked them together and named the digits
    run best (0.757 above 0.305); so did sweep_summary.json. So is one measured on part of the
    validation split (trainer.limit_val_batches: found by review, ranked with the others)."""

    def run(name: str, acc: float, source: str, val: int, overrides: list, **more) -> Path:
        summary = {
            "status": "completed",
            "metrics": {"val/acc": acc, "test/acc": acc},
            "objective": {"metric": "val/acc", "mode": "max", "value": acc},
            "data": {"source": source, "splits": {"train": 1, "val": val, "test": 1}},
            **more,
        }
        return write_run(tmp_path / "runs" / name, summary, overrides)

    run("0", 0.30, "fashion_mnist", 6000, ["data=fashion_mnist"])
    run("1", 0.20, "digits", 144, ["data=digits"])
    run("5", 0.76, "digits", 144, ["data=digits", "model.optimizer.lr=0.01"])
    run("2", 0.35, "fashion_mnist", 6000, ["data=fashion_mnist", "model.optimizer.lr=0.01"])
    run("3", 0.90, "fashion_mnist", 600, ["data=fashion_mnist", "data.val_fraction=0.01"])
    limited = ["data=fashion_mnist", "+trainer.limit_val_batches=1"]
    run("4", 0.95, "fashion_mnist", 6000, limited, evaluation_limits={"val": 1})
    main([str(tmp_path / "runs"), "--out", str(tmp_path / "out")])
    capsys.readouterr()
    md = (tmp_path / "out" / "report.md").read_text()
    names = [row.split(" | ")[1].split("`")[1] for row in md_rows(md)]
    assert names[:2] == ["2", "0"]
    # the runs not ranked: each measure's best first (they were in folder order: 146)
    assert names.index("5") < names.index("1")
    assert "- **Best run:** 2: val/acc = 0.35" in md
    assert "| objective (val/acc [fashion_mnist, val=6000], max) |" in md
    assert "val/acc [digits, val=144]=0.76" in md
    assert "val/acc [fashion_mnist, val=6000, limit_val_batches=1]=0.95" in md
    assert Path(best_job(read_jobs(tmp_path / "runs"))["job_dir"]).name == "2"


def test_a_runs_summary_names_its_data(tmp_path):
    """What the report's comparison rests on: summary.json's data.source."""
    result = run_cli(
        "trainer.max_epochs=1", "model.net.width=8", "logger=csv", "test=false",
        "extras.print_config=false", "callbacks.progress_bar=null", f"paths.log_dir={tmp_path}",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    (path,) = tmp_path.rglob("summary.json")
    summary = json.loads(path.read_text())
    assert summary["data"]["source"] == "digits" and summary["data"]["splits"]["val"] > 0


def test_fids_rank_only_against_fids_of_the_same_extractor_and_n(tmp_path, capsys):
    """Every GAN's val/fid was ranked together: FIDs through another extractor (or at another N
    or N_real) are other numbers (the same generator: 548 through one domain extractor, 228
    through another), and the report named the lower one best; so did sweep_summary.json."""

    def fid_run(name: str, fid: float, tag: str, n: int, overrides: list, real=10000) -> Path:
        metrics = {f"val/fid_{tag}": fid, "val/fid_samples": n, "val/fid_floor": 3.0}
        metrics.update({"test/fid": fid + 1, f"test/fid_{tag}": fid + 1, "test/fid_samples": n})
        metrics.update({"val/fid_real_samples": real, "test/fid_real_samples": real})
        return write_run(tmp_path / "runs" / name, gan_summary(fid, **metrics), overrides)

    fid_run("0", 548.0, "domain-7cca31a5", 2048, ["model=dcgan"])
    fid_run("1", 500.0, "domain-7cca31a5", 2048, ["model=dcgan", "model.optimizer_g.lr=1e-3"])
    fid_run("2", 228.0, "domain-6c73f971", 2048, ["model=dcgan"])
    fid_run("3", 100.0, "domain-7cca31a5", 256, ["model=dcgan"])
    fid_run("5", 90.0, "domain-7cca31a5", 2048, ["model=dcgan"], real=5000)
    write_run(tmp_path / "runs" / "4", {"status": "interrupted"}, ["model=dcgan"])
    main([str(tmp_path / "runs"), "--out", str(tmp_path / "out")])
    capsys.readouterr()
    md = (tmp_path / "out" / "report.md").read_text()
    assert [row.split(" | ")[1].split("`")[1] for row in md_rows(md)][:3] == ["1", "0", "2"]
    assert "- **Best run:** 1: val/fid = 500;" in md
    scale = "domain-7cca31a5, N=2048, N_real=10000"
    assert f"| objective (val/fid [{scale}], min) | test/fid [{scale}] (" in md
    # the other columns too: a value on another scale than its column's names its own
    other_n = next(row for row in md_rows(md) if "`3`" in row.split(" | ")[1])
    assert "| 101 [domain-7cca31a5, N=256, N_real=10000] |" in other_n
    assert "| 3 [domain-7cca31a5, N=256, N_real=10000] |" in other_n  # its floor
    assert "val/fid [domain-6c73f971, N=2048, N_real=10000]=228" in md
    assert "val/fid [domain-7cca31a5, N=256, N_real=10000]=100" in md
    assert "val/fid [domain-7cca31a5, N=2048, N_real=5000]=90" in md
    # the sweep's own summary (litlab.sweep) picks the same best
    assert Path(best_job(read_jobs(tmp_path / "runs"))["job_dir"]).name == "1"
    assert "- **Varied:** model.optimizer_g.lr" in md
    # on the val/fid curve, the runs of another scale say theirs in the legend
    from litlab.report.compare import compare
    from litlab.report.plots import curve_label

    comparison = compare(find_runs([tmp_path / "runs"]))
    labels = {run.name: curve_label(comparison, run, "val/fid") for run in comparison.runs}
    ours = next(run for run in comparison.runs if run.name == "0")
    assert labels["0"] == comparison.label(ours)  # the report's own scale: no tag
    assert labels["2"].endswith(" [domain-6c73f971, N=2048, N_real=10000]")
    assert labels["3"].endswith(" [domain-7cca31a5, N=256, N_real=10000]")


def test_a_tuned_runs_parameters_are_the_values_it_trained_with(tmp_path):
    """tune.batch_size=true trains at the batch size found, which no override gives: the sweep
    plots and the varied keys take it from summary.json's "tuned"."""
    from litlab.report.compare import numeric_params, varied_params

    done = {"status": "completed", "metrics": {"val/acc": 0.5}}
    write_run(tmp_path / "a", done, ["data.batch_size=64"])
    write_run(tmp_path / "b", {**done, "tuned": {"batch_size": 256, "lr": 0.01}}, ["tune=default"])
    runs = {run.name: run for run in find_runs([tmp_path])}
    assert runs["b"].params["data.batch_size"] == "256"
    assert runs["b"].params["model.optimizer.lr"] == "0.01"
    varied = varied_params(list(runs.values()))
    assert "data.batch_size" in numeric_params(list(runs.values()), varied)


def test_a_resumed_tuned_run_keeps_the_values_it_trained_with(tmp_path):
    """A later part of a tuned run (resume=, a requeued job) tunes nothing: its summary.json
    keeps the first part's "tuned", so the report still plots the run at the batch size found
    (before: only previous_summary had it, and the run fell back to its overrides)."""
    from omegaconf import OmegaConf

    from litlab.run import Run

    first = {"status": "interrupted", "tuned": {"batch_size": 256, "lr": 0.01}}
    folder = write_run(tmp_path / "b", first, ["tune=default"])
    with Run(OmegaConf.create({"paths": {"output_dir": str(folder)}}), "train"):
        pass
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["tuned"] == first["tuned"]
    (run,) = find_runs([tmp_path])
    assert run.params["data.batch_size"] == "256"
    # a resume that set its own batch size trained the later parts with it
    from litlab.overrides import RESUME_OVERRIDES

    (folder / ".hydra" / RESUME_OVERRIDES).write_text("- data.batch_size=64\n")
    (run,) = find_runs([tmp_path])
    assert run.params["data.batch_size"] == "64"
    (folder / ".hydra" / RESUME_OVERRIDES).unlink()
    # another task's summary in the folder (eval.py) does not pass its values on
    eval_folder = tmp_path / "e"
    eval_folder.mkdir()
    (eval_folder / "summary.json").write_text(json.dumps({"task": "eval", **first}))
    with Run(OmegaConf.create({"paths": {"output_dir": str(eval_folder)}}), "train"):
        pass
    assert "tuned" not in json.loads((eval_folder / "summary.json").read_text())


def test_repeats_over_seeds_get_their_mean_and_spread(tmp_path):
    """README's grid over seeds (model.optimizer.lr=1e-3,3e-3 seed=1,2,3): the report named
    the luckiest seed's run best and plotted the objective against the seed. It names that
    run as one seed's and ranks the configurations by their mean over seeds, ± the standard
    deviation, n each; the seed is no parameter to plot against."""
    from litlab.report.compare import compare, facts, numeric_params

    acc = {"metric": "val/acc", "mode": "max"}
    values = {"0.001": [0.95, 0.80, 0.81], "0.003": [0.90, 0.91, 0.92]}
    job = 0
    for lr, scores in values.items():
        for seed, value in enumerate(scores, start=1):
            summary = {"status": "completed", "objective": {**acc, "value": value}}
            write_run(tmp_path / str(job), summary, [f"model.optimizer.lr={lr}", f"seed={seed}"])
            job += 1
    comparison = compare(find_runs([tmp_path]))
    lines = dict(facts(comparison))
    assert lines["Best run"].startswith("0: val/acc = 0.95") and "(one seed's)" in lines["Best run"]
    assert lines["Over seeds"].startswith(
        "model.optimizer.lr=0.003: mean 0.91 ± 0.01 (n=3); "
        "model.optimizer.lr=0.001: mean 0.8533 ± 0.08386 (n=3)"
    )
    assert numeric_params(comparison.runs, comparison.varied) == ["model.optimizer.lr"]
    assert "Code" not in lines  # one commit (none recorded here)
    main([str(tmp_path)])
    assert (
        "**Over seeds:** model.optimizer.lr=0.003: mean 0.91"
        in (tmp_path / "report.md").read_text()
    )


def test_a_loss_objective_shows_its_test_loss(tmp_path):
    """Runs ranked by val/loss (data=digits' objective) showed test/acc and val/acc beside it,
    not the objective's own test value, test/loss (walkthrough 136): its columns come first."""
    from litlab.report.compare import compare

    loss = {"metric": "val/loss", "mode": "min"}
    for name, value in (("a", 0.30), ("b", 0.20)):
        metrics = {"val/loss": value, "test/loss": value + 0.01, "val/acc": 0.9, "test/acc": 0.9}
        summary = {"status": "completed", "objective": {**loss, "value": value}}
        write_run(tmp_path / name, {**summary, "metrics": metrics}, [f"seed={name}"])
    comparison = compare(find_runs([tmp_path]))
    assert comparison.metric_columns == ["test/loss", "val/loss", "test/acc", "val/acc"]
    assert comparison.cells(1, comparison.runs[0])[5] == "0.21"  # b's test/loss


def test_a_seed_run_twice_counts_once_over_seeds(tmp_path):
    """The same settings and seed in two sweeps are one draw run twice (walkthrough 136: it
    read "mean 0.1506 ± 0 (n=2)", a spread over seeds of none): one value a seed, its runs'
    mean, the repeat said; a setting with a single seed repeated has no spread to show."""
    from litlab.report.compare import compare, facts

    acc = {"metric": "val/acc", "mode": "max"}
    runs = [("a", "1", 0.90), ("b", "2", 0.80), ("c", "2", 0.82), ("d", "7", 0.15)]
    runs += [("e", "7", 0.15)]
    for name, seed, value in runs:
        lr = "0.1" if seed != "7" else "0.2"
        summary = {"status": "completed", "objective": {**acc, "value": value}}
        write_run(tmp_path / name, summary, [f"model.optimizer.lr={lr}", f"seed={seed}"])
    # seed 1 again, the config's default (no override; review 138: a seed of its own)
    summary = {"status": "completed", "objective": {**acc, "value": 0.90}}
    write_run(tmp_path / "f", summary, ["model.optimizer.lr=0.1"])
    (tmp_path / "f" / ".hydra" / "config.yaml").write_text("seed: 1\n")
    lines = dict(facts(compare(find_runs([tmp_path]))))
    assert lines["Over seeds"].startswith(
        "model.optimizer.lr=0.1: mean 0.855 ± 0.06364 (n=2) (2 more run(s) of a seed already "
        "counted: one value a seed); model.optimizer.lr=0.2: 0.15 (n=1) (1 more run(s) of a "
        "seed already counted: one value a seed)"
    )
    for name in ("a", "b", "c", "f"):  # one setting, all of seed 7: nothing repeated over seeds
        shutil.rmtree(tmp_path / name)
    assert "Over seeds" not in dict(facts(compare(find_runs([tmp_path]))))


def test_a_sweep_trial_and_its_seeds_run_again_are_one_setting(tmp_path):
    """An Optuna sweep's best trial (hparams_search=cnn_optuna among its overrides) run again
    over seeds without the search, one run tagged: hparams_search and tags were settings, the
    trial's seed counted in a group of its own and the re-runs split (walkthrough 163). What
    names, tags, logs or places a run, or chose it, is no setting."""
    from litlab.report.compare import compare, facts

    acc = {"metric": "val/acc", "mode": "max"}
    trial = ["model.optimizer.lr=0.002", "hparams_search=cnn_optuna", "logger=csv"]
    runs = [
        ("trial", [*trial, "seed=42"], 0.80),
        ("s1", ["model.optimizer.lr=0.002", "seed=1"], 0.82),
    ]
    runs += [("s2", ["model.optimizer.lr=0.002", "seed=2", "tags=[confirm]"], 0.84)]
    runs += [("other", ["model.optimizer.lr=0.01", "seed=1", "hydra.job.chdir=false"], 0.5)]
    for name, overrides, value in runs:
        summary = {"status": "completed", "objective": {**acc, "value": value}}
        write_run(tmp_path / name, summary, overrides)
    comparison = compare(find_runs([tmp_path]))
    assert comparison.varied == ["model.optimizer.lr", "seed"]
    assert dict(facts(comparison))["Over seeds"].startswith(
        "model.optimizer.lr=0.002: mean 0.82 ± 0.02 (n=3)"
    )


def test_over_seeds_groups_settings_not_override_order_and_ranks_repeats_first(tmp_path):
    """A setting's runs are one group whatever the order of their overrides; a setting with
    one ranked run (its other seeds failed) comes after the repeated ones, however lucky; a
    grid beside one failed run of another seed repeats nothing: no Over seeds line."""
    from litlab.report.compare import compare, facts

    acc = {"metric": "val/acc", "mode": "max"}

    def run(name: str, value: float | None, *overrides: str) -> None:
        status = "completed" if value is not None else "failed"
        summary = {"status": status, "objective": {**acc, "value": value}}
        write_run(tmp_path / name, summary, list(overrides))

    run("a", 0.90, "model.optimizer.lr=0.01", "model.net.width=32", "seed=1")
    run("b", 0.91, "model.net.width=32", "model.optimizer.lr=0.01", "seed=2")
    run("c", 0.97, "model.optimizer.lr=0.1", "model.net.width=64", "seed=1")
    run("d", None, "model.optimizer.lr=0.1", "model.net.width=64", "seed=2")
    lines = dict(facts(compare(find_runs([tmp_path]))))
    assert lines["Over seeds"].startswith(
        "model.net.width=32 model.optimizer.lr=0.01: mean 0.905 ± 0.007071 (n=2); "
        "model.net.width=64 model.optimizer.lr=0.1: 0.97 (n=1 of 2: 1 failed or without a value)"
    )  # its failed seed said (it read n=1, as a setting run once)
    assert lines["Best run"].endswith(
        "(one seed's; its setting has 1 seed(s) that failed or have no value)"
    )
    # a run ranked on another scale is not a failed seed; a setting whose every seed failed
    # is said, last
    other = {"status": "completed", "objective": {**acc, "value": 0.5}, "data": {"source": "x"}}
    write_run(tmp_path / "h", other, ["model.optimizer.lr=0.1", "model.net.width=64", "seed=3"])
    run("i", None, "model.optimizer.lr=0.2", "model.net.width=64", "seed=1")
    lines = dict(facts(compare(find_runs([tmp_path]))))
    assert lines["Over seeds"].startswith(
        "model.net.width=32 model.optimizer.lr=0.01: mean 0.905 ± 0.007071 (n=2); "
        "model.net.width=64 model.optimizer.lr=0.1: 0.97 (n=1 of 2: 1 failed or without a value); "
        "model.net.width=64 model.optimizer.lr=0.2: no value (its 1 seed(s) failed or have none)"
    )
    shutil.rmtree(tmp_path / "h")
    shutil.rmtree(tmp_path / "i")
    for name in "abcd":
        shutil.rmtree(tmp_path / name)
    run("e", 0.90, "model.optimizer.lr=0.1", "seed=1")
    run("f", 0.80, "model.optimizer.lr=0.01", "seed=1")
    run("g", None, "model.optimizer.lr=0.01", "seed=2")
    lines = dict(facts(compare(find_runs([tmp_path]))))
    assert "Over seeds" not in lines and "one seed" not in lines["Best run"], lines


def test_runs_of_other_commits_are_named_as_such(tmp_path):
    """Runs of the same overrides from other commits may differ in their defaults or code; the
    report ranked them as like for like without a word (summary.json records the commit)."""
    from litlab.report.compare import compare, facts

    acc = {"metric": "val/acc", "mode": "max"}
    for name, commit in [("a", "1111111111aa"), ("b", "2222222222bb"), ("c", "2222222222bb")]:
        summary = {"status": "completed", "objective": {**acc, "value": 0.5}, "git_commit": commit}
        write_run(tmp_path / name, summary)
    lines = dict(facts(compare(find_runs([tmp_path]))))
    assert lines["Code"] == "the runs come from 2 commits: 22222222 (2), 11111111 (1)"
    # a run of the same commit with uncommitted changes: its code is not the commit's
    summary = json.loads((tmp_path / "c" / "summary.json").read_text())
    (tmp_path / "c" / "summary.json").write_text(json.dumps({**summary, "git_dirty": True}))
    lines = dict(facts(compare(find_runs([tmp_path]))))
    assert lines["Code"].endswith("; 1 run(s) with uncommitted changes to the code: c")


def test_settings_compare_by_value_not_by_how_they_were_typed(tmp_path):
    """One sweep gave model.optimizer.lr=3e-3, another left it at its default, 0.003: the
    report made them two settings, "(the same settings)" and "model.optimizer.lr=0.003", each
    n=2, and left the second sweep out of the objective-vs-lr plot (review 152). A key a run
    does not override has the value its saved config holds; a config group's, Hydra's choice."""
    from litlab.report.compare import compare, facts, numeric_params
    from litlab.report.plots import sweep_points

    loss = {"metric": "val/loss", "mode": "min"}

    def run(name: str, value: float, overrides: list[str], config: str, model: str) -> None:
        summary = {"status": "completed", "objective": {**loss, "value": value}}
        write_run(tmp_path / name, summary, overrides)
        (tmp_path / name / ".hydra" / "config.yaml").write_text(config)
        choices = f"hydra:\n  runtime:\n    choices:\n      model: {model}\n"
        (tmp_path / name / ".hydra" / "hydra.yaml").write_text(choices)

    default = "seed: 1\nmodel:\n  optimizer:\n    lr: 0.003\n"
    run("a1", 0.15, ["model.optimizer.lr=3e-3", "seed=1"], default, "cnn")
    run("a2", 0.24, ["model.optimizer.lr=3e-3", "seed=2"], default, "cnn")
    run("b1", 0.30, ["model.optimizer.lr=1e-3", "seed=1"], default, "cnn")
    run("b2", 0.40, ["model.optimizer.lr=1e-3", "seed=2"], default, "cnn")
    run("e1", 0.15, ["seed=1"], default, "cnn")
    run("e2", 0.24, ["seed=2"], default, "cnn")
    comparison = compare(find_runs([tmp_path]))
    lines = dict(facts(comparison))
    assert lines["Over seeds"].startswith(
        "model.optimizer.lr=0.003: mean 0.195 ± 0.06364 (n=2) (2 more run(s) of a seed already "
        "counted: one value a seed); model.optimizer.lr=0.001: mean 0.35 ± 0.07071 (n=2)"
    ), lines["Over seeds"]
    assert "(the same settings)" not in lines["Over seeds"]
    assert numeric_params(comparison.runs, comparison.varied) == ["model.optimizer.lr"]
    points = sweep_points(comparison, "model.optimizer.lr")
    assert sorted(run.name for _, _, run in points) == ["a1", "a2", "b1", "b2", "e1", "e2"]
    assert {x for x, _, run in points if run.name.startswith("e")} == {0.003}
    # a config group given in one run at the choice the others had by default varies nothing
    run("c1", 0.5, ["model=cnn", "seed=3"], default, "cnn")
    assert "model" not in compare(find_runs([tmp_path])).varied
    run("d1", 0.5, ["model=resnet", "seed=3"], default, "resnet")
    comparison = compare(find_runs([tmp_path]))
    assert "model" in comparison.varied
    assert {run.name: run.setting("model") for run in comparison.runs}["e1"] == "cnn"
    # a node one run sets to null, the other's default holding an interpolation to Hydra's
    # resolver, which the report's process has not (review 154: a traceback)
    node = "callbacks:\n  ckpt:\n    dirpath: ${paths.out}/checkpoints\npaths:\n  out: ${hydra:runtime.output_dir}\n"
    run("f1", 0.5, ["callbacks.ckpt=null", "seed=4"], default + node, "cnn")
    run("f2", 0.5, ["seed=5"], default + node, "cnn")
    comparison = compare(find_runs([tmp_path]))
    assert "callbacks.ckpt" in comparison.varied
    assert {run.name: run.setting("callbacks.ckpt") for run in comparison.runs}["f2"] == (
        '{"dirpath": "${paths.out}/checkpoints"}'
    )


def test_a_running_run_whose_process_is_gone_is_lost(tmp_path):
    """A run killed hard (SIGKILL, out of memory) stays "running" in its summary.json: the
    report showed it running for good (review 152). Where its process ran on this machine and
    is gone it is "lost", with the resume= line that continues it; a live one, or one on
    another machine (nothing can be told), stays running."""
    import platform
    from datetime import datetime, timezone

    from litlab.files import pid_namespace
    from litlab.report.compare import compare, facts

    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait()
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        now = datetime.now(timezone.utc).isoformat(timespec="seconds")
        here = {"status": "running", "host": platform.node(), "pid_namespace": pid_namespace()}
        write_run(tmp_path / "killed", {**here, "pid": ended.pid, "started_at": now})
        write_run(tmp_path / "live", {**here, "pid": live.pid, "started_at": now})
        elsewhere = {**here, "host": f"not-{platform.node()}", "pid": ended.pid}
        write_run(tmp_path / "elsewhere", {**elsewhere, "started_at": now})
        launched = "torchrun --nnodes=1 --nproc_per_node=2"  # as summary.json records it
        write_run(tmp_path / "ranks", {**here, "pid": ended.pid, "launched_as": launched})
        for saved in ("killed", "ranks"):
            (tmp_path / saved / "checkpoints").mkdir()
            (tmp_path / saved / "checkpoints" / "last.ckpt").touch()
        # killed before its first checkpoint: nothing to continue (walkthrough 176: told to)
        write_run(tmp_path / "early", {**here, "pid": ended.pid, "started_at": now})
        comparison = compare(find_runs([tmp_path]))
        status = {run.name: run.status for run in comparison.runs}
        assert status == {
            "killed": "lost",
            "live": "running",
            "elsewhere": "running",
            "ranks": "lost",
            "early": "lost",
        }
        early = next(run for run in comparison.runs if run.name == "early")
        assert early.error.endswith("; it wrote no checkpoint to continue from: start it again")
        killed = next(run for run in comparison.runs if run.name == "killed")
        assert f"; python train.py resume={tmp_path / 'killed'} continues it" in killed.error
        # a torchrun run's: with its launcher (a plain one is refused: another process count)
        ranks = next(run for run in comparison.runs if run.name == "ranks")
        assert f"; {launched} train.py resume={tmp_path / 'ranks'} continues it" in ranks.error
        assert dict(facts(comparison))["Runs"] == "5 (3 lost, 2 running)"
        # report.md has the whole line (its table's cell cut it to "…": walkthrough 182)
        from litlab.report.markdown import render_markdown

        md = render_markdown(comparison, [tmp_path])
        assert f"- `killed` (lost): its process {ended.pid}" in md
        assert f"python train.py resume={tmp_path / 'killed'} continues it" in md
    finally:
        live.kill()
        live.wait()


def test_a_tie_for_best_is_said_and_a_run_of_another_direction_is_not_ranked(tmp_path):
    """Equal objective values (common: 144 validation images move val/acc in steps of 0.7%)
    named the first folder given best without a word; and a run that maximized val/loss
    (an old summary, or a metric of no known direction) was ranked among those minimizing
    it, its worst value "best" (review 152)."""
    from litlab.report.compare import compare, facts

    loss = {"metric": "val/loss", "mode": "min"}
    for name, value in [("a", 0.2), ("b", 0.1), ("c", 0.1), ("d", 0.3)]:
        write_run(tmp_path / name, {"status": "completed", "objective": {**loss, "value": value}})
    maxed = {"status": "completed", "objective": {**loss, "mode": "max", "value": 0.9}}
    write_run(tmp_path / "e", maxed)
    comparison = compare(find_runs([tmp_path]))
    assert [run.name for run in comparison.runs] == ["b", "c", "a", "d", "e"]
    assert comparison.best.name == "b" and not comparison.comparable(comparison.runs[-1])
    best = dict(facts(comparison))["Best run"]
    assert best.startswith("b: val/loss = 0.1") and "(tied with 1 other run(s): c;" in best
    assert comparison.cells(5, comparison.runs[-1])[0] == ""


def test_runs_on_other_numbers_of_processes_are_other_settings(tmp_path):
    """A torchrun run on 2 processes and a plain one on 1 have the same overrides and saved
    config (torchrun's layout is not an override): the report made them one setting over
    seeds, "(the same settings) n=2" (walkthrough 153). Each step's batch is data.batch_size x
    processes: summary.json's world_size sets them apart, shown beside the overrides."""
    from litlab.report.compare import compare, facts

    loss = {"metric": "val/loss", "mode": "min"}
    for name, world, seed, value in [("a", 2, 1, 0.1), ("b", 2, 2, 0.2), ("c", 1, 1, 0.3)]:
        summary = {"status": "completed", "objective": {**loss, "value": value}}
        write_run(tmp_path / name, {**summary, "world_size": world}, [f"seed={seed}"])
    write_run(
        tmp_path / "d", {"status": "completed", "objective": {**loss, "value": 0.4}}, ["seed=2"]
    )  # fmt: skip  (a summary before world_size was recorded: unknown)
    comparison = compare(find_runs([tmp_path]))
    assert comparison.varied == ["seed", "processes"]
    assert dict(facts(comparison))["Over seeds"].startswith(
        "processes=2: mean 0.15 ± 0.07071 (n=2); processes=1: 0.3 (n=1)"
    )
    assert comparison.cells(1, comparison.runs[0])[2] == "seed=1 processes=2"
    assert comparison.cells(4, comparison.runs[3])[2] == "seed=2"
    # all on one number of processes: nothing said
    for name in "bc":
        shutil.rmtree(tmp_path / name)
    assert compare(find_runs([tmp_path])).varied == ["seed"]


def test_an_eval_run_beside_training_runs_varies_none_of_their_settings(tmp_path):
    """Two runs of two learning rates and an eval.py run of one of them: the report said 12
    keys varied (walkthrough 157), the eval run having none of the training's settings and
    its own; what varies is what sets the training runs apart."""
    from litlab.report.compare import compare

    done = {"status": "completed", "objective": {"metric": "val/acc", "mode": "max", "value": 0.9}}
    same = ["data=image_folder", "data.num_classes=3", "model=torchvision"]
    write_run(tmp_path / "1", done, ["model.optimizer.lr=0.01", *same])
    write_run(tmp_path / "2", done, ["model.optimizer.lr=0.003", *same])
    evaluated = {"status": "completed", "metrics": {"test/acc": 0.85}}
    evaluated = {"task": "eval", **evaluated}
    write_run(tmp_path / "3", evaluated, ["ckpt_path=/r/1/best.ckpt", "data=image_folder"])
    assert compare(find_runs([tmp_path])).varied == ["model.optimizer.lr"]
    # eval runs of their own settings: what sets them apart among them too (review 161)
    write_run(tmp_path / "4", evaluated, ["ckpt_path=/r/1/best.ckpt", "data=cifar10"])
    varied = compare(find_runs([tmp_path])).varied
    assert varied == ["model.optimizer.lr", "data"]
    alone = tmp_path / "evals"
    for name, path in (("a", "/r/1/best.ckpt"), ("b", "/r/2/best.ckpt")):  # eval runs alone
        write_run(alone / name, evaluated, [f"ckpt_path={path}"])
    assert compare(find_runs([alone])).varied == ["ckpt_path"]


def test_the_classes_mean_accuracy_has_a_column_beside_the_accuracy(tmp_path):
    """test/acc_macro (each class counted alike) was in summary.json and not in the report,
    where an unbalanced test's test/acc alone was shown (walkthrough 160)."""
    objective = {"metric": "val/acc", "mode": "max", "value": 0.9}
    for name, macro in (("1", 0.5), ("2", 0.75)):
        metrics = {"test/acc": 0.9, "test/acc_macro": macro}
        write_run(
            tmp_path / name, {"status": "completed", "metrics": metrics, "objective": objective}
        )
    main([str(tmp_path)])
    md = (tmp_path / "report.md").read_text()
    assert "| test/acc (final weights) | test/acc_macro (final weights) |" in md
    assert "| 0.9 | 0.75 |" in md and "| 0.9 | 0.5 |" in md
