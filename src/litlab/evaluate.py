"""The eval task: rebuild data and model from a checkpoint's stored config and test it."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import hydra
import lightning as L
from omegaconf import DictConfig, OmegaConf

from litlab.callbacks.gan import save_generated_images
from litlab.checkpoint import load_checkpoint, stored_config
from litlab.config import (
    build,
    check_all,
    check_top_level,
    config_dir,
    require,
)
from litlab.errors import ConfigError
from litlab.hardware import check_hardware, resolve_precision
from litlab.loggers import finish_loggers
from litlab.run import Run, build_list
from litlab.train import setup_extras

log = logging.getLogger("litlab")

USAGE = "python eval.py ckpt_path=outputs/train/<date>/<time>/checkpoints/best.ckpt"


def evaluate(cfg: DictConfig, run: Run) -> dict[str, Any]:
    """Test the checkpoint on the stored data config (or data=... given here)."""
    check_top_level(cfg, "eval")
    path = require(cfg, "ckpt_path", USAGE)
    checkpoint = load_checkpoint(path)
    stored = stored_config(checkpoint, path)
    # The stored config is resolved; a data=... choice made here is resolved against this run.
    parts = OmegaConf.create(
        {"data": other_data(cfg.data, stored.data) if cfg.get("data") else stored.data}
    )
    parts.model = stored.model
    check_all(parts)
    run.summary["precision"] = resolve_precision(cfg.trainer)
    check_all(cfg)
    check_hardware(cfg.trainer)
    setup_extras(cfg)
    L.seed_everything(cfg.seed, workers=True)
    run.summary["checkpoint"] = str(path)
    run.summary["trained_config_digest"] = stored.get("config_digest")
    run.summary["metric"] = eval_metric(stored)

    datamodule = build(parts.data, "data")
    # the class names the model learned (image folders), checked when the data is set up
    datamodule.load_state_dict(checkpoint.get(type(datamodule).__qualname__, {}))
    model = build(parts.model, "model")
    model.load_state_dict(checkpoint["state_dict"])
    loggers = build_list(cfg.get("logger"), "logger")
    # Evaluation callbacks of the trained run (a GAN's FID and sample grids) test it the same way.
    trained_callbacks = build_list(stored.get("callbacks"), "callbacks")
    callbacks = [c for c in trained_callbacks if getattr(c, "used_in_eval", False)]
    trainer = build(cfg.trainer, "trainer", logger=loggers, callbacks=callbacks)
    try:
        with run.phase("test"):
            trainer.test(model, datamodule=datamodule)
        run.record_metrics(trainer.callback_metrics)
    finally:
        finish_loggers(trainer.loggers)
    if cfg.get("generate"):
        folder = Path(cfg.paths.output_dir) / "generated"
        with run.phase("generate"):
            run.summary["generated"] = save_generated_images(model, int(cfg.generate), folder)
        run.summary["generated_dir"] = str(folder)
    return run.summary["metrics"]


def other_data(chosen: DictConfig, trained: DictConfig) -> DictConfig:
    """The data chosen for testing, normalized as the model was trained (the network only
    knows the inputs it was trained on), and refused when its images or classes differ."""
    data = OmegaConf.to_container(chosen, resolve=True)
    before = OmegaConf.to_container(trained, resolve=True)
    for key in ("image_shape", "num_classes"):
        if data[key] != before[key]:
            raise ConfigError(
                f"the model was trained on data.{key}={before[key]} but this data has "
                f"{data[key]}; test it on data of the same {key.replace('_', ' ')}"
            )
    if (data["mean"], data["std"]) != (before["mean"], before["std"]):
        log.info(
            "normalizing this data as in training: mean %s, std %s (not %s, %s)",
            before["mean"],
            before["std"],
            data["mean"],
            data["std"],
        )
        data["mean"], data["std"] = before["mean"], before["std"]
    return OmegaConf.create(data)


def eval_metric(stored: DictConfig) -> str:
    """The test counterpart of the metric the trained run optimized (objective group)."""
    metric = str((stored.get("objective") or {}).get("metric", "val/acc"))
    return "test/" + metric.split("/", 1)[-1]


def eval_task(cfg: DictConfig) -> float | None:
    """Everything `python eval.py` does once Hydra has composed the config."""
    with Run(cfg, "eval") as run:
        metrics = evaluate(cfg, run)
        return metrics.get(run.summary["metric"])


@hydra.main(version_base="1.3", config_path=config_dir(), config_name="eval")
def main(cfg: DictConfig) -> float | None:
    return eval_task(cfg)


if __name__ == "__main__":
    main()
