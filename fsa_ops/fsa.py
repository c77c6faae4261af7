"""The `Fsa` data structure (k2's Fsa / FsaVec as a JAX pytree), batching, and k2 / OpenFst text formats.

Layout (everyone codes against it):

- `Fsa` is a pytree. Children: `src`, `dst`, `label` (int32[..., A]), `score` (float32[..., A]),
  `num_states`, `num_arcs` (int32[...]: 0-d for one FSA, [B] for a batch) and the per-arc attributes
  `attrs` (dict name -> array[..., A], e.g. 'aux_labels' int32). Static aux data: `max_states` (the padded
  state dimension; equals num_states for a single FSA) and the attribute names.
- k2 invariants: state 0 starts, state num_states-1 is final, arcs into the final state carry label -1 and
  only they do, arcs are sorted by src state, label 0 is epsilon. An FSA with num_states == 0 is empty.
- A batch (k2's FsaVec, `create_fsa_vec`) has a leading dim B on every arc array; arc i of FSA b is real iff
  i < num_arcs[b]. Padding arcs have src=dst=0, label=0, score=-inf, attributes 0 (mask them by index).
- Arrays may be numpy (host ops) or jax (scoring ops). Host ops convert with np.asarray.

Text (k2's `Fsa.from_str` / `to_str_simple`): one arc per line, `src dst label [aux_label ...] score`, and the
final state alone on the last line. With `openfst=True`: `src dst label [aux ...] [cost]` arcs and
`state [cost]` final-state lines (several allowed); costs are negated scores, and a new final state is added
with label -1 arcs from every OpenFst final state (as k2's `Fsa.from_openfst`).
"""
from __future__ import annotations

import re
import warnings
from typing import Dict, List, Optional, Sequence

import jax.numpy as jnp
import numpy as np
from jax import tree_util

__all__ = ["Fsa", "create_fsa_vec", "to_str", "to_str_simple", "check_fsa", "get_aux_label_info"]

_CORE = ("src", "dst", "label", "score", "num_states", "num_arcs")


def _is_jax(x) -> bool:
    return not isinstance(x, (np.ndarray, np.generic)) and hasattr(x, "shape") and hasattr(x, "dtype")


