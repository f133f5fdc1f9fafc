"""The `sparseditto` console script.

Each subcommand is a thin shell over a library function, so that everything the CLI does is also
available (and tested) from Python. Heavy modules are imported inside the handlers to keep
`sparseditto --help` fast.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

EXAMPLE_DIR = Path(__file__).resolve().parent / "examples"


def _print_json(obj) -> None:
    print(json.dumps(obj, indent=2, default=str))


def cmd_analyze(args) -> int:
    from sparseditto.analysis import analyze
    from sparseditto.io import load_matrix

    matrix = load_matrix(args.matrix, tensor=args.tensor, seed=args.seed)
    report = analyze(matrix)
    if args.json:
        Path(args.json).write_text(report.model_dump_json(indent=2))
    if args.full:
        print(report.model_dump_json(indent=2))
    else:
        print(report.describe())
    return 0


def cmd_targets(args) -> int:
    from rich.console import Console
    from rich.table import Table

    from sparseditto.targets import list_targets

    table = Table(title="Known GPU targets")
    for col in ("name", "arch", "SMs", "HBM GB/s", "L2 MB", "fp16 TC TFLOP/s", "fp16 2:4 TFLOP/s"):
        table.add_column(col)
    for t in list_targets():
        table.add_row(t.name, t.arch, str(t.sm_count), f"{t.mem_bandwidth_gbs:.0f}", f"{t.l2_mb:.0f}",
                      f"{t.tensor_tflops['float16']:.0f}", f"{t.sparse_tensor_tflops['float16']:.0f}")
    Console().print(table)
    return 0


def cmd_run(args) -> int:
    from sparseditto.api import run_graph

    result = run_graph(
        args.matrix,
        target=args.target,
        n=args.n,
        dtype=args.dtype,
        backend=args.backend,
        llm=args.llm,
        budget=args.budget,
        memory=args.memory,
        tensor=args.tensor,
        progress=not args.quiet,
    )
    if args.json:
        Path(args.json).write_text(result.model_dump_json(indent=2))
    print(result.summary())
    return 0


def cmd_demo(args) -> int:
    """Run the main job on the bundled example with the embedded defaults."""
    example = EXAMPLE_DIR / "pruned_2of4_256x256.mtx.gz"
    args.matrix = str(example)
    args.tensor = None
    return cmd_run(args)


def cmd_memory(args) -> int:
    from sparseditto.memory import Memory

    mem = Memory(args.memory)
    if args.action == "list":
        print(mem.format_runs(limit=args.limit))
    elif args.action == "show":
        if args.id is None:
            raise SystemExit("memory show needs a run id (see `sparseditto memory list`)")
        _print_json(mem.get_run(args.id))
    elif args.action == "export":
        out = Path(args.out) if args.out else None
        count = mem.export(out, fmt=args.format)
        print(f"exported {count} records" + (f" to {out}" if out else ""), file=sys.stderr)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sparseditto", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("analyze", help="print the pattern report of a matrix")
    p.add_argument("matrix", help="path (.mtx, .smtx, .npz, .pt, .safetensors; optionally .gz)")
    p.add_argument("--tensor", help="tensor name inside a .pt/.safetensors file")
    p.add_argument("--seed", type=int, default=0, help="seed for values of pattern-only files")
    p.add_argument("--json", help="also write the full report as JSON to this path")
    p.add_argument("--full", action="store_true", help="print the full report instead of the summary")
    p.set_defaults(func=cmd_analyze)

    p = sub.add_parser("targets", help="list the known GPU targets")
    p.set_defaults(func=cmd_targets)

    def add_run_options(p):
        p.add_argument("--target", default="auto", help="GPU to plan for (A100, H100, H200, ... or auto)")
        p.add_argument("-n", type=int, action="append", help="dense columns N of B (repeatable)")
        p.add_argument("--dtype", default="float16", choices=["float16", "bfloat16", "float32"])
        p.add_argument("--backend", default="auto", choices=["auto", "cuda", "interpret"])
        p.add_argument("--llm", default=None, help="chat model name for the LLM policy (default: expert)")
        p.add_argument("--budget", type=int, default=None, help="max candidates to try")
        p.add_argument("--memory", default=None, help="SQLite memory file (default: user cache dir)")
        p.add_argument("--json", help="write the Result as JSON to this path")
        p.add_argument("--quiet", action="store_true", help="no live progress display")

    p = sub.add_parser("run", help="find the fastest verified kernel for a matrix")
    p.add_argument("matrix")
    p.add_argument("--tensor", help="tensor name inside a .pt/.safetensors file")
    add_run_options(p)
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("demo", help="run on the bundled example with the embedded defaults")
    add_run_options(p)
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("memory", help="inspect the optimization memory")
    p.add_argument("action", choices=["list", "show", "export"])
    p.add_argument("id", nargs="?", help="run id for `show`")
    p.add_argument("--memory", default=None, help="SQLite memory file (default: user cache dir)")
    p.add_argument("--limit", type=int, default=50)
    p.add_argument("--format", default="jsonl", choices=["jsonl", "json"])
    p.add_argument("--out", help="output file for export (default: stdout)")
    p.set_defaults(func=cmd_memory)
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except ValueError as exc:  # bad input: one clear line, no traceback
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
