"""Graph constructors with k2's exact structure, scores and aux_labels: linear_fsa, linear_fst,
linear_fsa_with_self_loops, linear_fst_with_self_loops, ctc_topo, ctc_graph, levenshtein_graph, trivial_graph.
All host-side (numpy)."""
from __future__ import annotations

from typing import Sequence, Union

import numpy as np

from fsa_ops.fsa import Fsa, create_fsa_vec
from fsa_ops.host import as_numpy
from fsa_ops.ragged import Ragged, is_ragged
from fsa_ops.unary import add_epsilon_self_loops

__all__ = ["linear_fsa", "linear_fst", "linear_fsa_with_self_loops", "linear_fst_with_self_loops", "ctc_topo",
           "ctc_graph", "levenshtein_graph", "trivial_graph"]

Labels = Union[Sequence[int], Sequence[Sequence[int]]]

# k2's attribute name for levenshtein_graph's score offsets (used by levenshtein_alignment)
INS_DEL_OFFSET_ATTR = "__ins_del_score_offset_internal_attr_"


def _is_nested(labels) -> bool:
    if isinstance(labels, np.ndarray):
        return labels.ndim == 2
    return len(labels) > 0 and not np.isscalar(labels[0]) and not isinstance(labels[0], np.integer)


def _seq(x, name, positive=False) -> np.ndarray:
    a = np.asarray(x)
    if a.ndim != 1 and a.size:
        raise ValueError(f"{name}: expected a list of ints, got shape {a.shape}")
    a = a.reshape(-1)
    if a.size and a.dtype.kind not in "iu":
        raise ValueError(f"{name}: expected integers, got dtype {a.dtype}")
    a = a.astype(np.int32)
    if np.any(a == -1):
        raise ValueError(f"{name}: -1 is reserved for arcs into the final state")
    if positive and np.any(a <= 0):
        raise ValueError(f"{name}: symbols must be > 0 (0 is blank/epsilon), got {a[a <= 0][0]}")
    return a


def _single(src, dst, label, score, num_states, attrs) -> Fsa:
    A = len(src)
    return Fsa(np.asarray(src, np.int32), np.asarray(dst, np.int32), np.asarray(label, np.int32),
               np.asarray(score, np.float32), np.asarray(num_states, np.int32), np.asarray(A, np.int32),
               {k: v if is_ragged(v) else (np.asarray(v, np.int32) if np.asarray(v).dtype.kind in "iu"
                                            else np.asarray(v))
                for k, v in attrs.items()}, max_states=num_states)


def linear_fsa(labels: Labels) -> Fsa:
    """Linear acceptor(s) with zero scores: a list of ints gives one Fsa, a list of lists a batch (k2)."""
    if _is_nested(labels):
        return create_fsa_vec([linear_fsa(x) for x in labels])
    lab = _seq(labels, "labels")
    n = len(lab)
    return _single(np.arange(n + 1), np.arange(1, n + 2), np.append(lab, -1), np.zeros(n + 1), n + 2, {})


def linear_fst(labels: Labels, aux_labels: Labels) -> Fsa:
    """Linear transducer(s): labels with aux_labels (same lengths; -1 appended on the final arc), as k2."""
    if _is_nested(labels):
        if not _is_nested(aux_labels) or len(aux_labels) != len(labels):
            raise ValueError("aux_labels must be a list of lists matching labels")
        return create_fsa_vec([linear_fst(x, y) for x, y in zip(labels, aux_labels)])
    f = linear_fsa(labels)
    aux = np.asarray(aux_labels, np.int32).reshape(-1)
    if len(aux) != len(f.label) - 1:
        raise ValueError(f"aux_labels has {len(aux)} entries, labels has {len(f.label) - 1}")
    return f.replace(aux_labels=np.append(aux, -1).astype(np.int32))


def _linear_parts(fsas, name: str):
    """The single FSAs of a linear Fsa or batch (arc i: state i -> i + 1; ValueError naming the FSA otherwise)."""
    fsas = as_numpy(fsas, name)
    parts = list(fsas) if fsas.is_batch else [fsas]
    for i, f in enumerate(parts):
        n = len(f.label)
        where = f"{name}[{i}]" if fsas.is_batch else name
        if n == 0 or int(f.num_states) != n + 1 or np.any(f.src != np.arange(n)) \
                or np.any(f.dst != np.arange(1, n + 1)):
            raise ValueError(f"{where}: expected a linear FSA (arc i from state i to state i + 1, at least one arc "
                             f"and one more state than arcs), got {int(f.num_states)} states and {n} arcs")
        if np.any(f.label[:-1] < 0):
            raise ValueError(f"{where}: negative label {int(f.label[:-1].min())} on an arc that does not enter the "
                             "final state")
    return fsas, parts


