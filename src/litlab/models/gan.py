"""Adversarial training of a generator against a discriminator, with Lightning manual optimization."""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Literal

import lightning as L
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.modules.batchnorm import _BatchNorm
from torch.optim import Optimizer
from torch.optim.lr_scheduler import ConstantLR
from torch.optim.swa_utils import AveragedModel

from litlab import rng
from litlab.compat import CheapHookName, ema_update
from litlab.data.decode import all_unreadable
from litlab.data.transforms import per_channel
from litlab.distributed import broadcast_buffers, ddp_net
from litlab.errors import ConfigError
from litlab.metrics.aggregation import Mean
from litlab.models.curves import StepCurves
from litlab.models.diffaugment import diff_augment, parse_policy
from litlab.models.lazy import has_lazy_tensors
from litlab.models.optim import make_optimizer
from litlab.rng import RankSeeded

Loss = Literal["bce", "wgan_gp", "hinge"]


def d_loss_fn(loss: Loss, real: Tensor, fake: Tensor) -> Tensor:
    """Discriminator loss from its logits on real and on generated images (float32: under
    bf16 autocast the logits are bf16, and a bf16 mean rounds the WGAN estimate to 0.25 at 50)."""
    real, fake = real.float(), fake.float()
    if loss == "bce":
        return F.softplus(-real).mean() + F.softplus(fake).mean()
    if loss == "hinge":
        return F.relu(1.0 - real).mean() + F.relu(1.0 + fake).mean()
    return fake.mean() - real.mean()  # wgan_gp: the critic's Wasserstein estimate, negated


def g_loss_fn(loss: Loss, fake: Tensor) -> Tensor:
    """Generator loss from the discriminator's logits on generated images (float32)."""
    fake = fake.float()
    if loss == "bce":
        return F.softplus(-fake).mean()  # non-saturating: -log D(G(z))
    return -fake.mean()


def gradient_penalty(
    discriminator: nn.Module, real: Tensor, fake: Tensor, generator: torch.Generator | None = None
) -> Tensor:
    """WGAN-GP penalty (Gulrajani et al. 2017), in float32 even under autocast.

    Under 16-bit autocast the inner gradient can overflow and it is not covered by the
    loss scaler, so both the interpolation and its gradient are computed in float32.
    """
    with torch.autocast(device_type=real.device.type, enabled=False):
        alpha = torch.rand(real.shape[0], 1, 1, 1, device=real.device, generator=generator)
        mixed = (alpha * real.float() + (1 - alpha) * fake.float()).requires_grad_(True)
        (grad,) = torch.autograd.grad(discriminator(mixed).float().sum(), mixed, create_graph=True)
        return ((grad.flatten(1).norm(2, dim=1) - 1.0) ** 2).mean()


def ema_with_warmup(decay: float) -> Callable[[list[Tensor], list[Tensor], Tensor], None]:
    """EMA update for AveragedModel whose decay ramps up as min(decay, (1 + n) / (10 + n)).

    Early averages are then not dominated by the random initial weights (a fixed 0.999 would
    need thousands of steps to forget them). Runs on the device: no host sync per step. A
    partial of a module-level function, not a closure: ddp_spawn pickles the model.
    """
    return functools.partial(_ema_with_warmup, decay)


@torch.no_grad()
def _ema_with_warmup(decay: float, ema: list[Tensor], current: list[Tensor], n: Tensor) -> None:
    if not ema[0].is_floating_point():  # BN's num_batches_tracked: just follow the model
        for e, c in zip(ema, current, strict=True):
            e.copy_(c)
        return
    # (not in a 16-bit average's type: bfloat16 rounds 0.999 to 1.0, an average that stops)
    d = torch.clamp((1.0 + n) / (10.0 + n), max=decay).to(
        torch.promote_types(ema[0].dtype, torch.float32)
    )
    ema_update(ema, current, d)


