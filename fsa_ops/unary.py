"""Unary structure ops (k2 semantics): invert, project, add/remove epsilon self-loops, union, closure."""
from __future__ import annotations

import numpy as np

from fsa_ops.expand import expand_ragged_attributes
from fsa_ops.fsa import Fsa
from fsa_ops.host import as_numpy, build, empty_like, flat_attr, from_arc_map, index_attr, map_fsas
from fsa_ops.ragged import Ragged, is_ragged

__all__ = ["invert", "project", "add_epsilon_self_loops", "remove_epsilon_self_loops", "union", "closure"]


def _final_fixed_labels(fsa: Fsa, new_label: np.ndarray, what: str) -> np.ndarray:
    """Labels taken from an attribute: -1 stays on (and only on) arcs into the final state."""
    new_label = np.asarray(new_label)
    if new_label.ndim != 1:
        raise ValueError(f"{what}: aux_labels must be one label per arc or a Ragged (got shape {new_label.shape})")
    into_final = fsa.dst == int(fsa.num_states) - 1
    bad = (new_label == -1) & ~into_final
    if bad.any():
        raise ValueError(f"{what}: aux_label -1 on arc {int(np.nonzero(bad)[0][0])}, which does not enter the "
                         f"final state")
    return np.where(into_final, -1, new_label).astype(np.int32)


def _invert_one(fsa: Fsa) -> Fsa:
    if "aux_labels" not in fsa.attrs:
        raise ValueError("invert: the Fsa has no aux_labels (it is an acceptor)")
    aux = fsa.attrs["aux_labels"]
    label = _final_fixed_labels(fsa, aux, "invert")
    return fsa.replace(label=label, aux_labels=fsa.label.copy())


def invert(fsa: Fsa, ret_arc_map: bool = False):
    """Swap labels and aux_labels (k2's invert). Arcs into the final state keep label -1. A Ragged aux_labels is
    first expanded (expand_ragged_attributes, so arcs may turn into chains; other Ragged attributes stay ragged).
    `ret_arc_map`: also int32[..., A'] output arc -> input arc (-1 for arcs added by the expansion)."""
    fsa = as_numpy(fsa)
    if "aux_labels" not in fsa.attrs:
        raise ValueError("invert: the Fsa has no aux_labels (it is an acceptor)")
    if is_ragged(fsa.attrs["aux_labels"]):
        fsa, arc_map = expand_ragged_attributes(fsa, ret_arc_map=True, ragged_attribute_names=["aux_labels"])
    else:
        arc_map = np.broadcast_to(np.arange(fsa.label.shape[-1], dtype=np.int32), fsa.label.shape).copy()
        if fsa.is_batch:
            arc_map[arc_map >= fsa.num_arcs[:, None]] = -1
    out = map_fsas(_invert_one, fsa)
    return (out, arc_map) if ret_arc_map else out


def project(fsa: Fsa, project_input: bool = True) -> Fsa:
    """Turn a transducer into an acceptor: keep the input labels (project_input=True) or the output labels
    (aux_labels become labels; a Ragged aux_labels is expanded first, as invert does); aux_labels is removed
    either way. An acceptor is returned unchanged."""
    fsa = as_numpy(fsa)
    if not project_input and "aux_labels" in fsa.attrs and is_ragged(fsa.attrs["aux_labels"]):
        fsa = expand_ragged_attributes(fsa, ragged_attribute_names=["aux_labels"])

    def one(f):
        if "aux_labels" not in f.attrs:
            return f
        if project_input:
            return f.replace(aux_labels=None)
        return f.replace(label=_final_fixed_labels(f, f.attrs["aux_labels"], "project"), aux_labels=None)
    return map_fsas(one, fsa)


def _add_eps_one(fsa: Fsa) -> Fsa:
    ns = int(fsa.num_states)
    if ns == 0:
        return fsa
    loops = np.arange(ns - 1)
    # new self-loop first among each state's arcs (as k2: epsilon sorts first)
    key_src = np.concatenate([loops, fsa.src]).astype(np.int64)
    key_new = np.concatenate([np.zeros(len(loops)), np.ones(len(fsa.src))])
    order = np.lexsort((key_new, key_src))
    arc_map = np.concatenate([np.full(len(loops), -1), np.arange(len(fsa.src))])[order]
    src = key_src[order]
    dst = np.concatenate([loops, fsa.dst])[order]
    label = np.concatenate([np.zeros(len(loops), np.int32), fsa.label])[order]
    score = np.concatenate([np.zeros(len(loops), np.float32), fsa.score])[order]
    return from_arc_map(fsa, arc_map, src, dst, label, score, ns)


