"""Text formats of FSAs: k2's (`Fsa.from_str` / `to_str` / `to_str_simple`) and OpenFst's (`openfst=True`).

k2 text: one arc per line, ``src dst label [aux_label ...] [[ragged ...] ...] score``, then the final state alone
on the last line. Ragged labels (per-arc integer lists, `fsa_ops.ragged.Ragged` attributes) are written
``[ 1 2 ]`` (``[ ]`` when empty); the reader also takes ``[1 2]`` and ``[]``. OpenFst text: arcs
``src dst label [aux ...] [[ragged ...] ...] [cost]`` and ``state [cost]`` final-state lines (several allowed);
costs are negated scores; a new final state gets label -1 arcs (aux labels -1, ragged labels empty) from every
OpenFst final state whose cost is not ``Inf``; the state of the first line is the start state (swapped with 0).

The parsers return plain arrays (`parse_text`), so this module does not import `fsa_ops.fsa`; `Fsa.from_str`
builds the Fsa.
"""
from __future__ import annotations

import re
import warnings
from typing import List, Optional

import numpy as np

from fsa_ops.ragged import Ragged, is_ragged

__all__ = ["to_str", "to_str_simple", "parse_text", "text_lines", "fmt_float"]


def fmt_float(x) -> str:
    """Shortest text that reads back as the same float32 (``1`` for 1.0, ``0`` for -0.0)."""
    s = str(np.float32(x))
    if s.endswith(".0"):
        s = s[:-2]
    return "0" if s == "-0" else s


def _is_int_attr(v) -> bool:
    return not is_ragged(v) and np.asarray(v).dtype.kind in "iu" and np.ndim(v) == 1


def to_str(fsa, openfst: bool = False) -> str:
    """k2's `to_str`: every 1-D integer attribute (sorted by name) as an aux-label column, then every ragged
    attribute (sorted by name) as a ``[ ... ]`` list, as `Fsa.from_str(..., aux_label_names=...,
    ragged_label_names=...)` reads back. `openfst=True`: costs (negated scores), final arcs as ``state cost``
    lines. A batch prints its FSAs one after another."""
    def cols(f):
        return ([k for k in sorted(f.attrs) if _is_int_attr(f.attrs[k])],
                [k for k in sorted(f.attrs) if is_ragged(f.attrs[k])])
    return _format(fsa, openfst, cols)


def to_str_simple(fsa, openfst: bool = False) -> str:
    """k2's `to_str_simple`: like `to_str` but the only extra column is a 1-D `aux_labels` (other attributes,
    and a ragged aux_labels, are not printed)."""
    def cols(f):
        return (["aux_labels"] if "aux_labels" in f.attrs and _is_int_attr(f.attrs["aux_labels"]) else []), []
    return _format(fsa, openfst, cols)


def _format(fsa, openfst, cols) -> str:
    if fsa.is_batch:
        return "".join(_format(f, openfst, cols) for f in fsa)
    ns = int(fsa.num_states)
    if ns == 0:
        return ""
    ints, raggeds = cols(fsa)
    label = np.asarray(fsa.label)
    score = np.asarray(fsa.score, np.float32)
    if openfst:
        score = -score
    final = ns - 1
    columns = [list(map(str, np.asarray(x).tolist())) for x in (fsa.src, fsa.dst, fsa.label)]
    columns += [list(map(str, np.asarray(fsa.attrs[k]).tolist())) for k in ints]
    columns += [_ragged_column(fsa.attrs[k]) for k in raggeds]
    columns.append([fmt_float(x) for x in score.tolist()])
    lines = list(map(" ".join, zip(*columns)))
    if openfst:
        for i in np.nonzero((label == -1) & (np.asarray(fsa.dst) == final))[0].tolist():
            lines[i] = f"{columns[0][i]} {columns[-1][i]}"
    else:
        lines.append(str(final))
    return "\n".join(lines) + "\n"


def _ragged_column(r: Ragged) -> List[str]:
    """k2's ``[ 1 2 ]`` / ``[ ]`` text of each row."""
    flat, splits = list(map(str, r.flat_values.tolist())), r.row_splits.tolist()
    return ["[ " + " ".join(flat[a:b]) + " ]" if b > a else "[ ]" for a, b in zip(splits[:-1], splits[1:])]


def parse_text(s, num_aux_labels: int, aux_label_names: List[str], ragged_label_names=(),
               openfst: bool = False) -> dict:
    """Parse k2 / OpenFst text (str or UTF-8 bytes) into ``dict(src, dst, label, score, num_states, attrs)``
    (arcs in text order, not yet sorted; `Fsa.from_arcs(**d)` sorts and validates). ValueError names the line."""
    lines = text_lines(s)
    rnames = list(ragged_label_names)
    if len(set(rnames)) != len(rnames) or set(rnames) & set(aux_label_names):
        raise ValueError(f"ragged_label_names {rnames} has duplicates or repeats an aux label name")
    if not rnames:
        fast = _parse_fast(lines, num_aux_labels, aux_label_names, openfst)
    else:
        fast = None if openfst else _parse_fast_ragged(lines, num_aux_labels, aux_label_names, rnames)
    if fast is not None:
        return fast
    return _parse(lines, num_aux_labels, aux_label_names, openfst, rnames)


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