class AveragedCopy(AveragedModel):
    """torch's AveragedModel without its two host syncs an update: torch reads the device-side
    count twice (``bool(n_averaged == 0)``, ``n_averaged > 0``), each a GPU stall per step. The
    count is also kept on the host (read once after construction or a checkpoint load); the
    averaging, its groups by device and dtype, and the state dict are torch's."""

    _host_count: int | None = None  # None: read n_averaged once

    def _load_from_state_dict(self, *args: Any, **kwargs: Any) -> None:
        super()._load_from_state_dict(*args, **kwargs)
        self._host_count = None

    @torch.no_grad()
    def update_parameters(self, model: nn.Module) -> None:
        if not self.use_buffers or self.multi_avg_fn is None:
            super().update_parameters(model)
            self._host_count = None
            return
        if self._host_count is None:
            self._host_count = int(self.n_averaged)
        averaged = [
            t.detach() for t in itertools.chain(self.module.parameters(), self.module.buffers())
        ]
        current = itertools.chain(model.parameters(), model.buffers())
        current = [t.detach().to(a.device) for a, t in zip(averaged, current, strict=True)]
        if self._host_count == 0:
            for a, c in zip(averaged, current, strict=True):
                a.copy_(c)
        else:
            groups: dict[tuple[torch.device, torch.dtype], tuple[list[Tensor], list[Tensor]]] = {}
            for a, c in zip(averaged, current, strict=True):
                kept, new = groups.setdefault((a.device, a.dtype), ([], []))
                kept.append(a)
                new.append(c)
            for (device, _), (kept, new) in groups.items():
                self.multi_avg_fn(kept, new, self.n_averaged.to(device))
        self.n_averaged += 1
        self._host_count += 1


