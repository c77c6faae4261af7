"""Random FSAs for tests and a randomized equivalence check (k2's `random_fsa`, `random_fsa_vec`,
`is_rand_equivalent`). Host-side numpy; every function takes `seed` (an int, a `numpy.random.Generator`, or None
for fresh OS entropy, as k2's unseeded generators) and touches no global random state.

`random_fsa` draws like k2's RandomFsa: a number of arcs between min_num_arcs and max_num_arcs (small counts
more likely), split over a random number of non-final states (some may get none), then the final state. Arc i
leaves its state for a uniformly drawn destination (a higher state when `acyclic`, any state otherwise); arcs
into the final state get label -1, the others a label in [0, max_symbol]; scores are uniform in [0, 10). The
FSA need not be connected; with no states drawn it is the empty FSA. (k2 also, rarely, inserts a long run of
empty states; that is not done here, and the random streams differ from k2's.)

`is_rand_equivalent(a, b, log_semiring, ...)` follows k2's host IsRandEquivalent: after `connect`, both empty is
equivalent and one empty is not; the label sets may differ by at most the epsilon (with
treat_epsilons_specially); the total scores must agree within `delta`; then `npath` times a uniformly random path
of a or b (coin flip) gives a label sequence, whose total score (max or log-sum over the paths that carry it) must
agree within `delta` in both, unless it is more than `beam` below the total score in both. Scores are accumulated
in float64 by dynamic programming (no intersection). Labels only: aux_labels are not compared (as k2). The FSAs
must be acyclic once connected (k2 requires top-sorted input); a batch is compared FSA by FSA.
"""
from __future__ import annotations

import math
import numbers
from typing import List, Optional, Union

import numpy as np

from fsa_ops.connect import connect
from fsa_ops.fsa import Fsa, create_fsa_vec
from fsa_ops.host import as_numpy, build, csr

__all__ = ["random_fsa", "random_fsa_vec", "is_rand_equivalent", "rand_equivalence_report"]

Seed = Union[None, int, np.random.Generator]


def _rng(seed: Seed) -> np.random.Generator:
    if isinstance(seed, np.random.Generator):
        return seed
    if seed is None or (isinstance(seed, numbers.Integral) and not isinstance(seed, bool)):
        if seed is not None and int(seed) < 0:
            raise ValueError(f"seed must be >= 0, got {seed}")
        return np.random.default_rng(None if seed is None else int(seed))
    raise TypeError(f"seed: expected an int, a numpy.random.Generator or None, got {type(seed).__name__}")


def _int_arg(x, name: str, lo: int) -> int:
    if not isinstance(x, numbers.Integral) or isinstance(x, bool):
        raise TypeError(f"{name}: expected an int, got {type(x).__name__}")
    if int(x) < lo:
        raise ValueError(f"{name} must be >= {lo}, got {x}")
    return int(x)


def _geometric(rng: np.random.Generator, lo: int, hi: int) -> int:
    """An int in [lo, hi], small values favoured: a uniform bit count, then uniform below that power of 2."""
    span = hi - lo
    bits = int(rng.integers(0, span.bit_length() + 1))
    return lo + int(rng.integers(0, min(span, (1 << bits) - 1) + 1))


def _random_one(rng, acyclic: bool, max_symbol: int, min_num_arcs: int, max_num_arcs: int) -> Fsa:
    num_arcs = _geometric(rng, min_num_arcs, max_num_arcs)
    sizes: List[int] = []
    left = num_arcs
    while left > 0 or rng.integers(0, 3) == 0:   # (k2 also adds empty states after the arcs are placed)
        k = _geometric(rng, 0, left)
        sizes.append(k)
        left -= k
    if not sizes:
        return build([], [], [], [], 0)
    final = len(sizes)
    src = np.repeat(np.arange(final), sizes)
    if acyclic:
        dst = rng.integers(src + 1, final + 1) if num_arcs else np.zeros(0, np.int64)
    else:
        dst = rng.integers(0, final + 1, size=num_arcs)
    label = np.where(dst == final, -1, rng.integers(0, max_symbol + 1, size=num_arcs))
    score = rng.uniform(0.0, 10.0, size=num_arcs).astype(np.float32)
    return build(src, dst, label, score, final + 1)


def _check_random_args(max_symbol, min_num_arcs, max_num_arcs):
    _int_arg(max_symbol, "max_symbol", 0)
    lo = _int_arg(min_num_arcs, "min_num_arcs", 0)
    hi = _int_arg(max_num_arcs, "max_num_arcs", 0)
    if hi < lo:
        raise ValueError(f"max_num_arcs ({hi}) must be >= min_num_arcs ({lo})")