def linear_fsa_with_self_loops(fsas) -> Fsa:
    """k2's linear_fsa_with_self_loops: the labels > 0 of a linear Fsa (or of each FSA of a batch) as a new
    `linear_fsa` (epsilon arcs removed, scores 0, attributes dropped, as k2), then an epsilon self-loop (score 0)
    first on every non-final state. Not in k2: a list of labels (or of label lists) stands for its linear_fsa."""
    if not isinstance(fsas, Fsa):
        fsas = linear_fsa(fsas)
    fsas, parts = _linear_parts(fsas, "fsas")
    out = [add_epsilon_self_loops(linear_fsa(f.label[f.label > 0])) for f in parts]
    return create_fsa_vec(out) if fsas.is_batch else out[0]


def _fst_with_self_loops_one(f: Fsa) -> Fsa:
    label = f.label
    aux = f.attrs["aux_labels"]
    # each run of epsilon arcs joins the non-epsilon arc after it (the arc into the final state included)
    group = np.concatenate([[0], np.cumsum(label[:-1] != 0)]).astype(np.int64)
    num_groups = int(group[-1]) + 1 if len(label) else 0
    rows = aux.tolist() if is_ragged(aux) else [[int(x)] for x in np.asarray(aux).tolist()]
    grouped = [[] for _ in range(num_groups)]
    for g, row in zip(group.tolist(), rows):
        grouped[g].extend(x for x in row if x > 0)      # k2 drops values <= 0 (epsilon 0 and the final -1)
    score = np.zeros(num_groups, np.float64)
    np.add.at(score, group, np.asarray(f.score, np.float64))
    n = num_groups - 1                                  # non-final arcs of the result
    states = np.arange(n + 1)
    src = np.repeat(states, 2)
    dst = np.stack([states, states + 1], 1).reshape(-1)
    lab = np.stack([np.zeros(n + 1, np.int32), np.append(label[label > 0], -1)], 1).reshape(-1)
    sc = np.stack([np.zeros(n + 1), score], 1).reshape(-1)
    aux_rows = [r for g in grouped for r in ([], g)]    # the self-loop's row is empty
    return _single(src, dst, lab, sc, n + 2, {"aux_labels": Ragged.from_lists(aux_rows)})


def linear_fst_with_self_loops(fsts: Fsa) -> Fsa:
    """k2's linear_fst_with_self_loops for a linear transducer (or a batch of them): epsilon arcs (label 0) are
    removed, each run of them merged into the next non-epsilon arc (scores added, aux_labels concatenated with
    values <= 0 dropped), then an epsilon self-loop (label 0, aux_labels [], score 0) goes first on every
    non-final state. The result's aux_labels are `Ragged` (as k2's RaggedTensor); other attributes are
    dropped (as k2). Input aux_labels may be 1-D or Ragged."""
    if isinstance(fsts, Fsa) and "aux_labels" not in fsts.attrs:
        raise ValueError("linear_fst_with_self_loops: the input has no aux_labels; use linear_fsa_with_self_loops")
    fsts, parts = _linear_parts(fsts, "fsts")
    out = [_fst_with_self_loops_one(f) for f in parts]
    return create_fsa_vec(out) if fsts.is_batch else out[0]


def ctc_topo(max_token: int, modified: bool = False) -> Fsa:
    """k2's CTC topology over tokens 1..max_token (0 = blank); labels are frame labels, aux_labels the output.

    Standard: states 0..max_token plus final max_token+1; from every non-final state i an arc to every state
    j with label j (-1 into the final state) and aux_label 0 if i == j else j.
    Modified: state 0 has self-loops (label = aux = t for t in 0..max_token) and arcs to state t (label = aux
    = t, -1 into the final state); every state t >= 1 has a self-loop and an arc back to 0, both label t,
    aux 0. Scores are 0.
    """
    if int(max_token) < 0:
        raise ValueError(f"max_token must be >= 0, got {max_token}")
    T = int(max_token)
    S = T + 2
    final = S - 1
    if not modified:
        i, j = np.meshgrid(np.arange(S - 1), np.arange(S), indexing="ij")
        i, j = i.reshape(-1), j.reshape(-1)
        label = np.where(j == final, -1, j)
        aux = np.where(i == j, 0, label)
        return _single(i, j, label, np.zeros(len(i)), S, {"aux_labels": aux})
    t = np.arange(S - 1)          # 0..T
    d = np.arange(1, S)           # 1..T+1
    s = np.arange(1, S - 1)       # 1..T
    src = np.concatenate([np.zeros_like(t), np.zeros_like(d), np.repeat(s, 2)])
    dst = np.concatenate([np.zeros_like(t), d, np.stack([s, np.zeros_like(s)], 1).reshape(-1)])
    lab_d = np.where(d == final, -1, d)
    label = np.concatenate([t, lab_d, np.repeat(s, 2)])
    aux = np.concatenate([t, lab_d, np.zeros(2 * len(s), np.int64)])
    return _single(src, dst, label, np.zeros(len(src)), S, {"aux_labels": aux})