@tree_util.register_pytree_node_class
class Fsa:
    """One FSA (arrays [A]) or a padded batch of FSAs (arrays [B, A]); see the module docstring.

    The constructor does not validate (it must work under jit); host constructors (`from_arcs`, `from_str`,
    `create_fsa_vec`) do, and `check_fsa` validates explicitly.
    """

    __slots__ = ("src", "dst", "label", "score", "num_states", "num_arcs", "attrs", "max_states", "_props")

    def __init__(self, src, dst, label, score, num_states, num_arcs, attrs=None, max_states=None):
        self.src = src
        self.dst = dst
        self.label = label
        self.score = score
        self.num_states = num_states
        self.num_arcs = num_arcs
        self.attrs = dict(attrs) if attrs else {}
        if max_states is None:
            try:
                ns = np.asarray(num_states)
            except Exception as e:  # a tracer under jit
                raise TypeError("Fsa(...): pass max_states= when num_states is traced (under jit)") from e
            max_states = int(ns.max()) if ns.size else 0
        self.max_states = int(max_states)
        self._props = None

    # ---- pytree ----
    def tree_flatten(self):
        names = tuple(sorted(self.attrs))
        children = (self.src, self.dst, self.label, self.score, self.num_states, self.num_arcs,
                    tuple(self.attrs[n] for n in names))
        return children, (self.max_states, names)

    @classmethod
    def tree_unflatten(cls, aux, children):
        max_states, names = aux
        obj = object.__new__(cls)
        (obj.src, obj.dst, obj.label, obj.score, obj.num_states, obj.num_arcs, vals) = children
        obj.attrs = dict(zip(names, vals))
        obj.max_states = max_states
        obj._props = None
        return obj

    # ---- construction ----
    @classmethod
    def from_arcs(cls, src, dst=None, label=None, score=None, num_states: Optional[int] = None,
                  attrs: Optional[Dict[str, np.ndarray]] = None, aux_labels=None, sort: bool = True) -> "Fsa":
        """Build a single validated host Fsa from arc arrays.

        `src` may also be an [A, 4] array (src, dst, label, score) or [A, 3] (score 0). `num_states` defaults
        to max state + 1 (0 when there are no arcs: the empty FSA). With `sort`, arcs are stably sorted by src
        (attributes follow). Raises ValueError on invalid input.
        """
        if dst is None:
            arr = np.asarray(src)
            if arr.ndim != 2 or arr.shape[1] not in (3, 4):
                raise ValueError(f"arcs: expected an [A, 3] or [A, 4] array, got shape {arr.shape}")
            src, dst, label = arr[:, 0], arr[:, 1], arr[:, 2]
            score = arr[:, 3] if arr.shape[1] == 4 else np.zeros(len(arr), np.float32)
        src = _as_int_array(src, "src")
        dst = _as_int_array(dst, "dst")
        label = _as_int_array(label, "label")
        score = np.zeros(src.shape, np.float32) if score is None else np.asarray(score, np.float32)
        attrs = dict(attrs or {})
        if aux_labels is not None:
            attrs["aux_labels"] = aux_labels
        attrs = {k: np.asarray(v) for k, v in attrs.items()}
        for k, v in attrs.items():
            if v.dtype.kind in "iub":
                attrs[k] = v.astype(np.int32)
        n = src.shape[0]
        for name, arr in [("dst", dst), ("label", label), ("score", score)] + [(f"attrs[{k!r}]", v)
                                                                                 for k, v in attrs.items()]:
            if arr.ndim != 1 or arr.shape[0] != n:
                raise ValueError(f"{name}: expected shape ({n},) like src, got {arr.shape}")
        if num_states is None:
            num_states = int(max(src.max(), dst.max())) + 1 if n else 0
        if sort and n and np.any(np.diff(src) < 0):
            order = np.argsort(src, kind="stable")
            src, dst, label, score = src[order], dst[order], label[order], score[order]
            attrs = {k: v[order] for k, v in attrs.items()}
        fsa = cls(src, dst, label, score, np.asarray(num_states, np.int32), np.asarray(n, np.int32), attrs,
                  max_states=num_states)
        check_fsa(fsa)
        return fsa

    @classmethod
    def from_str(cls, s: str, acceptor: Optional[bool] = None, num_aux_labels: Optional[int] = None,
                 aux_label_names: Optional[List[str]] = None, openfst: bool = False) -> "Fsa":
        """Parse k2's text format (or OpenFst's with `openfst=True`); see the module docstring.

        At most one of `acceptor`, `num_aux_labels`, `aux_label_names` may be given (none: acceptor).
        `acceptor=False` means one aux label named 'aux_labels'; further ones are 'aux_labels2', ....
        An empty string gives the empty FSA. Malformed text raises ValueError naming the line: fields
        must be ASCII integers within int32 (states, labels, aux labels) and ASCII numbers whose value
        fits float32 (scores; ``inf``, ``-inf`` and ``nan`` allowed); lines end at \\n, \\r\\n or
        \\r. `s` may also be UTF-8 bytes (ValueError naming the line if they are not UTF-8); any other
        type is a TypeError.
        """
        naux, names = get_aux_label_info(acceptor, num_aux_labels, aux_label_names)
        lines = _text_lines(s)
        fast = _parse_fast(lines, naux, names, openfst)
        return fast if fast is not None else _parse(lines, naux, names, openfst)

    @classmethod
    def from_openfst(cls, s: str, acceptor: Optional[bool] = None, num_aux_labels: Optional[int] = None,
                     aux_label_names: Optional[List[str]] = None) -> "Fsa":
        """`from_str(..., openfst=True)` (k2's `Fsa.from_openfst`)."""
        return cls.from_str(s, acceptor, num_aux_labels, aux_label_names, openfst=True)

    @staticmethod
    def from_fsas(fsas: Sequence["Fsa"]) -> "Fsa":
        """Same as `create_fsa_vec`."""
        return create_fsa_vec(fsas)

    # ---- views ----
    @property
    def is_batch(self) -> bool:
        return len(self.label.shape) == 2

    @property
    def labels(self):
        return self.label

    @property
    def scores(self):
        return self.score

    @property
    def aux_labels(self):
        if "aux_labels" not in self.attrs:
            raise AttributeError("this Fsa has no 'aux_labels' attribute (it is an acceptor)")
        return self.attrs["aux_labels"]

    @property
    def shape(self):
        """k2's shape: (num_states, None) for one FSA, (num_fsas, None, None) for a batch."""
        if self.is_batch:
            return (self.label.shape[0], None, None)
        return (int(self.num_states), None)

    @property
    def arcs(self) -> np.ndarray:
        """[..., A, 4] int32 (src, dst, label, score bits reinterpreted as int32), as k2's arcs tensor."""
        sc = np.ascontiguousarray(np.asarray(self.score, np.float32)).view(np.int32)
        return np.stack([np.asarray(self.src, np.int32), np.asarray(self.dst, np.int32),
                         np.asarray(self.label, np.int32), sc], axis=-1)

    @property
    def properties(self) -> int:
        """k2's property bit mask (see fsa_ops.properties); single FSA: its own, batch: AND over FSAs."""
        if self._props is None:
            from fsa_ops.properties import get_properties  # noqa: lazy import, properties builds on this file
            self._props = get_properties(self)
        return self._props

    @property
    def properties_str(self) -> str:
        from fsa_ops.properties import properties_to_str
        return properties_to_str(self.properties)

    def __len__(self) -> int:
        if not self.is_batch:
            raise TypeError("len() of a single Fsa is undefined; it is defined for a batch (FsaVec)")
        return int(self.label.shape[0])

    def __getitem__(self, i):
        """fsavec[i] -> the i-th FSA trimmed to its arcs and states; fsavec[slice or list] -> a batch."""
        if not self.is_batch:
            raise TypeError("indexing needs a batch (FsaVec); this is a single Fsa")
        B = len(self)
        if isinstance(i, slice):
            return create_fsa_vec([self[j] for j in range(*i.indices(B))])
        if isinstance(i, (list, tuple, np.ndarray)):
            return create_fsa_vec([self[int(j)] for j in i])
        i = int(i)
        if not -B <= i < B:
            raise IndexError(f"FSA index {i} out of range for a batch of {B}")
        i %= B
        na = int(self.num_arcs[i])
        ns = int(self.num_states[i])
        return Fsa(self.src[i, :na], self.dst[i, :na], self.label[i, :na], self.score[i, :na],
                   self.num_states[i], self.num_arcs[i], {k: v[i, :na] for k, v in self.attrs.items()},
                   max_states=ns)

    def __iter__(self):
        for i in range(len(self)):
            yield self[i]

    def replace(self, **fields) -> "Fsa":
        """A new Fsa with some fields replaced (src, dst, label, score, num_states, num_arcs, attrs,
        max_states, or an attribute name such as aux_labels; an attribute set to None is removed)."""
        kw = {k: getattr(self, k) for k in _CORE}
        kw["attrs"] = dict(self.attrs)
        kw["max_states"] = self.max_states
        for k, v in fields.items():
            if k in ("labels", "scores"):
                k = k[:-1]
            if k in kw:
                kw[k] = v
            elif v is None:
                kw["attrs"].pop(k, None)
            else:
                kw["attrs"][k] = v
        return Fsa(**kw)

    def invert(self) -> "Fsa":
        """Swap labels and aux_labels (k2's `Fsa.invert`)."""
        from fsa_ops.unary import invert
        return invert(self)

    def as_dict(self) -> Dict[str, np.ndarray]:
        """numpy arrays for saving (e.g. np.savez(path, **fsa.as_dict())), k2-style: 'arcs' ([..., A, 4]
        int32, score bits reinterpreted), 'num_states', 'num_arcs', 'max_states' and each attribute by name."""
        d = {"arcs": self.arcs, "num_states": np.asarray(self.num_states, np.int32),
             "num_arcs": np.asarray(self.num_arcs, np.int32), "max_states": np.asarray(self.max_states, np.int32)}
        for k, v in self.attrs.items():
            if k in d:
                raise ValueError(f"attribute name {k!r} clashes with a reserved key of as_dict")
            d[k] = np.asarray(v)
        return d

    @classmethod
    def from_dict(cls, d) -> "Fsa":
        """Inverse of `as_dict` (also accepts an np.load result); validates."""
        arcs = np.asarray(d["arcs"], np.int32)
        attrs = {k: np.asarray(d[k]) for k in d if k not in ("arcs", "num_states", "num_arcs", "max_states")}
        fsa = cls(arcs[..., 0], arcs[..., 1], arcs[..., 2], np.ascontiguousarray(arcs[..., 3]).view(np.float32),
                  np.asarray(d["num_states"], np.int32), np.asarray(d["num_arcs"], np.int32), attrs,
                  max_states=int(np.asarray(d["max_states"])))
        check_fsa(fsa)
        return fsa

    def to_dot(self, title=None, **kw) -> str:
        from fsa_ops.draw import to_dot
        return to_dot(self, title=title, **kw)

    def draw(self, filename: str, title=None, **kw) -> str:
        """Render with graphviz's `dot` (k2's Fsa.draw); see fsa_ops.draw.draw."""
        from fsa_ops.draw import draw
        return draw(self, filename, title=title, **kw)

    def to_numpy(self) -> "Fsa":
        return tree_util.tree_map(np.asarray, self)

    def to_jax(self) -> "Fsa":
        return tree_util.tree_map(jnp.asarray, self)

    def to_str(self, openfst: bool = False) -> str:
        return to_str(self, openfst=openfst)

    def __str__(self) -> str:
        if self.is_batch:
            body = "".join(f"FsaVec[{i}]: {to_str(f)}" for i, f in enumerate(self))
            return f"Fsa batch of {len(self)}:\n{body}"
        return "Fsa: " + to_str(self)

    def __repr__(self) -> str:
        kind = f"batch={len(self)}, " if self.is_batch else f"num_states={int(self.num_states)}, "
        return (f"Fsa({kind}arcs={self.label.shape[-1]}, attrs={sorted(self.attrs)}, "
                f"{'jax' if _is_jax(self.label) else 'numpy'})")


