"""What the machine at hand can run: its native precision (``trainer.precision=auto``), and the
accelerator, precision and device choices it refuses.

bfloat16 is fast only where the hardware has it: GPUs from Ampere on, and x86 CPUs with
AVX512-BF16 or AMX. Elsewhere torch emulates it: measured on a 2-core AVX2 EPYC,
experiment=fashion_fast trained 11x and experiment=fashion_dcgan 22x slower in bf16-mixed
than in 32-true, while on a 2-core AVX512-BF16 EPYC bf16-mixed trained them 1.8x and 1.5x
faster (docs/benchmarks.md). Recipes therefore ask for ``auto``, resolved here.
"""

from __future__ import annotations

import logging
from functools import cache
from pathlib import Path

import torch
from lightning.pytorch.utilities import rank_zero_only
from omegaconf import DictConfig

from litlab.compat import cpu_probe_bf16
from litlab.distributed.strategy import forks_the_ranks, strategy_name
from litlab.errors import ConfigError

log = logging.getLogger("litlab")

BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")


@cache
def cpu_flags() -> frozenset[str] | None:
    """The CPU's feature flags from /proc/cpuinfo (Linux); None where there is no such file."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("flags"):
            return frozenset(line.split(":", 1)[1].split())
    return frozenset()


def cpu_has_native_bf16() -> bool:
    """Whether this CPU computes bfloat16 in hardware (AVX512-BF16 or AMX-BF16)."""
    flags = cpu_flags()
    if flags is not None:
        return any(flag in flags for flag in BF16_CPU_FLAGS)
    return cpu_probe_bf16()  # not Linux: torch's own probe


def on_gpu(accelerator: str) -> bool:
    """Whether the run computes on a CUDA GPU (a GPU asked for on a machine without one is
    refused later, by check_hardware, with what to use instead)."""
    return accelerator in ("gpu", "cuda", "auto") and torch.cuda.is_available()


def gpu_emulates_bf16() -> bool:
    """Whether this CUDA GPU runs bfloat16 only by emulation (before compute capability 8.0,
    where torch.cuda.is_bf16_supported() still says True)."""
    return torch.cuda.is_bf16_supported() and not torch.cuda.is_bf16_supported(
        including_emulation=False
    )


def fastest_precision(accelerator: str) -> tuple[str, str]:
    """(Lightning precision, reason): the fastest precision this hardware runs natively."""
    if on_gpu(accelerator):
        name = torch.cuda.get_device_name()
        if torch.cuda.is_bf16_supported(including_emulation=False):
            return "bf16-mixed", f"{name} computes bfloat16 natively"
        if torch.cuda.get_device_capability()[0] >= 7:
            return "16-mixed", f"{name} has float16 tensor cores but no native bfloat16"
        return "32-true", f"{name} has no tensor cores"
    if accelerator in ("cpu", "auto") and cpu_has_native_bf16():
        return "bf16-mixed", "this CPU computes bfloat16 natively (AVX512-BF16/AMX)"
    if accelerator in ("cpu", "auto"):
        return "32-true", "this CPU has no native bfloat16 (AVX512-BF16/AMX): it would be emulated"
    return "32-true", f"no measured faster precision on accelerator={accelerator}"


def resolve_precision(trainer: DictConfig) -> dict[str, str]:
    """Turn trainer.precision=auto into the fastest native precision (said in one line), and
    warn once when bf16 is asked for explicitly on a CPU that would emulate it. Returns what
    summary.json records: requested, chosen and why."""
    given = trainer.get("precision", "32-true")
    requested = str(given)
    accelerator = str(trainer.get("accelerator", "auto"))
    # (null: Lightning's default; Lightning's own refusal prints its type in full)
    if given is not None and requested not in (*PRECISIONS, "auto"):
        raise ConfigError(
            f"trainer.precision={requested} is not a precision: auto (the machine's fastest; "
            "eval.py's default, trained: the run's), " + ", ".join(PRECISIONS[:6])
        )
    if requested == "auto":
        chosen, why = fastest_precision(accelerator)
        trainer.precision = chosen
        if not _refused(trainer):  # (said "on accelerator=gpu" before the refusal: 142)
            log.info("trainer.precision=auto: %s (%s)", chosen, why)
        return {"requested": requested, "chosen": chosen, "why": why}
    emulated = (requested.startswith("bf16") and not cpu_has_native_bf16()) or requested in (
        "16-true",
        "16",
        "16-mixed",
    )
    emulated = emulated and not on_gpu(accelerator)  # (on this CPU)
    # (float16 autocast on a CPU is refused by check_hardware: no warning before the refusal)
    if emulated and requested not in GPU_ONLY_PRECISIONS:
        bf16 = requested.startswith("bf16")
        log.warning(
            "trainer.precision=%s on a CPU without native %s: torch emulates it, %s; "
            "trainer.precision=auto picks the fastest",
            requested,
            "bfloat16 (AVX512-BF16/AMX)" if bf16 else "float16",
            "bf16 measured 10-20x slower than 32-true on such a CPU"
            if bf16
            else "slower than 32-true",
        )
    elif requested.startswith("bf16") and on_gpu(accelerator) and gpu_emulates_bf16():
        log.warning(
            "trainer.precision=%s on %s, which has no native bfloat16 (compute capability below "
            "8.0): torch emulates it without tensor cores; trainer.precision=auto picks %s",
            requested,
            torch.cuda.get_device_name(),
            fastest_precision(accelerator)[0],
        )
    why = "as configured" + (", emulated on this CPU" if emulated else "")
    chosen = "32-true" if given is None else requested  # (null: Lightning's default, kept in
    trainer.precision = chosen  # the run's config as such: eval's "trained" read "None": 180)
    return {"requested": requested, "chosen": chosen, "why": why}


# float16 autocast: a GPU's only (16-true, float16 weights, runs emulated on a CPU).
GPU_ONLY_PRECISIONS = ("16-mixed", "16")
# What Lightning's Trainer takes (its precision plugin's inputs), the named ones first
PRECISIONS = (
    "32-true", "bf16-mixed", "16-mixed", "bf16-true", "16-true", "64-true",
    "transformer-engine", "transformer-engine-float16", "64", "32", "16", "bf16",
)  # fmt: skip


def check_accelerator(trainer: DictConfig) -> None:
    """Refuse an accelerator (or FSDP) this machine does not have (check_hardware's first
    checks; resolve_precision says nothing of a precision for it: walkthrough 142)."""
    accelerator = str(trainer.get("accelerator", "auto"))
    cuda = torch.cuda.device_count()
    mps = torch.backends.mps.is_available()
    name = strategy_name(trainer.get("strategy", "auto"))
    clipped = trainer.get("gradient_clip_val") and trainer.get("gradient_clip_algorithm") != "value"
    if "fsdp" in name.lower() and clipped:  # Lightning raised it once the fit had started
        raise ConfigError(
            "trainer.gradient_clip_val clips by norm, which Lightning's FSDP does not (a norm "
            "over sharded gradients); set trainer.gradient_clip_algorithm=value, or use "
            "trainer.strategy=ddp"
        )
    # trainer=fsdp on a machine without CUDA: this line, not the accelerator's and then this
    if "fsdp" in name.lower() and not cuda and accelerator != "cpu":
        raise ConfigError(
            "FSDP shards models across CUDA GPUs, and this machine has none; on CPU use "
            "trainer=ddp trainer.accelerator=cpu (or trainer=cpu for one process)"
        )
    if accelerator in ("gpu", "cuda") and not cuda and not (accelerator == "gpu" and mps):
        raise ConfigError(
            f"trainer.accelerator={accelerator} but this machine has no CUDA GPU; "
            "use trainer=cpu (or trainer.accelerator=auto)"
        )
    if accelerator == "mps" and not mps:
        raise ConfigError(
            "trainer.accelerator=mps but Apple's MPS is not available; use trainer.accelerator=auto"
        )


def _refused(trainer: DictConfig) -> bool:
    """Whether check_accelerator refuses this trainer (check_hardware says it, later)."""
    try:
        check_accelerator(trainer)
    except ConfigError:
        return True
    return False


def check_hardware(trainer: DictConfig) -> bool:
    """Refuse accelerator/precision/device choices this machine cannot run, saying what to use;
    return whether the run is on the CPU."""
    check_accelerator(trainer)
    accelerator = str(trainer.get("accelerator", "auto"))
    precision = str(trainer.get("precision", "32-true"))
    devices = trainer.get("devices", 1)
    cuda = torch.cuda.device_count()
    mps = torch.backends.mps.is_available()
    name = strategy_name(trainer.get("strategy", "auto"))
    on_cpu = accelerator == "cpu" or (accelerator == "auto" and not cuda and not mps)
    if on_cpu and precision in GPU_ONLY_PRECISIONS:  # Lightning would run bf16-mixed instead
        raise ConfigError(
            f"trainer.precision={precision} (float16 autocast) needs a GPU; on CPU use "
            "trainer.precision=auto (the fastest this CPU runs natively), 32-true or bf16-mixed"
        )
    if on_cpu and "fsdp" in name.lower():  # trainer.accelerator=cpu on a machine with GPUs
        raise ConfigError("FSDP shards models across CUDA GPUs; on CPU use trainer.strategy=ddp")
    if on_cpu and str(devices).strip() == "-1":
        raise ConfigError(
            "trainer.devices=-1 means every GPU; on CPU give a number of processes, e.g. trainer.devices=2"
        )
    if on_cpu and not (
        devices == "auto"
        or (isinstance(devices, int) and not isinstance(devices, bool))
        or (isinstance(devices, str) and devices.strip().lstrip("-").isdigit())
    ):  # (Lightning's CPUAccelerator TypeError, as Hydra's error: walkthrough 178)
        raise ConfigError(
            f"trainer.devices={devices} on CPU: give a number of processes, e.g. "
            "trainer.devices=2 (GPU indices and lists select GPUs)"
        )
    if (isinstance(devices, int) and (devices == 0 or devices < -1)) or int(
        trainer.get("num_nodes", 1)
    ) < 1:
        raise ConfigError(
            f"trainer.devices must be a positive count, -1 (all) or auto and trainer.num_nodes at "
            f"least 1, got devices={devices}, num_nodes={trainer.get('num_nodes')}"
        )
    if cuda and not on_cpu and precision.startswith("bf16") and not torch.cuda.is_bf16_supported():
        raise ConfigError(
            f"this GPU has no bfloat16 support; use trainer.precision=16-mixed instead of {precision}"
        )
    if cuda and not on_cpu and forks_the_ranks(trainer.get("strategy", "auto")):
        # Lightning checks for CUDA started before the fork in the forked ranks only, where it
        # is too late: each died at its first CUDA call ("Cannot re-initialize CUDA in forked
        # subprocess"), after litlab had read the GPU's name and bfloat16 support here
        raise ConfigError(
            f"trainer.strategy={name} forks the ranks from this process, which has already "
            "asked CUDA about the GPU (precision); use trainer.strategy=ddp (or ddp_spawn)"
        )
    if isinstance(devices, int) and not on_cpu and cuda and devices > cuda:
        raise ConfigError(
            f"trainer.devices={devices} but this machine has {cuda} CUDA GPU(s); "
            f"use trainer.devices={cuda} (or -1 for all)"
        )
    several = isinstance(devices, int) and devices > 1
    if accelerator == "auto" and on_cpu and several and rank_zero_only.rank == 0:
        # a command written for a GPU machine runs here as CPU processes: say so once (rank 0;
        # every rank checks)
        log.warning(
            "trainer.devices=%d on a machine without a GPU: %d CPU processes (DDP over gloo), "
            "each with data.batch_size images a step",
            devices,
            devices,
        )
    return on_cpu
