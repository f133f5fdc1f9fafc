"""The `sparseditto` command line: its arguments, and how the process ends.

Exit codes: 0 done; 1 the demo's kernel check failed; 2 bad input or usage (one `error:` line,
no traceback); 3 the kernel sandbox could not start; 130 interrupted (Ctrl-C), with the way to
resume; 141 the reader of stdout went away (`sparseditto analyze M --json | head`), quietly, as
Unix tools do on SIGPIPE.
"""
from __future__ import annotations

import argparse
import os
import sys

from sparseditto.cli import commands

DESCRIPTION = """SparseDitto: find the fastest verified SpMM kernel (C = A @ B) for a sparse matrix,
such as a pruned LLM weight, on the GPU you name; or say honestly that a library is best."""
EPILOG = """examples:
  sparseditto demo                                   the bundled block-pruned weight, as a story
  sparseditto analyze layer.safetensors --tensor mlp.down_proj.weight
  sparseditto run layer.mtx --target H100 -n 16      live progress of every agent, then a summary
  sparseditto run layer.mtx --json > result.json     the full Result as JSON
  sparseditto batch model/ --target H200 --out run1  a kernel per layer, report.html, bundle/
  sparseditto export RUN_ID --out kernel.py          one kernel as a standalone module (python kernel.py checks it)
  sparseditto memory list                            what past runs found
  sparseditto targets                                the GPU table the planner costs kernels on
  langgraph dev --no-browser                         the same graph in LangGraph Studio (docs/studio.md)

Without a GPU the kernels run in the Triton interpreter: correct but slow, and the roofline cost
model (labelled "estimated") ranks them. Docs: README.md and docs/."""

RESUME_RUN = ("every finished step is checkpointed: run the same command again to resume this run where it "
              "stopped")
RESUME_BATCH = "finished layers are kept in --out: run the same command with --resume to continue"
RESUME_BENCH = "finished cases are kept in --out: run the same command with --resume to continue"

MATRIX_HELP = ("the matrix: a .mtx, .smtx, .npz, .pt/.pth or .safetensors file, optionally gzipped "
               "(pick a tensor of a checkpoint with --tensor)")


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("sparseditto")
    except PackageNotFoundError:  # pragma: no cover - running from a source tree that is not installed
        return "unknown (not installed)"


def _add_run_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", default="auto", metavar="GPU",
                   help="GPU to plan for: A100, H100, H200, ... (`sparseditto targets`), or auto: the local GPU, "
                        "A100 without one (default: auto)")
    p.add_argument("-n", type=int, action="append", metavar="N",
                   help="columns of B (the batch of activations); repeat for several: the first is benchmarked, "
                        "all are verified (default: 16)")
    p.add_argument("--dtype", default="float16", choices=["float16", "bfloat16", "float32"],
                   help="value dtype of A, B and C; accumulation is float32 (default: float16)")
    p.add_argument("--backend", default="auto", choices=["auto", "cuda", "interpret"],
                   help="where kernels run: cuda (a GPU), interpret (the Triton interpreter on the CPU: "
                        "correctness only) or auto (default)")
    p.add_argument("--llm", default=None, metavar="MODEL",
                   help="chat model for the LLM policy, e.g. gpt-4o-mini, through OPENAI_BASE_URL "
                        "(default: $SPARSEDITTO_LLM_MODEL, else the deterministic expert policy; docs/llm.md)")
    p.add_argument("--budget", type=int, default=None, metavar="K",
                   help="most candidate kernels to try (default: 8 on a GPU, 4 on the interpreter)")
    p.add_argument("--max-llm-tokens", type=int, default=None, metavar="TOKENS",
                   help="LLM token budget of the run (prompt + completion tokens); once the next request would "
                        "pass it, the expert policy answers the remaining steps (default: no limit)")
    p.add_argument("--max-llm-cost", type=float, default=None, metavar="USD",
                   help="LLM cost budget of the run in US dollars, priced with --llm-price (default: no limit)")
    p.add_argument("--llm-price", default=None, metavar="IN,OUT",
                   help="model price: USD per million prompt tokens, per million completion tokens (for "
                        "--max-llm-cost and the cost in the token usage)")
    p.add_argument("--memory", default=None, metavar="FILE",
                   help="SQLite file of the optimization memory (default: $SPARSEDITTO_MEMORY, else the cache "
                        "directory)")
    p.add_argument("--json", action="store_true", help="print the full Result as JSON instead of the summary")
    p.add_argument("-o", "--out", default=None, metavar="FILE", help="also write the Result as JSON to FILE")
    p.add_argument("-q", "--quiet", action="store_true", help="no live progress on stderr")