def get_aux_label_info(acceptor: Optional[bool], num_aux_labels: Optional[int],
                       aux_label_names: Optional[List[str]]):
    """k2's rule: at most one of the three; returns (num_aux_labels, names)."""
    given = sum(x is not None for x in (acceptor, num_aux_labels, aux_label_names))
    if given > 1:
        raise ValueError("give at most one of acceptor, num_aux_labels, aux_label_names")
    if aux_label_names is not None:
        names = list(aux_label_names)
        if len(set(names)) != len(names):
            raise ValueError(f"aux_label_names has duplicates: {names}")
        return len(names), names
    if num_aux_labels is None:
        num_aux_labels = 0 if acceptor in (None, True) else 1
    if num_aux_labels < 0:
        raise ValueError(f"num_aux_labels must be >= 0, got {num_aux_labels}")
    names = ["aux_labels"] + [f"aux_labels{i}" for i in range(2, num_aux_labels + 1)]
    return num_aux_labels, names[:num_aux_labels]


def _as_int_array(x, name):
    a = np.asarray(x)
    if a.size and a.dtype.kind not in "iu":
        if a.dtype.kind == "f" and np.all(np.floor(a) == a):
            return a.astype(np.int32)
        raise ValueError(f"{name}: expected integers, got dtype {a.dtype}")
    return a.astype(np.int32)


