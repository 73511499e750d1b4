"""Sweeps: Optuna and grid multiruns that survive failures, resumable studies, W&B grouping."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
import yaml

from conftest import QUIET, REPO, make_cfg, run_cli
from wandb_records import offline_run


def sweep_dirs(root: Path) -> list[Path]:
    return sorted(p.parent for p in root.rglob("sweep_summary.json"))


def jobs(sweep: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(sweep.glob("*/summary.json"))]


@pytest.mark.slow
def test_optuna_sweep_prints_the_best_and_the_report_reads_it(tmp_path):
    """The issue's command, as written, then the offline report."""
    result = run_cli(
        "-m",
        "hparams_search=cnn_optuna",
        "hydra.sweeper.n_trials=4",
        "data=digits",
        "trainer.max_epochs=1",
        "logger=csv",
        *QUIET,
        f"paths.log_dir={tmp_path}",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    (sweep,) = sweep_dirs(tmp_path)
    best = yaml.safe_load((sweep / "optimization_results.yaml").read_text())
    assert "model.optimizer.lr" in best["best_params"] and "Best parameters" in result.stdout
    summary = json.loads((sweep / "sweep_summary.json").read_text())
    assert summary["completed"] == 4 and summary["best"]["objective"]["value"] == pytest.approx(
        best["best_value"]
    )
    assert "best of 4 jobs" in result.stdout and str(sweep) in result.stdout
    # the best job alone, as a command: not its sweep's search (pasted, a new study of
    # identical trials: walkthrough 163)
    (line,) = [line for line in result.stdout.splitlines() if "best of 4 jobs" in line]
    again = line.split("; to train it again: ")[1]
    assert again.startswith("python train.py ") and "model.optimizer.lr=" in again
    assert "hparams_search" not in again and "data=digits" in again
    report = subprocess.run(
        [sys.executable, "-m", "litlab.report", str(sweep)], capture_output=True, text=True
    )
    assert report.returncode == 0, report.stderr
    html = (sweep / "report.html").read_text()
    assert html.count("data:image/png;base64,") >= 2 and "http://" not in html


@pytest.mark.slow
def test_a_failing_job_is_recorded_and_the_study_goes_on_and_resumes(tmp_path):
    space = (  # batch size 5000 > the training images: those jobs fail
        'hydra.sweeper.params={data.batch_size:"choice(32,5000)",'
        'model.optimizer.lr:"tag(log, interval(0.0003, 0.01))"}'
    )
    first = run_cli(
        "-m",
        "hparams_search=cnn_optuna",
        "hydra.sweeper.n_trials=4",
        space,
        "trainer.max_epochs=1",
        "logger=csv",
        *QUIET,
        f"paths.log_dir={tmp_path / 'a'}",
    )
    assert first.returncode == 0, first.stderr[-3000:]
    (sweep,) = sweep_dirs(tmp_path / "a")
    results = jobs(sweep)
    failed = [j for j in results if j["status"] == "failed"]
    assert failed and len(failed) < 4
    assert all("batch_size 5000 exceeds" in j["error"] for j in failed)
    # each failed trial said as such, not as the objective's fault (Hydra's Optuna sweeper:
    # "Return value must be float-castable. Got 'None'.")
    output = first.stdout + first.stderr
    assert "float-castable" not in output
    assert output.count("the job gave no value (failed or stopped: said above)") == len(failed)
    summary = json.loads((sweep / "sweep_summary.json").read_text())
    assert len(summary["failed"]) == len(failed)
    assert summary["best"]["objective"]["value"] < 1.0  # val/loss of a trained net (untrained: 2.3)
    study = optuna.load_study(study_name="cnn_optuna", storage=f"sqlite:///{sweep}/optuna.db")
    states = [t.state for t in study.trials]
    assert states.count(optuna.trial.TrialState.FAIL) == len(failed) and len(states) == 4

    # Resume: the same study, two more trials, in a new sweep folder; nothing earlier is touched.
    before = {p: p.stat().st_mtime_ns for p in sweep.rglob("summary.json")}
    second = run_cli(
        "-m",
        "hparams_search=cnn_optuna",
        "hydra.sweeper.n_trials=2",
        space,
        "trainer.max_epochs=1",
        "logger=wandb",
        *QUIET,
        f"paths.log_dir={tmp_path / 'b'}",
        f"hydra.sweeper.storage=sqlite:///{sweep}/optuna.db",
    )
    assert second.returncode == 0, second.stderr[-3000:]
    # its W&B runs in the study's group, the first launch's (its folder's)
    records = [offline_run(p) for p in sorted((tmp_path / "b").rglob("offline-run-*"))]
    assert {r["group"] for r in records} == {f"train-{sweep.parent.name}_{sweep.name}"}
    assert len(study_trials(sweep)) == 6
    assert {p: p.stat().st_mtime_ns for p in sweep.rglob("summary.json")} == before
    assert len(jobs(sweep_dirs(tmp_path / "b")[0])) == 2
    # The continued study draws new trials, not the first launch's again (same sampler seed).
    lrs = [t.params["model.optimizer.lr"] for t in study_trials(sweep)]
    assert len(set(lrs)) == 6, lrs
    # The continued launch's summary names the study's best, over the first launch's trials too
    # ("best of 2 jobs" is this launch's own; found by review).
    done = [t for t in study_trials(sweep) if t.value is not None]
    best = min(done, key=lambda t: t.value)  # val/loss (digits')
    (later,) = sweep_dirs(tmp_path / "b")
    study = json.loads((later / "sweep_summary.json").read_text())["study_best"]
    # the report over the study's every launch (it named this launch's folder alone: 163)
    assert f"compare the runs offline: python -m litlab.report {sweep} {later}" in second.stdout
    assert study == {"value": pytest.approx(best.value), "params": best.params}


def study_trials(sweep: Path) -> list[optuna.trial.FrozenTrial]:
    return optuna.load_study(study_name="cnn_optuna", storage=f"sqlite:///{sweep}/optuna.db").trials


def test_a_study_made_in_the_other_direction_is_refused_before_any_trial(tmp_path):
    """A digits study from before data=digits chose val/loss maximized val/acc; continued as the
    README says, Optuna's "Cannot overwrite study direction" was taken for a sweep whose
    trials all failed: no trial ran, and the sweep ended with status 0."""
    storage = f"sqlite:///{tmp_path / 'old' / 'optuna.db'}"
    (tmp_path / "old").mkdir()
    optuna.create_study(study_name="cnn_optuna", storage=storage, direction="maximize")
    result = run_cli(
        "-m",
        "hparams_search=cnn_optuna",
        "hydra.sweeper.n_trials=1",
        f"hydra.sweeper.storage={storage}",
        "logger=csv",
        *QUIET,
        f"paths.log_dir={tmp_path / 'new'}",
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-3000:]
    line = result.stderr.strip().splitlines()[-1]
    assert (
        line.startswith("litlab: error: the Optuna study cnn_optuna in ")
        and (
            "was made to maximize its objective, but this sweep's objective, val/loss (min), would "
            "minimize: continue it with the objective it was made with (e.g. objective=accuracy"
        )
        in line
    )
    assert not list((tmp_path / "new").rglob("summary.json"))  # no trial ran
    assert not list((tmp_path / "new" / "train" / "multirun").glob("*"))  # nor an empty folder


def test_a_search_over_a_key_the_config_lacks_is_refused_before_any_trial(tmp_path):
    """cnn_optuna searches model.net.width, which model/net=custom lacks (and a misspelled
    key is alike): each job's config failed to compose in Hydra's advice to append it with +,
    and the sweep ended with a FAIL trial and no summary (walkthrough 136). One line, which
    says how to leave a key out; no trial, no sweep folder."""
    result = run_cli(
        "-m",
        "hparams_search=cnn_optuna",
        "hydra.sweeper.n_trials=1",
        "model/net=custom",
        "model.net._target_=tiny_mlp.TinyMLP",
        "+model.net.in_features=choice(64,784)",  # searched, appended: not refused
        "model.optimizer.lr=choice(0.01,0.02)",
        "logger=csv",
        *QUIET,
        f"paths.log_dir={tmp_path}",
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-3000:]
    line = result.stderr.strip().splitlines()[-1]
    assert line.startswith(
        "litlab: error: the Optuna study searches what the config does not have "
        "(hydra.sweeper.params.model.net.width=choice(16, 32, 64)): "
    ), line
    assert "a copy of conf/hparams_search/cnn_optuna.yaml without it" in line
    assert not list((tmp_path / "train" / "multirun").glob("*/*"))  # no sweep folder


def test_a_grid_sweeps_planned_jobs_take_a_keys_later_value_as_hydra_does():
    """A key given twice (a value, then a sweep of it; a sweeper param, then the command's
    sweep): each planned job holds the value Hydra runs, the command's own spelling of the
    others (review 138: not_run said seed=3 for jobs of seeds 1 and 2)."""
    from omegaconf import OmegaConf

    from litlab.sweep import planned_jobs

    basic = "hydra._internal.core_plugins.basic_sweeper.BasicSweeper"
    task = ["seed=3", "seed=1,2", "model.optimizer.lr=0.1,0.2", "extras.print_config=false"]
    task += ["data.batch_size=64,128", "data.batch_size=32"]
    config = OmegaConf.create(
        {
            "hydra": {
                "sweeper": {"_target_": basic, "params": {"model.optimizer.lr": 0.5}},
                "overrides": {"task": task},
            }
        }
    )
    assert planned_jobs(config) == [
        ["model.optimizer.lr=0.1", "seed=1", "extras.print_config=false", "data.batch_size=32"],
        ["model.optimizer.lr=0.1", "seed=2", "extras.print_config=false", "data.batch_size=32"],
        ["model.optimizer.lr=0.2", "seed=1", "extras.print_config=false", "data.batch_size=32"],
        ["model.optimizer.lr=0.2", "seed=2", "extras.print_config=false", "data.batch_size=32"],
    ]


def test_the_missing_search_key_check_leaves_valid_searches_alone(capsys):
    """The check reads the sweep's config, composed without the searched values: a key that a
    group searched in the same study brings (resnet's model.optimizer.nesterov), a key whose
    value is to be given (???), an appended key and a group's own choice all pass (review
    138: the first two were refused); a typo is refused with advice for where it was given."""
    from omegaconf import OmegaConf

    from litlab.sweep import refuse_a_search_over_a_missing_key as check

    config = OmegaConf.create(
        {
            "hydra": {"runtime": {"choices": {"model": "cnn", "hparams_search": "cnn_optuna"}}},
            "model": {"optimizer": {"lr": 0.1}, "net": {"width": 8}},
            "data": {"source": {"root": "???"}, "image_shape": [1, 8, 8]},
        }
    )
    for arguments in (
        ["model=choice(resnet,cnn)", "model.optimizer.nesterov=choice(true,false)"],
        ["model/net=choice(resnet,custom)", "model.net.depth=choice(1,2)"],
        ["data.source.root=choice(/a,/b)", "data.image_shape.0=choice(1,3)"],
        ["+model.net.hidden=choice(8,16)", "model.net.width=choice(8,16)"],
    ):
        check(config, arguments, {"model.optimizer.lr": "interval(0.01, 0.1)"})
    with pytest.raises(SystemExit):
        check(config, ["model.net.widht=choice(8,16)"], {})
    assert "correct it, or leave it out of the command;" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        check(config, [], {"model.net.depth": "choice(1,2)"})
    said = capsys.readouterr().err
    assert "(hydra.sweeper.params.model.net.depth=choice(1,2))" in said
    assert "a copy of conf/hparams_search/cnn_optuna.yaml without it" in said


def test_the_other_direction_refusal_names_the_studys_own_objective(tmp_path, capsys):
    """A study that recorded its measure (val/loss, minimized) continued with objective=accuracy:
    the refusal named no metric of the study's and advised objective=accuracy, what the user
    had just passed (walkthrough 136); it names val/loss and objective=loss."""
    from omegaconf import OmegaConf

    from litlab.sweep import refuse_another_direction

    storage = f"sqlite:///{tmp_path / 'optuna.db'}"
    held = optuna.create_study(study_name="s", storage=storage, direction="minimize")
    held.set_user_attr("litlab_measure", {"metric": "val/loss", "data": {}, "settings": {}})
    config = OmegaConf.create(
        {
            "hydra": {"sweeper": {"direction": "maximize"}},
            "objective": {"metric": "val/acc", "mode": "max"},
        }
    )
    with pytest.raises(SystemExit) as exit_info:
        refuse_another_direction(config, storage, "s")
    assert exit_info.value.code == 2
    line = capsys.readouterr().err.strip()
    said = (
        "was made to minimize its objective, val/loss, but this sweep's objective, val/acc "
        "(max), would maximize: continue it with the objective it was made with "
        "(objective=loss), or start another study"
    )
    assert line.startswith("litlab: error: the Optuna study s in ") and said in line, line


def test_a_sweep_with_no_completed_job_keeps_its_summary_and_says_so(tmp_path):
    result = run_cli(
        "-m",
        "hparams_search=cnn_optuna",
        "hydra.sweeper.n_trials=2",
        'hydra.sweeper.params={data.batch_size:"choice(5000)"}',  # > the training images
        "logger=csv",
        *QUIET,
        f"paths.log_dir={tmp_path}",
    )
    (sweep,) = sweep_dirs(tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert (
        f"litlab: error: no job of the sweep in {sweep} completed with an objective value "
        "(2 failed" in result.stderr
    )
    summary = json.loads((sweep / "sweep_summary.json").read_text())
    assert summary["completed"] == 0 and len(summary["failed"]) == 2 and summary["best"] is None
    assert [t.state for t in study_trials(sweep)] == [optuna.trial.TrialState.FAIL] * 2


@pytest.mark.slow
def test_grid_sweep_jobs_are_grouped_w_and_b_runs(tmp_path):
    result = run_cli(
        "-m",
        "model.optimizer.lr=0.001,0.003",
        "trainer.max_epochs=1",
        "logger=wandb",
        *QUIET,
        f"paths.log_dir={tmp_path}",
        f"paths.cache_dir={tmp_path / 'cache'}",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    records = [offline_run(p) for p in sorted(tmp_path.rglob("offline-run-*"))]
    assert len(records) == 2 and len({r["id"] for r in records}) == 2
    (sweep,) = sweep_dirs(tmp_path)
    assert {r["group"] for r in records} == {f"train-{sweep.parent.name}_{sweep.name}"}
    assert {r["job_type"] for r in records} == {"train"}
    # Named after the overrides (housekeeping keys such as paths.log_dir, paths.cache_dir and
    # logger left out).
    names = sorted(r["name"] for r in records)
    assert names == [f"model.optimizer.lr={lr},trainer.max_epochs=1" for lr in ("0.001", "0.003")]
    for record in records:
        assert record["name"].split(",")[0] in record["tags"]
    # The config is flat: every key is a column in the dashboard's table and parallel coordinates.
    assert sorted(r["config"]["model.optimizer.lr"] for r in records) == [0.001, 0.003]
    assert "model" not in records[0]["config"]
    # A job resumed (resume=<its folder>) stays in its sweep's group, under its id and name
    # (before: its next part had no group).
    job = sweep / "0"
    resumed = run_cli(f"resume={job}", "trainer.max_epochs=2")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    first, then = (offline_run(p) for p in sorted((job / "wandb").glob("offline-run-*")))
    assert (then["id"], then["name"], then["group"]) == (first["id"], first["name"], first["group"])
    # the name stays the first command's; what the resume changed is tagged
    assert "trainer.max_epochs=1" in then["tags"] and "resumed:trainer.max_epochs=2" in then["tags"]
    assert not any(t.startswith("resumed:") for t in first["tags"])


def test_a_sweep_of_test_only_jobs_completes(tmp_path):
    """`-m train=false seed=1,2` (untrained scores over seeds): every job tested, then failed
    for want of an objective that nothing validates (the sweep exited 2)."""
    args = ["-m", "train=false", "seed=1,2", "logger=csv", *QUIET, f"paths.log_dir={tmp_path}"]
    result = run_cli(*args)
    assert result.returncode == 0, result.stderr[-3000:]
    summaries = [json.loads(p.read_text()) for p in sorted(tmp_path.rglob("*/summary.json"))]
    assert [s["status"] for s in summaries] == ["completed", "completed"]
    assert all("test/acc" in s["metrics"] for s in summaries)


def test_run_folders_never_collide(tmp_path):
    """Two runs and two sweeps started at the same moment each get their own folder."""
    args = [*QUIET, "logger=csv", "test=false", f"paths.log_dir={tmp_path}"]
    # A sweep's jobs train (one batch): a sweep of which no job completed exits with an error.
    one_batch = ["trainer.max_epochs=1", "+trainer.limit_train_batches=1"]
    sweep = ["-m", "seed=1,2", *one_batch, "+trainer.limit_val_batches=1"]
    procs = []
    for extra in (["train=false"], ["train=false"], sweep, sweep):
        procs.append(
            subprocess.Popen(
                [sys.executable, str(REPO / "train.py"), *extra, *args],
                cwd=REPO,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )
        time.sleep(0.01)
    assert [p.wait(timeout=300) for p in procs] == [0, 0, 0, 0]
    single = [p for p in (tmp_path / "train").glob("*/*") if p.parent.name != "multirun"]
    assert len(single) == 2 and all((p / "summary.json").is_file() for p in single)
    sweeps = sweep_dirs(tmp_path)
    assert len(sweeps) == 2 and all(len(jobs(s)) == 2 for s in sweeps)


def test_a_multirun_of_jobs_without_an_objective_ends_without_an_error(tmp_path):
    """python eval.py -m ...: its jobs complete with test metrics and no objective."""
    from omegaconf import OmegaConf

    from litlab.sweep import SweepSummary

    for job in ("0", "1"):
        (tmp_path / job).mkdir()
        summary = {"task": "eval", "status": "completed", "metrics": {"test/acc": 0.9}}
        (tmp_path / job / "summary.json").write_text(json.dumps(summary))
    SweepSummary().on_multirun_end(OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path)}}}))
    summary = json.loads((tmp_path / "sweep_summary.json").read_text())
    assert summary["completed"] == 2 and summary["failed"] == [] and summary["best"] is None


