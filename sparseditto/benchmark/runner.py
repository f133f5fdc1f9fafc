"""`sparseditto.bench(...)`: run the suites, append one row per case, write the reports.

Built for scarce GPU time: cases are grouped by matrix (each matrix is built once, generated ones
cached on disk), one SQLite memory is shared by the whole run, a row is appended to
``results.jsonl`` (and fsynced) as soon as its case finishes, ``budget_s`` stops *before* a case
that would not fit (estimated from the cases done so far, or from earlier runs' rows), and
``resume`` skips every case already in the file. Whatever stops the run (the budget, Ctrl-C, a
SIGTERM from a timeout), the summary and the HTML report are written from all the rows there are.
"""
from __future__ import annotations

import json
import math
import os
import signal
import statistics
import sys
import time
import uuid
from contextlib import contextmanager
from pathlib import Path

from .cases import Case, build_matrix, default_matrix_cache, expected_nnz
from .measure import Settings, measure_case, unbuilt_row
from .metrics import summarize
from .report_html import render_report_html
from .report_md import render_summary_md
from .rows import BenchReport, BenchRow
from .suites import select_cases

RESULTS = "results.jsonl"
ENVIRONMENT = "environment.json"
SUMMARY = "summary.md"
SUMMARY_JSON = "summary.json"
REPORT = "report.html"
MEMORY = "memory.sqlite"
DTYPES = ("float16", "bfloat16", "float32")
NCU_MODES = ("off", "best", "all")


# ---- rows on disk -------------------------------------------------------------------------------

def load_rows(path: Path) -> list[BenchRow]:
    """Rows of a results.jsonl; a torn last line (a run killed mid-write) is skipped."""
    if not path.exists():
        return []
    rows = []
    for i, line in enumerate(path.read_text().splitlines()):
        if not line.strip():
            continue
        try:
            rows.append(BenchRow.model_validate_json(line))
        except ValueError:
            print(f"warning: {path}:{i + 1} is not a valid result row (a run killed while writing?); skipped",
                  file=sys.stderr)
    return rows


def append_row(path: Path, row: BenchRow) -> None:
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(row.model_dump_json() + "\n")
        fh.flush()
        os.fsync(fh.fileno())


def load_environments(out: Path) -> list[dict]:
    path = out / ENVIRONMENT
    if not path.exists():
        return []
    try:
        return list(json.loads(path.read_text()).get("runs", []))
    except (ValueError, AttributeError):
        return []


def save_environment(out: Path, env: dict) -> None:
    runs = load_environments(out) + [env]
    (out / ENVIRONMENT).write_text(json.dumps({"runs": runs}, indent=2, default=str))


def write_reports(out: Path, *, command: str, stopped: str | None = None, remaining: int = 0):
    """summary.md, summary.json and report.html from every row in ``out/results.jsonl``."""
    rows = load_rows(out / RESULTS)
    summaries = summarize(rows)
    envs = load_environments(out)
    kw = dict(command=command, environments=envs, stopped=stopped, remaining=remaining)
    (out / SUMMARY).write_text(render_summary_md(rows, summaries, **kw))
    (out / SUMMARY_JSON).write_text(json.dumps({"command": command, "stopped": stopped, "remaining": remaining,
                                                "suites": [s.model_dump() for s in summaries]}, indent=2))
    (out / REPORT).write_text(render_report_html(rows, summaries, **kw))
    return rows, summaries


def report(out: str | os.PathLike, command: str | None = None) -> BenchReport:
    """Rewrite summary.md and report.html of an existing bench output folder (after a change to
    the report code, or on a folder copied off the GPU machine). The pages keep the command and
    the "incomplete" note of the run that made the rows (from its summary.json): they describe
    those rows, not the rewrite; ``command`` is only used for a folder without one."""
    out = Path(out)
    if not (out / RESULTS).exists():
        raise ValueError(f"No {RESULTS} in {out}: nothing to report.")
    previous = {}
    if (out / SUMMARY_JSON).exists():
        try:
            previous = json.loads((out / SUMMARY_JSON).read_text())
        except (OSError, ValueError):
            previous = {}
    remaining = int(previous.get("remaining") or 0)
    rows, summaries = write_reports(out, command=previous.get("command") or command or
                                    f"sparseditto bench --report-only --out {out}",
                                    stopped=previous.get("stopped"), remaining=remaining)
    return BenchReport(out_dir=str(out), rows=len(rows), new_rows=0, skipped=0, remaining=remaining,
                       summaries=summaries, files=_files(out))


def _files(out: Path) -> dict[str, str]:
    names = (RESULTS, ENVIRONMENT, SUMMARY, SUMMARY_JSON, REPORT, MEMORY)
    return {name: str(out / name) for name in names if (out / name).exists()}


