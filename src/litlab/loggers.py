"""Experiment loggers. W&B never prompts or blocks: online with credentials, offline without
(or as `wandb offline` / `wandb disabled` saved); CSV keeps a resumed run's history.

wandb itself is imported only when a W&B logger is actually built.
"""

from __future__ import annotations

import configparser
import contextlib
import glob
import logging
import netrc
import os
import shlex
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, ClassVar, Literal
from urllib.parse import urlparse

from lightning.pytorch.loggers import Logger, WandbLogger
from lightning.pytorch.loggers.logger import rank_zero_experiment
from lightning.pytorch.utilities import rank_zero_only
from lightning.pytorch.utilities.exceptions import SIGTERMException
from omegaconf import OmegaConf

from litlab.compat import (
    AppendingCSVLogger,
    flat_hyperparameters,
    wandb_init_arguments,
    wandb_started,
)
from litlab.errors import ConfigError, first_line

log = logging.getLogger(__name__)

Mode = Literal["auto", "online", "offline", "disabled"]


# Lightning's CSVLogger, but a resumed run appends to metrics.csv instead of deleting it.
CSVLogger = AppendingCSVLogger


# The hosts of W&B's cloud: `wandb login` saves its key under the default one of the wandb
# release that ran it (api.wandb.ai until 0.2x, the CoreWeave host since), and wandb finds a key
# saved under either.
WANDB_CLOUD_HOSTS = ("api.wandb.ai", "api.forge.coreweave.com")


def wandb_settings_files() -> list[Path]:
    """W&B's settings files, the later one winning: the global one (where `wandb login --host`
    saves its server's URL) and the workspace one (where `wandb offline` / `wandb disabled` save
    the mode: <WANDB_DIR or the working directory>/wandb/settings, .wandb/ where that exists)."""
    config_dir = os.environ.get("WANDB_CONFIG_DIR")
    folder = Path(config_dir).expanduser() if config_dir else Path("~/.config/wandb").expanduser()
    root = Path(os.environ.get("WANDB_DIR") or os.getcwd()).expanduser()
    workspace = root / (".wandb" if (root / ".wandb").is_dir() else "wandb")
    return [folder / "settings", workspace / "settings"]


def wandb_saved_settings() -> Any:
    """The [default] sections of W&B's settings files, merged as wandb merges them (empty where
    there are none). Read here rather than asked of wandb: its public API gives the effective
    settings only through wandb.setup(), which imports wandb and starts its service process."""
    saved = configparser.ConfigParser()
    with contextlib.suppress(OSError, configparser.Error):
        saved.read(wandb_settings_files())
    return saved["default"] if saved.has_section("default") else {}


def wandb_base_url() -> str | None:
    """The W&B server's URL as configured: WANDB_BASE_URL, else the one `wandb login --host`
    saved; None: W&B's cloud."""
    return os.environ.get("WANDB_BASE_URL") or wandb_saved_settings().get("base_url")


def wandb_credentials() -> bool:
    """Whether W&B has credentials, found where wandb.init finds them, without importing wandb
    (runs that log elsewhere must work where it is not installed): WANDB_API_KEY or
    WANDB_IDENTITY_TOKEN_FILE; else the server's URL (WANDB_BASE_URL, or the one saved by
    `wandb login --host`, or W&B's cloud) and a netrc entry for it, or an API key in W&B's
    settings files. Without them W&B would ask for a key (online, in a terminal) or fail."""
    if os.environ.get("WANDB_API_KEY") or os.environ.get("WANDB_IDENTITY_TOKEN_FILE"):
        return True
    if wandb_saved_settings().get("api_key"):
        return True
    base_url = wandb_base_url()
    hosts = [urlparse(base_url).hostname] if base_url else WANDB_CLOUD_HOSTS
    path = os.environ.get("NETRC", os.path.expanduser("~/.netrc"))
    try:
        entries = netrc.netrc(path)
    except (OSError, netrc.NetrcParseError):
        return False
    return any(entries.authenticators(host) is not None for host in hosts if host)


