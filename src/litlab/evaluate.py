"""The eval task: rebuild data and model from a checkpoint's stored config and test it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import hydra
from omegaconf import DictConfig, OmegaConf

from litlab.callbacks.gan import save_generated_images
from litlab.checkpoint import load_checkpoint, stored_config
from litlab.config import build, check_all, check_hardware, config_dir, require
from litlab.loggers import finish_loggers
from litlab.run import Run, build_list
from litlab.train import setup_extras

USAGE = "python eval.py ckpt_path=outputs/train/<date>/<time>/checkpoints/best.ckpt"


def evaluate(cfg: DictConfig, run: Run) -> dict[str, Any]:
    """Test the checkpoint on the stored data config (or data=... given here)."""
    path = require(cfg, "ckpt_path", USAGE)
    checkpoint = load_checkpoint(path)
    stored = stored_config(checkpoint, path)
    # The stored config is resolved; a data=... choice made here is resolved against this run.
    parts = OmegaConf.create(
        {"data": cfg.data if cfg.get("data") else stored.data, "model": stored.model}
    )
    check_all(parts)
    check_all(cfg)
    check_hardware(cfg.trainer)
    setup_extras(cfg)
    run.summary["checkpoint"] = str(path)
    run.summary["trained_config_digest"] = stored.get("config_digest")

    datamodule = build(parts.data, "data")
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


def eval_task(cfg: DictConfig) -> float | None:
    """Everything `python eval.py` does once Hydra has composed the config."""
    with Run(cfg, "eval") as run:
        metrics = evaluate(cfg, run)
        return metrics.get("test/acc", metrics.get("test/fid"))


@hydra.main(version_base="1.3", config_path=config_dir(), config_name="eval")
def main(cfg: DictConfig) -> float | None:
    return eval_task(cfg)


if __name__ == "__main__":
    main()