def test_an_interrupted_job_is_listed_apart_from_the_failed_ones(tmp_path, caplog):
    """A job stopped by a signal (a preempted SLURM job) continues with resume=: the sweep's
    summary listed it under "failed" and counted it in the "(N failed)" of the best's line."""
    from omegaconf import OmegaConf

    from litlab.sweep import SweepSummary

    objective = {"metric": "val/acc", "mode": "max", "value": 0.9}
    jobs = {
        "0": {"status": "completed", "objective": objective, "metrics": {"val/acc": 0.9}},
        "1": {"status": "failed", "error": "ConfigError: batch_size 5000 exceeds"},
        "2": {"status": "interrupted", "error": "stopped by a signal; continue with: resume=x"},
    }
    for job, summary in jobs.items():
        (tmp_path / job).mkdir()
        (tmp_path / job / "summary.json").write_text(json.dumps(summary))
    with caplog.at_level("INFO", logger="litlab"):
        SweepSummary().on_multirun_end(
            OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path)}}})
        )
    written = json.loads((tmp_path / "sweep_summary.json").read_text())
    assert written["completed"] == 1
    assert [j["job_dir"] for j in written["failed"]] == [str(tmp_path / "1")]
    assert written["interrupted"] == [{"job_dir": str(tmp_path / "2"), "error": jobs["2"]["error"]}]
    assert "best of 3 jobs (1 failed, 1 interrupted)" in caplog.text
    assert f"interrupted job {tmp_path / '2'}: stopped by a signal" in caplog.text


