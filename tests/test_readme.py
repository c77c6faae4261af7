"""The README's Python examples run as written: every ```python block, in order, in one namespace.

A README whose examples do not run is a README that lies; the blocks are small (tiny shapes) so that this stays a
few seconds. Blocks that need files the tests do not have (a Hugging Face checkpoint directory) are marked with
a first line ``# needs: ...`` and are only compiled, not executed.
"""
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def _blocks():
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        return BLOCK.findall(f.read())


def test_readme_starts_with_the_two_commands():
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        text = f.read()
    first = re.search(r"^```bash\n(.*?)^```", text, re.S | re.M)
    assert first is not None and text.index(first.group(0)) < text.index("\n## "), "a bash block comes first"
    commands = [line.split("#")[0].strip() for line in first.group(1).splitlines() if line.strip()]
    assert commands == ["./run.sh demo", "./run.sh test"]
    with open(os.path.join(ROOT, ".ci", "run"), encoding="utf-8") as f:
        assert "./run.sh test" in f.read(), ".ci/run calls the README's test command"


def test_readme_python_examples_run(monkeypatch):
    blocks = _blocks()
    assert len(blocks) >= 3
    monkeypatch.chdir(ROOT)
    namespace = {"__name__": "readme"}
    for i, src in enumerate(blocks):
        code = compile(src, f"README.md python block {i}", "exec")
        if src.lstrip().startswith("# needs:"):
            continue
        exec(code, namespace)