def check_fsa(fsa: Fsa, name: str = "fsa") -> None:
    """Validate shapes and k2's invariants on the host; raises ValueError naming the problem."""
    src, dst, label = (np.asarray(fsa.src), np.asarray(fsa.dst), np.asarray(fsa.label))
    score = np.asarray(fsa.score)
    ns, na = np.asarray(fsa.num_states), np.asarray(fsa.num_arcs)
    batch = label.ndim == 2
    if label.ndim not in (1, 2):
        raise ValueError(f"{name}: label must be 1-D (one FSA) or 2-D (batch), got shape {label.shape}")
    for nm, a in (("src", src), ("dst", dst), ("score", score)):
        if a.shape != label.shape:
            raise ValueError(f"{name}: {nm} has shape {a.shape}, label has {label.shape}")
    for k, v in fsa.attrs.items():
        if np.shape(v)[:label.ndim] != label.shape:
            raise ValueError(f"{name}: attribute {k!r} has shape {np.shape(v)}, arcs have {label.shape}")
    lead = label.shape[:-1]
    if ns.shape != lead or na.shape != lead:
        raise ValueError(f"{name}: num_states/num_arcs shapes {ns.shape}/{na.shape} must be {lead}")
    if not batch:
        src, dst, label, ns, na = src[None], dst[None], label[None], ns[None], na[None]
    A = label.shape[1]
    if np.any(na < 0) or np.any(na > A):
        raise ValueError(f"{name}: num_arcs {na.tolist()} outside [0, {A}]")
    if np.any(ns < 0) or (ns.size and int(ns.max()) > fsa.max_states):
        raise ValueError(f"{name}: num_states {ns.tolist()} outside [0, max_states={fsa.max_states}]")
    if not batch and A != int(na[0]):
        raise ValueError(f"{name}: a single Fsa has {A} arcs but num_arcs={int(na[0])}")
    real = np.arange(A)[None, :] < na[:, None]
    final = (ns - 1)[:, None]
    where = lambda bad: _first_bad(bad, batch)  # noqa: E731
    if np.any(real & (ns[:, None] == 0)):
        raise ValueError(f"{name}: an FSA with 0 states has arcs{where(real & (ns[:, None] == 0))}")
    bad = real & ((src < 0) | (src >= ns[:, None]) | (dst < 0) | (dst >= ns[:, None]))
    if bad.any():
        raise ValueError(f"{name}: state out of range [0, num_states){where(bad)}")
    bad = real & (src == final)
    if bad.any():
        raise ValueError(f"{name}: arc leaves the final state{where(bad)}")
    bad = real & (label == -1) & (dst != final)
    if bad.any():
        raise ValueError(f"{name}: label -1 on an arc not entering the final state{where(bad)}")
    bad = real & (label != -1) & (dst == final)
    if bad.any():
        raise ValueError(f"{name}: arc into the final state has label != -1{where(bad)}")
    bad = real[:, 1:] & (np.diff(src, axis=1) < 0)
    if bad.any():
        raise ValueError(f"{name}: arcs are not sorted by src state{where(bad)}")