@pytest.mark.slow
def test_a_sweep_stopped_by_a_signal_in_a_job_summarizes_the_jobs_that_ran(tmp_path):
    """The local launcher runs the jobs in its own process: SIGTERM in job 1 (of 3) ends the
    sweep (exit 143), and the summary holds job 0 (the best) and job 1 (interrupted, with how
    to continue it), marked stopped. Before: no sweep_summary.json at all."""
    signal_in_job_1 = ["+callbacks.stop._target_=helpers.SignalAt", "+callbacks.stop.batch=-1,3,-1"]
    command = ["trainer.max_epochs=1", "model.net.width=8", "data.batch_size=128", "logger=csv"]
    command += [*QUIET, *signal_in_job_1, f"paths.log_dir={tmp_path}"]
    result = run_cli("-m", *command)
    assert result.returncode == 143, result.stderr[-3000:]
    (sweep,) = sweep_dirs(tmp_path)
    summary = json.loads((sweep / "sweep_summary.json").read_text())
    assert summary["stopped"] is True and summary["jobs"] == 2 and summary["completed"] == 1
    assert summary["best"]["job_dir"] == str(sweep / "0")
    (stopped,) = summary["interrupted"]
    assert stopped["job_dir"] == str(sweep / "1") and f"resume={sweep / '1'}" in stopped["error"]
    assert not (sweep / "2").exists()
    # the job that never ran: counted, and its overrides kept (multirun.yaml alone had them),
    # all of them, as a shell line that runs that job alone (the swept one alone dropped the
    # command's trainer.max_epochs=1 and the rest: walkthrough 136)
    assert summary["planned"] == 3 and len(summary["not_run"]) == 1
    job = [o.replace("=-1,3,-1", "=-1") for o in command]
    assert shlex.split(summary["not_run"][0]) == job
    said = f"the sweep stopped in its job {sweep / '1'}, the 1 of 3 jobs after it did not run"
    assert said in result.stdout
    # and the offline report says so (its table alone showed 2 runs, one interrupted)
    from litlab.report import main as report

    report([str(sweep)])
    said = (
        f"the sweep stopped in its job {sweep / '1'}; the 1 of 3 jobs after it did not run "
        f"(their overrides: not_run in {sweep / 'sweep_summary.json'})"
    )
    assert said in (sweep / "report.md").read_text()