def text_lines(s) -> List[str]:
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
    if abs(value) > _FLOAT32_MAX and tok.lstrip("+-")[:1] not in "iI":
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


def _parse_fast(lines: List[str], naux: int, names: List[str], openfst: bool) -> Optional[dict]:
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
            start = int(lines[0].split()[0])
            ints[:, :2], fst = _swap_start(ints[:, :2], start), _swap_start(fst, start)
            fst, fsc = fst[fsc != -np.inf], fsc[fsc != -np.inf]     # cost Inf: not final
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
    return dict(src=src.astype(np.int32), dst=dst.astype(np.int32), label=lab.astype(np.int32), score=score,
                num_states=ns, attrs=attrs)


def _parse_fast_ragged(lines: List[str], naux: int, names: List[str], rnames: List[str]) -> Optional[dict]:
    """Vectorised parser of k2 text with ragged labels (over the bytes: brackets, token starts, which list each
    token is in); None (the line parser then reports the problem) on anything unusual."""
    lines = [ln for ln in lines if ln.strip()]
    nrag = len(rnames)
    if len(lines) < 2 or not _INT_RE.fullmatch(lines[-1].strip()):
        return None
    try:
        b = np.frombuffer("\n".join(lines[:-1]).encode("ascii"), np.uint8)
    except UnicodeEncodeError:
        return None
    L = len(lines) - 1
    cls = _BYTE_CLASS[b]
    opening, closing, newline = np.flatnonzero(b == ord("[")), np.flatnonzero(b == ord("]")), np.flatnonzero(cls == 0)
    newline = newline[b[newline] == ord("\n")]
    cls[opening], cls[closing] = 0, 0
    if np.any(cls == 3) or len(opening) != L * nrag or len(closing) != L * nrag:
        return None
    # brackets alternate [ ] [ ] ..., each pair on one line, nrag pairs per line
    o_line, c_line = np.searchsorted(newline, opening), np.searchsorted(newline, closing)
    if (np.any(opening >= closing) or np.any(closing[:-1] >= opening[1:]) or np.any(o_line != c_line)
            or np.any(np.bincount(o_line, minlength=L) != nrag)):
        return None
    tok = cls != 0
    start = tok.copy()
    start[1:] &= ~tok[:-1]
    pos = np.flatnonzero(start)
    del tok, start
    tline = np.searchsorted(newline, pos)
    n_open = np.searchsorted(opening, pos)
    group = n_open - tline * nrag                                       # lists opened before the token
    inside = n_open - np.searchsorted(closing, pos) == 1
    head = ~inside & (group == 0)
    tail = ~inside & (group == nrag)
    if np.any(~inside & ~head & ~tail):
        return None
    if (np.any(np.bincount(tline[head], minlength=L) != 3 + naux)
            or np.any(np.bincount(tline[tail], minlength=L) != 1)):
        return None
    token_of_float_char = np.searchsorted(pos, np.flatnonzero(cls == 2), "right") - 1
    if np.any(~tail[token_of_float_char]):                              # float characters only in scores
        return None
    b = b.copy()
    b[opening], b[closing] = ord(" "), ord(" ")
    text = b.tobytes().decode("ascii")
    try:
        nums = _numbers(text, len(pos))
        ints = _ints(nums[~tail]) if len(pos) else np.zeros(0, np.int64)
        score = _scores(nums[tail])
    except ValueError:
        return None
    is_int = np.nonzero(~tail)[0]
    plain = ints[head[is_int]].reshape(L, 3 + naux)
    ns = int(lines[-1]) + 1
    src, dst, lab = plain[:, 0], plain[:, 1], plain[:, 2]
    final = ns - 1
    if (np.any(np.abs(ints) > _INT32.max) or ns > _INT32.max or np.any((src < 0) | (dst < 0) | (src > final)
                                                                       | (dst > final)) or np.any(src == final)
            or np.any((lab == -1) != (dst == final))):
        return None
    attrs = {nm: plain[:, 3 + j].astype(np.int32) for j, nm in enumerate(names)}
    vals, vline, vgroup = ints[inside[is_int]], tline[inside], group[inside]
    for j, nm in enumerate(rnames):
        sel = vgroup == j + 1
        splits = np.concatenate([[0], np.cumsum(np.bincount(vline[sel], minlength=L))])
        attrs[nm] = Ragged.from_row_splits(splits, vals[sel].astype(np.int32))
    return dict(src=src.astype(np.int32), dst=dst.astype(np.int32), label=lab.astype(np.int32), score=score,
                num_states=ns, attrs=attrs)


def _swap_start(states: np.ndarray, start: int) -> np.ndarray:
    """OpenFst's start state is the first one mentioned: swap its number with 0 (as k2)."""
    if start <= 0:
        return states
    return np.where(states == start, 0, np.where(states == 0, start, states))


