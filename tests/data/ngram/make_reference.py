"""Regenerates the KenLM reference numbers in this folder (tests/test_ngram.py reads them; it does not need kenlm).

Made with KenLM 0.3.0 (the pip sdist kenlm-0.3.0.tar.gz): its Python module in a separate venv, and its lmplz
built from the same sources (cmake + make lmplz; needs the boost program_options/system/thread headers):

    python3 -m venv /tmp/kenlm-venv && /tmp/kenlm-venv/bin/pip install wheel setuptools
    /tmp/kenlm-venv/bin/pip install --no-build-isolation kenlm-0.3.0.tar.gz
    (cd kenlm-0.3.0 && mkdir build && cd build && cmake .. -DCMAKE_BUILD_TYPE=Release && make lmplz)
    cd tests/data/ngram
    LMPLZ=/path/to/kenlm-0.3.0/build/bin/lmplz
    $LMPLZ -o 2 -S 10% -T /tmp < corpus.txt > lmplz_o2.arpa
    $LMPLZ -o 3 -S 10% -T /tmp < corpus.txt > lmplz_o3.arpa
    $LMPLZ -o 4 -S 10% -T /tmp < corpus.txt > lmplz_o4.arpa
    $LMPLZ -o 3 -S 10% -T /tmp --discount_fallback < tiny.txt > lmplz_tiny_o3.arpa
    /tmp/kenlm-venv/bin/python make_reference.py     # writes kenlm_scores.json

kenlm_scores.json: {arpa file: [{"sentence", "full" (log10 per word, with <s> and </s>, as
kenlm.Model.full_scores), "plain" (total log10 with bos=False, eos=False)}]}.
"""
import json
import os

import kenlm

HERE = os.path.dirname(os.path.abspath(__file__))
SENTENCES = {
    "handmade_nounk.arpa": ["a b c d a b", "", "a", "b", "a b c", "c d", "d d d", "x a b y", "b a b a b c d </s>",
                            "<s> a b", "c d a b c d a b c"],
    "lmplz_o2.arpa": None, "lmplz_o3.arpa": None, "lmplz_o4.arpa": None,
    "lmplz_tiny_o3.arpa": ["a b c", "", "c c c c", "b a d a b", "a b c a b", "c b a </s> a"],
}
CORPUS_LIKE = ["one zero one five", "", "oh", "zero zero zero zero", "nine eight seven six five four three two one",
               "one two three", "four zero", "five unknownword six", "oh six three three zero", "seven seven",
               "two five nine oh one", "three four five six seven eight nine oh zero one"]


def main():
    out = {}
    for name, sentences in SENTENCES.items():
        model = kenlm.Model(os.path.join(HERE, name))
        rows = []
        for s in sentences or CORPUS_LIKE:
            rows.append({"sentence": s, "full": [p for p, _, _ in model.full_scores(s, bos=True, eos=True)],
                         "plain": model.score(s, bos=False, eos=False)})
        out[name] = rows
    with open(os.path.join(HERE, "kenlm_scores.json"), "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