@pytest.mark.slow
def test_a_trial_a_signal_stopped_is_told_to_its_study_when_its_job_is_resumed(tmp_path):
    """SIGTERM in job 1 of a batch of two (n_jobs=2) ends the local sweep before the sweeper
    tells the study: job 0, completed, is told as the sweep stops, and trial 1 stays RUNNING.
    Before: both stayed RUNNING, and job 1 continued with resume= completed in its folder while
    the study never learned it (a continued study reported another best)."""
    stop = [
        "+callbacks.stop._target_=helpers.SignalInJob", "+callbacks.stop.job=1",
        "+callbacks.stop.batch=3", f"+callbacks.stop.mark={tmp_path / 'signalled'}",
    ]  # fmt: skip
    first = run_cli(
        "-m", "hparams_search=cnn_optuna", "hydra.sweeper.n_trials=2", "hydra.sweeper.n_jobs=2",
        "trainer.max_epochs=1", "model.net.width=8", "logger=csv", *QUIET, *stop,
        f"paths.log_dir={tmp_path}",
    )  # fmt: skip
    assert first.returncode == 143, first.stderr[-3000:]
    (sweep,) = sweep_dirs(tmp_path)
    complete, running = optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.RUNNING
    assert [t.state for t in study_trials(sweep)] == [complete, running]
    assert study_trials(sweep)[0].value == jobs(sweep)[0]["objective"]["value"]
    stopped = json.loads((sweep / "1" / "summary.json").read_text())
    assert stopped["status"] == "interrupted" and stopped["optuna_trial"]["number"] == 1
    before = json.loads((sweep / "sweep_summary.json").read_text())
    assert before["stopped"] and [j["job_dir"] for j in before["interrupted"]] == [str(sweep / "1")]

    # a resume with another config (train=false: a test of last.ckpt) is not told; the
    # resume that trains the job on after it is (reviewer 125: no end-to-end test of it)
    tested = run_cli(f"resume={sweep / '1'}", "train=false")
    assert tested.returncode == 0, tested.stderr[-3000:]
    assert "is not told this run's result" in tested.stdout + tested.stderr
    assert study_trials(sweep)[1].state == running
    resumed = run_cli(f"resume={sweep / '1'}")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    done = json.loads((sweep / "1" / "summary.json").read_text())
    assert done["status"] == "completed"
    trial = study_trials(sweep)[1]
    assert trial.state == complete and trial.value == pytest.approx(done["objective"]["value"])
    assert "the Optuna study cnn_optuna now holds its trial 1: val/loss=" in resumed.stdout
    # and the sweep's summary counts it (walkthrough: it still named it interrupted, and the
    # best of job 0 alone, where the report named job 1 best)
    after = json.loads((sweep / "sweep_summary.json").read_text())
    assert after["completed"] == 2 and after["interrupted"] == [] and after["stopped"]
    assert after["stopped_in"] == str(sweep / "1")  # where the sweep stopped (the report's)
    values = [jobs(sweep)[i]["objective"]["value"] for i in (0, 1)]
    assert after["best"]["objective"]["value"] == min(values)
    # the study's best, asked of the study now (the stopped sweep wrote no
    # optimization_results.yaml, and one written at a sweep's end misses trials told since)
    assert before["study_best"]["value"] == pytest.approx(values[0])
    assert after["study_best"]["value"] == pytest.approx(min(values))
    assert after["study_best"]["params"] == study_trials(sweep)[values.index(min(values))].params


@pytest.mark.slow
def test_a_trial_stopped_while_testing_is_told_when_its_job_is_resumed(tmp_path):
    """A job stopped in its test (its fit trained to its end): resume= tests it again with
    train=false set for it, which changed the run's config digest, so the study was never told,
    "a resume with other settings" said, and the trial stayed RUNNING for good (walkthrough
    163). The run is its trial's: told."""
    stop = [  # killed hard (the sweep's process with it), as walkthrough 163 did
        "+callbacks.stop._target_=helpers.SignalInTest", "+callbacks.stop.signum=SIGKILL",
        f"+callbacks.stop.mark={tmp_path / 'm'}",
    ]  # fmt: skip
    first = run_cli(
        "-m", "hparams_search=cnn_optuna", "hydra.sweeper.n_trials=1", "trainer.max_epochs=1",
        "model.net.width=8", "logger=wandb", *QUIET, *stop, f"paths.log_dir={tmp_path}",
    )  # fmt: skip
    assert first.returncode == -9, first.stderr[-3000:]
    (job,) = tmp_path.rglob("0/summary.json")  # (a sweep killed hard writes no sweep summary)
    sweep = job.parent.parent
    assert [t.state for t in study_trials(sweep)] == [optuna.trial.TrialState.RUNNING]
    resumed = run_cli(f"resume={sweep / '0'}")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "testing best.ckpt again, training nothing" in resumed.stdout + resumed.stderr
    done = json.loads((sweep / "0" / "summary.json").read_text())
    assert done["status"] == "completed"
    assert done["config_digest"] == done["optuna_trial"]["config_digest"]
    newest = sorted((sweep / "0" / "wandb").glob("offline-run-*"))[-1]  # the resumed part's
    assert offline_run(newest)["summary"]["config_digest"] == done["config_digest"]  # (164)
    (trial,) = study_trials(sweep)
    assert trial.state == optuna.trial.TrialState.COMPLETE
    assert trial.value == pytest.approx(done["objective"]["value"])


def test_a_trial_stopped_before_its_first_checkpoint_or_never_launched_is_told_failed(tmp_path):
    """Ctrl-C in a trial's first epoch (no checkpoint: resume= refuses its job), and a search
    over config group options that do not exist (its job's config cannot be composed): each
    trial stayed RUNNING for good, and a continued study counted it in flight. Now the study
    holds each as failed."""
    stop = [
        "+callbacks.stop._target_=helpers.SignalInJob", "+callbacks.stop.job=0",
        "+callbacks.stop.batch=2", f"+callbacks.stop.mark={tmp_path / 'signalled'}",
        "+callbacks.stop.signum=SIGINT",
    ]  # fmt: skip
    common = ["-m", "hparams_search=cnn_optuna", "hydra.sweeper.n_trials=2", "logger=csv", *QUIET]
    stopped = run_cli(
        *common, "trainer.max_epochs=1", "model.net.width=8", *stop,
        f"hydra.sweep.dir={tmp_path / 'stopped'}",
    )  # fmt: skip
    assert stopped.returncode != 0, stopped.stderr[-3000:]
    assert not (tmp_path / "stopped" / "0" / "checkpoints" / "last.ckpt").exists()
    assert [t.state for t in study_trials(tmp_path / "stopped")] == [optuna.trial.TrialState.FAIL]
    said = f"trial 0 as failed: its job {tmp_path / 'stopped' / '0'} stopped before its first"
    assert said in stopped.stdout + stopped.stderr
    # a net that does not exist (a misspelled key is refused before any trial: its own test)
    typo = run_cli(*common, "model/net=choice(resnt,cnnn)", f"hydra.sweep.dir={tmp_path / 'typo'}")
    assert typo.returncode == 1 and "Could not find 'model/net/" in typo.stderr
    assert [t.state for t in study_trials(tmp_path / "typo")] == [optuna.trial.TrialState.FAIL]
    assert "trial 0 as failed: the launch of its job failed" in typo.stdout + typo.stderr


def test_a_failed_launch_leaves_the_trials_of_jobs_that_may_run_on(tmp_path):
    """Under submitit (or joblib) one job lost on the cluster makes the launch raise while the
    batch's other jobs still run: their trials stay RUNNING, to be told when they complete
    (reviewer: told FAIL, a finished job's trial stayed failed for good). Jobs run in the
    sweep's own process are all over: those RUNNING are failed."""
    from litlab.sweep import fail_unrun_trials

    storage = f"sqlite:///{tmp_path}/optuna.db"
    study = optuna.create_study(study_name="s", storage=storage)
    trials = [study.ask().number for _ in range(2)]
    fail_unrun_trials(str(tmp_path), storage, "s", trials, in_process=False)
    running, failed = optuna.trial.TrialState.RUNNING, optuna.trial.TrialState.FAIL
    assert [t.state for t in study_trials_named(storage, "s")] == [running, running]
    fail_unrun_trials(str(tmp_path), storage, "s", trials, in_process=True)
    assert [t.state for t in study_trials_named(storage, "s")] == [failed, failed]


def test_resume_of_a_completed_job_tells_its_study_what_it_never_learned(tmp_path, caplog):
    """A sweep killed (or its study locked) after a job completed and before its trial was
    told: resume=<job folder>, with nothing left to train, tells it and ends (exit 0)."""
    from litlab.resume import resume_argv

    storage = f"sqlite:///{tmp_path}/optuna.db"
    study = optuna.create_study(study_name="s", storage=storage, direction="minimize")
    study.ask()  # trial 0, left RUNNING
    job = tmp_path / "0"
    (job / ".hydra").mkdir(parents=True)
    (job / ".hydra" / "config.yaml").write_text("{}\n")
    trial = {"study_name": "s", "storage": storage, "number": 0, "config_digest": "d1"}
    summary = {"status": "completed", "config_digest": "d2", "optuna_trial": trial}
    summary["objective"] = {"metric": "val/loss", "mode": "min", "value": 0.25}
    (job / "summary.json").write_text(json.dumps(summary))
    (job / ".completed").touch()
    with pytest.raises(SystemExit) as refused:  # another config's value: not told
        resume_argv(["train.py", f"resume={job}"])
    assert refused.value.code == 2  # (this folder holds no checkpoint to train further from)
    assert "the run's config is not its trial's" in caplog.text
    assert study_trials_named(storage, "s")[0].state == optuna.trial.TrialState.RUNNING
    (job / "summary.json").write_text(json.dumps({**summary, "config_digest": "d1"}))
    with pytest.raises(SystemExit) as told:
        resume_argv(["train.py", f"resume={job}"])
    assert told.value.code == 0
    (held,) = study_trials_named(storage, "s")
    assert held.state == optuna.trial.TrialState.COMPLETE and held.value == 0.25
    # its trial told, a resume with other settings says nothing of it (it said "it stays
    # RUNNING" of the COMPLETE trial: walkthrough 146)
    (job / "summary.json").write_text(json.dumps(summary))
    caplog.clear()
    with pytest.raises(SystemExit):
        resume_argv(["train.py", f"resume={job}"])
    assert "stays RUNNING" not in caplog.text
    # a study that cannot be read: not "resume= its folder again" for a run never told (149)
    gone = {**summary, "optuna_trial": {**trial, "study_name": "another"}}
    (job / "summary.json").write_text(json.dumps(gone))
    caplog.clear()
    with pytest.raises(SystemExit):
        resume_argv(["train.py", f"resume={job}"])
    assert "this run's config is not its trial's, so it is not told" in caplog.text


