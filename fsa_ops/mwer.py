"""k2's ``levenshtein_alignment`` (k2/python/k2/fsa_algo.py) and ``mwer_loss`` (k2/python/k2/mwer_loss.py).

`levenshtein_alignment`: intersect each hyp's `levenshtein_graph` with its ref's (label 0 an ordinary symbol,
as k2's ``intersect_device``), drop epsilon self-loops, take the best (tropical) path and subtract the graphs'
ins/del offsets, so that every edit costs exactly -1 and the total score is minus the edit distance.

`mwer_loss`: the expected number of word errors over an n-best list sampled from the lattice (equation 2 of
arXiv:2106.02302): ``sum_paths softmax_utt(path_score / temperature) * errors(path, ref)``. The path scores are
sums of ``lattice.score`` (a gather), so the loss is differentiable w.r.t. ``lattice.score`` under ``jax.grad``;
the sampling, the n-best structure and the error counts are host work on concrete values (not differentiated,
as in k2).
"""
from __future__ import annotations

from typing import Literal

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from fsa_ops.connect import connect
from fsa_ops.fsa import Fsa
from fsa_ops.graphs import INS_DEL_OFFSET_ATTR, levenshtein_graph
from fsa_ops.host import as_numpy
from fsa_ops.intersect import intersect
from fsa_ops.nbest import Nbest, PathScores
from fsa_ops.ragged import is_ragged
from fsa_ops.scores import get_tot_scores, score_dtype
from fsa_ops.shortest_path import shortest_path
from fsa_ops.sort import top_sort
from fsa_ops.unary import remove_epsilon_self_loops

__all__ = ["levenshtein_alignment", "mwer_loss"]


def levenshtein_alignment(refs: Fsa, hyps: Fsa, hyp_to_ref_map, sorted_match_ref: bool = False) -> Fsa:
    """Align each FSA of `hyps` with FSA ``hyp_to_ref_map[i]`` of `refs` (both from `levenshtein_graph`).

    Returns an FsaVec with one linear FSA per hyp: ``labels`` (the symbol where ref and hyp match, else 0),
    attributes ``ref_labels`` / ``hyp_labels`` (the aligned symbols, 0 for a gap) and scores 0 per match and
    -1 per edit, so ``-get_tot_scores(..., log_semiring=False)`` is the edit distance (k2's semantics; ties
    between equally good alignments are broken by the shortest-path order). `sorted_match_ref` is accepted for
    k2 compatibility and changes nothing here (the host intersection needs no sorted refs).
    """
    refs, hyps = as_numpy(refs, "refs"), as_numpy(hyps, "hyps")
    for name, f in (("refs", refs), ("hyps", hyps)):
        if not f.is_batch:
            raise ValueError(f"{name}: expected an FsaVec (from levenshtein_graph of a list of lists)")
        if "aux_labels" not in f.attrs or INS_DEL_OFFSET_ATTR not in f.attrs:
            raise ValueError(f"{name}: expected the output of levenshtein_graph (aux_labels and the ins/del "
                             "offset attribute)")
    m = np.asarray(hyp_to_ref_map)
    if m.shape != (len(hyps),) or (m.size and m.dtype.kind not in "iu"):
        raise ValueError(f"hyp_to_ref_map: expected {len(hyps)} ints (one per hyp), got shape {m.shape} "
                         f"dtype {m.dtype}")
    if m.size and (m.min() < 0 or m.max() >= len(refs)):
        raise ValueError(f"hyp_to_ref_map: values must be in [0, {len(refs)}), got {m.min()}..{m.max()}")
    hyp_attrs = dict(hyps.attrs)
    hyp_attrs["hyp_labels"] = hyp_attrs.pop("aux_labels")
    if len(hyps) == 0:
        return hyps.replace(attrs={"ref_labels": hyp_attrs["hyp_labels"].copy(), **hyp_attrs})
    lat = intersect(refs[m.tolist()], hyps.replace(attrs=hyp_attrs), treat_epsilons_specially=False)
    lat = top_sort(connect(remove_epsilon_self_loops(lat)))
    best = shortest_path(lat, use_double_scores=bool(jax.config.jax_enable_x64))
    attrs = dict(best.attrs)
    attrs["ref_labels"] = attrs.pop("aux_labels")
    score = best.score - attrs[INS_DEL_OFFSET_ATTR]
    return best.replace(score=score, attrs=attrs)


def _ref_lists(ref_texts, num_utts: int):
    rows = ref_texts.tolist() if is_ragged(ref_texts) else ref_texts
    if isinstance(rows, (str, bytes)) or not hasattr(rows, "__len__"):
        raise TypeError(f"ref_texts: expected a list of lists of word ids (or a Ragged), got "
                        f"{type(ref_texts).__name__}")
    rows = [list(r) for r in rows]
    if len(rows) != num_utts:
        raise ValueError(f"ref_texts: expected {num_utts} references (one per lattice FSA), got {len(rows)}")
    return rows


def mwer_loss(lattice: Fsa, ref_texts, key=None, nbest_scale: float = 0.5, num_paths: int = 200,
              temperature: float = 1.0, use_double_scores: bool = True,
              reduction: Literal["none", "mean", "sum"] = "sum", positions=None):
    """k2's ``mwer_loss``: expected word errors of `num_paths` paths sampled per utterance (see the module
    docstring). `ref_texts`: a list of word-id lists (or a `Ragged`), one per lattice FSA; `key` a JAX PRNG
    key (or `positions`, k2's fixed sampling positions, see `fsa_ops.random_paths`).

    reduction 'sum': a scalar (the sum over all paths of all utterances); 'mean': that divided by the number of
    distinct paths; 'none': a `PathScores` ``[utt][path]`` of per-path terms (``.sum()`` per utterance).
    Differentiable w.r.t. ``lattice.score`` (call ``jax.grad`` outside jit).
    """
    if reduction not in ("none", "mean", "sum"):
        raise ValueError(f"reduction: expected 'none', 'mean' or 'sum', got {reduction!r}")
    if not temperature > 0:
        raise ValueError(f"temperature: expected a positive number, got {temperature!r}")
    nbest = Nbest.from_lattice(lattice, num_paths, key=key, use_double_scores=use_double_scores,
                               nbest_scale=nbest_scale, positions=positions)
    refs = levenshtein_graph(_ref_lists(ref_texts, len(lattice)))
    hyps = nbest.build_levenshtein_graphs()
    align = levenshtein_alignment(refs, hyps, nbest.shape.row_ids(1), sorted_match_ref=True)
    dtype = score_dtype(use_double_scores)
    errors = -np.asarray(get_tot_scores(align, use_double_scores=use_double_scores, log_semiring=False))
    logp = nbest.tot_scores().values.astype(dtype) / temperature
    seg, U = jnp.asarray(nbest.shape.row_ids(1)), nbest.shape.dim0
    top = lax.stop_gradient(jax.ops.segment_max(logp, seg, num_segments=U))
    top = jnp.where(jnp.isfinite(top), top, 0.0)
    den = jnp.log(jax.ops.segment_sum(jnp.exp(logp - top[seg]), seg, num_segments=U)) + top
    terms = jnp.exp(logp - den[seg]) * jnp.asarray(errors, dtype)
    if reduction == "sum":
        return jnp.sum(terms)
    if reduction == "mean":
        return jnp.sum(terms) / max(int(terms.shape[0]), 1)
    return PathScores(nbest.shape, terms)
