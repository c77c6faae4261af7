"""The peers of bench/decode.py, served from their own virtual environment: pyctcdecode (+ kenlm) and
flashlight-text's LexiconDecoder (+ its KenLM), and kenlm scores of texts.

    /tmp/bench-venv/bin/python bench/decode_peers.py      # started by bench/decode.py; JSON lines on stdin/stdout

Requests (one JSON object per line) and replies:
  {"cmd": "setup", "data": npz with lp [B, T, V] and lengths [B], "arpa": path, "tokens": [token of id 1, ...]
   (id 0 is the blank, " " the word separator), "alpha", "beta", "unk_offset", "beam", "lexicon": [words]}
      -> builds the decoders, decodes one utterance with each (warm-up); {"versions": {...}}
  {"cmd": "pass", "decoder": "pyctcdecode/nolm" | "pyctcdecode/lm" | "flashlight/lm"}
      -> decodes every utterance in turn; {"wall": s, "cpu": s, "texts": [best text per utterance]}
  {"cmd": "kenlm", "texts": [...]} -> {"scores": {text: [ln P(text with <s> </s>), OOV words]}}
  {"cmd": "quit"}

Only numpy, the standard library and the peers are imported: this file never needs jax or jasr.
"""
from __future__ import annotations

import importlib.metadata
import json
import math
import sys
import time

import numpy as np

LN10 = math.log(10.0)


def arpa_vocab(path):
    """The unigram words of an ARPA file."""
    words, section = set(), None
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line.startswith("\\"):
                section = line
                continue
            if section == "\\1-grams:" and line:
                words.add(line.split("\t")[1] if "\t" in line else line.split()[1])
    return words


class Peers:
    def __init__(self, req):
        import kenlm   # the bench venv's packages
        from pyctcdecode import build_ctcdecoder
        data = np.load(req["data"])
        self.lp = np.ascontiguousarray(data["lp"], np.float32)
        self.lengths = data["lengths"]
        self.tokens = req["tokens"]
        self.arpa = req["arpa"]
        self.kenlm = kenlm.Model(self.arpa)
        self.vocab = arpa_vocab(self.arpa) - {"<s>", "</s>", "<unk>"}
        alpha, beta, unk = req["alpha"], req["beta"], req["unk_offset"]
        self.py = {}
        for name, arpa in (("nolm", None), ("lm", self.arpa)):
            self.py[name] = build_ctcdecoder([""] + self.tokens, kenlm_model_path=arpa, alpha=alpha, beta=beta,
                                             unk_score_offset=unk)
        self.py_opts = dict(beam_width=req["beam"], beam_prune_logp=-10.0, token_min_logp=-5.0)
        self.versions = {"pyctcdecode": importlib.metadata.version("pyctcdecode"),
                         "kenlm": importlib.metadata.version("kenlm")}
        self.fl, self.fl_error = None, None
        try:
            self.fl = self._flashlight(req, alpha, beta)
            self.versions["flashlight-text"] = importlib.metadata.version("flashlight-text")
        except Exception as e:   # reported in the results file, verbatim
            self.fl_error = f"{type(e).__name__}: {e}"
        for name in list(self.py) + (["lm"] if self.fl else []):
            self.decode("pyctcdecode/" + name, 0)
        if self.fl:
            self.decode("flashlight/lm", 0)

    def _flashlight(self, req, alpha, beta):
        """LexiconDecoder over the ARPA's words (spelled by the CTC tokens, no trailing separator: a word ends at
        its last token; the separator " " is the silence token between words), KenLM of the same ARPA, trie
        smeared with max (look-ahead), sum over alignments (log_add), no unknown words (unk_score -inf). KenLM
        scores are log10, so lm_weight = alpha * ln 10 puts them on the natural-log scale of the objective."""
        from flashlight.lib.text.decoder import (CriterionType, KenLM, LexiconDecoder, LexiconDecoderOptions,
                                                 SmearingMode, Trie)
        from flashlight.lib.text.dictionary import Dictionary
        words = sorted(set(req["lexicon"]))
        word_dict = Dictionary()
        for w in words + ["<unk>"]:
            word_dict.add_entry(w)
        word_dict.set_default_index(word_dict.get_index("<unk>"))
        lm = KenLM(self.arpa, word_dict)
        sil = self.tokens.index(" ") + 1
        trie = Trie(len(self.tokens) + 1, sil)
        start = lm.start(False)
        for w in words:
            idx = word_dict.get_index(w)
            _, score = lm.score(start, idx)
            trie.insert([self.tokens.index(c) + 1 for c in w], idx, score)
        trie.smear(SmearingMode.MAX)
        opts = LexiconDecoderOptions(beam_size=req["beam"], beam_size_token=len(self.tokens) + 1,
                                     beam_threshold=10.0, lm_weight=alpha * LN10, word_score=beta,
                                     unk_score=-math.inf, sil_score=0.0, log_add=True,
                                     criterion_type=CriterionType.CTC)
        self.fl_words = word_dict
        self._keep = (lm, trie)   # the decoder holds raw pointers to these
        return LexiconDecoder(opts, trie, lm, sil, 0, word_dict.get_index("<unk>"), [], False)

    def decode(self, decoder, b):
        n = int(self.lengths[b])
        if decoder.startswith("pyctcdecode/"):
            beams = self.py[decoder.split("/")[1]].decode_beams(self.lp[b, :n], **self.py_opts)
            return beams[0][0]
        em = np.ascontiguousarray(self.lp[b, :n])
        best = self.fl.decode(em.ctypes.data, n, em.shape[1])[0]
        return " ".join(self.fl_words.get_entry(w) for w in best.words if w >= 0)

    def run_pass(self, decoder):
        wall, cpu = time.perf_counter(), time.process_time()
        texts = [self.decode(decoder, b) for b in range(self.lp.shape[0])]
        return {"wall": time.perf_counter() - wall, "cpu": time.process_time() - cpu, "texts": texts}

    def scores(self, texts):
        return {t: [self.kenlm.score(t, bos=True, eos=True) * LN10, sum(w not in self.vocab for w in t.split())]
                for t in texts}


def main():
    peers = None
    for line in sys.stdin:
        req = json.loads(line)
        if req["cmd"] == "setup":
            peers = Peers(req)
            out = {"versions": peers.versions, "flashlight_error": peers.fl_error}
        elif req["cmd"] == "pass":
            out = peers.run_pass(req["decoder"])
        elif req["cmd"] == "kenlm":
            out = {"scores": peers.scores(req["texts"])}
        else:
            break
        sys.stdout.write(json.dumps(out) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
