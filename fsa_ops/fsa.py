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
- Ragged attributes (k2's RaggedTensor, e.g. several words on one arc) are `fsa_ops.ragged.Ragged` values in
  `attrs`: values [..., A, W] and lengths [..., A]; padding arcs have empty rows.

Text formats (k2's and OpenFst's) live in `fsa_ops.fsa_text`; `Fsa.from_str` / `to_str` are the entry points.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence

import jax.numpy as jnp
import numpy as np
from jax import tree_util

from fsa_ops.fsa_text import parse_text, to_str, to_str_simple
from fsa_ops.ragged import Ragged, is_ragged

__all__ = ["Fsa", "create_fsa_vec", "to_str", "to_str_simple", "check_fsa", "get_aux_label_info", "fix_final_labels",
           "host_attr", "is_jax"]

_CORE = ("src", "dst", "label", "score", "num_states", "num_arcs")


def is_jax(x) -> bool:
    """Whether x is a jax array (or tracer) rather than numpy."""
    return not isinstance(x, (np.ndarray, np.generic)) and hasattr(x, "shape") and hasattr(x, "dtype")


@tree_util.register_pytree_node_class
class Fsa:
    """One FSA (arrays [A]) or a padded batch of FSAs (arrays [B, A]); see the module docstring.

    The constructor does not validate (it must work under jit); host constructors (`from_arcs`, `from_str`,
    `create_fsa_vec`) do, and `check_fsa` validates explicitly. As in k2, attributes are read and set by name
    (`fsa.aux_labels2`, `fsa.foo = Ragged(...)`, `del fsa.foo`; shapes checked) and `fsa.labels = ...` applies
    k2's fix_final_labels; these setters change the object in place (host-side use, not under jit).
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
        attrs = {k: host_attr(v) for k, v in attrs.items()}
        n = src.shape[0]
        for name, arr in [("dst", dst), ("label", label), ("score", score)] + [(f"attrs[{k!r}]", v)
                                                                                 for k, v in attrs.items()]:
            if is_ragged(arr):
                if arr.ndim != 2 or len(arr) != n:
                    raise ValueError(f"{name}: expected a Ragged with {n} rows (one per arc), got values of shape "
                                     f"{arr.shape}")
            elif arr.ndim != 1 or arr.shape[0] != n:
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
                 aux_label_names: Optional[List[str]] = None, ragged_label_names: Sequence[str] = (),
                 openfst: bool = False) -> "Fsa":
        """Parse k2's text format (or OpenFst's with `openfst=True`); see `fsa_ops.fsa_text`.

        At most one of `acceptor`, `num_aux_labels`, `aux_label_names` may be given (none: acceptor).
        `acceptor=False` means one aux label named 'aux_labels'; further ones are 'aux_labels2', ....
        `ragged_label_names`: that many ``[ ... ]`` lists follow the aux labels on every arc line, read as
        `Ragged` attributes of these names (OpenFst's added final arcs get empty lists).
        An empty string gives the empty FSA. Malformed text raises ValueError naming the line: fields
        must be ASCII integers within int32 (states, labels, aux labels) and ASCII numbers whose value
        fits float32 (scores; ``inf``, ``-inf`` and ``nan`` allowed); lines end at \\n, \\r\\n or
        \\r. `s` may also be UTF-8 bytes (ValueError naming the line if they are not UTF-8); any other
        type is a TypeError.
        """
        naux, names = get_aux_label_info(acceptor, num_aux_labels, aux_label_names)
        return cls.from_arcs(**parse_text(s, naux, names, ragged_label_names or (), openfst))

    @classmethod
    def from_openfst(cls, s: str, acceptor: Optional[bool] = None, num_aux_labels: Optional[int] = None,
                     aux_label_names: Optional[List[str]] = None, ragged_label_names: Sequence[str] = ()) -> "Fsa":
        """`from_str(..., openfst=True)` (k2's `Fsa.from_openfst`)."""
        return cls.from_str(s, acceptor, num_aux_labels, aux_label_names, ragged_label_names, openfst=True)

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

    @labels.setter
    def labels(self, value):
        """k2's setter: int labels of the arc shape; -1 on arcs not entering the final state becomes 0 and 0 on
        arcs entering it becomes -1 (k2's fix_final_labels); any other label there is a ValueError."""
        value = _as_int_array(value, "labels")
        if value.shape != np.shape(self.label):
            raise ValueError(f"labels: expected shape {np.shape(self.label)}, got {value.shape}")
        object.__setattr__(self, "label", fix_final_labels(self, value, "labels"))
        self._props = None
        check_fsa(self, "labels")

    @property
    def scores(self):
        return self.score

    @scores.setter
    def scores(self, value):
        if np.shape(value) != np.shape(self.score):
            raise ValueError(f"scores: expected shape {np.shape(self.score)}, got {np.shape(value)}")
        object.__setattr__(self, "score", value if is_jax(value) else np.asarray(value, np.float32))

    @property
    def aux_labels(self):
        if "aux_labels" not in self.attrs:
            raise AttributeError("this Fsa has no 'aux_labels' attribute (it is an acceptor)")
        return self.attrs["aux_labels"]

    @aux_labels.setter
    def aux_labels(self, value):
        self._set_attr("aux_labels", value)

    # ---- attributes by name (k2: fsa.foo = tensor or RaggedTensor; fsa.foo; del fsa.foo) ----
    def __getattr__(self, name):
        if name.startswith("_") or name in Fsa.__slots__:
            raise AttributeError(name)
        attrs = object.__getattribute__(self, "attrs")
        if name in attrs:
            return attrs[name]
        raise AttributeError(f"this Fsa has no attribute {name!r} (attributes: {sorted(attrs)})")

    def __setattr__(self, name, value):
        if name in Fsa.__slots__:
            object.__setattr__(self, name, value)
            return
        prop = getattr(type(self), name, None)
        if isinstance(prop, property):
            if prop.fset is None:
                raise AttributeError(f"Fsa.{name} is read-only")
            prop.fset(self, value)
            return
        self._set_attr(name, value)

    def __delattr__(self, name):
        if name in Fsa.__slots__ or name not in self.attrs:
            raise AttributeError(f"cannot delete {name!r}: not a per-arc attribute of this Fsa")
        del self.attrs[name]

    def convert_attr_to_ragged_(self, name: str, remove_eps: bool = True) -> "Fsa":
        """k2's in-place conversion of an integer attribute [..., A] to a Ragged with one value per row (rows of 0
        empty if `remove_eps`; padding arcs of a batch empty); returns self."""
        v = self.attrs.get(name)
        if v is None or is_ragged(v) or np.ndim(v) != np.ndim(self.label) or np.asarray(v).dtype.kind not in "iu":
            raise ValueError(f"convert_attr_to_ragged_: {name!r} is not an integer attribute with one value per arc")
        v = np.asarray(v, np.int32)
        lengths = (v != 0) if remove_eps else np.ones(v.shape, bool)
        if v.ndim == 2:
            lengths &= np.arange(v.shape[1]) < np.asarray(self.num_arcs)[:, None]
        self.attrs[name] = Ragged(np.where(lengths, v, 0)[..., None], lengths.astype(np.int32))
        return self

    def _set_attr(self, name, value):
        """Set per-arc attribute `name`: an array [..., A, ...] or a Ragged with the arc shape as rows."""
        value = value if is_jax(value) or is_jax(getattr(value, "values", None)) else host_attr(value)
        shape = tuple(np.shape(self.label))
        got = tuple(np.shape(value.lengths)) if is_ragged(value) else tuple(np.shape(value))[:len(shape)]
        if got != shape:
            raise ValueError(f"{name}: expected one value (or Ragged row) per arc, shape {shape}, got {got}")
        self.attrs[name] = value

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
            from fsa_ops.properties import get_properties  # lazy: properties builds on this file
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
        """Swap labels and aux_labels (k2's `Fsa.invert`; a ragged aux_labels is expanded first)."""
        from fsa_ops.unary import invert
        return invert(self)

    # ---- scores (thin wrappers of fsa_ops.scores, as k2's Fsa methods) ----
    def get_forward_scores(self, use_double_scores: bool = True, log_semiring: bool = True):
        """[..., S] forward scores (see fsa_ops.scores.get_forward_scores)."""
        from fsa_ops.scores import get_forward_scores
        return get_forward_scores(self, use_double_scores, log_semiring)

    def get_backward_scores(self, use_double_scores: bool = True, log_semiring: bool = True):
        """[..., S] backward scores (see fsa_ops.scores.get_backward_scores)."""
        from fsa_ops.scores import get_backward_scores
        return get_backward_scores(self, use_double_scores, log_semiring)

    def get_tot_scores(self, use_double_scores: bool = True, log_semiring: bool = True):
        """[...] total scores (see fsa_ops.scores.get_tot_scores)."""
        from fsa_ops.scores import get_tot_scores
        return get_tot_scores(self, use_double_scores, log_semiring)

    def get_arc_post(self, use_double_scores: bool = True, log_semiring: bool = True):
        """[..., A] arc posteriors (see fsa_ops.scores.get_arc_post)."""
        from fsa_ops.scores import get_arc_post
        return get_arc_post(self, use_double_scores, log_semiring)

    def as_dict(self) -> Dict[str, np.ndarray]:
        """numpy arrays for saving (e.g. np.savez(path, **fsa.as_dict())), k2-style: 'arcs' ([..., A, 4]
        int32, score bits reinterpreted), 'num_states', 'num_arcs', 'max_states' and each attribute by name."""
        d = {"arcs": self.arcs, "num_states": np.asarray(self.num_states, np.int32),
             "num_arcs": np.asarray(self.num_arcs, np.int32), "max_states": np.asarray(self.max_states, np.int32)}
        for k, v in self.attrs.items():
            keys = (k + ".values", k + ".lengths") if is_ragged(v) else (k,)
            if any(key in d for key in keys) or k.endswith((".values", ".lengths")):
                raise ValueError(f"attribute name {k!r} clashes with a key of as_dict")
            if is_ragged(v):
                d[keys[0]], d[keys[1]] = np.asarray(v.values), np.asarray(v.lengths)
            else:
                d[k] = np.asarray(v)
        return d

    @classmethod
    def from_dict(cls, d) -> "Fsa":
        """Inverse of `as_dict` (also accepts an np.load result); validates. A Ragged attribute `k` is stored as
        'k.values' and 'k.lengths'."""
        arcs = np.asarray(d["arcs"], np.int32)
        keys = [k for k in d if k not in ("arcs", "num_states", "num_arcs", "max_states")]
        attrs = {k: np.asarray(d[k]) for k in keys if not k.endswith((".values", ".lengths"))}
        for k in keys:
            if k.endswith(".values"):
                name = k[:-len(".values")]
                if name + ".lengths" not in d:
                    raise ValueError(f"from_dict: {k!r} without {name + '.lengths'!r}")
                attrs[name] = Ragged(np.asarray(d[k], np.int32), np.asarray(d[name + ".lengths"], np.int32))
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
                f"{'jax' if is_jax(self.label) else 'numpy'})")


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
        if is_ragged(v):
            vals, lens = np.asarray(v.values), np.asarray(v.lengths)
            if lens.shape != label.shape or vals.shape[:-1] != label.shape or vals.ndim != label.ndim + 1:
                raise ValueError(f"{name}: Ragged attribute {k!r} has values {vals.shape} and lengths {lens.shape}; "
                                 f"arcs have {label.shape} (rows must match the arcs)")
            if lens.size and (lens.min() < 0 or lens.max() > vals.shape[-1]):
                raise ValueError(f"{name}: Ragged attribute {k!r} has row lengths outside [0, {vals.shape[-1]}]")
        elif np.shape(v)[:label.ndim] != label.shape:
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
        vs = [host_attr(f.attrs[k]) for f in flat]
        if len({is_ragged(v) for v in vs}) != 1:
            raise ValueError(f"attribute {k!r} is a Ragged in some FSAs and an array in others")
        if is_ragged(vs[0]):
            w = max(v.width for v in vs)
            attrs[k] = Ragged(np.zeros((B, A, w), np.int32), np.zeros((B, A), np.int32))  # padding: empty rows
            continue
        if len({v.ndim for v in vs}) != 1:
            raise ValueError(f"attribute {k!r} has different numbers of dimensions across the FSAs")
        trail = tuple(np.max([v.shape[1:] for v in vs], axis=0).tolist()) if vs[0].ndim > 1 else ()
        attrs[k] = np.zeros((B, A) + trail, vs[0].dtype)  # trailing dims (padded lists) pad with 0
    for b, f in enumerate(flat):
        n = na[b]
        src[b, :n] = np.asarray(f.src)
        dst[b, :n] = np.asarray(f.dst)
        label[b, :n] = np.asarray(f.label)
        score[b, :n] = np.asarray(f.score)
        for k in names:
            v = f.attrs[k]
            if is_ragged(v):
                vals = np.asarray(v.values)
                attrs[k].values[b, :n, :vals.shape[-1]] = vals
                attrs[k].lengths[b, :n] = np.asarray(v.lengths)
                continue
            v = np.asarray(v)
            attrs[k][(b, slice(0, n)) + tuple(slice(0, d) for d in v.shape[1:])] = v
    return Fsa(src, dst, label, score, ns, na, attrs, max_states=S)


def fix_final_labels(fsa: Fsa, labels, name: str = "labels") -> np.ndarray:
    """k2's FixFinalLabels on host arrays (labels int[..., A], the arc shape of `fsa`): -1 on arcs into the final
    state, and -1 turned to 0 elsewhere; arcs into the final state may hold only -1 or 0 (else ValueError)."""
    labels = np.asarray(labels, np.int32)
    ns = np.asarray(fsa.num_states)
    into_final = np.asarray(fsa.dst) == (ns[..., None] if ns.ndim else ns) - 1
    bad = into_final & (labels != -1) & (labels != 0)
    if labels.ndim == 2:
        bad &= np.arange(labels.shape[1]) < np.asarray(fsa.num_arcs)[:, None]
    if bad.any():
        raise ValueError(f"{name}: arc {np.argwhere(bad)[0].tolist()} enters the final state with label "
                         f"{int(labels[bad][0])}; only -1 (or 0, made -1) may go there")
    out = np.where(into_final, -1, np.where(labels == -1, 0, labels)).astype(np.int32)
    if labels.ndim == 2:   # padding arcs (src = dst = 0) keep their label 0
        out = np.where(np.arange(labels.shape[1]) < np.asarray(fsa.num_arcs)[:, None], out, labels)
    return out


def host_attr(v):
    """An attribute value as numpy: a Ragged with int32 numpy arrays, integer/bool arrays as int32."""
    if is_ragged(v):
        return v.numpy()
    v = np.asarray(v)
    return v.astype(np.int32) if v.dtype.kind in "iub" else v


