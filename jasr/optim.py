"""Optimiser and learning-rate schedules: AdamW (betas (0.9, 0.98), weight decay 0.01), warmup + cosine / Noam /
constant schedules, global-norm clipping and gradient accumulation.

Non-finite updates are skipped in :func:`jasr.training.train_step` (the whole train state keeps its old value and
a counter goes up), so the optimiser itself stays a plain optax chain.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

SCHEDULES = ("cosine", "noam", "constant")


def make_schedule(name: str, *, lr: float, warmup_steps: int, total_steps: int, final_lr_ratio: float = 0.0
                  ) -> optax.Schedule:
    """Learning rate as a function of the optimiser-update count.

    * ``cosine``: linear warmup 0 -> `lr` over `warmup_steps`, then cosine decay to `lr * final_lr_ratio` at
      `total_steps`.
    * ``noam``: ``lr * min(step / warmup, sqrt(warmup / step))`` (the Transformer schedule, normalised so that its
      peak, reached at the end of warmup, is `lr`).
    * ``constant``: linear warmup then `lr`.
    """
    if name not in SCHEDULES:
        raise ValueError(f"optim.schedule must be one of {SCHEDULES}, got {name!r}")
    if lr <= 0:
        raise ValueError(f"optim.lr must be > 0, got {lr}")
    if warmup_steps < 0 or total_steps <= 0:
        raise ValueError(f"need optim.warmup_steps >= 0 and total steps > 0, got {warmup_steps}, {total_steps}")
    warmup = max(int(warmup_steps), 1)
    if name == "cosine":
        decay = max(total_steps - warmup_steps, 1)
        return optax.warmup_cosine_decay_schedule(0.0, lr, warmup_steps, warmup_steps + decay,
                                                  end_value=lr * final_lr_ratio)
    if name == "noam":
        def noam(step):
            s = jnp.maximum(jnp.asarray(step, jnp.float32), 1.0)
            return lr * jnp.minimum(s / warmup, jnp.sqrt(warmup / s))
        return noam
    return optax.join_schedules([optax.linear_schedule(0.0, lr, warmup), optax.constant_schedule(lr)], [warmup])


def decay_mask(params):
    """Weight decay on matrices only (kernels, embeddings); not on biases, norm scales or other vectors."""
    return jax.tree.map(lambda p: jnp.ndim(p) >= 2, params)


def param_path(path) -> str:
    """'a/b/c' for a jax key path (dict keys joined by '/')."""
    return "/".join(str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k)))) for k in path)


def frozen_labels(params, frozen: tuple[str, ...]):
    """'frozen' for every leaf whose path ('a/b/c') starts with one of the `frozen` prefixes, else 'train'."""
    def label(path, _):
        name = param_path(path)
        return "frozen" if any(name == f or name.startswith(f + "/") for f in frozen) else "train"
    return jax.tree_util.tree_map_with_path(label, params)


def stop_gradient_frozen(params, frozen: tuple[str, ...]):
    """`params` with lax.stop_gradient on the leaves under the `frozen` path prefixes (no backward pass there)."""
    if not frozen:
        return params
    labels = frozen_labels(params, tuple(frozen))
    return jax.tree.map(lambda p, l: jax.lax.stop_gradient(p) if l == "frozen" else p, params, labels)


def make_optimizer(*, schedule: optax.Schedule, b1: float = 0.9, b2: float = 0.98, eps: float = 1e-8,
                   weight_decay: float = 0.01, clip_norm: float | None = 1.0, grad_accum: int = 1,
                   frozen: tuple[str, ...] = ()) -> optax.GradientTransformation:
    """AdamW with global-norm clipping; with ``grad_accum = k > 1`` gradients of k calls are averaged before one
    update (optax.MultiSteps), and `schedule` counts updates, not calls.

    `frozen`: parameter path prefixes ('wav2vec2/feature_extractor') that never change (no update, no weight
    decay; clipping sees only the trainable gradients), as torch's ``requires_grad = False``."""
    if grad_accum < 1:
        raise ValueError(f"optim.grad_accum must be >= 1, got {grad_accum}")
    parts = []
    if clip_norm is not None and clip_norm > 0:
        parts.append(optax.clip_by_global_norm(clip_norm))
    parts.append(optax.adamw(schedule, b1=b1, b2=b2, eps=eps, weight_decay=weight_decay, mask=decay_mask))
    tx = optax.chain(*parts)
    if frozen:
        tx = optax.multi_transform({"train": tx, "frozen": optax.set_to_zero()},
                                   lambda params: frozen_labels(params, tuple(frozen)))
    if grad_accum > 1:
        tx = optax.MultiSteps(tx, every_k_schedule=grad_accum)
    return tx


def make_optimizer_from_config(optim_cfg, num_steps: int, frozen: tuple[str, ...] = ()
                               ) -> tuple[optax.GradientTransformation, optax.Schedule]:
    """Builds (optimizer, schedule) from the ``optim`` section of a run config for a run of `num_steps` train
    steps (micro-batches: the schedule counts num_steps // grad_accum updates); `frozen`: see make_optimizer."""
    sched = make_schedule(optim_cfg.schedule, lr=optim_cfg.lr, warmup_steps=optim_cfg.warmup_steps,
                          total_steps=max(num_steps // optim_cfg.grad_accum, 1),
                          final_lr_ratio=optim_cfg.final_lr_ratio)
    tx = make_optimizer(schedule=sched, b1=optim_cfg.b1, b2=optim_cfg.b2, eps=optim_cfg.eps,
                        weight_decay=optim_cfg.weight_decay, clip_norm=optim_cfg.clip_norm,
                        grad_accum=optim_cfg.grad_accum, frozen=tuple(frozen))
    return tx, sched