def test_a_copied_sweep_folders_job_tells_the_copys_study(tmp_path):
    """A sweep folder copied with its study (optuna.db) to another place: resume= of a job in
    the copy told the original study, whose trial it is not, and the copy's never learned."""
    import shutil

    from litlab.resume import resume_argv

    original = tmp_path / "original"
    original.mkdir()
    storage = f"sqlite:///{original}/optuna.db"
    optuna.create_study(study_name="s", storage=storage, direction="minimize").ask()  # RUNNING
    trial = {"study_name": "s", "storage": storage, "number": 0, "config_digest": "d"}
    summary = {"status": "completed", "config_digest": "d", "optuna_trial": trial}
    summary["objective"] = {"metric": "val/loss", "mode": "min", "value": 0.25}
    (original / "0" / ".hydra").mkdir(parents=True)
    (original / "0" / ".hydra" / "config.yaml").write_text("{}\n")
    (original / "0" / "summary.json").write_text(json.dumps(summary))
    (original / "0" / ".completed").touch()
    shutil.copytree(original, tmp_path / "copy")
    with pytest.raises(SystemExit) as told:
        resume_argv(["train.py", f"resume={tmp_path / 'copy' / '0'}"])
    assert told.value.code == 0
    running, complete = optuna.trial.TrialState.RUNNING, optuna.trial.TrialState.COMPLETE
    assert study_trials_named(storage, "s")[0].state == running
    (held,) = study_trials_named(f"sqlite:///{tmp_path / 'copy'}/optuna.db", "s")
    assert held.state == complete and held.value == 0.25


def test_a_continued_studys_jobs_are_told_their_own_trials_whatever_their_numbers(tmp_path):
    """In a study continued in a new sweep folder, job 0 is trial 3: optuna_trials.json maps each
    job's number to its trial's, batch after batch (a job told by its own number would tell
    another trial's result)."""
    from litlab.sweep import TRIALS, record_asked_trials, study_url

    storage = f"sqlite:///{tmp_path}/optuna.db"
    study = optuna.create_study(study_name="s", storage=storage)
    for _ in range(3):  # the first sweep's trials 0-2
        study.tell(study.ask(), 1.0)
    sweep = tmp_path / "continued"
    record_asked_trials(str(sweep), 0, [study.ask(), study.ask()], storage, "s")
    record_asked_trials(str(sweep), 2, [study.ask()], storage, "s")  # its second batch
    known = json.loads((sweep / TRIALS).read_text())
    assert known["jobs"] == {"0": 3, "1": 4, "2": 5}
    assert known["study_name"] == "s" and known["storage"] == study_url(storage)
    record_asked_trials(str(sweep), 0, [study.ask()], storage, "s")  # a new sweep in the folder
    assert json.loads((sweep / TRIALS).read_text())["jobs"] == {"0": 6}


def test_a_trial_whose_study_is_gone_is_not_told_and_no_study_is_made(tmp_path, caplog):
    """A resumed job whose study's SQLite file was deleted or moved: said, and not told (asking
    Optuna would create an empty database at the old path and fail on the missing study)."""
    from litlab.sweep import tell_the_study

    storage = f"sqlite:///{tmp_path}/gone/optuna.db"
    trial = {"study_name": "s", "storage": storage, "number": 0, "config_digest": "d"}
    summary = {"status": "completed", "config_digest": "d", "optuna_trial": trial}
    summary["objective"] = {"metric": "val/loss", "mode": "min", "value": 0.5}
    with caplog.at_level("WARNING", logger="litlab"):
        assert tell_the_study(summary, tmp_path / "0") is None
    assert f"the Optuna study s ({storage}) is gone" in caplog.text
    assert not (tmp_path / "gone").exists()


def study_trials_named(storage: str, name: str) -> list[optuna.trial.FrozenTrial]:
    return optuna.load_study(study_name=name, storage=storage).trials


def test_a_continued_study_counts_the_trials_a_stop_left_running(tmp_path, caplog):
    """Its sampler is seeded past them: seeded past the finished trials alone, a study stopped
    in its first trial drew the stopped one's parameters again (found by review)."""
    from datetime import datetime, timedelta

    from omegaconf import OmegaConf

    from litlab.sweep import continued_sampler

    storage = f"sqlite:///{tmp_path}/optuna.db"
    study = optuna.create_study(study_name="s", storage=storage)
    earlier = optuna.trial.FrozenTrial(
        number=0, trial_id=0, state=optuna.trial.TrialState.RUNNING, value=None,
        datetime_start=datetime.now() - timedelta(hours=1), datetime_complete=None, params={},
        distributions={}, user_attrs={}, system_attrs={}, intermediate_values={},
    )  # fmt: skip
    study.add_trial(earlier)
    study.ask()  # running since this process started: another rank's, not counted
    config = OmegaConf.create({"_target_": "optuna.samplers.TPESampler", "seed": 7})
    with caplog.at_level("INFO", logger="litlab"):
        sampler = continued_sampler(None, config, storage, "s")
    assert isinstance(sampler, optuna.samplers.TPESampler)
    assert "its sampler's seed is 7 + 1" in caplog.text
    assert "trial(s) 0 of the study are RUNNING since before this sweep" in caplog.text


def test_a_study_storage_given_that_does_not_hold_the_study_is_said_to(tmp_path, caplog):
    """hydra.sweeper.storage=sqlite:///<a mistyped folder>/optuna.db started a new study in
    silence (Optuna's own line only), which repeated the first study's trials."""
    import optuna
    from omegaconf import OmegaConf

    from litlab.sweep import SweepSummary

    def start(storage: Path, study: str = "cnn_optuna") -> list[str]:
        caplog.clear()
        sweeper = {"storage": f"sqlite:///{storage}", "study_name": study}
        hydra = {"sweep": {"dir": str(tmp_path / "sweep")}, "sweeper": sweeper}
        SweepSummary().on_multirun_start(OmegaConf.create({"hydra": hydra}))
        return [r.getMessage() for r in caplog.records if "hydra.sweeper.storage" in r.getMessage()]

    assert start(tmp_path / "sweep" / "optuna.db") == []  # the sweep's own: new, as it should
    (tmp_path / "first").mkdir()
    first = f"sqlite:///{tmp_path / 'first'}/optuna.db"
    optuna.create_study(study_name="cnn_optuna", storage=first)
    assert start(tmp_path / "first" / "optuna.db") == []  # a study to continue
    (said,) = start(tmp_path / "frist" / "optuna.db")
    assert said.startswith(f"hydra.sweeper.storage=sqlite:///{tmp_path / 'frist'}/optuna.db holds")
    assert "holds no study yet" in said
    (said,) = start(tmp_path / "first" / "optuna.db", study="cnn_optuan")  # a study name mistyped
    assert said == (
        f"hydra.sweeper.storage={first} holds the studies cnn_optuna, not cnn_optuan: a new "
        "study cnn_optuan starts there (to continue one, give its name: "
        "hydra.sweeper.study_name=...)"
    )
    (said,) = start(tmp_path / "first" / "optuna.db", study=None)
    assert "and no study_name is given: a new study starts there" in said
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "optuna.db").write_bytes(b"not a database at all, " * 100)
    (said,) = start(tmp_path / "junk" / "optuna.db")  # one line, not a traceback
    assert said.startswith(f"hydra.sweeper.storage=sqlite:///{tmp_path / 'junk'}/optuna.db could")