def _add_batch_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", default="auto", metavar="GPU", help="GPU to plan for (default: auto)")
    p.add_argument("-n", type=int, action="append", metavar="N",
                   help="tokens (columns of B); repeat for several: the first is timed, all are verified (default: 16)")
    p.add_argument("--dtype", default="float16", choices=["float16", "bfloat16", "float32"],
                   help="value dtype of the kernels (default: float16)")
    p.add_argument("--backend", default="auto", choices=["auto", "cuda", "interpret"],
                   help="cuda, interpret (Triton interpreter on the CPU) or auto (default)")
    p.add_argument("--select", default=None, metavar="REGEX", help="only tensors whose name matches (re.search)")
    p.add_argument("--min-sparsity", type=float, default=0.3, metavar="S",
                   help="skip weights less sparse than this fraction, with the reason (default: 0.3)")
    p.add_argument("--out", default="sparseditto-batch", metavar="DIR",
                   help="output folder: report.json, report.html, bundle/, journal (default: ./sparseditto-batch)")
    p.add_argument("--resume", action="store_true", help="continue the batch in --out; nothing finished is redone")
    p.add_argument("--previous", default=None, metavar="DIR",
                   help="--out of an earlier batch of this model: unchanged layers reuse its kernels, slower "
                        "layers are flagged")
    p.add_argument("--budget", type=int, default=None, metavar="K", help="run_graph budget of each full search")
    p.add_argument("--ncu", default="best", choices=["best", "all", "off"],
                   help="Nsight Compute inside each full search (default best: each new best candidate; off saves "
                        "~10 s per profile on the H200)")
    p.add_argument("--tolerance", type=float, default=0.05,
                   help="how close (fraction) a reused kernel must be to its expected time (default: 0.05)")
    p.add_argument("--memory", default=None, metavar="FILE", help="SQLite memory file (default: the cache's)")
    p.add_argument("--workers", default=None, metavar="K|ray",
                   help="K worker processes (pinned to the local GPUs round robin: several may share one, each "
                        "timing takes it alone), or 'ray' for Ray tasks (default: one per local GPU when there are "
                        "several, else this process); on one GPU, 4 runs a 7B-shaped model's reused layers ~4 at a time")
    p.add_argument("--ray-address", default=None, metavar="ADDR", help="run the groups as Ray tasks on this cluster")
    p.add_argument("--json", action="store_true", help="print report.json's content instead of the summary")
    p.add_argument("-q", "--quiet", action="store_true", help="no live progress on stderr")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sparseditto", description=DESCRIPTION, epilog=EPILOG,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-V", "--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("demo", help="run on a bundled block-pruned weight and tell what happened",
                       description="Run SparseDitto on a bundled 1024 x 4096 MLP weight, block-pruned to 95% "
                                   "(64x64 tiles), and tell the story: the pattern and why, the kernels tried, "
                                   "verified or rejected, the one chosen and its speedup (measured on a GPU, "
                                   "estimated by the roofline model on the CPU), what the memory did, and "
                                   "result.kernel(B) checked against the fp64 product.")
    _add_run_options(p)
    p.add_argument("-v", "--verbose", action="store_true", help="print every agent's progress line")
    p.set_defaults(func=commands.cmd_demo, resume_hint=RESUME_RUN)

    p = sub.add_parser("analyze", help="print the pattern report of a matrix",
                       description="Measure a matrix's sparsity pattern (class, confidence, N:M conformance, "
                                   "block occupancy, row balance, bandwidth) and say why it is that class.")
    p.add_argument("matrix", help=MATRIX_HELP)
    p.add_argument("--tensor", metavar="NAME", help="tensor name inside a .pt/.safetensors/.npz file holding several")
    p.add_argument("--seed", type=int, default=0, help="seed of the values drawn for pattern-only files (default: 0)")
    p.add_argument("--json", action="store_true", help="print the full report as JSON instead of the readable one")
    p.add_argument("--full", dest="json", action="store_true", help=argparse.SUPPRESS)   # old spelling of --json
    p.add_argument("-o", "--out", default=None, metavar="FILE", help="also write the full report as JSON to FILE")
    p.set_defaults(func=commands.cmd_analyze)

    p = sub.add_parser("run", help="find the fastest verified kernel for a matrix",
                       description="Analyze the matrix, then plan, write, compile, verify and profile kernels "
                                   "for it until one beats dense cuBLAS and the vendor libraries on the target "
                                   "(or dense stays). Progress streams to stderr; the summary goes to stdout.")
    p.add_argument("matrix", help=MATRIX_HELP)
    p.add_argument("--tensor", metavar="NAME", help="tensor name inside a .pt/.safetensors/.npz file holding several")
    _add_run_options(p)
    p.set_defaults(func=commands.cmd_run, resume_hint=RESUME_RUN)

    p = sub.add_parser("targets", help="list the GPUs the planner knows (names, aliases, peaks)")
    p.set_defaults(func=commands.cmd_targets)

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
    p.add_argument("--backend", default="auto", choices=["auto", "cuda", "interpret"],
                   help="cuda, interpret (Triton interpreter on the CPU) or auto (default)")
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
    p.add_argument("--no-chain", dest="chain", action="store_false",
                   help="skip the chained timing (the chosen kernel and dense launched back to back from one "
                        "CUDA graph over L2-cold weight copies; GPU only)")
    p.add_argument("--list", action="store_true", help="print the cases that would run, run nothing")
    p.add_argument("--report-only", action="store_true", help="rewrite summary.md / report.html of --out")
    p.add_argument("--quiet", action="store_true", help="no live progress display")
    p.set_defaults(func=commands.cmd_bench, resume_hint=RESUME_BENCH)

    p = sub.add_parser("batch", help="a kernel per layer of a pruned model: report + kernel bundle",
                       description="Select the 2-D weights of a model (and im2col'd conv weights), group them by "
                                   "pattern signature and shape, run the full search on the first layer of each "
                                   "group and start the others from its winner; write report.json, report.html "
                                   "and a kernel bundle (sparseditto.load_bundle / patch_model) to --out.")
    p.add_argument("model", help="a .safetensors file, a folder of safetensors shards (with its index json) or a "
                                 ".pt/.pth state_dict")
    _add_batch_options(p)
    p.set_defaults(func=commands.cmd_batch, resume_hint=RESUME_BATCH)

    p = sub.add_parser("export", help="one kernel as a standalone Python module (torch, numpy, triton or cupy only)",
                       description="Write the best verified kernel of a memory run (or, with --bundle, of a batch "
                                   "bundle's layer) as one Python file that needs no SparseDitto: the kernel "
                                   "source, its parameters and packed format (EXPORT), SpMM(weight)(B), and a "
                                   "self-check: python kernel.py.")
    p.add_argument("ref", metavar="RUN_ID",
                   help="run id (or a unique prefix) in the memory; with --bundle a layer name or a layer's run id")
    p.add_argument("--out", required=True, metavar="FILE.py", help="the module to write, e.g. kernel.py")
    p.add_argument("--bundle", default=None, metavar="DIR", help="a batch's out folder or its bundle/ folder")
    p.add_argument("--memory", default=None, metavar="FILE",
                   help="SQLite memory file (default: $SPARSEDITTO_MEMORY, else the cache directory)")
    p.set_defaults(func=commands.cmd_export)

    p = sub.add_parser("memory", help="inspect the optimization memory (list, show RUN_ID, export)",
                       description="The SQLite memory of past runs: every candidate, step and outcome. The next "
                                   "matrix with a known pattern reuses its kernel after re-verification.")
    p.add_argument("action", choices=["list", "show", "export"],
                   help="list: recent runs as a table; show: one run as JSON; export: every run as JSON Lines")
    p.add_argument("id", nargs="?", help="run id (or a unique prefix) for `show`")
    p.add_argument("--llm", action="store_true",
                   help="`show`: print the run's LLM transcript (every model request) instead of its JSON")
    p.add_argument("--text-chars", type=int, default=None, metavar="N",
                   help="`show --llm`: clip each prompt and answer to N characters (default: whole)")
    p.add_argument("--memory", default=None, metavar="FILE",
                   help="SQLite memory file (default: $SPARSEDITTO_MEMORY, else the cache directory)")
    p.add_argument("--limit", type=int, default=50, help="runs to list (default: 50)")
    p.add_argument("--format", default="jsonl", choices=["jsonl", "json"], help="export format (default: jsonl)")
    p.add_argument("--out", metavar="FILE", help="output file for export (default: stdout)")
    p.set_defaults(func=commands.cmd_memory)
    return parser


def _quiet_stdout() -> None:
    """After a closed pipe: point stdout at /dev/null so the final flush at exit cannot fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    from sparseditto.harness.sandbox import WorkerStartError

    try:
        code = args.func(args)
        sys.stdout.flush()   # inside the try: a closed pipe surfaces here, not at interpreter exit
        return code
    except ValueError as exc:  # bad input: one clear line, no traceback
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except WorkerStartError as exc:  # the environment, not the input: no result was produced
        print(f"error: the kernel sandbox could not start, so no kernel was verified: {exc}", file=sys.stderr)
        return 3
    except BrokenPipeError:
        _quiet_stdout()
        return 141
    except KeyboardInterrupt:
        hint = getattr(args, "resume_hint", None)
        print(f"\ninterrupted{': ' + hint if hint else ''}.", file=sys.stderr)
        return 130
