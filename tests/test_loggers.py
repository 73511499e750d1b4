"""W&B never prompts: the mode follows WANDB_MODE, then credentials."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from litlab.loggers import wandb_credentials, wandb_mode
from wandb_records import offline_run


@pytest.fixture
def no_wandb_env(monkeypatch, tmp_path):
    for var in ("WANDB_MODE", "WANDB_API_KEY", "WANDB_BASE_URL", "WANDB_IDENTITY_TOKEN_FILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "netrc"))
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb-config"))
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))  # its wandb/settings: none but the test's
    return tmp_path / "netrc"


def test_no_credentials_means_offline(no_wandb_env, caplog):
    assert not wandb_credentials()
    with caplog.at_level("INFO", logger="litlab"):
        assert wandb_mode("auto") == "offline"
    assert any("no credentials" in r.getMessage() for r in caplog.records)  # said why
    assert (
        wandb_mode("online") == "offline"
    )  # asked for online, but it would prompt: offline instead


def test_the_no_credentials_line_is_said_by_rank_0_alone(no_wandb_env, monkeypatch, caplog):
    """Every DDP rank builds its loggers: each printed the line (walkthrough 153)."""
    from lightning.pytorch.utilities import rank_zero_only

    monkeypatch.setattr(rank_zero_only, "rank", 1)
    with caplog.at_level("INFO", logger="litlab"):
        assert wandb_mode("auto") == "offline" and wandb_mode("online") == "offline"
    assert not caplog.records


def test_api_key_or_netrc_means_online(no_wandb_env, monkeypatch):
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    assert wandb_mode("auto") == "online"
    monkeypatch.delenv("WANDB_API_KEY")
    no_wandb_env.write_text("machine api.wandb.ai\n  login user\n  password " + "y" * 40 + "\n")
    no_wandb_env.chmod(0o600)
    assert wandb_credentials() and wandb_mode("auto") == "online"
    monkeypatch.setenv("WANDB_BASE_URL", "https://wandb.example.org")
    assert not wandb_credentials()  # a key for another host does not count


def netrc_entry(path, host: str) -> None:
    path.write_text(f"machine {host}\n  login user\n  password " + "y" * 40 + "\n")
    path.chmod(0o600)


@pytest.mark.parametrize("host", ["api.wandb.ai", "api.forge.coreweave.com"])
def test_a_key_saved_by_wandb_login_is_found_as_wandb_finds_it(no_wandb_env, tmp_path, host):
    """`wandb login` of wandb 0.31 saves the key under api.forge.coreweave.com, its default
    host; litlab looked for api.wandb.ai alone and logged such a user's runs offline, silently.
    Whatever wandb itself finds counts, and nothing else: a key saved by `wandb login --host` for
    a server of its own, the identity-token login."""
    from wandb.sdk.lib.wbauth import wbnetrc
    from wandb.sdk.lib.wbauth.host_url import HostUrl

    netrc_entry(no_wandb_env, host)
    assert wbnetrc.read_netrc_auth(host=HostUrl("https://api.forge.coreweave.com"))  # wandb's
    assert wandb_credentials() and wandb_mode("auto") == "online"
    settings = tmp_path / "wandb-config" / "settings"  # `wandb login --host <url>`
    settings.parent.mkdir()
    settings.write_text("[default]\nbase_url = https://wandb.example.org\n")
    assert not wandb_credentials()  # the key is another server's
    netrc_entry(no_wandb_env, "wandb.example.org")
    assert wandb_credentials()


def test_an_identity_token_file_means_online(no_wandb_env, monkeypatch, tmp_path):
    monkeypatch.setenv("WANDB_IDENTITY_TOKEN_FILE", str(tmp_path / "token"))
    assert wandb_mode("auto") == "online"


def test_wandb_project_env_names_the_project(no_wandb_env, monkeypatch, tmp_path):
    """WANDB_PROJECT (W&B's own variable) was overridden by the config's project: litlab."""
    from conftest import make_cfg

    assert make_cfg(tmp_path).logger.wandb.project == "litlab"
    monkeypatch.setenv("WANDB_PROJECT", "mine")
    assert make_cfg(tmp_path).logger.wandb.project == "mine"
    assert make_cfg(tmp_path, ["logger.wandb.project=given"]).logger.wandb.project == "given"


def test_a_run_resumed_without_its_wandb_project_env_logs_to_its_project(tmp_path, monkeypatch):
    """The saved config reads WANDB_PROJECT again at resume=: under another (or none) the run's
    id went to another project, a new run there."""
    from conftest import QUIET, run_cli

    monkeypatch.setenv("WANDB_PROJECT", "first")
    args = [*QUIET, "+trainer.limit_train_batches=2", "model.scheduler=null", "test=false"]
    args += [f"paths.log_dir={tmp_path}"]
    assert run_cli(*args, "trainer.max_epochs=1").returncode == 0
    (folder,) = (tmp_path / "train").glob("*/*")
    monkeypatch.delenv("WANDB_PROJECT")
    resumed = run_cli(f"resume={folder}", "trainer.max_epochs=2")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    parts = [offline_run(p) for p in sorted((folder / "wandb").glob("offline-run-*"))]
    assert [p["project"] for p in parts] == ["first", "first"]


def test_wandb_mode_env_wins(no_wandb_env, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "disabled")
    assert wandb_mode("auto") == "disabled"
    monkeypatch.setenv("WANDB_MODE", "dryrun")
    assert wandb_mode("online") == "offline"


def wandb_cli(*args: str, cwd) -> None:
    """The `wandb` command as a user types it (it writes W&B's settings files)."""
    env = {k: v for k, v in os.environ.items() if k != "WANDB_DIR"}
    result = subprocess.run(
        [sys.executable, "-m", "wandb", *args], cwd=cwd, capture_output=True, text=True, env=env
    )
    assert result.returncode == 0, result.stderr[-2000:]


@pytest.mark.parametrize("saved", ["offline", "disabled"])
def test_wandb_offline_or_disabled_is_kept_though_credentials_exist(
    no_wandb_env, monkeypatch, tmp_path, saved
):
    """`wandb offline` / `wandb disabled` save the mode in W&B's settings files, which an explicit
    wandb.init(mode=...) outranks: logger.wandb.mode=auto passed online whenever a key existed,
    and a user who had turned W&B off got runs uploaded. Auto now keeps the saved mode (of the
    working directory, or the global file); WANDB_MODE and a mode the config names still win."""
    from litlab.compat import wandb_init_arguments
    from litlab.loggers import wandb_logger

    monkeypatch.delenv("WANDB_DIR")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_API_KEY", "a" * 40)
    monkeypatch.setenv("WANDB_BASE_URL", "http://127.0.0.1:9")  # never reached: nothing listens
    wandb_cli(saved, cwd=tmp_path)  # writes <cwd>/wandb/settings
    assert wandb_mode("auto") == saved
    logger = wandb_logger(str(tmp_path / "run"), settings={"init_timeout": 2})
    assert wandb_init_arguments(logger)["mode"] == saved
    run = logger.experiment  # a real run, started in that mode without trying the server
    assert run.settings.mode == saved
    run.finish()
    assert wandb_mode("online") == "online"  # the config's own choice
    monkeypatch.setenv("WANDB_MODE", "online")
    assert wandb_mode("auto") == "online"  # the environment's
    monkeypatch.delenv("WANDB_MODE")
    wandb_cli("online", cwd=tmp_path)  # clears the saved mode
    assert wandb_mode("auto") == "online"
    settings = tmp_path / "wandb-config" / "settings"  # the global file counts too
    settings.parent.mkdir()
    settings.write_text(f"[default]\nmode = {saved}\n")
    assert wandb_mode("auto") == saved


def test_wandb_is_imported_only_when_a_run_starts(no_wandb_env, tmp_path):
    """Runs with logger=csv must work where wandb is not installed (e.g. the GPU machine)."""
    code = (
        "import sys, litlab.train, litlab.evaluate\n"
        "from litlab.loggers import wandb_logger\n"
        f"logger = wandb_logger(save_dir={str(tmp_path)!r})\n"
        "assert 'wandb' not in sys.modules, 'wandb imported too early'\n"
        "assert logger._wandb_init['mode'] == 'offline'\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=dict(os.environ)
    )
    assert result.returncode == 0, result.stderr[-2000:]


@pytest.mark.parametrize("env", ["Offline", ""])
def test_wandb_mode_env_in_another_case_runs_and_a_wrong_one_is_one_line(
    no_wandb_env, monkeypatch, tmp_path, env
):
    """W&B reads WANDB_MODE itself and refuses "Offline", and an empty one (`export
    WANDB_MODE=`) with a pydantic traceback; litlab reads both (empty: unset)."""
    from conftest import QUIET, make_cfg, summary_of
    from litlab.errors import ConfigError
    from litlab.train import train_task

    monkeypatch.setenv("WANDB_MODE", env)
    cfg = make_cfg(tmp_path, ["logger=wandb", "trainer.max_epochs=1", "test=false", *QUIET])
    train_task(cfg)
    assert summary_of(cfg)["status"] == "completed"
    assert list((tmp_path / "run" / "wandb").glob("offline-run-*"))
    monkeypatch.setenv("WANDB_MODE", "offlin")
    with pytest.raises(ConfigError, match="WANDB_MODE=offlin is not a W&B mode"):
        wandb_mode("auto")


def test_only_an_unreachable_server_sends_the_later_runs_offline(
    no_wandb_env, monkeypatch, tmp_path
):
    """A server that answers TCP but does not start the run (here: a socket that accepts and
    says nothing, wandb's init_timeout 2 s) fails this run's online start only: the next run of
    the process tries online again. An unreachable one is remembered (no probe, no wait)."""
    import socket

    from litlab.loggers import LitlabWandbLogger, wandb_logger

    listener = socket.create_server(("127.0.0.1", 0))
    monkeypatch.setenv("WANDB_API_KEY", "a" * 40)
    monkeypatch.setenv("WANDB_BASE_URL", f"http://127.0.0.1:{listener.getsockname()[1]}")
    monkeypatch.setattr(LitlabWandbLogger, "_online_failed", None)
    logger = wandb_logger(str(tmp_path / "a"), settings={"init_timeout": 2})
    logger.experiment.finish()
    assert LitlabWandbLogger._online_failed is None  # it may work next time
    listener.close()  # now nothing listens there
    logger = wandb_logger(str(tmp_path / "b"), settings={"init_timeout": 2})
    logger.experiment.finish()
    assert "not reachable" in LitlabWandbLogger._online_failed


def test_log_model_uploads_the_best_checkpoint_as_best_and_nothing_else(monkeypatch, tmp_path):
    """Lightning's log_model uploaded every ModelCheckpoint's files, each callback's newest as
    "best": model-<id>:best ended on last.ckpt, and each file was first copied under
    ~/.local/share/wandb. Now one version per fit: the file the objective ranks best (what the
    test measured), read in place from the run folder. log_model=all is refused in one line."""
    from conftest import QUIET, make_cfg, summary_of
    from litlab.errors import ConfigError
    from litlab.loggers import wandb_logger
    from litlab.train import train_task
    from wandb_records import offline_run

    monkeypatch.setenv("WANDB_DATA_DIR", str(tmp_path / "wandb-data"))  # W&B's staging folder
    overrides = ["logger=wandb", "logger.wandb.log_model=true", "trainer.max_epochs=2"]
    cfg = make_cfg(tmp_path, [*overrides, "data.batch_size=128", "model.net.width=8", *QUIET])
    train_task(cfg)
    summary = summary_of(cfg)
    (folder,) = (tmp_path / "run" / "wandb").glob("offline-run-*")
    run = offline_run(folder)
    (artifact,) = run["artifacts"]  # ("latest": W&B's, the newest version)
    assert (artifact["name"], artifact["type"], set(artifact["aliases"])) == (
        f"model-{run['id']}",
        "model",
        {"best", "latest"},
    )
    # read when uploaded (offline: at `wandb sync`): a link to this version of best.ckpt, which
    # a later best (a resume) replaces by rename, in the run folder
    (uploaded,) = (Path(p) for p in artifact["files"].values())
    assert uploaded.parent == tmp_path / "run" / "wandb" / "uploads"
    assert os.path.samefile(uploaded, summary["best_checkpoint"])
    os.replace(tmp_path / "run" / "checkpoints" / "last.ckpt", summary["best_checkpoint"])
    assert not os.path.samefile(uploaded, summary["best_checkpoint"]) and uploaded.stat().st_size
    metadata = run["artifacts"][0]["metadata"]
    assert metadata["metric"] == cfg.objective.metric
    assert metadata["score"] == summary["objective"]["value"]
    assert not list((tmp_path / "wandb-data").rglob("*.ckpt"))  # no copy outside the run folder
    with pytest.raises(ConfigError, match="log_model=all is not supported; use true"):
        wandb_logger(str(tmp_path / "all"), log_model="all")


def test_the_wandb_summary_holds_the_objective_and_the_runs_verdict(tmp_path):
    """W&B's run summary held each metric's last value only: its table and parallel-coordinates
    views compared sweep runs by their last epoch, not by the objective the sweep optimised.
    Now it also holds summary.json's objective (the best checkpoint's score), status, checkpoints
    and config digest."""
    from conftest import QUIET, make_cfg, summary_of
    from litlab.train import train_task
    from wandb_records import offline_run

    overrides = ["logger=wandb", "trainer.max_epochs=2", "data.batch_size=128"]
    cfg = make_cfg(tmp_path, [*overrides, "model.net.width=8", *QUIET])
    train_task(cfg)
    summary = summary_of(cfg)
    (folder,) = (tmp_path / "run" / "wandb").glob("offline-run-*")
    logged = offline_run(folder)["summary"]
    assert summary["objective"]["value"] == summary["best_score"] is not None
    assert logged["objective"] == summary["objective"]  # {"metric", "mode", "value"}
    keys = ["status", "best_checkpoint", "tested_checkpoint", "best_score", "config_digest"]
    assert {key: logged[key] for key in keys} == {key: summary[key] for key in keys}
    assert logged["status"] == "completed"


def test_an_eval_run_logs_the_config_it_tested_with(tmp_path):
    """eval.py's W&B run had an empty config (its model never saved hyperparameters): an eval
    could not be told apart or compared with its training run. It now logs the config the model
    trained with, the data tested and the checkpoint, flat as a training run's."""
    from conftest import QUIET, make_cfg, summary_of
    from litlab.evaluate import eval_task
    from litlab.train import train_task
    from wandb_records import offline_run

    cfg = make_cfg(tmp_path / "train", ["trainer.max_epochs=1", "logger=csv", *QUIET])
    train_task(cfg)
    checkpoint = summary_of(cfg)["best_checkpoint"]
    given = [f"ckpt_path={checkpoint}", "logger=wandb", "extras.print_config=false"]
    eval_cfg = make_cfg(tmp_path / "eval", given, config_name="eval")
    eval_task(eval_cfg)
    (folder,) = (tmp_path / "eval" / "run" / "wandb").glob("offline-run-*")
    config = offline_run(folder)["config"]
    assert config["ckpt_path"] == checkpoint
    assert config["model.optimizer.lr"] == cfg.model.optimizer.lr
    assert config["data.batch_size"] == cfg.data.batch_size


def test_sample_grids_are_logged_at_the_step_of_the_scalars(tmp_path):
    """SampleGrid logged its images to W&B without a step (W&B put the g-step-3 grid at the
    previous row's trainer/global_step) and to TensorBoard at the generator's step; the scalars
    are at Lightning's batch step. Now a grid is at the step of the values logged with it, in
    W&B and TensorBoard alike."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from conftest import QUIET, TINY_GAN, make_cfg
    from litlab.train import train_task
    from wandb_records import offline_run

    overrides = ["logger=[wandb,tensorboard]", "trainer.log_every_n_steps=1"]
    gan = [*TINY_GAN, "callbacks.fid.num_samples=64", "callbacks.fid.batch_size=64"]
    settings = ["trainer.max_epochs=1", "callbacks.samples.every_n_g_steps=3"]
    cfg = make_cfg(tmp_path, [*overrides, *gan, *settings, *QUIET])
    train_task(cfg)
    (folder,) = (tmp_path / "run" / "wandb").glob("offline-run-*")
    history = offline_run(folder)["history"]
    at = {row["g/step"]: row["trainer/global_step"] for row in history if "g/step" in row}
    at["final"] = at["test"] = next(r["trainer/global_step"] for r in history if "test/fid" in r)
    grids = {}  # a grid's name (g_step_0000003, final, test): the step W&B has it at
    for row in history:
        if "samples/_type" in row:
            name = row["samples/captions"][0].split(" ")[0]
            grids[name] = row.get("trainer/global_step")
    assert list(grids) == ["g_step_0000003", "g_step_0000006", "final", "test"]
    for name, step in grids.items():
        assert step == at[float(name[7:]) if name.startswith("g_step") else name], name
    events = EventAccumulator(str(tmp_path / "run" / "tensorboard")).Reload()
    assert [image.step for image in events.Images("samples")] == list(grids.values())


def test_an_offline_run_sends_nothing_to_the_wandb_server(no_wandb_env, tmp_path):
    """Without credentials W&B logs offline, and nothing reaches its server, at exit neither:
    wandb's own usage telemetry posted there (and waited out its 10 s HTTP timeout on a server
    that took the connection and never answered, as behind a firewall that drops packets)."""
    import contextlib
    import socket
    import threading

    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.1)
    accepted: list[object] = []
    done = threading.Event()

    def accept() -> None:
        while not done.is_set():
            with contextlib.suppress(TimeoutError):
                accepted.append(listener.accept())

    watcher = threading.Thread(target=accept, daemon=True)
    watcher.start()
    code = (
        "from litlab.loggers import finish_loggers, wandb_logger\n"
        f"logger = wandb_logger(save_dir={str(tmp_path)!r})\n"
        "assert logger._wandb_init['mode'] == 'offline'\n"
        "logger.log_metrics({'train/loss': 1.0}, step=0)\n"
        "finish_loggers([logger])\n"
    )
    env = {
        **{k: v for k, v in os.environ.items() if k != "WANDB_SERVICE"},
        "WANDB_BASE_URL": f"http://127.0.0.1:{listener.getsockname()[1]}",
    }
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    done.set()
    watcher.join()
    listener.close()
    assert result.returncode == 0, result.stderr[-2000:]
    (run,) = tmp_path.glob("wandb/offline-run-*")
    # and the metrics it held for their step's others went out as it finished
    assert [r["train/loss"] for r in offline_run(run)["history"]] == [1.0]
    assert not accepted, f"{len(accepted)} connection(s) to the W&B server from an offline run"


def test_the_wandb_logger_sends_one_steps_metrics_together_and_nothing_else(tmp_path):
    """Metrics of one step in one W&B row (Lightning's LR monitor, then the step's metrics);
    a key given twice, metrics without a step and another step's: rows of their own, in order."""
    from litlab.loggers import finish_loggers, wandb_logger

    logger = wandb_logger(save_dir=str(tmp_path))
    logger.log_metrics({"lr": 0.1}, step=3)
    logger.log_metrics({"loss": 1.0}, step=3)
    logger.log_metrics({"loss": 2.0}, step=3)
    logger.log_metrics({"gpu": 5.0})
    logger.log_metrics({"loss": 3.0}, step=4)
    finish_loggers([logger])
    (run,) = tmp_path.glob("wandb/offline-run-*")
    for _ in range(100):  # wandb's service may still be writing the file as finish returns
        history = offline_run(run)["history"]
        if len(history) >= 4:
            break
        time.sleep(0.1)
    rows = [{k: v for k, v in r.items() if not k.startswith("_")} for r in history]
    assert rows == [
        {"lr": 0.1, "loss": 1.0, "trainer/global_step": 3},
        {"loss": 2.0, "trainer/global_step": 3},
        {"gpu": 5.0, "trainer/global_step": 3},  # W&B's step_sync: the last step, filled in
        {"loss": 3.0, "trainer/global_step": 4},
    ]


def test_a_runs_offline_parts_are_found_by_their_transaction_logs(tmp_path, caplog):
    """The parts of W&B run "abc" as wandb lays them out: one per resume, "-1" after the id
    when a part starts in the same second as the one before, a run "abcd" beside them, a part
    killed before its log was written, and `wandb sync`'s marker on an uploaded part. Under
    `.wandb` where that folder exists (wandb's own choice)."""
    from litlab.loggers import offline_parts, sync_command, unsynced_offline_parts, wandb_folder
    from litlab.resume import wandb_run_id

    assert wandb_folder(tmp_path) == tmp_path / "wandb"
    folder = tmp_path / ".wandb"
    names = ["20261205_150000-abc", "20261205_150000-abc-1", "20261205_150002-abc"]
    parts = [folder / f"offline-run-{name}" for name in names]
    header = b":W&B\xe1\xbe\x00"  # wandb's, alone in a part killed hard (review 170)
    for part in parts:
        part.mkdir(parents=True)
        (part / "run-abc.wandb").write_bytes(header + b"records")
    (folder / "offline-run-20261205_150001-abcd").mkdir()
    (folder / "offline-run-20261205_150001-abcd" / "run-abcd.wandb").write_bytes(header)
    (folder / "offline-run-20261205_150003-abc").mkdir()  # killed while W&B started
    (parts[0] / "run-abc.wandb.synced").touch()
    assert wandb_folder(tmp_path) == folder
    assert offline_parts(folder, "abc") == parts
    assert unsynced_offline_parts(folder, "abc") == parts[1:]
    assert unsynced_offline_parts(folder, None) == []
    assert sync_command(str(parts[2]), "abc") == f"wandb sync {parts[1]} {parts[2]}"
    # a part whose log holds the header alone (its process killed before W&B wrote a record):
    # nothing to upload, and said
    (parts[1] / "run-abc.wandb").write_bytes(header)
    with caplog.at_level("WARNING", logger="litlab"):
        assert sync_command(str(parts[2]), "abc") == f"wandb sync {parts[2]}"
    assert f"part(s) {parts[1].name} hold no data" in caplog.text
    (parts[1] / "run-abc.wandb").write_bytes(header + b"records")
    os.utime(parts[1], (time.time() + 10, time.time() + 10))  # the newest part
    assert wandb_run_id(tmp_path) == "abc"  # not "1"
