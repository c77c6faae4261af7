"""to_dot (graphviz source text, no graphviz package needed) and draw (renders with the `dot` binary)."""
from __future__ import annotations

import os
import shutil
import subprocess
from typing import Optional

import numpy as np

from fsa_ops.fsa import Fsa
from fsa_ops.ragged import is_ragged

__all__ = ["to_dot", "draw"]


def _q(s: str) -> str:
    return '"' + str(s).replace("\\", "\\\\").replace('"', '\\"') + '"'


def _fmt(x: float) -> str:
    s = f"{float(np.float32(x)):.4g}"
    return s


def to_dot(fsa: Fsa, title: Optional[str] = None, symbols=None, aux_symbols=None) -> str:
    """Graphviz DOT text for one FSA, in k2's style: left-to-right, state 0 bold, the final state a double
    circle, arcs labelled `label/score` or `label:aux_label/score` (0 shown as <eps>, -1 as -1; a Ragged
    aux_labels row shows its labels separated by spaces).
    `symbols` / `aux_symbols`: optional dict id -> name for the labels / aux_labels."""
    if fsa.is_batch:
        raise ValueError("to_dot: expects a single Fsa; index the batch first")
    ns = int(fsa.num_states)
    src, dst, lab, sc = (np.asarray(x) for x in (fsa.src, fsa.dst, fsa.label, fsa.score))
    aux = fsa.attrs.get("aux_labels")
    aux = aux.tolist() if is_ragged(aux) else (None if aux is None else np.asarray(aux))

    def name(x, table):
        x = int(x)
        if x == 0:
            return "<eps>"
        if table is not None and x in table:
            return str(table[x])
        return str(x)

    lines = ["digraph FSA {", '  rankdir = LR; size = "8.5,11"; center = 1; ranksep = "0.4"; nodesep = "0.25";']
    if title:
        lines.append(f"  label = {_q(title)}; labelloc = t;")
    for s in range(ns):
        shape = "doublecircle" if s == ns - 1 else "circle"
        style = ', style = bold' if s == 0 else ''
        lines.append(f"  {s} [label = {_q(s)}, shape = {shape}{style}, fontsize = 14];")
    for i in range(len(lab)):
        if isinstance(aux, np.ndarray) and aux.ndim == 1:
            text = f"{name(lab[i], symbols)}:{name(aux[i], aux_symbols)}/{_fmt(sc[i])}"
        elif aux is not None:   # a Ragged row (or a 0-padded 2-D row): its labels, <eps> if none
            outs = " ".join(name(a, aux_symbols) for a in aux[i] if a != 0) or "<eps>"
            text = f"{name(lab[i], symbols)}:{outs}/{_fmt(sc[i])}"
        else:
            text = f"{name(lab[i], symbols)}/{_fmt(sc[i])}"
        lines.append(f"  {int(src[i])} -> {int(dst[i])} [label = {_q(text)}];")
    lines.append("}")
    return "\n".join(lines) + "\n"


def draw(fsa: Fsa, filename: str, title: Optional[str] = None, **kw) -> str:
    """Render `fsa` to `filename` (format from its suffix: .svg, .png, .pdf, ...) with graphviz's `dot`
    binary; returns the DOT text. Raises RuntimeError if `dot` is not on PATH."""
    ext = os.path.splitext(filename)[1]
    if not ext or ext == ".":
        raise ValueError(f"filename needs a suffix like .svg, .png or .pdf: {filename!r}")
    src = to_dot(fsa, title=title, **kw)
    exe = shutil.which("dot")
    if exe is None:
        raise RuntimeError("draw: graphviz's `dot` program is not on PATH (install graphviz, e.g. "
                           "`apt-get install graphviz`); to_dot(fsa) gives the DOT text without it")
    res = subprocess.run([exe, f"-T{ext[1:]}", "-o", filename], input=src.encode(), capture_output=True)
    if res.returncode != 0:
        raise RuntimeError(f"draw: dot failed: {res.stderr.decode(errors='replace').strip()}")
    return src
