"""The pure core of training: :class:`TrainState`, its creation, and the jitted train, eval and decode steps.

``train_step(state, batch, key, *, task, tx) -> (state, metrics)`` is a pure function of pytrees (jit it with
static `task` and `tx`):

* a non-finite loss or gradient, or a batch without any row in the loss (all padding, e.g. every file failed to
  load), skips the update (params, optimiser state and model state keep their values), ``state.skipped`` counts
  it and the metrics report ``skipped``;
* bf16 mixed precision: the model computes in its config's ``dtype``, params and optimiser stay float32, losses are
  computed from float32 logits;
* the PRNG key of step s is ``step_key(state) = fold_in(state.rng, s)``, so a resumed run draws the same keys;
* parameters under ``task.frozen`` get no gradient (``stop_gradient``) and no update (the optimiser masks them).
"""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import struct

from jasr.optim import stop_gradient_frozen
from jasr.tasks import Task


class TrainState(struct.PyTreeNode):
    """Everything that changes during training (a pytree; checkpointed as a whole)."""
    step: jax.Array          # int32: train_step calls so far (micro-batches with gradient accumulation)
    params: Any
    model_state: Any         # non-parameter collections (e.g. batch_stats); {} if none
    opt_state: Any
    rng: jax.Array           # uint32[2] base key; step s uses fold_in(rng, s)
    skipped: jax.Array       # int32: updates skipped because the loss or a gradient was not finite


def create_train_state(key: jax.Array, task: Task, tx: optax.GradientTransformation, batch: dict,
                       params: Any = None) -> TrainState:
    """Initialises params (unless given, e.g. from a pretrained checkpoint) and the optimiser state."""
    init_key, rng = jax.random.split(key)
    variables = dict(task.init(init_key, batch))
    initial = variables.pop("params")
    p = initial if params is None else params
    return TrainState(step=jnp.zeros((), jnp.int32), params=p, model_state=variables, opt_state=tx.init(p),
                      rng=rng, skipped=jnp.zeros((), jnp.int32))


def step_key(state: TrainState) -> jax.Array:
    return jax.random.fold_in(state.rng, state.step)


def all_finite(tree) -> jax.Array:
    """True when every floating-point leaf of `tree` is finite."""
    leaves = [jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree) if jnp.issubdtype(x.dtype, jnp.floating)]
    return jnp.all(jnp.stack(leaves)) if leaves else jnp.array(True)


def train_step(state: TrainState, batch: dict, key: jax.Array, *, task: Task,
               tx: optax.GradientTransformation) -> tuple[TrainState, dict]:
    """One micro-batch: loss, gradients, (accumulated) optimiser update unless anything is non-finite.
    Metrics: loss (NaN when skipped), grad_norm, skipped, tokens, param_norm, the task's logged aux values, and
    ``infeasible_rows`` [B] (1.0 for a row the CTC loss left out because its labels cannot align with its frames;
    per row, so the loop can name the utterances: not to be summed across steps of different batch shapes)."""
    batch = {**batch, "step": state.step}

    def loss_fn(params):
        params = stop_gradient_frozen(params, task.frozen)
        loss_sum, (weight, ms, aux) = task.loss(params, state.model_state, batch, key, True)
        return loss_sum / weight, (weight, ms, aux)

    (loss, (weight, new_ms, aux)), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
    # a batch with no row in the loss (every file failed to load) makes no update: its zero gradient would still
    # move the weights through AdamW's momentum and weight decay
    ok = jnp.isfinite(loss) & all_finite(grads) & (jnp.sum(batch["row_weights"]) > 0)
    updates, new_opt = tx.update(grads, state.opt_state, state.params)
    new_params = optax.apply_updates(state.params, updates)
    keep = lambda new, old: jax.tree.map(lambda a, b: jnp.where(ok, a, b), new, old)  # noqa: E731
    new_state = state.replace(
        step=state.step + 1,
        params=keep(new_params, state.params),
        opt_state=keep(new_opt, state.opt_state),
        model_state=keep(new_ms, state.model_state),
        skipped=state.skipped + (1 - ok.astype(jnp.int32)),
    )
    out = {"loss": jnp.where(ok, loss, jnp.nan), "grad_norm": optax.tree.norm(grads),
           "skipped": 1.0 - ok.astype(jnp.float32), "tokens": weight,
           "param_norm": optax.tree.norm(new_state.params)}
    out.update({k: aux[k] for k in task.logged_aux if k in aux})
    out["infeasible_rows"] = aux.get("infeasible_rows", jnp.zeros_like(batch["row_weights"]))
    return new_state, out


def eval_step(state: TrainState, batch: dict, *, task: Task) -> dict:
    """Dev loss (loss_sum, weight) and the task's greedy hypotheses (ids [B, L], lengths [B]) when it decodes."""
    loss_sum, (weight, _, _) = task.loss(state.params, state.model_state, batch, None, False)
    out = {"loss_sum": loss_sum, "weight": weight}
    hyps = task.greedy_decode(state.params, state.model_state, batch)
    if hyps is not None:
        out["ids"], out["lengths"] = hyps
    return out


AUDIO_KEYS = ("features", "feature_paddings", "audio", "audio_paddings")


def decode_step(state: TrainState, batch: dict, *, task: Task) -> dict:
    """The task's greedy hypotheses (ids [B, L], lengths [B]; {} without a decoder) from the audio keys of `batch`
    only (AUDIO_KEYS): no label reaches the decoder, and one program serves each audio bucket, with or without
    transcripts."""
    hyps = task.greedy_decode(state.params, state.model_state, {k: batch[k] for k in AUDIO_KEYS if k in batch})
    return {} if hyps is None else {"ids": hyps[0], "lengths": hyps[1]}
