"""Run the agent graph (expert policy) on every case twice: first run, then again with the memory.

    python benchmarks/graph_runs.py --suite dlmc llm --out $OUT/graph_runs --budget-s 500
A thin wrapper over `sparseditto bench --memory-check <every case>`: each row records run_graph's
wall time for the first run (``run_graph_s``) and the repeat with the memory the first one filled
(``run_graph_memory_s``, ``memory_repeat``: exact hit, candidates tried, what it chose), beside the
chosen kernel's speedups over dense and the best vendor path measured in the same run. Every other
argument is a `sparseditto bench` argument.
"""
from __future__ import annotations

import sys

from sparseditto.cli import main as cli_main

EVERY_CASE = "1000000"


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--memory-check" not in argv:
        argv += ["--memory-check", EVERY_CASE]
    return cli_main(["bench", *argv])


if __name__ == "__main__":
    sys.exit(main())