def _split_ragged(line: str, head: int, nragged: int):
    """(the plain fields, the `nragged` bracketed integer lists) of an arc line whose lists follow its first
    `head` fields; ValueError if the brackets are not as expected."""
    toks = line.replace("[", " [ ").replace("]", " ] ").split()
    if len(toks) < head or "[" in toks[:head] or "]" in toks[:head]:
        raise ValueError(f"expected {head} plain fields (src dst label aux_labels) before the ragged labels")
    rows, i = [], head
    for r in range(nragged):
        if i >= len(toks) or toks[i] != "[":
            raise ValueError(f"expected '[' opening ragged label {r + 1} of {nragged}")
        j = i + 1
        while j < len(toks) and toks[j] not in ("[", "]"):
            j += 1
        if j >= len(toks) or toks[j] != "]":
            raise ValueError(f"ragged label {r + 1} is not closed by ']'")
        rows.append([_int_field(t) for t in toks[i + 1:j]])
        i = j + 1
    rest = toks[i:]
    if "[" in rest or "]" in rest:
        raise ValueError(f"more bracketed lists than the {nragged} ragged labels")
    return toks[:head] + rest, rows


def _parse(lines: List[str], naux: int, names: List[str], openfst: bool, rnames=()) -> dict:
    """The line-by-line parser (reports the first bad line)."""
    arc_fields = 4 + naux
    nrag = len(rnames)
    srcs, dsts, labs, scs = [], [], [], []
    auxs: List[List[int]] = []
    rags: List[List[List[int]]] = []
    arc_line = []
    finals = []  # (line_no, state, score)
    final_state = None
    final_line = None
    start = None

    def bad(ln, msg, text):
        return ValueError(f"line {ln}: {msg}: {text.strip()!r}")

    for ln, line in enumerate(lines, 1):
        f = line.split()
        if not f:
            continue
        if final_state is not None and not openfst:
            raise bad(ln, f"text after the final-state line (line {final_line})", line)
        try:
            plain = not nrag or ("[" not in line and "]" not in line)
            if openfst and plain and len(f) in (1, 2):
                st = _int_field(f[0])
                start = st if start is None else start
                finals.append((ln, st, -_float_field(f[1]) if len(f) == 2 else 0.0))
                continue
            if not openfst and plain and len(f) == 1:
                final_state, final_line = _int_field(f[0]), ln
                continue
            rows = []
            if nrag:
                f, rows = _split_ragged(line, 3 + naux, nrag)
            ok = len(f) == arc_fields or (openfst and len(f) == arc_fields - 1)
            if not ok:
                want = f"{arc_fields}" + (f" or {arc_fields - 1}" if openfst else "")
                raise bad(ln, f"expected {want} fields (src dst label{' aux_label' * naux}{' [...]' * nrag} "
                              f"{'[cost]' if openfst else 'score'}) or a final-state line, got {len(f)}", line)
            a, d, lab = _int_field(f[0]), _int_field(f[1]), _int_field(f[2])
            au = [_int_field(x) for x in f[3:3 + naux]]
            sc = _float_field(f[3 + naux]) if len(f) == arc_fields else 0.0
        except ValueError as e:
            if str(e).startswith("line "):
                raise
            raise bad(ln, str(e), line) from None
        start = a if start is None else start
        srcs.append(a)
        dsts.append(d)
        labs.append(lab)
        scs.append(-sc if openfst else sc)
        auxs.append(au)
        rags.append(rows)
        arc_line.append(ln)

    if openfst:
        if not srcs and not finals:
            return _empty(names, rnames)
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
        for i in range(len(srcs)):
            if labs[i] == -1:
                raise ValueError(f"line {arc_line[i]}: label -1 is reserved for arcs into the final state "
                                 f"(OpenFst text marks final states with 'state [cost]' lines)")
        for ln, st, sc in finals:
            if sc == -np.inf:   # cost Inf: OpenFst's "not final"
                continue
            srcs.append(st)
            dsts.append(final_state)
            labs.append(-1)
            scs.append(sc)
            auxs.append([-1] * naux)
            rags.append([[] for _ in range(nrag)])
            arc_line.append(ln)
        srcs = _swap_start(np.array(srcs, np.int64), start).tolist()
        dsts = _swap_start(np.array(dsts, np.int64), start).tolist()
    else:
        if final_state is None:
            if not srcs:
                return _empty(names, rnames)
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
    for j, nm in enumerate(rnames):
        attrs[nm] = Ragged.from_lists([r[j] for r in rags])
    return dict(src=np.array(srcs, np.int32), dst=np.array(dsts, np.int32), label=np.array(labs, np.int32),
                score=np.array(scs, np.float32), num_states=final_state + 1, attrs=attrs)


def _empty(names, rnames=()) -> dict:
    z = np.zeros(0, np.int32)
    attrs = {n: z.copy() for n in names}
    attrs.update({n: Ragged(np.zeros((0, 0), np.int32), z.copy()) for n in rnames})
    return dict(src=z, dst=z.copy(), label=z.copy(), score=np.zeros(0, np.float32), num_states=0, attrs=attrs)