def random_fsa(acyclic: bool = True, max_symbol: int = 50, min_num_arcs: int = 0, max_num_arcs: int = 1000,
               seed: Seed = None) -> Fsa:
    """A random single Fsa (numpy), see the module docstring; labels in [-1, max_symbol], scores in [0, 10)."""
    _check_random_args(max_symbol, min_num_arcs, max_num_arcs)
    return _random_one(_rng(seed), bool(acyclic), int(max_symbol), int(min_num_arcs), int(max_num_arcs))


def random_fsa_vec(min_num_fsas: int = 1, max_num_fsas: int = 1000, acyclic: bool = True, max_symbol: int = 50,
                   min_num_arcs: int = 0, max_num_arcs: int = 1000, seed: Seed = None) -> Fsa:
    """A batch of a uniform number in [min_num_fsas, max_num_fsas] of `random_fsa`s (padded, numpy)."""
    lo = _int_arg(min_num_fsas, "min_num_fsas", 0)
    hi = _int_arg(max_num_fsas, "max_num_fsas", 0)
    if hi < lo:
        raise ValueError(f"max_num_fsas ({hi}) must be >= min_num_fsas ({lo})")
    _check_random_args(max_symbol, min_num_arcs, max_num_arcs)
    rng = _rng(seed)
    n = int(rng.integers(lo, hi + 1))
    return create_fsa_vec([_random_one(rng, bool(acyclic), int(max_symbol), int(min_num_arcs), int(max_num_arcs))
                           for _ in range(n)])


# ------------------------------------------------------------------ randomized equivalence
class _Scorer:
    """A connected, non-empty single FSA with its states in topological order, scored in float64."""

    def __init__(self, fsa: Fsa, name: str, log_semiring: bool):
        self.ns = int(fsa.num_states)
        self.src = np.asarray(fsa.src, np.int64)
        self.dst = np.asarray(fsa.dst, np.int64)
        self.label = np.asarray(fsa.label, np.int64)
        self.score = np.asarray(fsa.score, np.float64)
        self.splits = csr(self.src, self.ns)
        self.add = np.logaddexp if log_semiring else np.maximum
        self.order = self._topo_order(name)

    def _topo_order(self, name: str) -> np.ndarray:
        indeg = np.bincount(self.dst, minlength=self.ns)
        stack = [s for s in range(self.ns) if indeg[s] == 0]
        order = []
        while stack:
            s = stack.pop()
            order.append(s)
            for d in self.dst[self.splits[s]:self.splits[s + 1]].tolist():
                indeg[d] -= 1
                if indeg[d] == 0:
                    stack.append(d)
        if len(order) != self.ns:
            raise ValueError(f"{name}: is_rand_equivalent needs acyclic FSAs (after connect); this one has a cycle "
                             "(k2 requires top-sorted input)")
        return np.asarray(order, np.int64)

    def total(self) -> float:
        alpha = np.full(self.ns, -np.inf)
        alpha[0] = 0.0
        for s in self.order.tolist():
            lo, hi = self.splits[s], self.splits[s + 1]
            if hi > lo:
                self.add.at(alpha, self.dst[lo:hi], alpha[s] + self.score[lo:hi])
        return float(alpha[self.ns - 1])

    def random_path(self, rng: np.random.Generator) -> List[int]:
        """Labels (without the final -1) of a path that picks a uniformly random leaving arc at each state."""
        s, labels = 0, []
        while s != self.ns - 1:
            lo, hi = self.splits[s], self.splits[s + 1]
            a = int(rng.integers(lo, hi))
            if self.label[a] != -1:
                labels.append(int(self.label[a]))
            s = int(self.dst[a])
        return labels

    def sequence_score(self, seq: np.ndarray, treat_epsilons_specially: bool) -> float:
        """Semiring sum of the scores of the paths whose labels (epsilons dropped when treated specially) are
        `seq` followed by the final -1."""
        n = len(seq)
        alpha = np.full((self.ns, n + 1), -np.inf)
        alpha[0, 0] = 0.0
        cols = np.arange(n + 1)
        for s in self.order.tolist():
            lo, hi = self.splits[s], self.splits[s + 1]
            if hi == lo or not np.any(alpha[s] > -np.inf):
                continue
            lab, dst, sc = self.label[lo:hi], self.dst[lo:hi], self.score[lo:hi]
            rows, cs, vals = [], [], []
            eps = (lab == 0) if treat_epsilons_specially else np.zeros(len(lab), bool)
            if eps.any():   # epsilon: same position
                k = np.nonzero(eps)[0]
                rows.append(np.repeat(dst[k], n + 1))
                cs.append(np.tile(cols, len(k)))
                vals.append((sc[k][:, None] + alpha[s][None, :]).reshape(-1))
            fin = lab == -1
            if fin.any():   # the final arc consumes the end of the sequence
                rows.append(dst[fin])
                cs.append(np.full(int(fin.sum()), n))
                vals.append(sc[fin] + alpha[s, n])
            sym = ~eps & ~fin
            if sym.any() and n:   # a symbol arc consumes seq[p] and moves to position p + 1
                k, p = np.nonzero(lab[sym][:, None] == seq[None, :])
                rows.append(dst[sym][k])
                cs.append(p + 1)
                vals.append(sc[sym][k] + alpha[s, p])
            if rows:
                self.add.at(alpha, (np.concatenate(rows), np.concatenate(cs)), np.concatenate(vals))
        return float(alpha[self.ns - 1, n])