def _first_bad(bad, batch):
    b, i = np.argwhere(bad)[0]
    return f" (FSA {b}, arc {i})" if batch else f" (arc {i})"


# ------------------------------------------------------------------ batching
def create_fsa_vec(fsas: Sequence[Fsa], pad_arcs_to: Optional[int] = None,
                   max_states: Optional[int] = None) -> Fsa:
    """Stack single FSAs (or batches, flattened) into one padded batch (k2's `create_fsa_vec`).

    All FSAs must have the same attribute names. `pad_arcs_to` / `max_states` pad further (static shapes
    for jit). Result arrays are numpy.
    """
    flat: List[Fsa] = []
    for i, f in enumerate(fsas):
        if not isinstance(f, Fsa):
            raise TypeError(f"fsas[{i}]: expected an Fsa, got {type(f).__name__}")
        flat.extend(list(f) if f.is_batch else [f])
    names = sorted(flat[0].attrs) if flat else []
    for i, f in enumerate(flat):
        if sorted(f.attrs) != names:
            raise ValueError(f"fsas[{i}] has attributes {sorted(f.attrs)}, fsas[0] has {names}")
    B = len(flat)
    na = np.array([f.label.shape[0] for f in flat], np.int32)
    ns = np.array([int(f.num_states) for f in flat], np.int32)
    A = int(na.max()) if B else 0
    if pad_arcs_to is not None:
        if pad_arcs_to < A:
            raise ValueError(f"pad_arcs_to={pad_arcs_to} is below the largest FSA's {A} arcs")
        A = int(pad_arcs_to)
    S = int(ns.max()) if B else 0
    if max_states is not None:
        if max_states < S:
            raise ValueError(f"max_states={max_states} is below the largest FSA's {S} states")
        S = int(max_states)
    src = np.zeros((B, A), np.int32)
    dst = np.zeros((B, A), np.int32)
    label = np.zeros((B, A), np.int32)
    score = np.full((B, A), -np.inf, np.float32)
    attrs = {}
    for k in names:
        vs = [np.asarray(f.attrs[k]) for f in flat]
        if len({v.ndim for v in vs}) != 1:
            raise ValueError(f"attribute {k!r} has different numbers of dimensions across the FSAs")
        trail = tuple(np.max([v.shape[1:] for v in vs], axis=0).tolist()) if vs[0].ndim > 1 else ()
        attrs[k] = np.zeros((B, A) + trail, vs[0].dtype)  # trailing dims (ragged as padded) pad with 0
    for b, f in enumerate(flat):
        n = na[b]
        src[b, :n] = np.asarray(f.src)
        dst[b, :n] = np.asarray(f.dst)
        label[b, :n] = np.asarray(f.label)
        score[b, :n] = np.asarray(f.score)
        for k in names:
            v = np.asarray(f.attrs[k])
            attrs[k][(b, slice(0, n)) + tuple(slice(0, d) for d in v.shape[1:])] = v
    return Fsa(src, dst, label, score, ns, na, attrs, max_states=S)


# ------------------------------------------------------------------ text
def _fmt_float(x) -> str:
    s = str(np.float32(x))  # shortest repr that round-trips float32
    if s.endswith(".0"):
        s = s[:-2]
    return "0" if s == "-0" else s


def to_str(fsa: Fsa, openfst: bool = False) -> str:
    """k2's `to_str_simple`: the text `Fsa.from_str` reads back (integer attributes printed as aux labels in
    sorted-name order, as k2). `openfst=True`: costs (negated scores), label -1 arcs as final-state lines."""
    if fsa.is_batch:
        return "".join(to_str(f, openfst) for f in fsa)
    ns = int(fsa.num_states)
    if ns == 0:
        return ""
    src, dst, label = (np.asarray(x).tolist() for x in (fsa.src, fsa.dst, fsa.label))
    score = np.asarray(fsa.score, np.float32)
    if openfst:
        score = -score
    extra = [np.asarray(fsa.attrs[k]).tolist() for k in sorted(fsa.attrs)
             if np.asarray(fsa.attrs[k]).dtype.kind in "iu" and np.ndim(fsa.attrs[k]) == 1]
    sc = [_fmt_float(x) for x in score]
    final = ns - 1
    lines = []
    for i in range(len(src)):
        if openfst and label[i] == -1 and dst[i] == final:
            lines.append(f"{src[i]} {sc[i]}")
            continue
        fields = [str(src[i]), str(dst[i]), str(label[i])] + [str(e[i]) for e in extra] + [sc[i]]
        lines.append(" ".join(fields))
    if not openfst:
        lines.append(str(final))
    return "\n".join(lines) + "\n"


