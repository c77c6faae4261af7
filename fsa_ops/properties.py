"""k2's FSA property bits: get_properties, properties_to_str and is_* helpers (host-side)."""
from __future__ import annotations

import numpy as np

from fsa_ops.connect import accessible_states, coaccessible_states
from fsa_ops.fsa import Fsa, check_fsa

__all__ = ["VALID", "NONEMPTY", "TOPSORTED", "TOPSORTED_AND_ACYCLIC", "ARC_SORTED",
           "ARC_SORTED_AND_DETERMINISTIC", "EPSILON_FREE", "ACCESSIBLE", "COACCESSIBLE", "ALL",
           "get_properties", "properties_to_str", "is_valid", "is_top_sorted", "is_arc_sorted",
           "is_epsilon_free", "is_connected", "is_deterministic", "is_acyclic"]

VALID = 0x01
NONEMPTY = 0x02
TOPSORTED = 0x04
TOPSORTED_AND_ACYCLIC = 0x08
ARC_SORTED = 0x10
ARC_SORTED_AND_DETERMINISTIC = 0x20
EPSILON_FREE = 0x40
ACCESSIBLE = 0x80
COACCESSIBLE = 0x100
ALL = 0x1FF

_NAMES = [(VALID, "Valid"), (NONEMPTY, "Nonempty"), (TOPSORTED, "TopSorted"),
          (TOPSORTED_AND_ACYCLIC, "TopSortedAndAcyclic"), (ARC_SORTED, "ArcSorted"),
          (ARC_SORTED_AND_DETERMINISTIC, "ArcSortedAndDeterministic"), (EPSILON_FREE, "EpsilonFree"),
          (ACCESSIBLE, "MaybeAccessible"), (COACCESSIBLE, "MaybeCoaccessible")]


def _one(fsa: Fsa) -> int:
    src, dst, lab = (np.asarray(x).astype(np.int64) for x in (fsa.src, fsa.dst, fsa.label))
    ns = int(fsa.num_states)
    p = 0
    try:
        check_fsa(fsa)
        p |= VALID
    except ValueError:
        return 0
    if len(src):
        p |= NONEMPTY
    if np.all(dst >= src):
        p |= TOPSORTED
    if np.all(dst > src):
        p |= TOPSORTED_AND_ACYCLIC
    ulab = lab & 0xFFFFFFFF  # k2 compares labels as unsigned (-1 last)
    same = src[1:] == src[:-1]
    if not np.any(same & (ulab[1:] < ulab[:-1])):
        p |= ARC_SORTED
        if not np.any(same & (ulab[1:] == ulab[:-1])):
            p |= ARC_SORTED_AND_DETERMINISTIC
    if not np.any(lab == 0):
        p |= EPSILON_FREE
    if ns == 0 or accessible_states(fsa).all():
        p |= ACCESSIBLE
    if ns == 0 or coaccessible_states(fsa).all():
        p |= COACCESSIBLE
    return p


def get_properties(fsa: Fsa) -> int:
    """Property bits of one FSA; for a batch, the AND over its FSAs (k2's FsaVec properties).

    Nonempty: has at least one arc. MaybeAccessible/MaybeCoaccessible are computed exactly here (every state
    reachable from the start / reaching the final state). ArcSorted compares labels as unsigned, as k2."""
    if fsa.is_batch:
        p = ALL
        for f in fsa:
            p &= _one(f)
        return p
    return _one(fsa)


def properties_to_str(p: int) -> str:
    """e.g. 'Valid|Nonempty|TopSorted|...' (k2's FsaPropertiesAsString names)."""
    return "|".join(name for bit, name in _NAMES if p & bit)


def is_valid(fsa: Fsa) -> bool:
    return bool(get_properties(fsa) & VALID)


def is_top_sorted(fsa: Fsa) -> bool:
    return bool(get_properties(fsa) & TOPSORTED)


def _acyclic_one(f: Fsa) -> bool:
    src, dst = np.asarray(f.src).astype(np.int64), np.asarray(f.dst).astype(np.int64)
    ns = int(f.num_states)
    if np.any(src == dst):
        return False
    order = np.argsort(src, kind="stable")
    src, dst = src[order], dst[order]
    splits = np.searchsorted(src, np.arange(ns + 1))
    indeg = np.bincount(dst, minlength=ns)
    batch = np.nonzero(indeg == 0)[0]
    seen = 0
    while len(batch):  # Kahn's algorithm, one level per step
        seen += len(batch)
        lens = splits[batch + 1] - splits[batch]
        if lens.sum() == 0:
            break
        idx = np.repeat(splits[batch] - np.cumsum(lens) + lens, lens) + np.arange(lens.sum())
        touched, dec = np.unique(dst[idx], return_counts=True)
        indeg[touched] -= dec
        batch = touched[indeg[touched] == 0]
    return seen == ns


def is_acyclic(fsa: Fsa) -> bool:
    """True if the FSA (every FSA of a batch) has no cycles; self-loops count as cycles."""
    return all(_acyclic_one(f) for f in (fsa if fsa.is_batch else [fsa]))


def is_arc_sorted(fsa: Fsa) -> bool:
    return bool(get_properties(fsa) & ARC_SORTED)


def is_epsilon_free(fsa: Fsa) -> bool:
    return bool(get_properties(fsa) & EPSILON_FREE)


def is_connected(fsa: Fsa) -> bool:
    return (get_properties(fsa) & (ACCESSIBLE | COACCESSIBLE)) == (ACCESSIBLE | COACCESSIBLE)


def is_deterministic(fsa: Fsa) -> bool:
    """No state has two leaving arcs with the same label (regardless of arc order)."""
    fs = list(fsa) if fsa.is_batch else [fsa]
    for f in fs:
        key = np.asarray(f.src).astype(np.int64) * (1 << 33) + (np.asarray(f.label).astype(np.int64) + 1)
        if len(np.unique(key)) != len(key):
            return False
    return True