def wandb_mode(requested: Mode) -> str:
    """The mode W&B will run in: WANDB_MODE wins; "auto" takes the mode saved by `wandb offline`
    or `wandb disabled` (W&B's settings files), else online; online without credentials means
    offline.

    A WANDB_MODE that is set is written back as this mode: W&B reads it too, and refuses
    "Offline" or "auto", and an empty one (``export WANDB_MODE=``: unset, as litlab reads it)
    with a traceback.
    """
    env = os.environ.get("WANDB_MODE")
    saved = wandb_saved_settings().get("mode") if requested == "auto" else None
    mode = (env or saved or requested).strip().lower()
    mode = {"dryrun": "offline", "run": "online"}.get(mode, mode)
    if mode not in ("auto", "online", "offline", "disabled", "shared"):
        if env:
            setting = f"WANDB_MODE={env}"
        elif saved:
            setting = f"mode = {saved} in W&B's settings (`wandb online` clears it)"
        else:
            setting = f"logger.wandb.mode={requested}"
        raise ConfigError(f"{setting} is not a W&B mode; use online, offline or disabled")
    if mode in ("auto", "online") and not wandb_credentials():
        said = rank_zero_only.rank == 0  # each rank builds its loggers: one line a run (153)
        if said and mode == "online":
            log.warning(
                "W&B online mode was asked for but no credentials were found: logging offline"
            )
        elif said:  # W&B's own line then says "run `wandb online`", which needs a login first
            log.info(
                "W&B: no credentials (WANDB_API_KEY or `wandb login`): logging offline into the "
                "run folder; `wandb sync <run>/wandb/offline-run-*` uploads it later"
            )
        mode = "offline"
    mode = "online" if mode == "auto" else mode
    if env is not None:
        os.environ["WANDB_MODE"] = mode
    return mode


def wandb_server() -> str:
    """The URL of the W&B server that wandb.init would use (wandb imported: a run starts)."""
    try:  # (private; wandb's default server moved from api.wandb.ai in 0.2x)
        from wandb.sdk.lib.urls import DEFAULT_BASE_URL
    except ImportError:
        DEFAULT_BASE_URL = "https://api.wandb.ai"

    return wandb_base_url() or DEFAULT_BASE_URL


