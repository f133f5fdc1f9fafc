"""Benchmark every applicable kernel template beside run_graph's answer: `sparseditto bench --templates all`.

This script is kept as a thin wrapper for the GPU machine (the logic lives in `sparseditto.benchmark`):
    python benchmarks/templates.py --suite llm --out $OUT/templates            # core preset
    python benchmarks/templates.py --suite llm dlmc --grid 3 --budget-s 500 --out $OUT/t --resume
Every argument is a `sparseditto bench` argument (see `sparseditto bench --help`). Per case it runs
run_graph, times the chosen kernel against dense cuBLAS and every vendor path, and also verifies and
times each applicable template's first `--grid` parameter sets beside dense in the same worker
(the rows' ``templates`` list; "Template sweep" in summary.md and report.html).
"""
from __future__ import annotations

import sys

from sparseditto.cli import main as cli_main


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--templates" not in argv:
        argv += ["--templates", "all"]
    return cli_main(["bench", *argv])


if __name__ == "__main__":
    sys.exit(main())