def _ctc_graph_one(sym: np.ndarray, modified: bool) -> Fsa:
    L = len(sym)
    src, dst, lab, aux = [], [], [], []

    def arc(a, b, la, au):
        src.append(a)
        dst.append(b)
        lab.append(la)
        aux.append(au)

    for i in range(L + 1):
        blank = 2 * i
        cur = int(sym[i]) if i < L else -1
        arc(blank, blank, 0, 0)
        arc(blank, blank + 1, cur, cur)
        if i == L:
            break
        nxt = int(sym[i + 1]) if i + 1 < L else -1
        s = blank + 1
        arc(s, s + 1, 0, 0)
        arc(s, s, cur, 0)
        if modified or cur != nxt:
            arc(s, s + 2, nxt, nxt)
    return _single(src, dst, lab, np.zeros(len(src)), 2 * L + 2, {"aux_labels": aux})


def ctc_graph(symbols: Labels, modified: bool = False) -> Fsa:
    """k2's CTC graph(s) for token sequences (scores 0, aux_labels = the token on the arc entering each token
    state, 0 elsewhere, -1 into the final state). States: blank 2i, token 2i+1, final 2L+1; the standard
    graph has no direct arc between two equal neighbouring tokens. A list of lists gives a batch (as k2);
    a flat list gives one Fsa."""
    if _is_nested(symbols):
        return create_fsa_vec([_ctc_graph_one(_seq(s, f"symbols[{i}]", True), modified)
                               for i, s in enumerate(symbols)])
    return _ctc_graph_one(_seq(symbols, "symbols", True), modified)


def _levenshtein_one(sym: np.ndarray, ins_del_score: float) -> Fsa:
    L = len(sym)
    i = np.arange(L)
    # state i < L: self-loop (0, ins_del), blank to i+1 (0, -0.5, aux sym), symbol to i+1 (sym, 0, aux sym)
    src = np.concatenate([np.repeat(i, 3), [L, L]])
    dst = np.concatenate([np.stack([i, i + 1, i + 1], 1).reshape(-1), [L, L + 1]])
    lab = np.concatenate([np.stack([np.zeros_like(i), np.zeros_like(i), sym], 1).reshape(-1), [0, -1]])
    aux = np.concatenate([np.stack([np.zeros_like(i), sym, sym], 1).reshape(-1), [0, -1]])
    sc = np.concatenate([np.tile(np.array([ins_del_score, -0.5, 0.0], np.float32), L),
                         np.array([ins_del_score, 0.0], np.float32)])
    o = np.float32(ins_del_score) + np.float32(0.5)
    off = np.concatenate([np.tile(np.array([o, 0.0, 0.0], np.float32), L), np.array([o, 0.0], np.float32)])
    return _single(src, dst, lab, sc, L + 2, {"aux_labels": aux, INS_DEL_OFFSET_ATTR: off})


def levenshtein_graph(symbols: Labels, ins_del_score: float = -0.501) -> Fsa:
    """k2's Levenshtein graph(s): per symbol i a self-loop (label 0, aux 0, score ins_del_score), a
    deletion arc (label 0, aux symbol, score -0.5) and a match arc (label = aux = symbol, score 0); the last
    state has a self-loop and the -1 arc. Attribute `__ins_del_score_offset_internal_attr_` holds
    ins_del_score + 0.5 on self-loops (k2). A list of lists gives a batch (k2); a flat list one Fsa."""
    if _is_nested(symbols):
        return create_fsa_vec([_levenshtein_one(_seq(s, f"symbols[{i}]", True), ins_del_score)
                               for i, s in enumerate(symbols)])
    return _levenshtein_one(_seq(symbols, "symbols", True), ins_del_score)


def trivial_graph(max_token: int) -> Fsa:
    """k2's trivial graph: state 0 has self-loops with label = aux_label = t for t in 1..max_token, then
    the -1 arc to final state 1. Scores 0."""
    if int(max_token) < 0:
        raise ValueError(f"max_token must be >= 0, got {max_token}")
    T = int(max_token)
    t = np.arange(1, T + 1)
    src = np.zeros(T + 1, np.int32)
    dst = np.append(np.zeros(T, np.int32), 1)
    lab = np.append(t, -1)
    return _single(src, dst, lab, np.zeros(T + 1), 2, {"aux_labels": lab.copy()})