to_str_simple = to_str


# Text fields: ASCII integers (optionally signed) in int32, and ASCII floats as Python writes them
# (``inf`` / ``nan`` included) whose value fits float32. Anything else is an error naming the line.
_INT = r"[+-]?[0-9]+"
_FLOAT = r"[+-]?(?:(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|inf(?:inity)?|nan)"
_INT_RE = re.compile(_INT, re.ASCII)
_FLOAT_RE = re.compile(_FLOAT, re.ASCII | re.IGNORECASE)
_LINE_BREAK = re.compile(r"\r\n|\r|\n")
_INT32 = np.iinfo(np.int32)
_FLOAT32_MAX = float(np.finfo(np.float32).max)


# byte classes of the fast parser's check: 0 blank, 1 integer character, 2 other float character, 3 other
_BYTE_CLASS = np.full(256, 3, np.uint8)
_BYTE_CLASS[list(b" \t\n")] = 0
_BYTE_CLASS[list(b"0123456789+-")] = 1
_BYTE_CLASS[list(b".eEinfatyINFATY")] = 2


def _strict_columns(text: str, fields: int) -> bool:
    """Whether `text` (lines joined by \\n, each of exactly `fields` blank-separated tokens, as
    counted before) holds only ASCII integer characters in its first fields - 1 columns and float
    characters in its last: vectorised over the bytes, so that the C number parser, which also
    reads 1.0 or 1e0 as an integer and nan(1) as a number, only ever sees what the line parser
    accepts."""
    try:
        cls = _BYTE_CLASS[np.frombuffer(text.encode("ascii"), np.uint8)]
    except UnicodeEncodeError:
        return False
    if np.any(cls == 3):
        return False
    float_only = np.flatnonzero(cls == 2)
    if float_only.size == 0:
        return True
    blank = cls == 0
    start = ~blank
    start[1:] &= blank[:-1]
    token = np.cumsum(start)[float_only] - 1          # tokens run on across lines: `fields` per line
    return bool(np.all(token % fields == fields - 1))


def _text_lines(s) -> List[str]:
    """The lines of `s` (str, or UTF-8 bytes) split at \\n, \\r\\n or \\r, as editors number them."""
    if isinstance(s, (bytes, bytearray, memoryview)):
        data = bytes(s)
        try:
            s = data.decode("utf-8")
        except UnicodeDecodeError as e:
            line = data.count(b"\n", 0, e.start) + 1
            raise ValueError(f"line {line}: not UTF-8 text (byte {data[e.start]:#04x} at offset "
                             f"{e.start})") from None
    if not isinstance(s, str):
        raise TypeError(f"Fsa.from_str: expected the text as str (or UTF-8 bytes), got {type(s).__name__}")
    return _LINE_BREAK.split(s) if "\r" in s else s.split("\n")


def _int_field(tok: str) -> int:
    if not _INT_RE.fullmatch(tok):
        raise ValueError(f"non-numeric field {tok!r} (an integer is expected)")
    value = int(tok)
    if not _INT32.min <= value <= _INT32.max:
        raise ValueError(f"{tok} is outside the int32 range")
    return value


def _float_field(tok: str) -> float:
    if not _FLOAT_RE.fullmatch(tok):
        raise ValueError(f"non-numeric field {tok!r} (a number is expected)")
    value = float(tok)
    if abs(value) > _FLOAT32_MAX and not tok.lstrip("+-")[:1] in "iI":
        raise ValueError(f"{tok} overflows float32 (write inf or -inf for an infinite score)")
    return value