# ---- settings -----------------------------------------------------------------------------------

def resolve_backend(backend: str) -> str:
    if backend not in ("auto", "cuda", "interpret"):
        raise ValueError(f"Unknown backend {backend!r}; expected auto, cuda or interpret.")
    import torch

    if backend == "cuda" and not torch.cuda.is_available():
        raise ValueError("backend 'cuda' needs a CUDA GPU, but torch.cuda.is_available() is False.")
    resolved = backend if backend != "auto" else ("cuda" if torch.cuda.is_available() else "interpret")
    if resolved == "interpret" and "triton" not in sys.modules:
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before Triton's first import in this process
    return resolved


def _check_args(preset, n, dtype, budget_s, memory_check, candidates, repeats, ncu) -> None:
    if n is not None and (not n or any(isinstance(v, bool) or int(v) != v or v < 1 for v in n)):
        raise ValueError(f"Expected positive integer N values, got {n!r}.")
    if dtype is not None and (not dtype or any(d not in DTYPES for d in dtype)):
        raise ValueError(f"Unsupported dtype(s) {dtype!r}; expected some of {', '.join(DTYPES)}.")
    if budget_s is not None and not budget_s > 0:
        raise ValueError(f"Expected budget_s > 0 seconds, got {budget_s!r}.")
    if memory_check < 0:
        raise ValueError(f"Expected memory_check >= 0 cases, got {memory_check!r}.")
    if candidates < 1:
        raise ValueError(f"Expected candidates >= 1 (run_graph's budget per case), got {candidates!r}.")
    if repeats is not None and repeats < 1:
        raise ValueError(f"Expected repeats >= 1, got {repeats!r}.")
    if ncu not in NCU_MODES:
        raise ValueError(f"Unknown ncu mode {ncu!r}; expected one of {NCU_MODES}.")


def sample_indices(count: int, k: int) -> set[int]:
    """``k`` indices spread evenly over ``range(count)`` (the cases that also get a memory repeat)."""
    if k <= 0 or count <= 0:
        return set()
    if k >= count:
        return set(range(count))
    if k == 1:
        return {0}
    return {round(i * (count - 1) / (k - 1)) for i in range(k)}


# How a case's seconds grow with its nonzeros when the estimate comes from other matrices: run_graph's
# fixed costs (compiles, candidates) dominate small matrices and its per-nonzero work (packing, references,
# dense baselines) large ones, so only the matrices nearest in size are scaled (SIZE_NEIGHBOURS of them).
# H200, graphs suite, sessions 30-31: 6-46 s (median 9) for the SuiteSparse files (10^2-2x10^5 nonzeros),
# 163 s for R-MAT scale 16 (~10^6), a case the plain median had put at ~10 s and that overran the budget
# by 4 minutes; 46 -> 163 s over 5.3x the nonzeros is an exponent of 0.76.
SIZE_NEIGHBOURS = 3
SIZE_EXPONENT = 0.75


class Budget:
    """Decides whether the next case fits in what is left of ``budget_s`` (None: no limit)."""

    def __init__(self, budget_s: float | None, previous: list[BenchRow], start: float | None = None):
        self.budget_s = budget_s
        self.start = time.perf_counter() if start is None else start
        self.previous = previous
        self.done: list[tuple[str, str, float, float | None]] = []   # (suite, matrix key, seconds, nonzeros)
        self.builds: list[float] = []

    def record(self, case: Case, seconds: float, nnz: float | None = None) -> None:
        self.done.append((case.suite, case.matrix.key, seconds, nnz))

    def estimate(self, case: Case, new_matrix: bool) -> float:
        """The median seconds of the cases most like this one: its own matrix's; else, from its suite's
        cases (else any this run measured, else the resumed file's), the SIZE_NEIGHBOURS cases
        nearest to its expected nonzeros, each time scaled by (nonzeros ratio)^SIZE_EXPONENT; the
        plain median where sizes are unknown (files before they are built)."""
        build = statistics.median(self.builds) if new_matrix and self.builds else 0.0
        same = [s for _, key, s, _ in self.done if key == case.matrix.key]
        if same:
            return statistics.median(same) + build
        suite = [(s, z) for st, _, s, z in self.done if st == case.suite]
        earlier = [(r.case_seconds, r.nnz) for r in self.previous if r.suite == case.suite and r.case_seconds]
        pool = suite or [(s, z) for _, _, s, z in self.done] or earlier
        nnz = expected_nnz(case.matrix)
        sized = [(s, z) for s, z in pool if z] if nnz else []
        if sized:
            near = sorted(sized, key=lambda p: abs(math.log(nnz / p[1])))[:SIZE_NEIGHBOURS]
            return statistics.median(s * (nnz / z) ** SIZE_EXPONENT for s, z in near) + build
        return (statistics.median(s for s, _ in pool) if pool else 0.0) + build

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def fits(self, case: Case, new_matrix: bool) -> bool:
        return self.budget_s is None or self.elapsed() + self.estimate(case, new_matrix) <= self.budget_s


