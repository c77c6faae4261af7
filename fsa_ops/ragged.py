"""`Ragged`: a list of integer lists per arc (k2's RaggedTensor attributes, e.g. several word labels on one arc).

Layout: `values` int32[..., N, W] and `lengths` int32[..., N]; row r is ``values[..., r, :lengths[..., r]]`` and
entries beyond a row's length are 0. Leading dims are the FSA batch (the Fsa's [B, A] arc layout, N = A), so a
ragged attribute sits in `Fsa.attrs` next to the 1-D ones and jit carries it as two arrays. Rows may hold any
int32 value, -1 and 0 included (k2 puts [-1] on arcs into the final state); `remove_values_leq(0)` drops both.
Host methods (`tolist`, `row_splits`, `flat_values`, `take`, `remove_values_*`, `concat_rows`) take numpy or
jax arrays and return numpy.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
from jax import tree_util

__all__ = ["Ragged", "is_ragged", "ragged_cat"]


@tree_util.register_pytree_node_class
class Ragged:
    """Rows of int32 values, padded: `values` [..., N, W], `lengths` [..., N] (see the module docstring)."""

    __slots__ = ("values", "lengths")

    def __init__(self, values, lengths):
        self.values = values
        self.lengths = lengths

    def tree_flatten(self):
        return (self.values, self.lengths), None

    @classmethod
    def tree_unflatten(cls, aux, children):
        return cls(*children)

    # ---- construction ----
    @classmethod
    def from_lists(cls, rows: Sequence[Sequence[int]], width: int | None = None) -> "Ragged":
        """One row axis from Python lists (k2's ``RaggedTensor([[1, 2], [], [3]])``); `width` pads further."""
        rows = [list(map(int, r)) for r in rows]
        lengths = np.array([len(r) for r in rows], np.int32)
        w = int(lengths.max()) if len(rows) else 0
        if width is not None:
            if width < w:
                raise ValueError(f"width={width} is below the longest row's {w} values")
            w = int(width)
        values = np.zeros((len(rows), w), np.int32)
        for i, r in enumerate(rows):
            values[i, :len(r)] = r
        return cls(values, lengths)

    @classmethod
    def from_row_splits(cls, row_splits, flat_values, width: int | None = None) -> "Ragged":
        """From k2's row_splits (int[N + 1], nondecreasing, starting at 0) and the concatenated values."""
        splits = np.asarray(row_splits, np.int64)
        flat = np.asarray(flat_values)
        if splits.ndim != 1 or splits.size == 0 or splits[0] != 0 or np.any(np.diff(splits) < 0) \
                or splits[-1] != flat.size:
            raise ValueError(f"row_splits must be nondecreasing from 0 to len(flat_values)={flat.size}, got "
                             f"{splits[:8].tolist()}{'...' if splits.size > 8 else ''}")
        lengths = np.diff(splits).astype(np.int32)
        w = int(lengths.max()) if lengths.size else 0
        if width is not None:
            if width < w:
                raise ValueError(f"width={width} is below the longest row's {w} values")
            w = int(width)
        values = np.zeros((lengths.size, w), np.int32)
        col = np.arange(flat.size) - np.repeat(splits[:-1], lengths)
        values[np.repeat(np.arange(lengths.size), lengths), col] = flat
        return cls(values, lengths)

    @classmethod
    def from_dense(cls, values, fill: int = 0) -> "Ragged":
        """From a [..., N] array: one value per row, rows equal to `fill` empty (e.g. 0 = no word)."""
        v = np.asarray(values, np.int32)
        return cls(v[..., None], (v != fill).astype(np.int32))

    # ---- views ----
    @property
    def shape(self):
        return tuple(np.shape(self.values))

    @property
    def ndim(self) -> int:
        """Dimensions of the padded `values` (2 for one FSA's arcs, 3 for a batch)."""
        return len(np.shape(self.values))

    @property
    def dtype(self):
        return np.dtype(np.int32)

    @property
    def width(self) -> int:
        return int(np.shape(self.values)[-1])

    def __len__(self) -> int:
        return int(np.shape(self.lengths)[0])

    def numpy(self) -> "Ragged":
        return Ragged(np.asarray(self.values, np.int32), np.asarray(self.lengths, np.int32))

    def _mask(self):
        v, n = np.asarray(self.values), np.asarray(self.lengths)
        return v, np.arange(v.shape[-1]) < n[..., None]

    @property
    def row_splits(self) -> np.ndarray:
        """int64[N + 1] over the flattened rows (k2's ``shape.row_splits(1)``)."""
        n = np.asarray(self.lengths, np.int64).reshape(-1)
        return np.concatenate([[0], np.cumsum(n)])

    @property
    def flat_values(self) -> np.ndarray:
        """int32[total]: the rows' values concatenated in row order (k2's ``.values``)."""
        v, m = self._mask()
        return v[m].astype(np.int32)

    def tolist(self) -> list:
        """Nested Python lists (rows sliced from the flat values: O(total values), no per-value Python work)."""
        flat, splits = self.flat_values.tolist(), self.row_splits.tolist()
        rows = [flat[a:b] for a, b in zip(splits[:-1], splits[1:])]
        shape = np.shape(self.lengths)
        for k in range(len(shape) - 1, 0, -1):   # regroup the leading (batch) axes
            d = shape[k]
            rows = [rows[i * d:(i + 1) * d] for i in range(int(np.prod(shape[:k])))]
        return rows

    def __getitem__(self, index) -> "Ragged":
        """Index the leading (row or batch) axes as numpy does; the value axis stays whole."""
        if isinstance(index, tuple) and len(index) >= self.ndim:
            raise IndexError("Ragged indexes its row axes only; use tolist() for single values")
        return Ragged(self.values[index], self.lengths[index])

    def __eq__(self, other) -> bool:
        if not isinstance(other, Ragged):
            return NotImplemented
        return self.tolist() == other.tolist()

    __hash__ = None

    def __repr__(self) -> str:
        rows = self.tolist()
        shown = rows if len(rows) <= 8 else rows[:8] + ["..."]
        return f"Ragged({shown})"

    # ---- host ops (numpy results) ----
    def take(self, index, fill_row: Sequence[int] = ()) -> "Ragged":
        """Rows `index` along the last row axis (int[M]; -1 gives `fill_row`), for one FSA's arcs ([N, W])."""
        v, n = np.asarray(self.values, np.int32), np.asarray(self.lengths, np.int32)
        if v.ndim != 2:
            raise ValueError(f"Ragged.take needs one row axis ([N, W]), got values of shape {v.shape}")
        index = np.asarray(index, np.int64)
        fill = np.asarray(list(fill_row), np.int32)
        w = max(v.shape[1], fill.size)
        if v.shape[0] == 0:
            v, n = np.zeros((1, w), np.int32), np.zeros(1, np.int32)
        elif w > v.shape[1]:
            v = np.pad(v, ((0, 0), (0, w - v.shape[1])))
        safe = np.maximum(index, 0)
        out_v, out_n = v[safe], n[safe]
        missing = index < 0
        if missing.any():
            out_v[missing] = 0
            out_v[missing, :fill.size] = fill
            out_n[missing] = fill.size
        return Ragged(out_v, out_n)

    def _keep(self, keep_value) -> "Ragged":
        v, m = self._mask()
        return _packed(v, m & keep_value(v))

    def remove_values_eq(self, target: int) -> "Ragged":
        return self._keep(lambda v: v != target)

    def remove_values_leq(self, cutoff: int) -> "Ragged":
        return self._keep(lambda v: v > cutoff)

    def concat_rows(self, other: "Ragged") -> "Ragged":
        """Row r of the result is row r of self followed by row r of other (same row shape)."""
        if np.shape(self.lengths) != np.shape(other.lengths):
            raise ValueError(f"concat_rows: row shapes differ: {np.shape(self.lengths)} vs {np.shape(other.lengths)}")
        a, ma = self._mask()
        b, mb = other._mask()
        return _packed(np.concatenate([a, b], -1), np.concatenate([ma, mb], -1))

    def with_width(self, width: int) -> "Ragged":
        """Pad (or trim empty columns) to `width` values per row; ValueError if a row is longer."""
        v, n = np.asarray(self.values, np.int32), np.asarray(self.lengths, np.int32)
        if n.size and int(n.max()) > width:
            raise ValueError(f"with_width({width}): a row has {int(n.max())} values")
        if width <= v.shape[-1]:
            return Ragged(v[..., :width], n)
        pad = [(0, 0)] * (v.ndim - 1) + [(0, width - v.shape[-1])]
        return Ragged(np.pad(v, pad), n)


def _packed(v, m) -> Ragged:
    """The values of `v` where `m` holds, moved to the front of each row in their order."""
    n = m.sum(-1).astype(np.int32)
    order = np.argsort(~m, axis=-1, kind="stable")
    packed = np.where(np.take_along_axis(m, order, -1), np.take_along_axis(v, order, -1), 0)
    w = int(n.max()) if n.size else 0
    return Ragged(packed[..., :w].astype(np.int32), n)


def is_ragged(x) -> bool:
    return isinstance(x, Ragged)


def ragged_cat(parts: Sequence[Ragged]) -> Ragged:
    """Stack the rows of several one-axis Raggeds ([N_i, W_i]) into one [sum N_i, max W_i]."""
    parts = [p.numpy() for p in parts]
    if not parts:
        return Ragged(np.zeros((0, 0), np.int32), np.zeros(0, np.int32))
    w = max(p.width for p in parts)
    return Ragged(np.concatenate([p.with_width(w).values for p in parts]),
                  np.concatenate([p.lengths for p in parts]))
