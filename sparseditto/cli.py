"""The `sparseditto` console script.

Each subcommand (analyze, targets, run, demo, bench, memory) is a thin shell over a library function, so that everything the CLI does is also
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


def check_output_path(path: str | None, flag: str) -> Path | None:
    """Fail before a long run, not after it: the folder must exist and be writable, and the path
    must not be a directory or a read-only file."""
    import os

    if path is None:
        return None
    if not str(path).strip():
        raise ValueError(f"{flag} needs a file path, got an empty string.")
    target = Path(path).expanduser()
    if target.is_dir():
        raise ValueError(f"{flag} {target} is a directory; give a file path.")
    parent = target.parent
    if not parent.is_dir():
        raise ValueError(f"{flag} {target}: the folder {parent} does not exist.")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ValueError(f"{flag} {target}: the folder {parent} is not writable.")
    if target.exists() and not os.access(target, os.W_OK):
        raise ValueError(f"{flag} {target} exists and is read-only.")
    return target


def check_positive(value, flag: str) -> None:
    values = value if isinstance(value, list) else [value]
    for v in values:
        if v is not None and v < 1:
            raise ValueError(f"{flag} must be a positive integer, got {v}.")


def cmd_analyze(args) -> int:
    from sparseditto.analysis import analyze
    from sparseditto.io import load_matrix

    check_output_path(args.json, "--json")
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

    check_output_path(args.json, "--json")
    check_positive(args.n, "-n")
    check_positive(args.budget, "--budget")
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

    if args.action == "export":
        check_output_path(args.out, "--out")
    mem = Memory(args.memory)
    if args.action == "list":
        print(mem.format_runs(limit=args.limit))
    elif args.action == "show":
        if args.id is None:
            raise SystemExit("memory show needs a run id (see `sparseditto memory list`)")
        _print_json(mem.get_run(args.id))
    elif args.action == "export":
        out = check_output_path(args.out, "--out")
        count = mem.export(out, fmt=args.format)
        print(f"exported {count} records" + (f" to {out}" if out else ""), file=sys.stderr)
    return 0


def cmd_bench(args) -> int:
    """Run the benchmark suites (or only rewrite the reports of an existing output folder)."""
    from sparseditto.benchmark import bench, plan, report

    command = "sparseditto " + " ".join(args.argv)
    if args.report_only:
        result = report(args.out, command=command)
    elif args.list:
        cases = plan(args.suite, preset=args.preset, n=args.n, dtype=args.dtype, data_dir=args.data)
        for c in cases:
            print(f"{c.case_id}  {c.suite:7s} {c.label}")
        print(f"{len(cases)} case(s), {len({c.matrix.key for c in cases})} matrices", file=sys.stderr)
        return 0
    else:
        result = bench(args.suite, preset=args.preset, n=args.n, dtype=args.dtype, target=args.target,
                       backend=args.backend, out=args.out, resume=args.resume, budget_s=args.budget_s,
                       memory_check=args.memory_check, candidates=args.candidates, repeats=args.repeats,
                       ncu=args.ncu, data_dir=args.data, progress=not args.quiet, templates=args.templates,
                       grid=args.grid, command=command)
    from sparseditto.benchmark.tables import SUITE_HEADERS, suite_cells

    for s in result.summaries:
        cells = dict(zip(SUITE_HEADERS, suite_cells(s)))
        print(f"{s.suite}: {s.cases} cases, {s.correct} correct; geomean x dense {cells['geomean x dense']}, "
              f"x best vendor sparse {cells['geomean x best vendor sparse']}, x best of dense+vendor "
              f"{cells['geomean x best of dense+vendor']}; fast_1 {cells['fast_1']}, fast_1.5 {cells['fast_1.5']}"
              + ("" if s.timings_are_gpu else " (CPU interpreter: NOT GPU timings)"))
    if result.stopped:
        print(f"stopped: {result.stopped}; {result.remaining} case(s) left: rerun with --resume", file=sys.stderr)
    print("\n".join(f"wrote {path}" for path in result.files.values()), file=sys.stderr)
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

    p = sub.add_parser("bench", help="is the chosen kernel faster than what I would use? (suites, fast_p, report)",
                       description="Run run_graph on every case of the suites, time the chosen kernel against "
                                   "dense cuBLAS and every vendor path in one process, and write results.jsonl, "
                                   "summary.md and report.html.")
    p.add_argument("--suite", nargs="+", default=["llm"], metavar="SUITE|PATH",
                   help="llm, dlmc, graphs, all, or matrix files / folders of them (default: llm)")
    presets = p.add_mutually_exclusive_group()
    presets.add_argument("--quick", dest="preset", action="store_const", const="quick",
                         help="a few small cases for the CPU interpreter (CI; NOT GPU timings)")
    presets.add_argument("--full", dest="preset", action="store_const", const="full",
                         help="the whole cross product of each suite")
    p.set_defaults(preset="core")
    p.add_argument("-n", type=int, action="append", help="replace the suites' N values (repeatable)")
    p.add_argument("--dtype", action="append", choices=["float16", "bfloat16", "float32"],
                   help="replace the suites' dtypes (repeatable)")
    p.add_argument("--target", default="auto", help="GPU run_graph plans for (default: the local one)")
    p.add_argument("--backend", default="auto", choices=["auto", "cuda", "interpret"])
    p.add_argument("--out", default="sparseditto_bench", help="output folder (default: ./sparseditto_bench)")
    p.add_argument("--resume", action="store_true", help="continue the run in --out, skipping finished cases")
    p.add_argument("--budget-s", type=float, default=None,
                   help="stop before a case that would not finish within this many seconds (then --resume)")
    p.add_argument("--memory-check", type=int, default=3, metavar="K",
                   help="repeat run_graph with the memory on K cases spread over the run (default 3)")
    p.add_argument("--candidates", type=int, default=4, help="run_graph budget: candidates per case (default 4)")
    p.add_argument("--repeats", type=int, default=None, help="timing repeats (default 30 on a GPU, 1 on the CPU)")
    p.add_argument("--ncu", default="off", choices=["off", "best", "all"], help="Nsight Compute inside run_graph")
    p.add_argument("--data", default=None, help="folder holding dlmc/ and suitesparse/ (default: $SPARSEDITTO_DATA "
                                                "or ../shared/data)")
    p.add_argument("--templates", nargs="+", metavar="NAME", default=None,
                   help="also time these templates (or 'all') on every case, beside run_graph's answer")
    p.add_argument("--grid", type=int, default=1, help="parameter sets per template with --templates (default 1)")
    p.add_argument("--list", action="store_true", help="print the cases that would run, run nothing")
    p.add_argument("--report-only", action="store_true", help="rewrite summary.md / report.html of --out")
    p.add_argument("--quiet", action="store_true", help="no live progress display")
    p.set_defaults(func=cmd_bench)

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
    args.argv = list(sys.argv[1:] if argv is None else argv)
    from sparseditto.harness.sandbox import WorkerStartError

    try:
        return args.func(args)
    except ValueError as exc:  # bad input: one clear line, no traceback
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except WorkerStartError as exc:  # the environment, not the input: no result was produced
        print(f"error: the kernel sandbox could not start, so no kernel was verified: {exc}", file=sys.stderr)
        return 3


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
