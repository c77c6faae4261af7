"""The layers' import rules, read from the source with ast (nothing is imported):

* imports point down: CLI (train.py, decode.py) -> jasr -> models -> fsa_ops; fsa_ops imports only jax, numpy,
  scipy and the standard library;
* no module-level import circle among the project's modules;
* no private name (or private module) imported from another module;
* imports sit at the top of a module, except the deliberately lazy ones listed in LAZY_IMPORTS.
"""
import ast
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LAYERS = {"fsa_ops": 0, "models": 1, "jasr": 2, "train": 3, "decode": 3}
FSA_OPS_THIRD_PARTY = {"jax", "jaxlib", "numpy", "scipy"}

# (importing module, imported top-level package) pairs allowed inside functions, and why
LAZY_IMPORTS = {
    ("train", "*"): "the CLI imports jasr after parsing arguments, so that --help answers at once",
    ("decode", "*"): "the CLI imports jasr after parsing arguments, so that --help answers at once",
    ("jasr.demo_data", "espeakng_loader"): "optional (the demo extra), GPL-3.0: loaded only to synthesise speech",
    ("models.hf_io", "torch"): "optional: only to read legacy pickled PyTorch checkpoints",
    ("fsa_ops.fsa", "fsa_ops"): "Fsa's k2-style methods (fsa.invert(), fsa.to_dot(), ...) call op modules that "
                                "themselves build on fsa.py",
}


def _modules():
    """Module name -> source path, for every project module."""
    out = {"train": os.path.join(ROOT, "train.py"), "decode": os.path.join(ROOT, "decode.py")}
    for pkg in ("fsa_ops", "models", "jasr"):
        for dirpath, _, files in os.walk(os.path.join(ROOT, pkg)):
            for f in files:
                if f.endswith(".py"):
                    rel = os.path.relpath(os.path.join(dirpath, f), ROOT)[:-3].replace(os.sep, ".")
                    out[rel[:-len(".__init__")] if rel.endswith(".__init__") else rel] = os.path.join(dirpath, f)
    return out


MODULES = _modules()


def _imports(name: str):
    """(imported module, imported names, at module level?, line) for every import of module `name`."""
    path = MODULES[name]
    tree = ast.parse(open(path).read(), path)
    package = name if path.endswith("__init__.py") else name.rpartition(".")[0]
    top = set(map(id, tree.body))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                yield a.name, (), id(node) in top, node.lineno
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
            if base == "__future__":
                continue
            yield base, tuple(a.name for a in node.names), id(node) in top, node.lineno


def _target_modules(module: str, names: tuple) -> list[str]:
    """The project modules an import statement loads (submodules named in a from-import count)."""
    subs = [f"{module}.{n}" for n in names if f"{module}.{n}" in MODULES]
    loads_module = module in MODULES and (len(subs) < len(names) or not names)
    return ([module] if loads_module else []) + subs


def test_imports_point_down_and_fsa_ops_needs_only_jax_numpy_scipy():
    bad = []
    for name in MODULES:
        layer = LAYERS[name.split(".")[0]]
        for module, _, _, line in _imports(name):
            top = module.split(".")[0]
            if top in LAYERS and LAYERS[top] > layer:
                bad.append(f"{name}:{line} imports {module} (a higher layer)")
            if (name.startswith("fsa_ops") and top not in LAYERS and top not in FSA_OPS_THIRD_PARTY
                    and top not in sys.stdlib_module_names):
                bad.append(f"{name}:{line} imports {module} (fsa_ops may use only jax, numpy and scipy)")
    assert not bad, "\n".join(bad)


def test_no_private_names_across_modules():
    bad = []
    for name in MODULES:
        for module, names, _, line in _imports(name):
            if module.split(".")[0] not in LAYERS or module == name:
                continue
            if any(p.startswith("_") and not p.startswith("__") for p in module.split(".")):
                bad.append(f"{name}:{line} imports the private module {module}")
            bad += [f"{name}:{line} imports the private name {module}.{n}" for n in names
                    if n.startswith("_") and not n.startswith("__")]
    assert not bad, "\n".join(bad)


def test_imports_at_the_top_unless_deliberately_lazy():
    bad = []
    for name in MODULES:
        for module, _, at_top, line in _imports(name):
            top = module.split(".")[0]
            if not at_top and (name, "*") not in LAZY_IMPORTS and (name, top) not in LAZY_IMPORTS:
                bad.append(f"{name}:{line} imports {module} inside a function")
    assert not bad, "\n".join(bad)


def test_no_import_circles_at_module_level():
    graph = {name: set() for name in MODULES}
    for name in MODULES:
        for module, names, at_top, _ in _imports(name):
            if at_top:
                graph[name].update(m for m in _target_modules(module, names) if m != name)
    state, stack, cycles = {}, [], []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                cycles.append(" -> ".join(stack[stack.index(nxt):] + [nxt]))
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = "done"
    for node in sorted(graph):
        if node not in state:
            visit(node)
    assert not cycles, "\n".join(cycles)


@pytest.mark.parametrize("case", ["up", "private", "circle", "lazy"])
def test_the_checks_catch_violations(case, monkeypatch, tmp_path):
    """Each rule fails on a module written to break it."""
    source = {"up": "import jasr\n", "private": "from fsa_ops.fsa import _hidden\n",
              "circle": "import fsa_ops.probe_b\n", "lazy": "def f():\n    import numpy\n"}[case]
    a, b = tmp_path / "probe_a.py", tmp_path / "probe_b.py"
    a.write_text(source)
    b.write_text("import fsa_ops.probe_a\n")
    monkeypatch.setitem(MODULES, "fsa_ops.probe_a", str(a))
    if case == "circle":
        monkeypatch.setitem(MODULES, "fsa_ops.probe_b", str(b))
    check = {"up": test_imports_point_down_and_fsa_ops_needs_only_jax_numpy_scipy,
             "private": test_no_private_names_across_modules, "circle": test_no_import_circles_at_module_level,
             "lazy": test_imports_at_the_top_unless_deliberately_lazy}[case]
    with pytest.raises(AssertionError, match="probe_a"):
        check()
