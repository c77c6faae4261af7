"""k2-style ``ctc_loss(decoding_graph, dense_fsa_vec, ...)``: CTC (or any graph-based) loss.

The loss of segment ``b`` is minus the log-semiring total score of
``intersect_dense(decoding_graph, dense_fsa_vec, output_beam)``, computed without building the
lattice by the frame-synchronous scan in :func:`fsa_ops.dense.dense_tot_scores` (analytic
gradient).  With ``decoding_graph = ctc_graph(labels)`` and an infinite ``output_beam`` this is
the usual CTC loss (``jasr.ctc_loss`` / ``optax.ctc_loss`` on the same log-probs); with k2's
default ``output_beam=10`` paths more than 10 nats below the best one are dropped first, exactly
as k2 does.  The graph may be any FSA (several pronunciations, LF-MMI numerators/denominators...).
"""
from __future__ import annotations

import math
from typing import Optional

import jax.numpy as jnp

from fsa_ops.dense import DenseFsaVec, dense_tot_scores

__all__ = ["ctc_loss"]


def ctc_loss(decoding_graph, dense_fsa_vec: DenseFsaVec, output_beam: float = 10,
             reduction: str = "sum", use_double_scores: bool = True,
             target_lengths: Optional[jnp.ndarray] = None, implementation: str = "auto"):
    """CTC loss given a decoding graph and a DenseFsaVec (k2's ``k2.ctc_loss``).

    Args:
      decoding_graph: one graph per supervision segment (a batch) or one graph shared by all.
      dense_fsa_vec: the network's log-probs (:class:`fsa_ops.dense.DenseFsaVec`).
      output_beam: pruning beam relative to the best path (``math.inf`` or ``None``: no pruning).
      reduction: ``'none'`` (per segment ``[S]``), ``'sum'`` or ``'mean'`` (each loss divided by its
        ``target_lengths`` entry, then averaged over segments), as in k2 / torch.
      use_double_scores: accumulate in float64 (k2's default). Needs ``jax_enable_x64``
        (``jax.config.update("jax_enable_x64", True)`` at startup); without it the loss is
        computed in float32 and the first such call warns (`fsa_ops.scores.Float32ScoresWarning`).
        ``False``: float32, no warning.
      target_lengths: ``[S]`` label counts, required for ``reduction='mean'``.
      implementation: ``'auto'`` (Pallas kernels on GPU, XLA loops elsewhere), ``'pallas'`` or ``'xla'``; see
        :func:`fsa_ops.dense.dense_tot_scores`.

    Returns float32 loss(es); ``+inf`` for a segment that no path fits (its gradient is 0), NaN for
    a segment with a NaN or +inf log-prob in a valid frame (any symbol) or graph score (its gradient
    NaN on its valid frames, or 0 if it is masked out of the loss, e.g. with
    ``jnp.where(jnp.isnan(loss), 0, loss)`` on ``reduction='none'``).
    """
    if reduction not in ("none", "mean", "sum"):
        raise ValueError(f"reduction must be 'none', 'mean' or 'sum', got {reduction!r}")
    beam = math.inf if output_beam is None else output_beam
    tot = dense_tot_scores(decoding_graph, dense_fsa_vec, output_beam=beam,
                           use_double_scores=use_double_scores, implementation=implementation)
    loss = (-tot).astype(jnp.float32)
    if reduction == "none":
        return loss
    if reduction == "sum":
        return jnp.sum(loss)
    if target_lengths is None:
        raise ValueError("reduction='mean' needs target_lengths (one label count per segment)")
    tl = jnp.asarray(target_lengths)
    if tl.shape != loss.shape:
        raise ValueError(f"target_lengths: expected shape {loss.shape}, got {tl.shape}")
    return jnp.mean(loss / tl.astype(jnp.float32))
