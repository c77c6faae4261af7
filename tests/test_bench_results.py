"""bench/RESULTS.md is the assembly of bench/results/*.md (rebuilt by every benchmark run)."""
import importlib.util
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_results_md_is_up_to_date_with_the_reports():
    spec = importlib.util.spec_from_file_location("collect_results", os.path.join(ROOT, "bench", "collect_results.py"))
    collect = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(collect)
    with open(collect.RESULTS_MD) as f:
        current = f.read()
    assert current == collect.build(), "bench/RESULTS.md is stale: run `python bench/collect_results.py`"
    for name, _, _ in collect.SECTIONS:   # every section has a measured report
        assert os.path.exists(os.path.join(collect.RESULTS_DIR, name)), name
    assert "results/ctc.png" in current and os.path.exists(os.path.join(collect.RESULTS_DIR, "ctc.png"))
