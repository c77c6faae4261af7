"""SymbolTable: k2's symbol_table_test.py, icefall-style files, errors, and a hypothesis round trip with unicode
symbols."""
import os
import tempfile

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fsa_ops.symbol_table import SymbolTable


def test_k2_symbol_table():
    """k2's symbol_table_test.py."""
    symbol_table = SymbolTable.from_str("""
        a 1
        b 2
        """)
    assert symbol_table.get("a") == 1
    assert symbol_table.get(1) == "a"
    assert symbol_table.get("b") == 2
    assert symbol_table.get(2) == "b"
    assert symbol_table.get(0) == "<eps>"
    assert symbol_table.get("<eps>") == 0
    assert symbol_table["a"] == 1
    assert symbol_table[1] == "a"
    assert symbol_table["b"] == 2
    assert symbol_table[2] == "b"
    assert symbol_table[0] == "<eps>"
    assert symbol_table["<eps>"] == 0
    assert 1 in symbol_table
    assert "a" in symbol_table
    assert 2 in symbol_table
    assert "b" in symbol_table
    assert symbol_table.ids == [0, 1, 2]
    assert symbol_table.symbols == ["<eps>", "a", "b"]

    symbol_table.add("c")
    assert symbol_table["c"] == 3
    symbol_table.add("d", 10)
    assert symbol_table["d"] == 10
    symbol_table.add("e")
    assert symbol_table["e"] == 11
    assert symbol_table.ids == [0, 1, 2, 3, 10, 11]
    assert symbol_table.symbols == ["<eps>", "a", "b", "c", "d", "e"]

    sym = SymbolTable.from_str("""
        a 1
        b 2
        h 12
        """)
    merged = symbol_table.merge(sym)
    assert merged.ids == [0, 1, 2, 3, 10, 11, 12]
    assert merged.symbols == ["<eps>", "a", "b", "c", "d", "e", "h"]
    assert merged[12] == "h"
    assert merged["h"] == 12
    assert merged["e"] == 11
    assert merged[11] == "e"

    copied = SymbolTable.from_str(merged.to_str())
    assert merged == copied


def test_icefall_files(tmp_path):
    # icefall's words.txt: <eps> 0, words, #0, <s>, </s>; tokens.txt: <blk> 0, BPE pieces with U+2581
    words = "<eps> 0\n!SIL 1\n<UNK> 2\nÉTÉ 3\n中文 4\n#0 5\n<s> 6\n</s> 7\n"
    p = tmp_path / "words.txt"
    p.write_bytes(words.encode("utf-8"))
    w = SymbolTable.from_file(str(p))
    assert w["中文"] == 4 and w[3] == "ÉTÉ" and w.eps == "<eps>" and len(w) == 8
    assert w.to_str() == words
    tokens = "<blk> 0\n<sos/eos> 1\n<unk> 2\n\u2581THE 3\nS 4\n"
    t = SymbolTable.from_str(tokens)
    assert t.eps == "<blk>" and t[0] == "<blk>" and t["\u2581THE"] == 3
    out = tmp_path / "tokens.txt"
    t.to_file(str(out))
    assert out.read_bytes() == tokens.encode("utf-8")
    assert SymbolTable.from_file(str(out)) == t
    # tabs, CRLF line ends, blank lines and a byte-order mark
    q = tmp_path / "crlf.txt"
    q.write_bytes("\ufeffa\t1\r\n\r\nb  2\r\n".encode("utf-8"))
    assert SymbolTable.from_file(str(q)).ids == [0, 1, 2]


def test_lookups_and_add():
    t = SymbolTable.from_str("a 1\nb 2")
    labels = np.array([0, 2, 1], np.int32)   # arc labels index the table directly
    assert [t[x] for x in labels] == ["<eps>", "b", "a"]
    assert np.int64(2) in t and 5 not in t and "z" not in t and [1] not in t
    with pytest.raises(KeyError):
        t[7]
    with pytest.raises(KeyError):
        t["z"]
    assert t.add("a") == 1 and t.add("a", 9) == 1   # present: its id, unchanged
    with pytest.raises(ValueError, match="id 2 .*taken by 'b'"):
        t.add("x", 2)
    with pytest.raises(ValueError, match="non-negative"):
        t.add("x", -1)
    assert t.add("x") == 3
    e = SymbolTable()
    assert e.ids == [0] and e[0] == "<eps>" and e.add("w") == 1
    assert SymbolTable() != SymbolTable.from_str("a 1") and SymbolTable() == SymbolTable()
    assert SymbolTable() != "<eps> 0"


@pytest.mark.parametrize("text, match", [
    ("a 1\na 2", "line 2: duplicate symbol 'a'"),
    ("a 1\nb 1", "line 2: duplicate id 1"),
    ("a 1 2", "line 1: expected 2 fields"),
    ("a", "line 1: expected 2 fields"),
    ("a x", "line 1: the id 'x' is not"),
    ("a -1", "line 1: the id '-1' is not"),
    ("a 1.0", "is not a non-negative integer"),
    ("a 1\n<eps> 3", "epsilon symbol '<eps>' has id 3"),
])
def test_from_str_errors(text, match):
    with pytest.raises(ValueError, match=match):
        SymbolTable.from_str(text)


def test_merge_errors_and_writing():
    a = SymbolTable.from_str("a 1\nb 2")
    with pytest.raises(ValueError, match="id 2 is 'b' in self, 'c' in other"):
        a.merge(SymbolTable.from_str("c 2"))
    with pytest.raises(ValueError, match="symbol 'b' has id 2 in self, 3 in other"):
        a.merge(SymbolTable.from_str("b 3"))
    with pytest.raises(ValueError, match="epsilon symbols differ"):
        a.merge(SymbolTable.from_str("<blk> 0\nz 5"))
    with pytest.raises(TypeError, match="other"):
        a.merge("a 1")
    with pytest.raises(TypeError, match="str"):
        SymbolTable.from_str(b"a 1")
    a.add("two words")
    with pytest.raises(ValueError, match="'two words'.*without whitespace"):
        a.to_str()
    b = SymbolTable()
    b.add(("a", "tuple"))   # any hashable symbol is allowed in memory, as k2; only strings are written
    with pytest.raises(ValueError, match="cannot be written"):
        b.to_str()


SYMBOL = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=6).filter(
    lambda s: s.split() == [s])


@settings(max_examples=40, deadline=None)
@given(st.dictionaries(SYMBOL, st.integers(1, 10**9), max_size=12), st.sampled_from(["<eps>", "ε", "<blk>"]))
def test_round_trip(entries, eps):
    """to_str -> from_str and to_file -> from_file give an equal table, for unicode symbols."""
    t = SymbolTable(eps=eps)
    for sym, idx in entries.items():
        if sym != eps and idx not in t:
            t.add(sym, idx)
    back = SymbolTable.from_str(t.to_str())
    assert back == t and back.eps == eps and back.ids == t.ids
    for idx in t.ids:
        assert back[idx] == t[idx] and back[t[idx]] == idx
    assert t.merge(back) == t
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "words.txt")
        t.to_file(path)
        assert SymbolTable.from_file(path) == t