@contextmanager
def _sigterm_as_interrupt():
    """A timeout's SIGTERM stops the run like Ctrl-C does, so the reports still get written."""
    def handler(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    try:
        previous = signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread: leave signals alone
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _progress(enabled: bool):
    from rich.console import Console
    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                               TimeRemainingColumn)

    console = Console(stderr=True)
    return console, Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                             TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(), console=console,
                             disable=not enabled, transient=False)


def _line(row: BenchRow) -> str:
    if row.status == "error":
        return f"{row.case}: [red]error[/] {row.error[:160] if row.error else ''}"
    ok = "[green]correct[/]" if row.correct else "[red]NOT correct[/]"
    chosen = row.chosen.template if row.chosen else "-"
    sd = f"{row.speedup_vs_dense.value:.2f}x dense" if row.speedup_vs_dense else "- dense"
    sv = (f"{row.best_vendor.value:.2f}x {row.best_vendor.versus}" if row.best_vendor else "no vendor sparse path")
    return f"{row.case}: {chosen}, {sd}, {sv}, {ok} ({row.case_seconds:.1f} s)"


# ---- the run ------------------------------------------------------------------------------------

def plan(suites=("llm",), *, preset: str = "core", n=None, dtype=None, data_dir=None) -> list[Case]:
    """The cases `bench` would run (nothing is built or timed)."""
    return select_cases(list(suites), preset, data_dir=data_dir, ns=tuple(n) if n else None,
                        dtypes=tuple(dtype) if dtype else None)


def bench(suites=("llm",), *, preset: str = "core", n=None, dtype=None, target: str = "auto",
          backend: str = "auto", out: str | os.PathLike = "sparseditto_bench", resume: bool = False,
          budget_s: float | None = None, memory_check: int = 3, candidates: int = 4, repeats: int | None = None,
          ncu: str = "off", data_dir=None, progress: bool = True, matrix_cache=None, seed: int = 0,
          templates=None, grid: int = 1, command: str | None = None, chain: bool = True) -> BenchReport:
    """Benchmark what `run_graph` chooses against dense cuBLAS and every vendor path, per suite.

    ``suites``: names from ``llm``, ``dlmc``, ``graphs``, ``all``, or matrix files / folders.
    ``preset``: quick (CPU-sized, not GPU timings), core (a few GPU minutes) or full (everything).
    ``n`` / ``dtype`` replace the suites' own N values / dtypes. ``budget_s`` stops before a case
    that would not fit; ``resume`` continues an existing ``out`` folder. ``memory_check`` cases
    (spread over the run) also get a repeat run_graph with the memory. ``candidates`` is
    run_graph's budget per case. ``templates`` (names or ``["all"]``) also times every applicable
    template's first ``grid`` parameter sets on each case (a kernel developer's view; the answer
    stays run_graph's). ``chain`` (GPU) also times the chosen kernel and dense chained (launches back
    to back from one graph over L2-cold weight copies). Returns a `BenchReport`; the files are in ``out``.
    """
    started = time.perf_counter()
    _check_args(preset, n, dtype, budget_s, memory_check, candidates, repeats, ncu)
    if templates:
        from .sweep import selected_templates

        selected_templates(templates)  # unknown names fail here, before any work
    if grid < 1:
        raise ValueError(f"Expected grid >= 1 parameter sets per template, got {grid!r}.")
    out = Path(out)
    results = out / RESULTS
    if results.exists() and not resume:
        raise ValueError(f"{results} already exists: pass resume=True (--resume) to continue that run, "
                         "or choose another output folder.")
    cases = plan(suites, preset=preset, n=n, dtype=dtype, data_dir=data_dir)
    command = command or (f"sparseditto.bench(suites={list(suites)!r}, preset={preset!r}, n={n!r}, dtype={dtype!r}, "
                          f"budget_s={budget_s!r}, resume={resume!r})")
    previous = load_rows(results)
    done_ids = {r.case_id for r in previous}
    pending = [c for c in cases if c.case_id not in done_ids]
    budget = Budget(budget_s, previous, start=started)  # the setup below counts against the budget too

    resolved = resolve_backend(backend)
    builtin = [c for c in pending if c.suite != "files"]
    if resolved == "interpret" and backend == "auto" and preset != "quick" and builtin:
        raise ValueError(f"No GPU found: the {preset} preset's {len(builtin)} case(s) (LLM-sized weights among them) "
                         "would take hours in the Triton interpreter. Pass --quick for the CPU-sized subset, or "
                         "--backend interpret to run them anyway.")
    out.mkdir(parents=True, exist_ok=True)
    from sparseditto.paths import cache_dir

    from .environment import collect_environment, measure_copy_bandwidth

    env = collect_environment(resolved)
    env.update(measure_copy_bandwidth(resolved), run_id=uuid.uuid4().hex[:12],
               started=time.strftime("%Y-%m-%d %H:%M:%S"), command=command, preset=preset, suites=list(suites))
    save_environment(out, env)
    gpu = resolved == "cuda"
    settings = Settings(target=target, backend=resolved, candidates=candidates,
                        repeats=repeats or (30 if gpu else 1), warmup=5 if gpu else 0, ncu=ncu, seed=seed,
                        memory_path=str(out / MEMORY), checkpoint_path=str(cache_dir() / "bench_checkpoints.sqlite"),
                        templates=list(templates or []), grid=grid, chain=bool(chain))
    cache = Path(matrix_cache) if matrix_cache is not None else default_matrix_cache()
    sampled = sample_indices(len(pending), memory_check)

    console, bar = _progress(progress)
    if progress and not gpu:
        console.print("[yellow]CPU (Triton interpreter): timings are NOT GPU timings; only correctness counts.")
    if os.environ.get("SPARSEDITTO_LLM_MODEL"):
        console.print("[yellow]SPARSEDITTO_LLM_MODEL is set: run_graph uses the LLM policy, not the expert one "
                      "(each row records its policy); unset it to benchmark the expert policy.")
    with _sigterm_as_interrupt(), bar:
        finished, stopped = _run_cases(pending, settings, env, cache, budget, sampled, results, bar)
    remaining = len(pending) - finished
    _fold_wal(out / MEMORY)
    rows, summaries = write_reports(out, command=command, stopped=stopped, remaining=remaining)
    return BenchReport(out_dir=str(out), rows=len(rows), new_rows=finished, skipped=len(cases) - len(pending),
                       remaining=remaining, stopped=stopped, summaries=summaries, files=_files(out))


