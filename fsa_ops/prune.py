"""prune_on_arc_post (host-side structure, JAX scores): drop the arcs whose posterior probability is below a
threshold (k2's `prune_on_arc_post`).

The arc posteriors are `get_arc_post(fsas, use_double_scores, log_semiring=True)` (log-sum over the paths
through the arc minus the total score; the FSAs must be top-sorted and acyclic, as for every forward-backward
score). An arc is removed iff its log posterior is below log(threshold_prob), compared in the posteriors'
precision as k2 does; a NaN posterior (an FSA with a NaN or +inf score) is not below anything, so such an FSA
keeps its arcs, as in k2. The kept arcs keep their order and attributes (`from_arc_map`), then `connect`
removes the states that lost every path (k2 keeps them, unconnected; the accepted weighted sequences are the
same). An FSA without an accepting path (total score -inf) becomes the empty FSA.
"""
from __future__ import annotations

import numbers

import numpy as np

from fsa_ops.connect import connect
from fsa_ops.fsa import Fsa, create_fsa_vec
from fsa_ops.host import as_numpy, from_arc_map, pad_arc_maps
from fsa_ops.scores import get_arc_post

__all__ = ["prune_on_arc_post"]


def _prune_one(fsa: Fsa, keep: np.ndarray):
    idx = np.nonzero(keep)[0]
    kept = from_arc_map(fsa, idx, fsa.src[idx], fsa.dst[idx], fsa.label[idx], fsa.score[idx], int(fsa.num_states))
    out, amap = connect(kept, ret_arc_map=True)
    return out, idx[amap].astype(np.int32)


def prune_on_arc_post(fsas: Fsa, threshold_prob: float, use_double_scores: bool = True, ret_arc_map: bool = False):
    """Remove the arcs of `fsas` (a batch [B, A], or a single Fsa) whose arc posterior is below
    `threshold_prob` (0 < threshold_prob < 1), then connect; see the module docstring. `ret_arc_map`: also
    return the map from output arcs to input arcs (per-FSA indexes, -1 padded for a batch)."""
    if not isinstance(threshold_prob, numbers.Real) or isinstance(threshold_prob, bool) \
            or not 0 < float(threshold_prob) < 1:
        raise ValueError(f"threshold_prob must be a number with 0 < threshold_prob < 1, got {threshold_prob!r}")
    fsas = as_numpy(fsas, "fsas")
    post = np.asarray(get_arc_post(fsas, use_double_scores=use_double_scores, log_semiring=True))
    below = post < np.log(np.asarray(threshold_prob, post.dtype))
    if not fsas.is_batch:
        out, amap = _prune_one(fsas, ~below)
        return (out, amap) if ret_arc_map else out
    outs = [_prune_one(f, ~below[b, :len(f.label)]) for b, f in enumerate(fsas)]
    vec = create_fsa_vec([o for o, _ in outs]) if outs else fsas
    return (vec, pad_arc_maps([m for _, m in outs], vec.label.shape[1])) if ret_arc_map else vec