def add_epsilon_self_loops(fsa: Fsa) -> Fsa:
    """Add an epsilon self-loop (score 0, attributes 0, Ragged attributes an empty row) to every non-final state,
    placed first (k2)."""
    return map_fsas(_add_eps_one, fsa)


def remove_epsilon_self_loops(fsa: Fsa) -> Fsa:
    """Remove arcs with label 0 whose src == dst (k2)."""
    def one(f):
        keep = ~((f.label == 0) & (f.src == f.dst))
        idx = np.nonzero(keep)[0]
        return from_arc_map(f, idx, f.src[idx], f.dst[idx], f.label[idx], f.score[idx], int(f.num_states))
    return map_fsas(one, fsa)


def union(fsas: Fsa) -> Fsa:
    """Union of a batch into one FSA (k2): a new start state 0 with epsilon arcs (score 0) to each FSA's
    start, the FSAs' other states in order, and one shared final state. Every FSA must be non-empty."""
    fsas = as_numpy(fsas, "fsas")
    if not fsas.is_batch:
        raise ValueError("union: expects a batch (FsaVec), got a single Fsa")
    parts = list(fsas)
    for i, f in enumerate(parts):
        if int(f.num_states) < 2:
            raise ValueError(f"union: fsas[{i}] has {int(f.num_states)} states; every FSA needs >= 2")
    n_inner = [int(f.num_states) - 1 for f in parts]  # non-final states
    offsets = 1 + np.concatenate([[0], np.cumsum(n_inner)[:-1]]).astype(np.int64)
    final = 1 + int(np.sum(n_inner))
    src = [np.zeros(len(parts), np.int64)]
    dst = [offsets.copy()]
    lab = [np.zeros(len(parts), np.int32)]
    sc = [np.zeros(len(parts), np.float32)]
    maps = [np.full(len(parts), -1, np.int64)]
    base = 0
    A = fsas.label.shape[1]
    for i, f in enumerate(parts):
        fin = int(f.num_states) - 1
        src.append(f.src.astype(np.int64) + offsets[i])
        dst.append(np.where(f.dst == fin, final, f.dst.astype(np.int64) + offsets[i]))
        lab.append(f.label)
        sc.append(f.score)
        maps.append(np.arange(len(f.src)) + i * A)  # index into the flattened padded batch arrays
        base += len(f.src)
    arc_map = np.concatenate(maps)
    attrs = {k: index_attr(flat_attr(v), arc_map) for k, v in fsas.attrs.items()}
    return build(np.concatenate(src), np.concatenate(dst), np.concatenate(lab), np.concatenate(sc),
                 final + 1, attrs)


def _closure_one(fsa: Fsa) -> Fsa:
    ns = int(fsa.num_states)
    if ns == 0:
        return empty_like(fsa)
    final = ns - 1
    into_final = fsa.dst == final
    n0 = int(np.sum(fsa.src == 0))
    A = len(fsa.src)
    arc_map = np.concatenate([np.arange(n0), [-1], np.arange(n0, A)])
    old = np.maximum(arc_map, 0)
    new = arc_map < 0
    redirected = np.where(new, False, into_final[old])
    src = np.where(new, 0, fsa.src[old])
    dst = np.where(new, final, np.where(redirected, 0, fsa.dst[old]))
    label = np.where(new, -1, np.where(redirected, 0, fsa.label[old]))
    score = np.where(new, 0.0, fsa.score[old])
    out = from_arc_map(fsa, arc_map, src, dst, label, score, ns)
    aux = out.attrs.get("aux_labels")
    if is_ragged(aux):   # rows of redirected arcs lose their -1; the new final arc gets an empty row
        keep = np.arange(aux.width) < aux.lengths[:, None]
        keep &= ~(redirected[:, None] & (aux.values == -1))
        out.attrs["aux_labels"] = Ragged.from_row_splits(np.concatenate([[0], np.cumsum(keep.sum(1))]),
                                                         aux.values[keep], width=aux.width)
    elif aux is not None and aux.ndim == 1:
        aux = aux.copy()
        aux[redirected & (aux == -1)] = 0
        aux[new] = -1
        out.attrs["aux_labels"] = aux
    return out


def closure(fsa: Fsa) -> Fsa:
    """Kleene closure (k2): arcs into the final state become epsilon arcs back to the start state (their
    aux_label -1 becomes 0) and a new arc 0 -> final with label -1 (score 0) follows the start state's arcs.
    Caution (as k2): this is the Kleene closure only if no arc enters the start state; otherwise the
    result also accepts strings that loop back to the start state mid-way (k2 returns it all the same).
    A Ragged aux_labels: redirected arcs' rows lose their -1, the new arc gets an empty row."""
    return map_fsas(_closure_one, fsa)
