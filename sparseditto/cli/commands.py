"""One handler per subcommand, each a thin shell over a library call (so everything the CLI does is
also available, and tested, from Python). Heavy modules are imported inside the handlers to keep
`sparseditto --help` fast. A handler returns the exit code; bad input raises ValueError (the app
turns it into one line on stderr and exit code 2).
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

EXAMPLE_DIR = Path(__file__).resolve().parents[1] / "examples"
# The demo's matrix: a 1024 x 4096 MLP down-projection weight, block-pruned to 95% in 64x64 tiles
# (sparseditto.generate.block_sparse(1024, 4096, (64, 64), 0.05, seed=7, dtype="float16")). On an
# A100 the roofline model puts bsr_tc at about 2.4x dense cuBLAS: a win the CPU can honestly estimate.
DEMO_EXAMPLE = EXAMPLE_DIR / "block_pruned_mlp_1024x4096.safetensors.gz"


# ---- argument checks shared by the handlers ----------------------------------------------------

def check_output_path(path: str | None, flag: str) -> Path | None:
    """Fail before a long run, not after it: the folder must exist and be writable, and the path
    must not be a directory or a read-only file."""
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


def _print_json(obj) -> None:
    print(json.dumps(obj, indent=2, default=str))


# ---- analyze, targets --------------------------------------------------------------------------

def cmd_analyze(args) -> int:
    from sparseditto.analysis import analyze
    from sparseditto.cli.views import print_report
    from sparseditto.io import load_matrix

    out = check_output_path(args.out, "--out")
    report = analyze(load_matrix(args.matrix, tensor=args.tensor, seed=args.seed))
    if out is not None:
        out.write_text(report.model_dump_json(indent=2))
    if args.json:
        print(report.model_dump_json(indent=2))
    else:
        print_report(report)
    return 0


def cmd_targets(args) -> int:
    from sparseditto.agents.costing import arch_exclusions
    from sparseditto.cli.views import print_table, targets_table
    from sparseditto.targets import list_targets

    targets = list_targets()
    print_table(targets_table(targets, {t.name: sorted(arch_exclusions(t)) for t in targets}))
    return 0


# ---- run, demo ---------------------------------------------------------------------------------

def _run(args, progress):
    from sparseditto import api

    check_positive(args.n, "-n")
    check_positive(args.budget, "--budget")
    return api.run_graph(args.matrix, target=args.target, n=args.n, dtype=args.dtype, backend=args.backend,
                         llm=args.llm, budget=args.budget, memory=args.memory, tensor=args.tensor,
                         progress=progress, **_llm_budget_options(args))


def _llm_budget_options(args) -> dict:
    """--max-llm-tokens / --max-llm-cost / --llm-price as run_graph options (only those given;
    run_graph checks them before any work)."""
    names = ("max_llm_tokens", "max_llm_cost", "llm_price")
    return {k: getattr(args, k) for k in names if getattr(args, k, None) is not None}


def _write_result(result, args, out: Path | None) -> None:
    if out is not None:
        out.write_text(result.model_dump_json(indent=2))
    if args.json:
        print(result.model_dump_json(indent=2))


def cmd_run(args) -> int:
    out = check_output_path(args.out, "--out")
    result = _run(args, progress=not args.quiet)   # progress is on stderr: stdout stays the summary or JSON
    _write_result(result, args, out)
    if not args.json:
        print(result.summary())
    return 0


def cmd_demo(args) -> int:
    """The bundled example, told as a story (see sparseditto.cli.story), with its kernel checked."""
    from sparseditto.cli.story import check_kernel, story
    from sparseditto.cli.views import stdout_console

    out = check_output_path(args.out, "--out")
    args.matrix, args.tensor = str(DEMO_EXAMPLE), None
    result = _run(args, progress=False if args.quiet else ("all" if args.verbose else "status"))
    _write_result(result, args, out)
    if args.json:
        return 0
    check = check_kernel(result, n=result.n_values[0]) if result.best.template != "dense" else None
    console = stdout_console()
    console.print("[bold]SparseDitto demo[/]: one pruned weight, from pattern to verified kernel", highlight=False)
    for label, text in story(result, check):
        console.print(f"[bold cyan]{label:>10}[/]  {text}", highlight=False, soft_wrap=not console.is_terminal)
    console.print(f"[bold cyan]{'next':>10}[/]  sparseditto run YOUR_WEIGHT.safetensors --tensor NAME --target H100"
                  f"  ·  sparseditto memory show {result.run_id[:8]}  ·  sparseditto demo -v (every agent step)",
                  highlight=False, soft_wrap=not console.is_terminal)
    return 0 if check is None or check.ok else 1


# ---- memory ------------------------------------------------------------------------------------

def cmd_memory(args) -> int:
    from sparseditto.memory import Memory

    out = check_output_path(args.out, "--out") if args.action == "export" else None
    mem = Memory(args.memory)
    if args.action == "list":
        from sparseditto.cli.views import print_table, runs_table

        runs = mem.list_runs(limit=args.limit)
        if not runs:
            print(f"No runs recorded yet in {mem.path}. `sparseditto run MATRIX` records one.")
        else:
            print_table(runs_table(runs, mem.path))
    elif args.action == "show":
        if args.id is None:
            raise ValueError("memory show needs a run id (see `sparseditto memory list`).")
        if args.llm:
            print(mem.format_transcript(args.id, text_chars=args.text_chars))
        else:
            _print_json(mem.get_run(args.id))
    elif args.action == "export":
        count = mem.export(out, fmt=args.format)
        print(f"exported {count} records" + (f" to {out}" if out else ""), file=sys.stderr)
    return 0


# ---- bench -------------------------------------------------------------------------------------

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
                       grid=args.grid, command=command, chain=args.chain)
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


# ---- batch -------------------------------------------------------------------------------------

def cmd_export(args) -> int:
    """One kernel as a standalone module (sparseditto.batch.export)."""
    from sparseditto.batch.export import export_kernel

    path = export_kernel(args.ref, args.out, bundle=args.bundle, memory=args.memory)
    print(f"wrote {path} (check it: python {path})", file=sys.stderr)
    return 0


def cmd_batch(args) -> int:
    """A kernel per layer of a model (sparseditto.run_batch)."""
    from sparseditto.batch.runner import run_batch

    check_positive(args.n, "-n")
    check_positive(args.budget, "--budget")
    report = run_batch(args.model, target=args.target, n=args.n, dtype=args.dtype, select=args.select,
                       min_sparsity=args.min_sparsity, out=args.out, resume=args.resume, backend=args.backend,
                       budget=args.budget, memory=args.memory, previous=args.previous, tolerance=args.tolerance,
                       progress=not args.quiet, workers=args.workers, ray_address=args.ray_address, ncu=args.ncu)
    print(report.model_dump_json(indent=1) if args.json else report.summary())
    return 0

