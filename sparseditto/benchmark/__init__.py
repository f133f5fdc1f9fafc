"""`sparseditto bench`: is the kernel `run_graph` chooses faster than what a user would use instead?

For every case of a suite (LLM layer weights, DLMC, graphs, or the user's own files) it runs
`run_graph` and then times the chosen kernel, dense cuBLAS and every applicable vendor path in one
process with one method, re-checks them all, and reports geomeans, fast_p, % of roofline and the
run_graph wall times (``results.jsonl``, ``summary.md``, ``report.html``). Modules, one job each:
``cases`` (what a case is), ``suites`` (which cases), ``environment`` (the machine), ``measure``
(one case), ``metrics`` (the numbers), ``tables`` / ``report_md`` / ``plots`` / ``report_html``
(the reports), ``runner`` (the run: resume, budget, progress).
"""
from .rows import BenchReport, BenchRow, SuiteSummary
from .runner import bench, plan, report
from .suites import PRESETS, SUITES

__all__ = ["PRESETS", "SUITES", "BenchReport", "BenchRow", "SuiteSummary", "bench", "plan", "report"]
