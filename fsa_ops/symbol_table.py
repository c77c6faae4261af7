"""`SymbolTable`: a two-way map between integer ids (the labels on arcs) and symbols, as k2's SymbolTable.

Id 0 is the epsilon symbol (`eps`, '<eps>' unless the text gives id 0 another name). Text format (icefall's
words.txt / tokens.txt, OpenFst's symbol tables): UTF-8, one ``symbol id`` per line, the two fields separated by
blanks (spaces, tabs); blank lines are skipped. Symbols may be any non-empty text without whitespace; ids are
non-negative ASCII integers. Lookups (`get`, ``table[k]``) take an id (any integer type, e.g. a numpy label)
and give its symbol, or take a symbol and give its id; a missing key raises KeyError. Malformed text,
duplicate symbols or ids, and conflicting tables raise ValueError (k2 asserts).
"""
from __future__ import annotations

import numbers
import re
from dataclasses import dataclass, field
from typing import Dict, Generic, List, Optional, TypeVar, Union

__all__ = ["SymbolTable"]

Symbol = TypeVar("Symbol")

_ID = re.compile(r"[0-9]+", re.ASCII)


def _is_id(k) -> bool:
    return isinstance(k, numbers.Integral) and not isinstance(k, bool)


@dataclass(repr=False)
class SymbolTable(Generic[Symbol]):
    """Ids <-> symbols, with `eps` at id 0 (see the module docstring). Build with `from_str` / `from_file`, or
    empty (``SymbolTable()``) and `add` symbols."""

    _id2sym: Dict[int, Symbol] = field(default_factory=dict)
    _sym2id: Dict[Symbol, int] = field(default_factory=dict)
    _next_available_id: int = 1
    eps: Symbol = "<eps>"

    def __post_init__(self):
        for idx, sym in self._id2sym.items():
            if not _is_id(idx) or idx < 0:
                raise ValueError(f"_id2sym: ids must be non-negative integers, got {idx!r}")
            if sym not in self._sym2id or self._sym2id[sym] != idx:
                raise ValueError(f"_id2sym / _sym2id disagree on id {idx} ({sym!r})")
        if len(self._sym2id) != len(self._id2sym):
            raise ValueError(f"_sym2id has {len(self._sym2id)} entries, _id2sym {len(self._id2sym)}")
        self._id2sym = {int(i): s for i, s in self._id2sym.items()}
        self._sym2id = {s: int(i) for s, i in self._sym2id.items()}
        if 0 not in self._id2sym:
            if self.eps in self._sym2id:
                raise ValueError(f"the epsilon symbol {self.eps!r} has id {self._sym2id[self.eps]}; it must be 0")
            self._id2sym[0] = self.eps
            self._sym2id[self.eps] = 0
        elif self._id2sym[0] != self.eps:
            raise ValueError(f"id 0 is {self._id2sym[0]!r}, but eps is {self.eps!r}")
        self._next_available_id = max(self._id2sym) + 1

    # ---- text ----
    @staticmethod
    def from_str(s: str) -> "SymbolTable":
        """Parse ``symbol id`` lines (see the module docstring); eps is the symbol of id 0 if there is one."""
        if not isinstance(s, str):
            raise TypeError(f"SymbolTable.from_str: expected str, got {type(s).__name__}")
        id2sym: Dict[int, str] = {}
        sym2id: Dict[str, int] = {}
        for n, line in enumerate(s.split("\n"), 1):
            fields = line.split()
            if not fields:
                continue
            if len(fields) != 2:
                raise ValueError(f"line {n}: expected 2 fields (symbol id), got {len(fields)}: {line.strip()!r}")
            sym, idx = fields
            if not _ID.fullmatch(idx):
                raise ValueError(f"line {n}: the id {idx!r} is not a non-negative integer")
            idx = int(idx)
            if sym in sym2id:
                raise ValueError(f"line {n}: duplicate symbol {sym!r} (ids {sym2id[sym]} and {idx})")
            if idx in id2sym:
                raise ValueError(f"line {n}: duplicate id {idx} ({id2sym[idx]!r} and {sym!r})")
            id2sym[idx] = sym
            sym2id[sym] = idx
        return SymbolTable(_id2sym=id2sym, _sym2id=sym2id, eps=id2sym.get(0, "<eps>"))

    @staticmethod
    def from_file(filename: str) -> "SymbolTable":
        """Read a UTF-8 symbol table file (e.g. icefall's words.txt; a byte-order mark is skipped)."""
        with open(filename, encoding="utf-8-sig") as f:
            return SymbolTable.from_str(f.read())

    def to_str(self) -> str:
        """``symbol id`` lines in id order, which `from_str` reads back into an equal table. Symbols must be
        non-empty strings without whitespace (ValueError otherwise)."""
        lines = []
        for idx, sym in sorted(self._id2sym.items()):
            if not isinstance(sym, str) or not sym or len(sym.split()) != 1 or sym.split()[0] != sym:
                raise ValueError(f"symbol {sym!r} (id {idx}) cannot be written: symbols must be non-empty strings "
                                 "without whitespace")
            lines.append(f"{sym} {idx}\n")
        return "".join(lines)

    def to_file(self, filename: str):
        """Write `to_str()` to `filename` (UTF-8)."""
        text = self.to_str()
        with open(filename, "w", encoding="utf-8") as f:
            f.write(text)

    # ---- edits ----
    def add(self, symbol: Symbol, index: Optional[int] = None) -> int:
        """Add `symbol` (with id `index`, or the next id above the largest) and return its id; a symbol already
        present returns its id unchanged. ValueError if `index` is taken by another symbol or negative."""
        if symbol in self._sym2id:
            return self._sym2id[symbol]
        if index is None:
            index = self._next_available_id
        if not _is_id(index) or index < 0:
            raise ValueError(f"index must be a non-negative integer, got {index!r}")
        index = int(index)
        if index in self._id2sym:
            raise ValueError(f"cannot give id {index} to {symbol!r}: it is taken by {self._id2sym[index]!r}")
        self._sym2id[symbol] = index
        self._id2sym[index] = symbol
        self._next_available_id = max(self._next_available_id, index + 1)
        return index

    def merge(self, other: "SymbolTable") -> "SymbolTable":
        """A new table with the entries of both; ValueError if the eps symbols differ or an id or a symbol
        maps differently in the two."""
        if not isinstance(other, SymbolTable):
            raise TypeError(f"other: expected a SymbolTable, got {type(other).__name__}")
        if self.eps != other.eps:
            raise ValueError(f"the epsilon symbols differ: {self.eps!r} vs {other.eps!r}")
        for idx in sorted(set(self._id2sym) & set(other._id2sym)):
            if self._id2sym[idx] != other._id2sym[idx]:
                raise ValueError(f"id {idx} is {self._id2sym[idx]!r} in self, {other._id2sym[idx]!r} in other")
        for sym in set(self._sym2id) & set(other._sym2id):
            if self._sym2id[sym] != other._sym2id[sym]:
                raise ValueError(f"symbol {sym!r} has id {self._sym2id[sym]} in self, {other._sym2id[sym]} in "
                                 "other")
        return SymbolTable(_id2sym={**self._id2sym, **other._id2sym}, _sym2id={**self._sym2id, **other._sym2id},
                           eps=self.eps)

    # ---- lookups ----
    def get(self, k: Union[int, Symbol]) -> Union[Symbol, int]:
        """The symbol of id `k` (an integer), or the id of symbol `k`; KeyError if absent."""
        if _is_id(k):
            return self._id2sym[int(k)]
        return self._sym2id[k]

    def __getitem__(self, k: Union[int, Symbol]) -> Union[Symbol, int]:
        return self.get(k)

    def __contains__(self, k) -> bool:
        if _is_id(k):
            return int(k) in self._id2sym
        try:
            return k in self._sym2id
        except TypeError:   # unhashable
            return False

    def __len__(self) -> int:
        return len(self._id2sym)

    def __eq__(self, other) -> bool:
        if not isinstance(other, SymbolTable):
            return NotImplemented
        return self._sym2id == other._sym2id

    __hash__ = None

    def __repr__(self) -> str:
        return f"SymbolTable({len(self)} symbols, eps={self.eps!r})"

    @property
    def ids(self) -> List[int]:
        """All ids, ascending."""
        return sorted(self._id2sym)

    @property
    def symbols(self) -> List[Symbol]:
        """All symbols, sorted (as k2: by the symbols themselves, not by id)."""
        return sorted(self._sym2id)