def _close(x: float, y: float, delta: float) -> bool:
    return x <= y + delta and y <= x + delta   # k2's DoubleApproxEqual (equal infinities are close)


def _report_one(a: Fsa, b: Fsa, log_semiring: bool, beam: float, treat_epsilons_specially: bool, delta: float,
                npath: int, rng: np.random.Generator) -> str:
    a, b = connect(a), connect(b)
    empty_a, empty_b = int(a.num_states) == 0, int(b.num_states) == 0
    if empty_a or empty_b:
        return "" if empty_a and empty_b else f"only {'a' if empty_a else 'b'} has no accepting path"
    ga, gb = _Scorer(a, "a", log_semiring), _Scorer(b, "b", log_semiring)
    la, lb = set(np.asarray(a.label).tolist()), set(np.asarray(b.label).tolist())
    diff = la ^ lb
    if len(diff) >= 2 or (len(diff) == 1 and (not treat_epsilons_specially or diff != {0})):
        return f"label sets differ (only in a: {sorted(la - lb)}, only in b: {sorted(lb - la)})"
    tot_a, tot_b = ga.total(), gb.total()
    if not _close(tot_a, tot_b, delta):
        return f"total scores differ: {tot_a!r} (a) vs {tot_b!r} (b)"
    cut_a, cut_b = tot_a - beam, tot_b - beam
    for _ in range(npath):
        g = ga if rng.random() < 0.5 else gb
        labels = g.random_path(rng)
        seq = np.asarray([x for x in labels if x != 0] if treat_epsilons_specially else labels, np.int64)
        cost_a = ga.sequence_score(seq, treat_epsilons_specially)
        cost_b = gb.sequence_score(seq, treat_epsilons_specially)
        if cost_a < cut_a and cost_b < cut_b:
            continue
        if not _close(cost_a, cost_b, delta):
            return f"label sequence {seq.tolist()}: score {cost_a!r} in a, {cost_b!r} in b"
    return ""


def rand_equivalence_report(a: Fsa, b: Fsa, log_semiring: bool, beam: float = math.inf,
                            treat_epsilons_specially: bool = True, delta: float = 1e-6, npath: int = 100,
                            seed: Seed = None) -> str:
    """`is_rand_equivalent`'s check, returning '' when `a` and `b` look equivalent and otherwise a sentence saying
    what differs (for test messages: ``assert not (msg := rand_equivalence_report(a, b, True)), msg``)."""
    a, b = as_numpy(a, "a"), as_numpy(b, "b")
    if not beam > 0:
        raise ValueError(f"beam must be > 0, got {beam}")
    if not delta >= 0:
        raise ValueError(f"delta must be >= 0, got {delta}")
    npath = _int_arg(npath, "npath", 0)
    rng = _rng(seed)
    if a.is_batch != b.is_batch:
        raise ValueError("a and b must both be single FSAs or both batches (FsaVec)")
    if not a.is_batch:
        return _report_one(a, b, bool(log_semiring), float(beam), bool(treat_epsilons_specially), float(delta),
                           npath, rng)
    if len(a) != len(b):
        raise ValueError(f"a has {len(a)} FSAs, b has {len(b)}")
    for i in range(len(a)):
        msg = _report_one(a[i], b[i], bool(log_semiring), float(beam), bool(treat_epsilons_specially),
                          float(delta), npath, rng)
        if msg:
            return f"FSA {i}: {msg}"
    return ""


def is_rand_equivalent(a: Fsa, b: Fsa, log_semiring: bool, beam: float = math.inf,
                       treat_epsilons_specially: bool = True, delta: float = 1e-6, npath: int = 100,
                       seed: Optional[Seed] = None) -> bool:
    """Whether `a` and `b` (single FSAs or batches of the same size) appear equivalent: k2's randomized check
    of total scores and of `npath` random paths' label sequences (see the module docstring). Tropical
    (`log_semiring=False`: max over paths) or log semiring (log-sum)."""
    return not rand_equivalence_report(a, b, log_semiring, beam, treat_epsilons_specially, delta, npath, seed)