def test_a_sweep_inside_a_slurm_job_leaves_no_stray_run_folders(tmp_path, monkeypatch):
    """Each job of a multirun in a SLURM allocation read hydra.run.dir, which claimed a run
    folder (slurm/<job>, slurm/<job>-1, ...) that it never used: empty folders beside the sweep."""
    for key, value in {"SLURM_JOB_ID": "999", "SLURM_JOB_NAME": "train"}.items():
        monkeypatch.setenv(key, value)
    result = run_cli(
        "-m",
        "seed=1,2",
        "trainer.max_epochs=1",
        "model.net.width=8",
        "logger=csv",
        *QUIET,
        f"hydra.sweep.dir={tmp_path / 'sweep'}",
        f"paths.log_dir={tmp_path / 'logs'}",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert sorted(p.name for p in (tmp_path / "sweep").iterdir() if p.is_dir()) == ["0", "1"]
    assert not (tmp_path / "logs").exists()


def test_a_sweep_into_an_earlier_sweeps_folder_is_refused_before_any_job(tmp_path):
    """The same hydra.sweep.dir given to another sweep: refused in one line before it writes
    anything. Before (found by review): Hydra replaced job 0's .hydra files with the new
    overrides, the job refused the checkpoints (another config's) and kept the old summary, and
    the sweep named the earlier score best "with model.net.width=32" for a net of width 16.
    The same grid sweep again (a requeued SLURM job's command) goes on: its jobs are done."""
    folder = tmp_path / "sweep"
    args = ["-m", f"hydra.sweep.dir={folder}", "trainer.max_epochs=1", "logger=csv", *QUIET]
    first = run_cli(*args, "model.net.width=4")
    assert first.returncode == 0, first.stderr[-3000:]
    summary = (folder / "0" / "summary.json").read_bytes()
    # its overrides in another order (walkthrough 146: refused as another sweep)
    again = run_cli("-m", "model.net.width=4", *reversed(args[1:-1]), args[-1])
    assert again.returncode == 0, again.stderr[-3000:]
    assert (folder / "0" / "summary.json").read_bytes() == summary  # completed: not trained
    written = {p: p.read_bytes() for p in folder.rglob("*") if p.is_file()}
    other = run_cli(*args, "model.net.width=8")
    assert other.returncode == 2
    told = f"litlab: error: hydra.sweep.dir={folder} holds the jobs of another sweep (1, "
    assert other.stderr.strip().splitlines()[-1].startswith(told)
    assert {p: p.read_bytes() for p in folder.rglob("*") if p.is_file()} == written
    # while another process runs a sweep in the folder (its lock held), the same grid too:
    # two sweeps started together each found it empty, and the same grid continued live jobs
    # (review 187: a job trained by both, its config of one sweep, its checkpoints the other's)
    from filelock import FileLock

    with FileLock(str(folder / ".sweep.lock")):
        busy = run_cli(*args, "model.net.width=4")
    assert busy.returncode == 2
    told = f"litlab: error: hydra.sweep.dir={folder} is in use by a sweep that runs now"
    assert busy.stderr.strip().splitlines()[-1].startswith(told)
    assert {p: p.read_bytes() for p in folder.rglob("*") if p.is_file()} == written


def test_a_grid_is_the_same_sweep_whatever_the_order_of_its_fixed_overrides():
    from litlab.sweep import same_grid

    grid = ["a=1,2", "b=3,4", "c=5", "d=6"]
    assert same_grid(grid, ["d=6", "a=1,2", "c=5", "b=3,4"])
    assert not same_grid(grid, ["b=3,4", "a=1,2", "c=5", "d=6"])  # other job numbers
    assert not same_grid(grid, ["a=1,2", "b=3,4", "c=5", "d=7"])
    # a key given twice: its last value, at its first place (review 149: judged the same)
    assert not same_grid(["a=1,2", "a=3"], ["a=3", "a=1,2"])
    assert not same_grid(["c=5", "c=6", "a=1,2"], ["c=6", "c=5", "a=1,2"])


def test_an_optuna_study_run_again_in_its_folder_is_refused(tmp_path):
    """The same Optuna command twice into one hydra.sweep.dir: the study (in that folder) draws
    new trials, numbered from 0 again, whose folders would be written over (found by review:
    both trials FAIL, "completed: 2", the old best credited to new overrides). Refused; a
    study continues in a new folder (README)."""
    folder = tmp_path / "sweep"
    args = ["-m", "hparams_search=cnn_optuna", "hydra.sweeper.n_trials=1", *QUIET]
    args += [f"hydra.sweep.dir={folder}", "trainer.max_epochs=1", "logger=csv"]
    first = run_cli(*args)
    assert first.returncode == 0, first.stderr[-3000:]
    again = run_cli(*args)
    assert again.returncode == 2, again.stderr[-3000:]
    told = f"litlab: error: hydra.sweep.dir={folder} holds the jobs of another sweep (1, "
    assert again.stderr.strip().splitlines()[-1].startswith(told)


@pytest.mark.parametrize("seed", ["seed=1,2,3", "seed=choice(1,2)", "data.split_seed=0,1"])
def test_an_optuna_study_over_seeds_is_refused(tmp_path, seed):
    """The Optuna sweeper makes a swept seed a parameter of the search, whose best trial is a
    lucky seed (found by review: "Best parameters: {..., 'seed': 2}"): one line, no job."""
    args = ["-m", "hparams_search=cnn_optuna", "hydra.sweeper.n_trials=2", seed, *QUIET]
    args += ["trainer.max_epochs=1", "logger=csv"]
    run = run_cli(*args, f"hydra.sweep.dir={tmp_path / 'sweep'}")
    assert run.returncode == 2
    line = run.stderr.strip().splitlines()[-1]
    assert line.startswith("litlab: error: the Optuna study would tune a seed (")
    # repeated as written, it was refused again (walkthrough 163)
    assert line.endswith(
        "the command its sweep's last line gives to train it again, with -m seed=1,2,3"
    )
    assert not list((tmp_path / "sweep").rglob("summary.json"))


def test_a_jobs_command_to_train_it_again_keeps_the_choices_its_search_made(tmp_path):
    """dcgan_optuna chooses model=dcgan: its jobs' overrides without hparams_search trained a
    classifier, refused for the GAN's keys (review 164)."""
    from litlab.sweep import run_again

    job = ["hparams_search=dcgan_optuna", "model.g_optimizer.lr=0.0002", "data=digits"]
    assert run_again([*job, "hydra.sweeper.n_trials=3"]) == (
        "python train.py model=dcgan model.g_optimizer.lr=0.0002 data=digits"
    )
    assert run_again([*job, "model=dcgan_hinge"]) == (  # the job's own choice stands
        "python train.py model.g_optimizer.lr=0.0002 data=digits model=dcgan_hinge"
    )
    composed = make_cfg(tmp_path, run_again(job).split()[2:])  # (composes, nothing runs)
    assert composed.model.g_optimizer.lr == 0.0002


def test_a_jobs_command_to_train_it_again_keeps_the_users_config_dir():
    """A sweep of an experiment in one's own config dir (--config-dir, hydra.searchpath):
    the job's command to train it again lost it, "Could not find 'experiment/mine'"
    (walkthrough 173; tried end to end by hand, both forms)."""
    from omegaconf import OmegaConf

    from litlab.sweep import config_dir_arguments, run_again

    config = OmegaConf.create(
        {
            "hydra": {
                "overrides": {
                    "hydra": ["hydra.searchpath=[file:///my/conf]", "hydra.sweep.dir=/x"]
                },
                "runtime": {
                    "config_sources": [
                        {"path": "hydra.conf", "schema": "pkg", "provider": "hydra"},
                        {"path": "/other conf", "schema": "file", "provider": "command-line"},
                    ]
                },
            }
        }
    )
    where = config_dir_arguments(config)
    assert where == ["--config-dir '/other conf'", "'hydra.searchpath=[file:///my/conf]'"]
    assert run_again(["experiment=mine", "seed=1"], where) == (
        "python train.py --config-dir '/other conf' 'hydra.searchpath=[file:///my/conf]' "
        "experiment=mine seed=1"
    )


@pytest.mark.parametrize(
    ("given", "said"),
    [
        ("+hparams_search.n_trials=3", "hparams_search.* is not a setting: "),
        ("objective.metric=test/acc", "objective.metric=test/acc is measured on the test split"),
    ],
)
def test_what_every_trial_would_refuse_is_refused_before_the_study(tmp_path, given, said):
    """A key of the command that each trial's job refuses: each of n_trials jobs failed with
    it (walkthrough 163; +hparams_search.n_trials=3, Hydra's own hint for hparams_search.n_trials,
    set nothing: the study ran its 20 trials). One line, no job."""
    args = ["-m", "hparams_search=cnn_optuna", given, "trainer.max_epochs=1", "logger=csv"]
    run = run_cli(*args, *QUIET, f"hydra.sweep.dir={tmp_path / 'sweep'}")
    assert run.returncode == 2
    line = run.stderr.strip().splitlines()[-1]
    assert line.startswith(f"litlab: error: {said}"), line
    assert not list((tmp_path / "sweep").rglob("summary.json"))


def test_an_optuna_study_over_what_its_objective_measures_is_refused(tmp_path):
    """'data=choice(digits,fashion_mnist)' in a study: Optuna ranked a Fashion-MNIST val/loss
    with digits' ones and named it best while litlab's summary named another (walkthrough):
    one line, no job. A search over how data is loaded, not what it is, goes on."""
    from litlab.sweep import _measures

    args = ["-m", "hparams_search=cnn_optuna", "hydra.sweeper.n_trials=2", *QUIET, "logger=csv"]
    run = run_cli(*args, "data=choice(digits,fashion_mnist)", f"hydra.sweep.dir={tmp_path}/s")
    assert run.returncode == 2
    last = run.stderr.strip().splitlines()[-1]
    assert last.startswith("litlab: error: the Optuna study would search over what its objective")
    assert "data=choice(digits,fashion_mnist)" in last and not (tmp_path / "s" / "0").exists()
    measured = ["data", "+data.val_fraction", "objective.metric", "data.source.test_fraction"]
    measured += ["model.tta_flip", "callbacks.fid.num_samples", "data.source"]
    measured += ["+trainer.limit_val_batches"]  # part of the split: ranked as all (146)
    assert all(map(_measures, measured))
    loading = ["data.batch_size", "data.num_workers", "data.source.workers", "data.source.cache"]
    prepared = ["data.image_shape", "data.source.size", "data.mean", "data.std"]  # tuned freely
    assert not any(map(_measures, [*loading, *prepared, "model.optimizer.lr", "dataset"]))


def test_a_study_continued_for_another_metric_or_data_is_refused(tmp_path, capsys):
    """A study keeps what its values measure (the objective metric, the data settings): a
    continuation with objective.metric=val/acc_top5 or other data added those values to the
    study's ranking without a word (walkthrough)."""
    from conftest import make_cfg
    from litlab.sweep import record_measure, refuse_another_measure

    storage = f"sqlite:///{tmp_path}/optuna.db"
    made = make_cfg(tmp_path / "a", ["objective=loss"])
    record_measure(optuna.create_study(study_name="s", storage=storage).ask(), made)
    refuse_another_measure(make_cfg(tmp_path / "b", ["objective=loss"]), storage, "s")
    # how images are prepared (their size) is a setting like the learning rate: not refused
    refuse_another_measure(
        make_cfg(tmp_path / "d", ["objective=loss", "data.source.size=32"]), storage, "s"
    )
    for other, said in (
        (["objective=accuracy"], "objective.metric: val/loss -> val/acc"),
        (["objective=loss", "data.val_fraction=0.3"], "data.val_fraction: 0.1 -> 0.3"),
        (["objective=loss", "+model.tta_flip=true"], "model.tta_flip: None -> True"),
        (
            ["objective=loss", "+trainer.limit_val_batches=1"],  # (walkthrough 146)
            "trainer.limit_val_batches: None -> 1",
        ),
    ):
        with pytest.raises(SystemExit) as refused:
            refuse_another_measure(make_cfg(tmp_path / "c", other), storage, "s")
        assert refused.value.code == 2
        assert said in capsys.readouterr().err


def test_a_sweeper_direction_against_the_objective_is_refused(tmp_path, capsys):
    """hydra.sweeper.direction=maximize with val/loss (min): Optuna named the worst trial its
    best and steered its sampler toward worse ones (walkthrough 146). cnn_optuna derives it
    from objective.mode, which passes."""
    from conftest import make_cfg
    from litlab.sweep import refuse_a_direction_against_the_objective

    refuse_a_direction_against_the_objective(make_cfg(tmp_path, ["hparams_search=cnn_optuna"]))
    from hydra_plugins.hydra_optuna_sweeper.config import Direction

    from litlab.sweep import directions

    assert directions(Direction.minimize) == ["minimize"]  # the sweeper's own default (148)
    against = make_cfg(tmp_path, ["hparams_search=cnn_optuna", "hydra.sweeper.direction=maximize"])
    with pytest.raises(SystemExit):
        refuse_a_direction_against_the_objective(against)
    said = capsys.readouterr().err
    assert "hydra.sweeper.direction=maximize but the objective, val/loss, is minimized" in said


def test_an_empty_search_space_or_grid_is_one_line_not_a_sweep_that_succeeded(tmp_path):
    """interval(0.01,0.001) in a study: Optuna's ValueError was taken for a sweep whose trials
    all failed, and the sweep ended with status 0 and a warning; a grid over range(64,16)
    launched 0 jobs with status 0 (walkthrough 146)."""
    mine = tmp_path / "mine"  # an empty folder of the user's
    mine.mkdir()
    study = run_cli(
        "-m",
        "hparams_search=cnn_optuna",
        "hydra.sweeper.n_trials=1",
        "model.optimizer.lr=interval(0.01,0.001)",
        *QUIET,
        f"hydra.sweep.dir={mine / 'study'}",
    )
    assert study.returncode == 2, study.stderr[-3000:]
    last = study.stderr.strip().splitlines()[-1]
    assert last.startswith("litlab: error: the Optuna study cannot search its parameters (")
    # the folder made for the study's file goes with it (it was left holding optuna.db alone,
    # which the report called "no run folders": walkthrough 176); a study there before stays
    assert not (mine / "study").exists() and mine.is_dir()  # (it went too)
    import optuna

    kept = tmp_path / "kept" / "optuna.db"
    kept.parent.mkdir()
    optuna.create_study(study_name="cnn_optuna", storage=f"sqlite:///{kept}")
    again = run_cli(
        "-m",
        "hparams_search=cnn_optuna",
        "hydra.sweeper.n_trials=1",
        "model.optimizer.lr=interval(0.01,0.001)",
        *QUIET,
        f"hydra.sweeper.storage=sqlite:///{kept}",
        f"hydra.sweep.dir={tmp_path / 'study'}",
    )
    assert again.returncode == 2 and kept.is_file(), again.stderr[-3000:]
    grid = run_cli("-m", "model.net.width=range(64,16)", *QUIET, f"hydra.sweep.dir={tmp_path}/g")
    assert grid.returncode == 2, grid.stderr[-3000:]
    assert "launched no job: a swept value list is empty" in grid.stderr.strip().splitlines()[-1]


def test_an_optuna_study_of_untrained_trials_is_refused(tmp_path):
    """train=false in a study: every trial tested, then failed without a validated value. And
    tune.lr=true in a study searching model.optimizer.lr: every trial failed on the finder's
    refusal (walkthrough): one line before any trial too."""
    args = ["-m", "hparams_search=cnn_optuna", "hydra.sweeper.n_trials=2", "train=false", *QUIET]
    run = run_cli(*args, "logger=csv", f"hydra.sweep.dir={tmp_path / 'sweep'}")
    assert run.returncode == 2
    last = run.stderr.strip().splitlines()[-1]
    assert last.startswith("litlab: error: an Optuna study scores each trial by the objective")
    assert not list((tmp_path / "sweep").rglob("summary.json"))
    from omegaconf import OmegaConf

    from litlab.sweep import refuse_a_found_value_searched

    config = OmegaConf.create({"tune": {"lr": True, "batch_size": False}})
    with pytest.raises(SystemExit):
        refuse_a_found_value_searched(config, [], {"model.optimizer.lr": "interval(0.1,1)"})
    with pytest.raises(SystemExit):  # swept on the command line
        refuse_a_found_value_searched(config, ["model.optimizer.lr=interval(0.1,1)"], {})
    refuse_a_found_value_searched(config, ["model.net.width=8,16"], {"data.batch_size": "x"})


def test_the_sweeps_best_is_the_reports_with_the_overrides_as_given(tmp_path):
    """sweep_summary.json's best job: of jobs tied on the objective (common on a small
    validation split), the first, as the report and Optuna name it (the folders were sorted
    0, 1, 10, 11, 2: job 10 won); its overrides as the command gave them (the line users copy
    to repeat the best trial): Hydra's overrides.yaml quotes some and folds long ones, which
    were read line by line into broken overrides."""
    from omegaconf import OmegaConf

    from litlab.report.compare import compare
    from litlab.report.runs import find_runs
    from litlab.sweep import SweepSummary, best_job, read_jobs

    note = "+model.note='lr: low'"
    tags = "tags=[" + ",".join(f"a_long_tag_number_{i}" for i in range(6)) + "]"
    for job in range(12):
        folder = tmp_path / str(job)
        (folder / ".hydra").mkdir(parents=True)
        value = 0.96 if job in (2, 10) else 0.5
        objective = {"metric": "val/acc", "mode": "max", "value": value}
        summary = {"status": "completed", "objective": objective, "metrics": {"val/acc": value}}
        summary["tuned"] = {"lr": job / 1000}  # tune.lr=true: the value it trained with
        (folder / "summary.json").write_text(json.dumps(summary))
        overrides = [f"model.optimizer.lr={job}", note, tags]
        OmegaConf.save(OmegaConf.create(overrides), folder / ".hydra" / "overrides.yaml")
    best = best_job(read_jobs(tmp_path))
    assert Path(best["job_dir"]) == compare(find_runs([tmp_path])).best.path == tmp_path / "2"
    assert best["overrides"] == ["model.optimizer.lr=2", note, tags]
    # a job of another objective is not ranked, and sweep_summary.json names it (README)
    (tmp_path / "12").mkdir()
    fid = {"metric": "val/fid", "mode": "min", "value": 0.01}
    (tmp_path / "12" / "summary.json").write_text(
        json.dumps({"status": "completed", "objective": fid})
    )
    SweepSummary().on_multirun_end(OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path)}}}))
    written = json.loads((tmp_path / "sweep_summary.json").read_text())
    assert written["best"]["job_dir"] == str(tmp_path / "2")
    assert written["best"]["overrides"] == ["model.optimizer.lr=2", note, tags]
    assert written["best"]["tuned"] == {"lr": 0.002}  # the overrides say only tune.lr=true
    assert written["not_compared"] == [str(tmp_path / "12")]