def _numbers(text: str, n: int) -> np.ndarray:
    """All whitespace-separated numbers of `text` as float64 (C parser); ValueError unless exactly n."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = np.fromstring(text, dtype=np.float64, sep=" ")
    if out.size != n:
        raise ValueError("unparsable text")
    return out


def _ints(x: np.ndarray) -> np.ndarray:
    """Integer columns parsed as float64 must be exact int32 integers (else ValueError)."""
    if not np.all(np.isfinite(x)) or np.any(np.floor(x) != x) or np.any(np.abs(x) > _INT32.max):
        raise ValueError("non-integer field")
    return x.astype(np.int64)


def _scores(x: np.ndarray) -> np.ndarray:
    """Float64 scores as float32; ValueError for values beyond float32's range, and for infinities
    (the C parser also turns 1e400 into inf: the line parser tells the literals apart)."""
    if np.any(np.abs(x) > _FLOAT32_MAX):
        raise ValueError("score overflows float32")
    return x.astype(np.float32)


def _parse_fast(lines: List[str], naux: int, names: List[str], openfst: bool) -> Optional[Fsa]:
    """Vectorised parser for well-formed text; returns None (the line-by-line parser then reports the
    problem with its line number) on anything unusual: before the C number parser reads the arcs,
    `_strict_columns` checks that they hold only what the line parser accepts."""
    lines = [ln for ln in lines if ln.strip()]
    if len(lines) < 2:
        return None
    counts = np.fromiter((len(ln.split()) for ln in lines), np.int64, len(lines))
    arc_fields = 4 + naux
    try:
        if not openfst:
            if counts[-1] != 1 or np.any(counts[:-1] != arc_fields):
                return None
            text = "\n".join(lines[:-1])
            if not _INT_RE.fullmatch(lines[-1].strip()) or not _strict_columns(text, arc_fields):
                return None
            tok = _numbers(text, arc_fields * (len(lines) - 1)).reshape(-1, arc_fields)
            final_state = int(lines[-1])
            ints = _ints(tok[:, :3 + naux])
            score = _scores(tok[:, -1])
            ns = final_state + 1
        else:
            fin = counts <= 2
            arcs = ~fin
            if np.any(counts[arcs] != arc_fields) or not fin.any():
                return None
            idx_a, idx_f = np.nonzero(arcs)[0], np.nonzero(fin)[0]
            text = "\n".join([lines[i] for i in idx_a])
            final_re = re.compile(rf"[ \t]*{_INT}(?:[ \t]+{_FLOAT})?[ \t]*", re.ASCII | re.IGNORECASE)
            if ((len(idx_a) and not _strict_columns(text, arc_fields))
                    or not all(final_re.fullmatch(lines[i]) for i in idx_f)):
                return None
            tok = _numbers(text, arc_fields * len(idx_a)).reshape(-1, arc_fields)
            ints = _ints(tok[:, :3 + naux])
            score = -_scores(tok[:, -1])
            ftok = [lines[i].split() for i in idx_f]
            fst = np.array([int(t[0]) for t in ftok], np.int64)
            fsc = np.array([-float(t[1]) if len(t) == 2 else 0.0 for t in ftok], np.float64)
            fsc = _scores(fsc)
            if np.any(ints[:, :2] < 0) or np.any(fst < 0) or np.any(ints[:, 2] == -1):
                return None
            final_state = int(max(ints[:, :2].max(initial=0), fst.max())) + 1
            extra = np.zeros((len(fst), 3 + naux), np.int64)
            extra[:, 0], extra[:, 1], extra[:, 2:] = fst, final_state, -1
            # final-weight arcs go after the other arcs of their state (stable sort below)
            ints = np.concatenate([ints, extra])
            score = np.concatenate([score, fsc])
            ns = final_state + 1
    except (ValueError, OverflowError):
        return None
    if np.any(np.abs(ints) > _INT32.max) or ns > _INT32.max:
        return None
    src, dst, lab = ints[:, 0], ints[:, 1], ints[:, 2]
    final = ns - 1
    if (final < 0 or np.any((src < 0) | (dst < 0) | (src > final) | (dst > final)) or np.any(src == final)
            or np.any((lab == -1) != (dst == final))):
        return None
    attrs = {nm: ints[:, 3 + j].astype(np.int32) for j, nm in enumerate(names)}
    return Fsa.from_arcs(src.astype(np.int32), dst.astype(np.int32), lab.astype(np.int32), score, num_states=ns,
                         attrs=attrs)


def _parse(lines: List[str], naux: int, names: List[str], openfst: bool) -> Fsa:
    arc_fields = 4 + naux
    srcs, dsts, labs, scs = [], [], [], []
    auxs: List[List[int]] = []
    arc_line = []
    finals = []  # (line_no, state, score)
    final_state = None
    final_line = None

    def bad(ln, msg, text):
        return ValueError(f"line {ln}: {msg}: {text.strip()!r}")

    for ln, line in enumerate(lines, 1):
        f = line.split()
        if not f:
            continue
        if final_state is not None and not openfst:
            raise bad(ln, f"text after the final-state line (line {final_line})", line)
        try:
            if openfst and len(f) in (1, 2):
                st = _int_field(f[0])
                finals.append((ln, st, -_float_field(f[1]) if len(f) == 2 else 0.0))
                continue
            if not openfst and len(f) == 1:
                final_state, final_line = _int_field(f[0]), ln
                continue
            ok = len(f) == arc_fields or (openfst and len(f) == arc_fields - 1)
            if not ok:
                want = f"{arc_fields}" + (f" or {arc_fields - 1}" if openfst else "")
                raise bad(ln, f"expected {want} fields (src dst label{' aux_label' * naux} "
                              f"{'[cost]' if openfst else 'score'}) or a final-state line, got {len(f)}", line)
            a, d, lab = _int_field(f[0]), _int_field(f[1]), _int_field(f[2])
            au = [_int_field(x) for x in f[3:3 + naux]]
            sc = _float_field(f[3 + naux]) if len(f) == arc_fields else 0.0
        except ValueError as e:
            if str(e).startswith("line "):
                raise
            raise bad(ln, str(e), line) from None
        srcs.append(a)
        dsts.append(d)
        labs.append(lab)
        scs.append(-sc if openfst else sc)
        auxs.append(au)
        arc_line.append(ln)

    if openfst:
        if not srcs and not finals:
            return _empty(names)
        for i, (a, d) in enumerate(zip(srcs, dsts)):
            if a < 0 or d < 0:
                raise ValueError(f"line {arc_line[i]}: negative state number in arc {a}->{d}")
        for ln, st, _ in finals:
            if st < 0:
                raise ValueError(f"line {ln}: negative final state {st}")
        states = srcs + dsts + [st for _, st, _ in finals]
        final_state = max(states) + 1
        if final_state >= _INT32.max:
            ln = max([(a, ln) for a, ln in zip(srcs + dsts, arc_line + arc_line)] +
                     [(st, ln) for ln, st, _ in finals])[1]
            raise ValueError(f"line {ln}: state {final_state - 1} leaves no room for the added final state "
                             f"{final_state} in int32")
        for ln, st, sc in finals:
            srcs.append(st)
            dsts.append(final_state)
            labs.append(-1)
            scs.append(sc)
            auxs.append([-1] * naux)
            arc_line.append(ln)
        for i in range(len(srcs) - len(finals)):
            if labs[i] == -1:
                raise ValueError(f"line {arc_line[i]}: label -1 is reserved for arcs into the final state "
                                 f"(OpenFst text marks final states with 'state [cost]' lines)")
    else:
        if final_state is None:
            if not srcs:
                return _empty(names)
            raise ValueError(f"line {arc_line[-1] + 1}: missing the final-state line (a single state number "
                             f"after the arcs)")
        if final_state < 0:
            raise ValueError(f"line {final_line}: negative final state {final_state}")
        if final_state >= _INT32.max:
            raise ValueError(f"line {final_line}: final state {final_state}: the number of states "
                             f"{final_state + 1} is outside int32")
        for i in range(len(srcs)):
            ln, a, d = arc_line[i], srcs[i], dsts[i]
            if a < 0 or d < 0 or a > final_state or d > final_state:
                raise ValueError(f"line {ln}: state out of range: arc {a}->{d} but the final state is "
                                 f"{final_state} (line {final_line})")
            if a == final_state:
                raise ValueError(f"line {ln}: arc leaves the final state {final_state}")
            if labs[i] == -1 and d != final_state:
                raise ValueError(f"line {ln}: label -1 on an arc to state {d}, not the final state {final_state}")
            if labs[i] != -1 and d == final_state:
                raise ValueError(f"line {ln}: arc into the final state {final_state} has label {labs[i]} "
                                 f"(must be -1)")
    n = len(srcs)
    aux_arr = np.array(auxs, np.int32).reshape(n, naux)
    attrs = {nm: aux_arr[:, j] for j, nm in enumerate(names)}
    return Fsa.from_arcs(np.array(srcs, np.int32), np.array(dsts, np.int32), np.array(labs, np.int32),
                         np.array(scs, np.float32), num_states=final_state + 1, attrs=attrs)


def _empty(names) -> Fsa:
    z = np.zeros(0, np.int32)
    return Fsa(z, z.copy(), z.copy(), np.zeros(0, np.float32), np.asarray(0, np.int32),
               np.asarray(0, np.int32), {n: z.copy() for n in names}, max_states=0)
