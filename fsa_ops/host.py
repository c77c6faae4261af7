"""Helpers shared by the host-side (numpy) FSA ops: conversion, batching, attribute maps, renumbering.

Attribute values may be arrays [A, ...] or `Ragged` (rows per arc): `index_attr`, `from_arc_map`, `build`,
`empty_like` and `renumber` move Ragged rows with the arcs (an arc map entry -1 gives an empty row).
"""
from __future__ import annotations

from typing import Callable, Dict, Optional

import numpy as np

from fsa_ops.fsa import Fsa, check_fsa, create_fsa_vec, host_attr
from fsa_ops.ragged import Ragged, is_ragged


def as_numpy(fsa: Fsa, name: str = "fsa") -> Fsa:
    """The same Fsa with numpy arrays (host ops accept jax arrays too), validated (ValueError naming `name`)."""
    if not isinstance(fsa, Fsa):
        raise TypeError(f"{name}: expected an Fsa, got {type(fsa).__name__}")
    check_fsa(fsa, name)
    return Fsa(np.asarray(fsa.src), np.asarray(fsa.dst), np.asarray(fsa.label), np.asarray(fsa.score),
               np.asarray(fsa.num_states), np.asarray(fsa.num_arcs),
               {k: v.numpy() if is_ragged(v) else np.asarray(v) for k, v in fsa.attrs.items()},
               max_states=fsa.max_states)


def map_fsas(fn: Callable[[Fsa], Fsa], fsa: Fsa, name: str = "fsa") -> Fsa:
    """Apply a single-FSA host op to an Fsa or to each FSA of a batch (result re-batched)."""
    fsa = as_numpy(fsa, name)
    if fsa.is_batch:
        return create_fsa_vec([fn(f) for f in fsa]) if len(fsa) else fsa
    return fn(fsa)


def index_attr(value, arc_map: np.ndarray, filler=0):
    """value[arc_map] with `filler` where arc_map == -1 (k2's index_select default); for a Ragged value
    ([A, W], one FSA's arcs), rows arc_map with an empty row where arc_map == -1 (k2's RaggedTensor.index)."""
    arc_map = np.asarray(arc_map, np.int64)
    if is_ragged(value):
        return value.take(arc_map)
    value = np.asarray(value)
    if value.shape[0] == 0:
        return np.full((len(arc_map),) + value.shape[1:], filler, value.dtype)
    out = value[np.maximum(arc_map, 0)]
    if np.any(arc_map < 0):
        out = out.copy()
        out[arc_map < 0] = filler
    return out


def build(src, dst, label, score, num_states: int, attrs: Optional[Dict[str, np.ndarray]] = None) -> Fsa:
    """A single numpy Fsa from arrays (no validation; callers produce valid, src-sorted arcs)."""
    n = len(src)
    out_attrs = {}
    for k, v in (attrs or {}).items():
        out_attrs[k] = host_attr(v)
    return Fsa(np.asarray(src, np.int32).reshape(n), np.asarray(dst, np.int32).reshape(n),
               np.asarray(label, np.int32).reshape(n), np.asarray(score, np.float32).reshape(n),
               np.asarray(num_states, np.int32), np.asarray(n, np.int32), out_attrs, max_states=int(num_states))


def from_arc_map(fsa: Fsa, arc_map, src, dst, label, score, num_states: int, skip=()) -> Fsa:
    """New Fsa whose arcs come from `fsa` via arc_map (-1: new arc, attributes get the filler 0, Ragged ones an
    empty row); attributes named in `skip` are left out."""
    attrs = {k: index_attr(v, arc_map) for k, v in fsa.attrs.items() if k not in skip}
    return build(src, dst, label, score, num_states, attrs)


def empty_like(fsa: Fsa) -> Fsa:
    """The empty FSA (0 states) with the same attribute names and dtypes."""
    attrs = {k: Ragged(np.zeros((0, v.width), np.int32), np.zeros(0, np.int32)) if is_ragged(v)
             else np.zeros((0,) + np.shape(v)[1:], np.asarray(v).dtype) for k, v in fsa.attrs.items()}
    return build([], [], [], [], 0, attrs)


def csr(src: np.ndarray, num_states: int):
    """Row splits of arcs by src state (arcs are sorted by src)."""
    return np.searchsorted(src, np.arange(num_states + 1)).astype(np.int64)


def renumber(fsa: Fsa, order: np.ndarray, keep_arc: Optional[np.ndarray] = None, ret_arc_map=False):
    """Renumber states: `order` lists old state ids in their new order (states not listed are dropped with
    their arcs). Arcs are stably re-sorted by new src state."""
    ns = int(fsa.num_states)
    new_id = np.full(ns, -1, np.int64)
    new_id[order] = np.arange(len(order))
    src, dst = fsa.src.astype(np.int64), fsa.dst.astype(np.int64)
    keep = (new_id[src] >= 0) & (new_id[dst] >= 0) if len(src) else np.zeros(0, bool)
    if keep_arc is not None:
        keep &= keep_arc
    idx = np.nonzero(keep)[0]
    nsrc = new_id[src[idx]]
    perm = np.argsort(nsrc, kind="stable")
    arc_map = idx[perm]
    out = from_arc_map(fsa, arc_map, nsrc[perm], new_id[dst[arc_map]], fsa.label[arc_map],
                       fsa.score[arc_map], len(order))
    return (out, arc_map.astype(np.int32)) if ret_arc_map else out


def pad_arc_maps(maps, num_arcs: int) -> np.ndarray:
    """Per-FSA arc maps (int[A_b] each) as one int32[B, num_arcs] array padded with -1 (a batch's arc_map)."""
    out = np.full((len(maps), num_arcs), -1, np.int32)
    for b, m in enumerate(maps):
        out[b, :len(m)] = m
    return out


def flat_attr(value):
    """A batch attribute [B, A, ...] (array or Ragged) flattened to rows [B * A, ...], e.g. to index it with
    flat arc ids b * A + i."""
    if is_ragged(value):
        v = value.numpy()
        return Ragged(v.values.reshape(v.lengths.size, v.values.shape[-1]), v.lengths.reshape(-1))
    v = np.asarray(value)
    return v.reshape((-1,) + v.shape[2:])