def test_ranks_of_a_torchrun_sweep_ask_the_same_trials(tmp_path, monkeypatch):
    """Under torchrun or srun every rank runs the sweep: a rank other than 0 asks a copy of the
    shared study's trials finished before it started, and those then RUNNING (a trial rank 0
    has run since would change its history and seed); enqueued trials (rank 0 alone would take them) and the grid
    sampler (unseeded: each rank another point) are refused on every rank; the copy goes."""
    import tempfile

    from litlab import sweep

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the ranks' scratch folder
    monkeypatch.setenv("WORLD_SIZE", "2")
    shared = f"sqlite:///{tmp_path}/optuna.db"
    study = optuna.create_study(study_name="s", storage=shared, direction="maximize")
    study.tell(study.ask({"lr": optuna.distributions.LogUniformDistribution(1e-4, 1)}), 0.5)
    study.ask()  # left RUNNING by an earlier launch a signal stopped: counted alike on each rank
    started = time.time()
    time.sleep(0.05)
    study.tell(study.ask({"lr": optuna.distributions.LogUniformDistribution(1e-4, 1)}), 0.7)
    monkeypatch.setattr(sweep, "_process_started", lambda: started)
    monkeypatch.setenv("RANK", "0")
    assert sweep.rank_storage(shared, "s") == shared
    monkeypatch.setenv("RANK", "1")
    local = sweep.rank_storage(shared, "s")
    assert local != shared
    copied = optuna.load_study(study_name="s", storage=local).trials
    assert [(t.value, t.state.name) for t in copied] == [(0.5, "COMPLETE"), (None, "RUNNING")]
    sweep.drop_rank_storage(shared, local)
    assert not Path(local.removeprefix("sqlite:///")).exists()
    study.enqueue_trial({"lr": 0.005})
    for rank in ("0", "1"):
        monkeypatch.setenv("RANK", rank)
        with pytest.raises(SystemExit):
            sweep.rank_storage(shared, "s")
    with pytest.raises(SystemExit):
        sweep.refuse_an_unseeded_grid({"_target_": "optuna.samplers.GridSampler"})
    sweep.refuse_an_unseeded_grid({"_target_": "optuna.samplers.TPESampler"})


