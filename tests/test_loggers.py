"""W&B never prompts: the mode follows WANDB_MODE, then credentials."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from litlab.loggers import wandb_credentials, wandb_mode


@pytest.fixture
def no_wandb_env(monkeypatch, tmp_path):
    for var in ("WANDB_MODE", "WANDB_API_KEY", "WANDB_BASE_URL", "WANDB_IDENTITY_TOKEN_FILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "netrc"))
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb-config"))
    return tmp_path / "netrc"


def test_no_credentials_means_offline(no_wandb_env):
    assert not wandb_credentials()
    assert wandb_mode("auto") == "offline"
    assert (
        wandb_mode("online") == "offline"
    )  # asked for online, but it would prompt: offline instead


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


def test_wandb_mode_env_wins(no_wandb_env, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "disabled")
    assert wandb_mode("auto") == "disabled"
    monkeypatch.setenv("WANDB_MODE", "dryrun")
    assert wandb_mode("online") == "offline"


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