def unreachable(url: str, timeout: float = 5.0) -> str | None:
    """Why the W&B server at ``url`` cannot be reached (no TCP connection within ``timeout``
    seconds: a compute node without internet), or None. wandb would spend its init_timeout
    (60 s) and about 10 s more before it gave up, at every run of a sweep. Behind a proxy
    (HTTPS_PROXY, ...) the server is not dialed directly: None, and wandb's own timeout bounds."""
    import socket

    if any(os.environ.get(k) for k in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy")):
        return None
    parts = urlparse(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        socket.create_connection((parts.hostname, port), timeout=timeout).close()
    except OSError as e:
        return f"{parts.hostname}:{port} not reachable: {e.strerror or type(e).__name__}"
    return None


def offline_in_this_process() -> None:
    """Make W&B's process-wide settings offline, as they are under WANDB_MODE=offline, before an
    offline run starts. A run made offline by ``wandb.init(mode="offline")`` alone (how Lightning
    passes the mode) still has wandb 0.2x-0.3x's own usage telemetry (its OpenTelemetry
    exporter, keyed to the process's settings) post to the W&B server: at exit it waits up to
    its 10 s HTTP timeout where the server takes the connection and never answers (a compute
    node behind a firewall that drops packets), and it sends from a run its user made offline.
    A later ``wandb.init(mode="online")`` in the process (a multirun's next job) is still online:
    the run's own mode overrides these settings."""
    import wandb

    wandb.setup(settings=wandb.Settings(mode="offline"))


def split_overrides(text: str) -> list[str]:
    """Split Hydra's override_dirname ("a=1,b=[1,2]") at the commas outside brackets."""
    items, depth, current = [], 0, ""
    for char in text:
        depth += (char in "[({") - (char in "])}")
        if char == "," and depth == 0:
            items.append(current)
            current = ""
        else:
            current += char
    return [item for item in [*items, current] if item]


class LitlabWandbLogger(WandbLogger):
    """Lightning's WandbLogger that survives a W&B outage and logs the config flat.

    If the run cannot start online (server unreachable, bad key), the failure is bounded by
    ``settings.init_timeout`` and the run continues offline with a warning; its files can be
    uploaded later with ``wandb sync``. The config is logged flat ("model.optimizer.lr") so the
    dashboard's table and parallel-coordinates views can use every key without editing.
    """

    # W&B's server could not be reached from this process: the next runs (a sweep's jobs)
    # log offline at once instead of probing again
    _online_failed: ClassVar[str | None] = None

    @property
    @rank_zero_experiment
    def experiment(self) -> Any:
        init = wandb_init_arguments(self)
        if not wandb_started(self) and init.get("mode") == "online":
            folder = wandb_folder(Path(init.get("dir") or "."))
            earlier = unsynced_offline_parts(folder, init.get("id"))
            if earlier:
                log.warning(
                    "W&B: this run's earlier part is offline and not uploaded, and W&B drops "
                    "the steps of a part uploaded after a later part's: this part logs offline "
                    "too (the line at its end uploads them all). To log online, upload them "
                    "first (%s) and resume again",
                    sync_line(earlier),
                )
                init["mode"] = "offline"
        if not wandb_started(self) and init.get("mode") == "online":
            why = LitlabWandbLogger._online_failed or unreachable(wandb_server())
            # only an unreachable server is remembered: another failure (a timeout, a run id
            # in use) may not repeat, and the next run tries online again
            LitlabWandbLogger._online_failed = why
            if why is None:
                try:
                    return WandbLogger.experiment.fget(self)
                except Exception as e:  # wandb raises CommError, UsageError, timeouts...
                    why = first_line(e)
            log.warning("W&B could not start online (%s); logging offline instead", why)
            init["mode"] = "offline"
        if not wandb_started(self) and init.get("mode") == "offline":
            offline_in_this_process()
        return WandbLogger.experiment.fget(self)

    _lost = False  # W&B's service process has gone

    def _send(self, call: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        """Pass data to W&B unless its service process has gone (killed with the run's process
        group by SLURM, `timeout` or `docker stop`): then warn once and let training go on,
        to stop at the next batch boundary with a checkpoint; the CSV log keeps the metrics."""
        if self._lost:
            return
        try:
            call(*args, **kwargs)
        except Exception as e:
            if not (isinstance(e, OSError) or type(e).__module__.startswith("wandb")):
                raise
            self._lost = True
            log.warning("W&B stopped taking data (%s); training goes on without it", first_line(e))

    def log_hyperparams(self, params: dict[str, Any] | Any) -> None:
        self._send(super().log_hyperparams, flat_hyperparameters(params))

    # Metrics of one step, held until the step's other metrics come (W&B call per step: one).
    _held: tuple[int, dict[str, Any]] | None = None

    def log_metrics(self, metrics: dict[str, Any], step: int | None = None) -> None:
        """Held, and sent with the next metrics of the same step, at ``save`` (which Lightning's
        logging calls after each of its own) or before anything else is sent. Lightning's
        LearningRateMonitor hands the rates of a logging step to the loggers itself at the
        batch's start, and Lightning the step's metrics at its end: two W&B ``log`` calls, each
        a round trip to W&B's service process (about 0.5 ms on a 2-core CPU, 3% of a small
        net's step at log_every_n_steps=10: docs/benchmarks.md, P1), and two rows of one step
        in the W&B run; now one. The CSV log, written as before, keeps every row at once.
        A key given twice and metrics without a step go out as rows of their own, in order.
        Lightning's log_table and log_text pass through here too (held to the step's end)."""
        if self._held is not None and (self._held[0] != step or self._held[1].keys() & metrics):
            self._release()  # another step's, or a second value of a key: rows of their own
        if step is None:  # no step to tell the rows of one step by
            self._send(WandbLogger.log_metrics, self, metrics, step)
            return
        held = self._held[1] if self._held is not None else {}
        self._held = (step, {**held, **metrics})

    def _release(self) -> None:
        held, self._held = self._held, None
        if held is not None:
            self._send(WandbLogger.log_metrics, self, held[1], held[0])

    def save(self) -> None:
        self._release()
        super().save()

    def log_image(self, *args: Any, **kwargs: Any) -> None:
        """Sent at once (Lightning's log_image goes through log_metrics, which would hold it)."""
        self._release()
        self._send(super().log_image, *args, **kwargs)
        self._release()

    # log_model: the ModelCheckpoint that keeps the best checkpoint by this metric (the
    # objective's), and the version of its file uploaded last
    _best_metric: str | None = None
    _best_callback: Any = None
    _uploaded: Path | None = None
    _said_none = False

    def after_save_checkpoint(self, checkpoint_callback: Any) -> None:
        # Not Lightning's log_model: it uploads every ModelCheckpoint's files, and the alias
        # "best" went to the newest file of a callback without a metric (last.ckpt).
        if self._best_metric and checkpoint_callback.monitor == self._best_metric:
            self._best_callback = checkpoint_callback

    @rank_zero_only
    def finalize(self, status: str) -> None:
        self._release()
        if self._best_metric and status == "success":
            self._send(self._upload_best)
        super().finalize(status)

    def _upload_best(self) -> None:
        """The best checkpoint as W&B artifact model-<run id>:best, once per version of its file
        (finalize comes after the fit and again after the test)."""
        path = getattr(self._best_callback, "best_model_path", "")
        if not path or not Path(path).is_file():
            if not self._said_none:
                self._said_none = True
                log.warning(
                    "logger.wandb.log_model: this run kept no checkpoint by %s "
                    "(callbacks.model_checkpoint); nothing uploaded",
                    self._best_metric,
                )
            return
        frozen = self._frozen(Path(path))  # named by the version: one upload each
        if frozen != self._uploaded:
            self.experiment.log_artifact(self._model_artifact(path, frozen), aliases=["best"])
            self._uploaded = frozen

    def _model_artifact(self, path: str, frozen: Path) -> Any:
        """The file added in place ("immutable": no copy in W&B's staging folder, outside the
        run folder), as a snapshot of this version (``frozen``): it is read when uploaded,
        offline by `wandb sync`, by which time best.ckpt may hold a later best (a resume)."""
        import wandb

        score = self._best_callback.best_model_score
        metadata = {
            "metric": self._best_metric,
            "score": None if score is None else float(score),
            "original_filename": Path(path).name,
        }
        artifact = wandb.Artifact(f"model-{self.experiment.id}", type="model", metadata=metadata)
        artifact.add_file(str(frozen), name="model.ckpt", policy="immutable")
        return artifact

    def _frozen(self, path: Path) -> Path:
        """This version of ``path`` under <run>/wandb/uploads/: a hard link (no second copy while
        the file stays; checkpoints are replaced by rename, so the link keeps these bytes), or a
        copy where the filesystem has no links."""
        stat = path.stat()
        frozen = Path(self.save_dir) / "wandb" / "uploads" / f"{path.stem}-{stat.st_mtime_ns}.ckpt"
        if not frozen.is_file():
            frozen.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.link(path, frozen)
            except OSError:
                shutil.copy2(path, frozen)
        return frozen


def wandb_logger(
    save_dir: str,
    project: str = "litlab",
    mode: Mode = "auto",
    name: str | None = None,
    group: str | None = None,
    tags: Sequence[str] = (),
    overrides: str = "",
    log_model: bool = False,
    best_metric: str | None = None,
    resumed: str = "",
    **kwargs: Any,
) -> WandbLogger:
    """A W&B logger that writes under the run folder and never waits for a login.

    ``overrides`` (what this run changed, e.g. "model.optimizer.lr=0.001,seed=2") names the run
    when ``name`` is not given and adds one tag per override, so sweep jobs are told apart;
    ``resumed`` (what ``resume=`` commands changed since) one tag each, "resumed:<override>"
    (the name stays the first command's).
    ``log_model``: upload the checkpoint that ``best_metric`` (the objective's) ranks best, at
    the end of the fit, as artifact model-<run id>:best.
    """
    changed = split_overrides(overrides)
    check_log_model(log_model, best_metric)
    # Lightning asks W&B to "allow" resuming every run, which costs an extra server round trip
    # (and minutes when the server is down); only a run resumed with its id needs it.
    kwargs.setdefault("resume", "allow" if kwargs.get("id") else None)
    if kwargs.get("settings") is not None:  # a config mapping; wandb wants a plain dict
        kwargs["settings"] = dict(kwargs["settings"])
    logger = LitlabWandbLogger(
        save_dir=save_dir,
        project=project,
        mode=wandb_mode(mode),
        name=name or overrides or None,
        group=group,
        tags=[
            *tags,
            *(tag[:64] for tag in changed),
            *(f"resumed:{tag}"[:64] for tag in split_overrides(resumed)),
        ],
        **kwargs,
    )
    logger._best_metric = best_metric if log_model else None
    # Lightning passes anonymous=None to wandb.init, which wandb >= 0.19 warns about on every
    # run; not passing it at all means the same.
    if wandb_init_arguments(logger).get("anonymous") is None:
        wandb_init_arguments(logger).pop("anonymous", None)
    return logger


def check_forked_wandb(cfg: Any) -> None:
    """Refuse W&B under a strategy that forks the ranks from this process (ddp_fork,
    ddp_notebook): W&B's runs do not survive a fork, and nothing the run logged reached them
    (two offline runs were left, without a record of the run, its history or its end)."""
    from litlab.distributed.strategy import forks_the_ranks, strategy_name

    strategy = OmegaConf.select(cfg, "trainer.strategy") or "auto"
    if not forks_the_ranks(strategy) or os.environ.get("WANDB_MODE") == "disabled":
        return
    for node in (cfg.get("logger") or {}).values():
        target = str(node.get("_target_", "")) if hasattr(node, "get") else ""
        if "wandb" in target.lower() and node.get("mode") != "disabled":
            raise ConfigError(
                f"trainer.strategy={strategy_name(strategy)} forks the ranks from this process, and W&B cannot "
                "log from forked processes (nothing would reach it): use trainer.strategy="
                "ddp_spawn or ddp, or logger=csv"
            )


def check_log_model(log_model: Any, best_metric: str | None) -> None:
    """log_model is true or false. Lightning's "all" (every checkpoint as it is written) is
    refused: litlab overwrites best.ckpt and last.ckpt in place, so W&B would need a copy of
    each version in its staging folder (~/.local/share/wandb, outside the run folder)."""
    if not isinstance(log_model, bool):
        raise ConfigError(
            f"logger.wandb.log_model={log_model} is not supported; use true (the best "
            "checkpoint, uploaded when the fit ends) or false"
        )
    if log_model and not best_metric:
        raise ConfigError(
            "logger.wandb.log_model=true needs logger.wandb.best_metric, the metric whose best "
            "checkpoint is uploaded"
        )


def finish_loggers(
    loggers: list[Logger], ended: BaseException | None = None, summary: dict[str, Any] | None = None
) -> None:
    """Close W&B runs (so the next multirun job gets its own) and say how to sync offline ones;
    ``ended``: what ended the run (None: it completed), which W&B then shows by the run's exit
    code (`wandb_exit_code`; wandb's own exit hook, which would say so, comes too late).
    ``summary`` (the objective's value, status, checkpoints) goes into the W&B run's summary.

    A W&B run that cannot be closed (its service process was ended by the same signal that
    stopped the run, as SLURM and `kill` of a process group do) is reported in one line: it
    never replaces how the run itself ended, and the files written so far stay in place.
    """
    for logger in loggers:
        if not isinstance(logger, WandbLogger):
            continue
        logger.save()  # metrics it still holds (LitlabWandbLogger.log_metrics)
        if not wandb_started(logger):
            continue
        run = logger.experiment
        offline = getattr(run.settings, "mode", "") in ("offline", "dryrun")
        upload = sync_command(run.settings.sync_dir, run.id) if offline else None
        try:
            run.summary.update(summary or {})
            run.finish(exit_code=wandb_exit_code(ended))
        except Exception as e:  # wandb raises ConnectionResetError, CommError, ...
            log.warning("W&B could not close its run (%s); what it logged is kept", first_line(e))
            import wandb

            with contextlib.suppress(Exception):  # else wandb's exit hook fails the same way
                wandb.teardown()
            continue
        if upload:
            log.info("W&B run saved offline; upload it later with: %s", upload)


def wandb_exit_code(ended: BaseException | None) -> int:
    """The exit code a W&B run is closed with, by what ended the run: 0 completed, 143 a
    SIGTERM (a scheduler's preemption or time limit, `kill`: 128 + 15, the process's own exit
    status), 255 Ctrl-C (wandb's code for a KeyboardInterrupt; Lightning ends a fit on one with
    a SystemExit), 1 an error (a divergence, out of memory, bad data). Only 0 is shown as
    finished: an interrupted run closed with 0 looked like one that had trained to its end."""
    if ended is None:
        return 0
    if isinstance(ended, SIGTERMException):
        return 143
    if isinstance(ended, SystemExit | KeyboardInterrupt):
        return 255
    return 1


# The length of a W&B transaction log's header (":W&B", a magic number, a version): a part
# whose log holds it alone has no record, as one of a process killed hard leaves it (W&B's
# service shuts down on its parent's death without writing what it held: review 170)
WANDB_HEADER = 7


def sync_command(sync_dir: str, run_id: str) -> str:
    """The `wandb sync` of an offline run: every part of it where it was resumed (one folder a
    part, the same run id) not uploaded yet, together, which wandb syncs as one run in order of
    start time; one part synced alone would upload that part's history only. Parts that hold
    no record are left out, and said: W&B's history misses what they trained."""
    folder = Path(sync_dir)
    parts = unsynced_offline_parts(folder.parent, run_id)
    empty = [p for p in parts if p != folder and _recorded(p / f"run-{run_id}.wandb") == 0]
    if empty:
        log.warning(
            "W&B: the run's part(s) %s hold no data (a process killed hard: W&B's service ended "
            "with it before writing what it held): the W&B run misses the steps they trained "
            "(metrics.csv has them all); left out of the upload",
            ", ".join(part.name for part in empty),
        )
    return sync_line([part for part in parts if part not in empty] or [folder])


def _recorded(transaction_log: Path) -> int:
    """How many bytes of records a W&B transaction log holds beyond its header (-1 where it
    cannot be read)."""
    try:
        return transaction_log.stat().st_size - WANDB_HEADER
    except OSError:
        return -1


def sync_line(parts: list[Path]) -> str:
    return "wandb sync " + " ".join(shlex.quote(str(part)) for part in parts)


def wandb_folder(save_dir: Path) -> Path:
    """Where wandb puts its run folders under a run's ``save_dir`` (its ``Settings.wandb_dir``):
    ``.wandb`` where that folder exists, else ``wandb``."""
    dot = save_dir / ".wandb"
    return dot if dot.is_dir() else save_dir / "wandb"


def offline_parts(wandb_dir: Path, run_id: str) -> list[Path]:
    """The folders where the W&B run ``run_id`` was logged offline, in the order they started
    (one a part: each resume adds one). Found by the transaction log each holds,
    ``run-<id>.wandb``: a part started in the same second as another has "-1" after the id in
    its folder's name."""
    logs = wandb_dir.glob(f"offline-run-*/run-{glob.escape(run_id)}.wandb")
    return sorted(log_file.parent for log_file in logs)


def unsynced_offline_parts(wandb_dir: Path, run_id: str | None) -> list[Path]:
    """offline_parts less those ``wandb sync`` uploaded (it leaves ``run-<id>.wandb.synced``
    beside the transaction log, as wandb's own ``sync --skip-synced`` reads it)."""
    if not run_id:
        return []
    parts = offline_parts(wandb_dir, run_id)
    return [part for part in parts if not (part / f"run-{run_id}.wandb.synced").exists()]


def end_wandb_service() -> None:
    """Stop W&B's service process now (``wandb.teardown``), before a cluster scheduler that was
    asked to requeue the job ends every process of it: else W&B's exit hook, finding its service
    gone, prints a traceback after the run had closed cleanly. Nothing if W&B was not used."""
    import sys

    wandb = sys.modules.get("wandb")
    if wandb is not None:
        with contextlib.suppress(Exception):
            wandb.teardown()