def _run_cases(pending: list[Case], settings: Settings, env: dict, cache: Path, budget: Budget, sampled: set[int],
               results: Path, bar) -> tuple[int, str | None]:
    """Measure the pending cases matrix by matrix, appending each row; returns (finished, why stopped)."""
    groups: dict[str, list[tuple[int, Case]]] = {}
    for i, c in enumerate(pending):
        groups.setdefault(c.matrix.key, []).append((i, c))
    task = bar.add_task("benchmark", total=len(pending))
    finished = 0
    try:
        for items in groups.values():
            matrix, build_error = None, None
            for i, case in items:
                if not budget.fits(case, new_matrix=matrix is None):
                    return finished, (f"budget of {budget.budget_s:.0f} s: {budget.elapsed():.0f} s used, the next "
                                      f"case ({case.label}) was estimated at "
                                      f"{budget.estimate(case, matrix is None):.0f} s")
                if matrix is None and build_error is None:
                    bar.update(task, description=f"building {case.matrix.label}")
                    t0 = time.perf_counter()
                    try:
                        matrix = build_matrix(case.matrix, cache)
                    except (ValueError, OSError) as exc:  # a broken file is a row, not the end of the run
                        build_error = f"could not build the matrix: {type(exc).__name__}: {exc}"
                    budget.builds.append(time.perf_counter() - t0)
                bar.update(task, description=case.label)
                if build_error is not None:
                    row = unbuilt_row(case, settings, build_error)
                else:
                    row = measure_case(case, matrix, settings, copy_gbs=env.get("copy_bandwidth_gbs"),
                                       repeat_with_memory=i in sampled, env=env)
                row.run_id, row.environment = env["run_id"], env
                append_row(results, row)
                budget.record(case, row.case_seconds, row.nnz)
                finished += 1
                bar.advance(task)
                bar.console.print(_line(row), highlight=False)
            if matrix is not None:
                _forget(matrix)
    except KeyboardInterrupt as exc:
        return finished, f"interrupted ({exc or 'Ctrl-C'})"
    return finished, None


def _fold_wal(path: Path) -> None:
    """Write the memory's SQLite write-ahead log back into the file, so that copying memory.sqlite
    alone (to carry it to the next machine) carries everything."""
    if not path.exists():
        return
    import sqlite3

    try:
        with sqlite3.connect(str(path)) as conn:
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    except sqlite3.Error as exc:  # a busy database keeps its -wal file: still correct, only bigger
        print(f"warning: could not checkpoint {path}: {exc}", file=sys.stderr)


def _forget(matrix) -> None:
    """Drop the in-process copy run_graph's artifact store keeps of a matrix we are done with."""
    from sparseditto.artifacts import forget_matrix, matrix_key

    forget_matrix(matrix_key(matrix))
