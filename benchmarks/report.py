"""Rewrite summary.md, summary.json and report.html of a `sparseditto bench` output folder.

    python benchmarks/report.py OUT_DIR          # = sparseditto bench --report-only --out OUT_DIR
Use it where matplotlib is installed (the GPU machine may lack it: its report.html then has no plots)
or after copying results.jsonl from several runs into one folder. The logic lives in
`sparseditto.benchmark` (metrics, tables, plots, report_md, report_html).
"""
from __future__ import annotations

import sys

from sparseditto.cli import main as cli_main


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) != 1 or argv[0].startswith("-"):
        print("usage: python benchmarks/report.py OUT_DIR", file=sys.stderr)
        return 2
    return cli_main(["bench", "--report-only", "--out", argv[0]])


if __name__ == "__main__":
    sys.exit(main())
