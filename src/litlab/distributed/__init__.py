"""What Lightning lacks for GANs and Hydra under DDP, one module per concern: the strategy a GAN
needs and rank 0's buffers (strategy), a sweep's jobs each on their own ranks (multirun), one
run folder under torchrun or srun (launchers). Where a SLURM job's run lives, so that a requeued
job continues there, is litlab.resume's."""

from litlab.distributed.launchers import global_rank, rank0_dir, torchrun_layout
from litlab.distributed.multirun import ranks_run_this_job
from litlab.distributed.strategy import (
    broadcast_buffers,
    fsdp_strategy,
    log_job_value,
    strategy_for,
    strategy_name,
)

__all__ = [
    "broadcast_buffers",
    "fsdp_strategy",
    "global_rank",
    "log_job_value",
    "rank0_dir",
    "ranks_run_this_job",
    "strategy_for",
    "strategy_name",
    "torchrun_layout",
]
