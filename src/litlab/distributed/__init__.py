"""What Lightning lacks for GANs and Hydra under DDP, one module per concern: the strategy a GAN
needs and rank 0's buffers (strategy), a sweep's jobs each on their own ranks (multirun), one
run or sweep folder and the processes' layout under torchrun or srun (launchers), the resources
of Hydra's SLURM launcher (slurm), a flag all ranks agree on without a host sync in the step
(agree). Where a SLURM job's run lives, so that a requeued
job continues there, is litlab.resume's."""

from litlab.distributed import slurm  # registers the SLURM launcher's resolvers
from litlab.distributed.launchers import (
    adopt_launcher_layout,
    global_rank,
    launched_processes,
    launcher_layout,
    rank0_dir,
)
from litlab.distributed.multirun import ranks_run_this_job
from litlab.distributed.strategy import (
    SeparateNetsDDPStrategy,
    broadcast_buffers,
    ddp_net,
    fsdp_strategy,
    log_job_value,
    strategy_for,
    strategy_name,
    unused_parameters_explained,
)

__all__ = [
    "SeparateNetsDDPStrategy",
    "adopt_launcher_layout",
    "broadcast_buffers",
    "ddp_net",
    "fsdp_strategy",
    "global_rank",
    "launched_processes",
    "launcher_layout",
    "log_job_value",
    "rank0_dir",
    "ranks_run_this_job",
    "slurm",
    "strategy_for",
    "strategy_name",
    "unused_parameters_explained",
]