def test_a_sweep_over_seeds_says_its_best_job_is_one_seeds(tmp_path, caplog):
    """`-m model.optimizer.lr=1e-3,3e-3 seed=1,2,3` logged one job as the best: a lucky seed.
    The log now points to the report's means over seeds."""
    from omegaconf import OmegaConf

    from litlab.sweep import SweepSummary

    for job, seed in enumerate((1, 2)):
        folder = tmp_path / str(job)
        (folder / ".hydra").mkdir(parents=True)
        objective = {"metric": "val/acc", "mode": "max", "value": 0.5 + job / 10}
        (folder / "summary.json").write_text(
            json.dumps({"status": "completed", "objective": objective})
        )
        OmegaConf.save(OmegaConf.create([f"seed={seed}"]), folder / ".hydra" / "overrides.yaml")
    with caplog.at_level("INFO", logger="litlab.sweep"):
        SweepSummary().on_multirun_end(
            OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path)}}})
        )
    assert "the jobs repeat settings over seeds: the report gives each one's mean" in caplog.text


def test_submitit_local_with_several_tasks_a_node_is_refused_before_any_job(tmp_path):
    """hydra.launcher.tasks_per_node=2 under submitit_local started each job's command twice,
    both as rank 0 in one folder: trained twice, then failed in the CSV writer, its summary
    "failed" beside a finished .trained (review 187). One line before any job."""
    folder = tmp_path / "sweep"
    run = run_cli(
        "-m",
        "hydra/launcher=submitit_local",
        "hydra.launcher.tasks_per_node=2",
        "trainer.max_epochs=1",
        "logger=csv",
        f"hydra.sweep.dir={folder}",
    )
    assert run.returncode == 2
    line = run.stderr.strip().splitlines()[-1]
    assert line.startswith("litlab: error: hydra/launcher=submitit_local with hydra.launcher.")
    assert "tasks_per_node=2 runs each job 2 times over in one folder" in line
    assert not list(folder.rglob("summary.json"))