@contextmanager
def batch_statistics(net: nn.Module) -> Iterator[nn.Module]:
    """Run ``net``'s batch norms on the batch's own statistics, as in a training step, without
    changing their running statistics (momentum 0 keeps them; the batch counter is put back).
    Only the norms switch mode: spectral norm's power iteration, for one, must not advance.

    Every kind of batch norm (``_BatchNorm``: also SyncBatchNorm, and the plain class Lightning
    turns SyncBatchNorm back into after a DDP fit). A SyncBatchNorm runs as a plain batch norm
    here, on this rank's batch: its own forward is a collective per call, and evaluation
    loaders may give ranks different numbers of batches (streamed splits), which would hang."""
    norms = [m for m in net.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    saved = [(m.training, m.momentum, m.num_batches_tracked) for m in norms]
    for m in norms:
        m.train()
        m.momentum = 0.0
        if m.num_batches_tracked is not None:
            m.num_batches_tracked = m.num_batches_tracked.clone()
        if isinstance(m, nn.SyncBatchNorm):
            m.forward = nn.modules.batchnorm._BatchNorm.forward.__get__(m)
    try:
        yield net
    finally:
        for m, (training, momentum, tracked) in zip(norms, saved, strict=True):
            m.train(training)
            m.momentum, m.num_batches_tracked = momentum, tracked
            m.__dict__.pop("forward", None)


class GAN(CheapHookName, RankSeeded, StepCurves, L.LightningModule):
    """Generator G, discriminator D, and an EMA copy of G used for samples and FID.

    Step accounting: every training batch is one D step; G steps once every ``n_critic``
    batches. Lightning's ``global_step`` counts both optimizers' steps, so ``trainer.max_steps``
    is (1 + 1/n_critic) x batches; ``max_g_steps`` budgets generator iterations instead, and
    ``g/step`` is logged as the generator-iteration x-axis.

    Randomness: the noise (and DiffAugment's and the penalty's draws) of training batch k comes
    from a generator seeded with (noise_seed, global rank, k) (litlab.rng): under DDP every rank
    draws its own, and a resumed run draws what an uninterrupted one would.
    """

    # The DataModule must not augment real images: D would tell augmented reals from plain
    # fakes and G would learn the augmentation. ``diffaugment`` augments both alike.
    augments_real_images_alone = False
    # The EMA copy of G needs float32 weights (a decay of 0.999 rounds to 1.0 in bfloat16), and
    # FID's and the gradient penalty's inputs are float32: no bf16-true or 16-true.
    needs_float32_weights = True
    # Under DDP each in a wrapper of its own (litlab.distributed.SeparateNetsDDPStrategy): a
    # backward all-reduces the gradients of the net it trains alone.
    ddp_nets = ("generator", "discriminator")

    def __init__(
        self,
        generator: nn.Module,
        discriminator: nn.Module,
        g_optimizer: Callable[..., Optimizer],
        d_optimizer: Callable[..., Optimizer],
        data_mean: Sequence[float],
        data_std: Sequence[float],
        loss: Loss = "bce",
        n_critic: int = 1,
        gp_weight: float = 10.0,
        ema_decay: float | None = 0.999,
        max_g_steps: int | None = None,
        gradient_clip_val: float | None = None,
        num_fixed_noise: int = 64,
        noise_seed: int = 0,
        diffaugment: Sequence[str] | None = None,
    ) -> None:
        super().__init__()
        if loss not in ("bce", "wgan_gp", "hinge"):
            raise ConfigError(f"loss must be bce, wgan_gp or hinge, got {loss!r}")
        if n_critic < 1:
            raise ConfigError(f"n_critic must be at least 1, got {n_critic}")
        if gp_weight < 0:  # the penalty would become a reward (walkthrough 145)
            raise ConfigError(f"gp_weight must be >= 0, got {gp_weight}")
        if max_g_steps is not None and max_g_steps < 1:  # 0 still took a generator step
            raise ConfigError(f"max_g_steps must be at least 1 or null, got {max_g_steps}")
        # val/d_real, test/d_real: means over every held-out image (torchmetrics sums values and
        # weights over ranks; Lightning's mean averages the ranks' image counts as integers)
        self.val_d_real, self.test_d_real = Mean(), Mean()
        if ema_decay is not None and not 0.0 < ema_decay < 1.0:
            raise ConfigError(f"ema_decay must lie in (0, 1) or be null, got {ema_decay}")
        if loss == "wgan_gp" and any(  # (any batch norm: lazy, 1-d, synchronized too)
            isinstance(m, _BatchNorm) for m in discriminator.modules()
        ):
            raise ConfigError(
                "the wgan_gp penalty treats samples independently, which batch norm in the "
                "discriminator breaks: set model.discriminator.norm=layer (or use model=dcgan_wgangp)"
            )
        self.automatic_optimization = False
        self.generator = generator
        self.discriminator = discriminator
        self.generator_ema = None
        self.ema_decay = ema_decay
        if not has_lazy_tensors(generator):  # a lazy one is copied once sized (sized())
            self.sized()
        self.g_optimizer_factory, self.d_optimizer_factory = g_optimizer, d_optimizer
        self.loss, self.n_critic, self.gp_weight = loss, n_critic, gp_weight
        self.max_g_steps, self.gradient_clip_val = max_g_steps, gradient_clip_val
        self.augment_policy = parse_policy(diffaugment)
        self.noise_seed = noise_seed
        self.latent_dim = generator.latent_dim
        # Normalized data -> [-1, 1] (the generator's Tanh range): x * scale + shift.
        mean, std = per_channel(data_mean), per_channel(data_std)
        self.register_buffer("to_tanh_scale", 2 * std, persistent=False)
        self.register_buffer("to_tanh_shift", 2 * mean - 1, persistent=False)
        # Fixed noise lives in the state dict: grids of one run, and of runs with the same
        # noise_seed, show the same latent points.
        noise = torch.randn(
            num_fixed_noise, self.latent_dim, generator=torch.Generator().manual_seed(noise_seed)
        )
        self.register_buffer("fixed_noise", noise)
        self.g_steps = 0
        self.d_steps = 0
        self.last_g_loss: Tensor | None = None

    @property
    def compile_targets(self) -> tuple[str, ...]:
        """Nets that litlab.callbacks.Speed may compile (no double backward through a compiled D)."""
        nets = ("generator", "generator_ema")
        return nets if self.loss == "wgan_gp" else (*nets, "discriminator")

    def sized(self) -> None:
        """The EMA generator, a copy of the generator (its average starts from the generator's
        weights): at construction, or for a generator with lazy layers, which cannot be copied
        unsized, once litlab.models.lazy.materialize has sized them (the same weights)."""
        if self.ema_decay is not None and self.generator_ema is None:
            self.generator_ema = AveragedCopy(
                self.generator, multi_avg_fn=ema_with_warmup(self.ema_decay), use_buffers=True
            ).requires_grad_(False)

    def example_input_shapes(self, image_shape: tuple[int, ...]) -> dict[str, tuple[int, ...]]:
        """One example's input to each net, by name (litlab.callbacks.ModelSummary's FLOPs)."""
        shapes = {"generator": (1, self.latent_dim), "discriminator": (1, *image_shape)}
        if self.generator_ema is not None:
            shapes["generator_ema"] = (1, self.latent_dim)
        return shapes

    # -- sampling ---------------------------------------------------------------------------
    @contextmanager
    def _eval_mode(self, net: nn.Module) -> Iterator[nn.Module]:
        was_training = net.training
        net.eval()
        try:
            yield net
        finally:
            net.train(was_training)

    @torch.no_grad()
    def sample(self, noise: Tensor, ema: bool = True) -> Tensor:
        """Images in [0, 1] from the EMA generator (or the raw one) in eval mode."""
        net = self.generator_ema if ema and self.generator_ema is not None else self.generator
        with self._eval_mode(net):
            return (net(noise.to(self.device)).float() + 1) / 2

    def random_stream(self, name: str, step: int = 0) -> torch.Generator:
        """This rank's generator for ``name`` ("train", "fid", "generate") at ``step``."""
        return rng.stream(self.noise_seed, self.global_rank, name, step, self.device)

    def random_noise(self, n: int, generator: torch.Generator) -> Tensor:
        return torch.randn(n, self.latent_dim, device=self.device, generator=generator)

    def augment(self, images: Tensor, generator: torch.Generator) -> Tensor:
        """What D sees of any image, real or generated: DiffAugment's policies (or the image),
        in the real images' dtype, the dtype of the buffers that map them to [-1, 1]: under mixed
        precision G's output is half precision, and DiffAugment's draws and arithmetic were too
        (about 1,250 distinct brightness shifts in bfloat16), where the real images' are float32."""
        if not self.augment_policy:
            return images
        return diff_augment(images.to(self.to_tanh_scale.dtype), self.augment_policy, generator)

    # -- training ---------------------------------------------------------------------------
    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> dict[str, Tensor]:
        if all_unreadable(batch[1], self.trainer):
            return {}  # no step of either network
        real = batch[0] * self.to_tanh_scale + self.to_tanh_shift
        g_opt, d_opt = self.optimizers()
        n = real.shape[0]
        generator = self.random_stream("train", self.d_steps)

        with self.toggled_optimizer(d_opt):
            # No graph for G in D's step: cheaper, and a compiled G traced here (grad mode is
            # part of torch.compile's guards) is not reused for G's own step.
            with torch.no_grad():
                fake = self.generator(self.random_noise(n, generator))
            real, fake = self.augment(real, generator), self.augment(fake, generator)
            # D through its DDP wrapper, if any: this backward averages D's gradients over ranks
            discriminator = ddp_net(self, "discriminator")
            real_logits, fake_logits = discriminator(real), discriminator(fake)
            d_loss = d_loss_fn(self.loss, real_logits, fake_logits)
            logs = {
                "d/loss": d_loss,
                "d/real": real_logits.float().mean(),
                "d/fake": fake_logits.float().mean(),
            }
            if self.loss == "wgan_gp":
                penalty = gradient_penalty(self.discriminator, real, fake, generator)
                d_loss = d_loss + self.gp_weight * penalty
                logs["d/gp"] = penalty
            d_opt.zero_grad(set_to_none=True)
            self.manual_backward(d_loss)
            d_opt.step()
        self.d_steps += 1

        if self.d_steps % self.n_critic == 0:
            with self.toggled_optimizer(g_opt):
                # G's gradients averaged over ranks; D (frozen here) called as itself
                fake = ddp_net(self, "generator")(self.random_noise(n, generator))
                fake = self.augment(fake, generator)
                g_loss = g_loss_fn(self.loss, self.discriminator(fake))
                g_opt.zero_grad(set_to_none=True)
                self.manual_backward(g_loss)
                g_opt.step()
            self.g_steps += 1
            self.last_g_loss = g_loss.detach()
            if self.generator_ema is not None:
                self.generator_ema.update_parameters(self.generator)
            if self.max_g_steps is not None and self.g_steps >= self.max_g_steps:
                self.trainer.should_stop = True
        if self.last_g_loss is not None:  # G's latest: logged with D's also when n_critic > 1
            logs["g/loss"] = self.last_g_loss
        # The step curves: every trainer.log_every_n_steps (when Lightning writes them), and at
        # an epoch's last batch, so that the run ends with its last values (summary.json).
        self.log_step_curves({**logs, "g/step": float(self.g_steps)})
        return {k: v for k, v in logs.items() if k in ("d/loss", "g/loss")}

    def on_before_optimizer_step(self, optimizer: Optimizer) -> None:
        # Called after the precision plugin has unscaled the gradients: the one place where
        # clipping is valid under 16-bit mixed precision with manual optimization.
        if self.gradient_clip_val:
            self.clip_gradients(
                optimizer, gradient_clip_val=self.gradient_clip_val, gradient_clip_algorithm="norm"
            )

    def _d_real(self, batch: tuple[Tensor, Tensor], batch_idx: int, stage: str) -> None:
        """D's mean logit on held-out real images, seen as d/real's are (batch statistics, and
        DiffAugment's policies): staying below d/real as it rises signals D memorizing."""
        metric = self.val_d_real if stage == "val" else self.test_d_real
        if len(batch[1]):  # else every file unreadable: nothing to count
            real = batch[0] * self.to_tanh_scale + self.to_tanh_shift
            # The augmentation's draws: the same at every evaluation, distinct across ranks.
            real = self.augment(real, self.random_stream("eval", batch_idx))
            with batch_statistics(self.discriminator):
                metric.update(self.discriminator(real).flatten())
        self.log(f"{stage}/d_real", metric, on_epoch=True)

    def on_validation_epoch_start(self) -> None:
        broadcast_buffers(self)  # every rank evaluates rank 0's G (its BatchNorm statistics)

    def on_test_epoch_start(self) -> None:
        broadcast_buffers(self)

    def validation_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        self._d_real(batch, batch_idx, "val")

    def test_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        self._d_real(batch, batch_idx, "test")

    def configure_optimizers(self) -> tuple[list[Optimizer], list[dict[str, Any]]]:
        clipped = bool(self.gradient_clip_val)
        g_opt = make_optimizer(
            self.g_optimizer_factory, self.generator.parameters(), self.trainer, clipped
        )
        d_opt = make_optimizer(
            self.d_optimizer_factory, self.discriminator.parameters(), self.trainer, clipped
        )
        # Constant schedules, only so that Lightning's LR monitor names the two learning rates
        # for what they are (it calls optimizers without a scheduler lr-Adam, lr-Adam-1).
        named = [
            {"scheduler": ConstantLR(opt, factor=1.0, total_iters=0), "name": f"lr/{name}"}
            for opt, name in ((g_opt, "generator"), (d_opt, "discriminator"))
        ]
        return [g_opt, d_opt], named

    # -- state that must survive a restart ---------------------------------------------------
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint["gan"] = {"g_steps": self.g_steps, "d_steps": self.d_steps}
        if self.last_g_loss is not None:  # logged until G's next step (n_critic > 1)
            checkpoint["gan"]["g_loss"] = float(self.last_g_loss)

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        state = checkpoint.get("gan", {})
        self.g_steps, self.d_steps = int(state.get("g_steps", 0)), int(state.get("d_steps", 0))
        g_loss = state.get("g_loss")
        self.last_g_loss = None if g_loss is None else torch.tensor(g_loss)

    def on_train_start(self) -> None:
        if self.last_g_loss is not None:  # restored before the module moved to its device
            self.last_g_loss = self.last_g_loss.to(self.device)
