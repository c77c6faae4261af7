"""decode.py's outputs: result writers (JSONL, plain text, SRT / WebVTT subtitles, CTM) and the per-utterance
error report (Levenshtein alignment of reference and hypothesis words).

A result is a dict as :func:`jasr.transcribe.transcribe` returns it: ``id``, ``ref``, ``hyp``, ``duration``,
``words`` ([{"word", "start", "end"}] in seconds, where the method gives them), or ``error``.
"""
from __future__ import annotations

import json
import os

import numpy as np

from jasr.errors import ConfigError

__all__ = ["FORMATS", "alignment", "ctm_lines", "cues", "error_report", "format_from_path", "subtitles",
           "write_results"]

FORMATS = ("jsonl", "txt", "srt", "vtt", "ctm")


# ------------------------------------------------------------------------------------------------------------
# error report

def alignment(ref: list[str], hyp: list[str]) -> list[tuple[str, str, str]]:
    """Levenshtein alignment of two word lists: [(op, ref word, hyp word)], op one of "=", "S", "D", "I"."""
    n, m = len(ref), len(hyp)
    d = np.zeros((n + 1, m + 1), np.int64)
    d[:, 0], d[0, :] = np.arange(n + 1), np.arange(m + 1)
    for i in range(1, n + 1):
        for j in range(1, m + 1):
            d[i, j] = min(d[i - 1, j] + 1, d[i, j - 1] + 1, d[i - 1, j - 1] + (ref[i - 1] != hyp[j - 1]))
    ops, i, j = [], n, m
    while i or j:
        if i and j and d[i, j] == d[i - 1, j - 1] + (ref[i - 1] != hyp[j - 1]):
            ops.append(("=" if ref[i - 1] == hyp[j - 1] else "S", ref[i - 1], hyp[j - 1]))
            i, j = i - 1, j - 1
        elif i and d[i, j] == d[i - 1, j] + 1:
            ops.append(("D", ref[i - 1], ""))
            i -= 1
        else:
            ops.append(("I", "", hyp[j - 1]))
            j -= 1
    return ops[::-1]


def error_report(results: list[dict], worst: int = 10) -> str:
    """The `worst` utterances by word errors (ties: more reference words first), each with its aligned ref/hyp
    (errors in capitals markers: S substitution, D deletion, I insertion); "" without references."""
    rows = []
    for r in results:
        if not r.get("ref"):
            continue
        ops = alignment(r["ref"].split(), r.get("hyp", "").split())
        errs = sum(op != "=" for op, _, _ in ops)
        if errs:
            rows.append((errs, len(r["ref"].split()), r, ops))
    rows.sort(key=lambda x: (-x[0] / max(x[1], 1), -x[0]))
    lines = []
    for errs, n, r, ops in rows[:worst]:
        width = [max(len(a), len(b), 1) for _, a, b in ops]
        lines.append(f"{r['id']}: {errs} errors / {n} words" + (f" ({r['error']})" if "error" in r else ""))
        lines.append("  REF: " + " ".join((a or "*" * w).ljust(w) for (_, a, _), w in zip(ops, width)))
        lines.append("  HYP: " + " ".join((b or "*" * w).ljust(w) for (_, _, b), w in zip(ops, width)))
        lines.append("       " + " ".join((op if op != "=" else "").ljust(w) for (op, _, _), w in zip(ops, width)))
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------------------
# writers

def format_from_path(path: str) -> str:
    """The output format an extension names (.jsonl/.json, .txt, .srt, .vtt, .ctm); "jsonl" otherwise."""
    ext = os.path.splitext(path)[1].lower().lstrip(".")
    return {"json": "jsonl"}.get(ext, ext) if ext in FORMATS + ("json",) else "jsonl"


def _stamp(t: float, sep: str) -> str:
    ms = int(round(t * 1000))
    return f"{ms // 3600000:02d}:{ms // 60000 % 60:02d}:{ms // 1000 % 60:02d}{sep}{ms % 1000:03d}"


def cues(result: dict, max_words: int = 10, max_seconds: float = 6.0) -> list[tuple[float, float, str]]:
    """Subtitle cues (start, end, text) of one result: its words grouped (at most `max_words` words and
    `max_seconds` per cue) where it has word times, else one cue over the whole file."""
    words = result.get("words")
    if not words:
        return [(0.0, float(result.get("duration", 0.0)), result.get("hyp", ""))] if result.get("hyp") else []
    out, cur = [], []
    for w in words:
        if cur and (len(cur) >= max_words or w["end"] - cur[0]["start"] > max_seconds):
            out.append((cur[0]["start"], cur[-1]["end"], " ".join(x["word"] for x in cur)))
            cur = []
        cur.append(w)
    out.append((cur[0]["start"], cur[-1]["end"], " ".join(x["word"] for x in cur)))
    return out


def subtitles(result: dict, fmt: str) -> str:
    """SRT or WebVTT text of one result."""
    sep = "," if fmt == "srt" else "."
    blocks = [] if fmt == "srt" else ["WEBVTT", ""]
    for i, (s, e, text) in enumerate(cues(result), 1):
        blocks += ([str(i)] if fmt == "srt" else []) + [f"{_stamp(s, sep)} --> {_stamp(e, sep)}", text, ""]
    return "\n".join(blocks)


def ctm_lines(result: dict) -> list[str]:
    """CTM lines (``<id> 1 <start> <duration> <word>``) of a result's word times."""
    return [f"{result['id']} 1 {w['start']:.3f} {max(w['end'] - w['start'], 0.0):.3f} {w['word']}"
            for w in result.get("words", [])]


def write_results(results: list[dict], path: str, fmt: str) -> list[str]:
    """Writes `results` as `fmt`; returns the paths written. jsonl / txt (``id<TAB>hyp``) / ctm: one file;
    srt / vtt: `path` itself for one result whose `path` ends in .srt / .vtt, else one file per result in the
    folder `path` (<id>.srt). CTM needs word times (a CTC model): ConfigError otherwise."""
    if fmt not in FORMATS:
        raise ConfigError(f"--format must be one of {FORMATS}, got {fmt!r}")
    if fmt == "ctm" and any("hyp" in r and r["hyp"] and "words" not in r for r in results):
        raise ConfigError("CTM needs word times, which only CTC models give (use --format jsonl, txt, srt or vtt)")
    if fmt in ("srt", "vtt"):
        single = len(results) == 1 and path.lower().endswith("." + fmt)
        if not single:
            os.makedirs(path, exist_ok=True)
        paths = []
        for r in results:
            p = path if single else os.path.join(path, f"{r['id']}.{fmt}")
            with open(p, "w", encoding="utf-8") as f:
                f.write(subtitles(r, fmt))
            paths.append(p)
        return paths
    with open(path, "w", encoding="utf-8") as f:
        for r in results:
            if fmt == "jsonl":
                f.write(json.dumps(r) + "\n")
            elif fmt == "txt":
                f.write(f"{r['id']}\t{r.get('hyp', '')}\n")
            else:
                f.write("".join(line + "\n" for line in ctm_lines(r)))
    return [path]
