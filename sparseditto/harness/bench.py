"""Benchmark a candidate against dense cuBLAS and the vendor sparse baselines (`bench`).

Everything runs in one sandboxed worker process, so the candidate and the baselines see the same
GPU state, clocks and allocator. The steps, in order:

1. ``prepare`` on the matrix's own values, timed on its own (``conversion_ms``; never hidden);
2. one checked run (a kernel that is wrong now is not timed: `BenchError` with "wrong_result");
3. eager cold-L2 timing, then the same launch inside a CUDA graph (a capture failure is noted and
   the eager number kept);
4. dense ``torch.matmul`` on the densified A (eager and graph), then the other baselines (with a
   ``baseline_scope``, once per scope in this worker process: see `ScopedBaselines`);
5. re-verification (``reverified``): every warm-up and timed launch gets fresh random contents in
   B (written outside the timed region), and the outputs of the timed launches are kept and
   compared with the fp64 reference of the B they saw (all of them when they fit in
   `TIMED_CHECK_BYTES`, else a random sample plus the last); the packed tensors must be unchanged.
   A kernel that caches outputs (by pointer, shape or content), or is correct only on its first
   calls, or lazier when called back to back, fails here.

On the interpreter backend the same steps run with wall-clock timing and
``timings_are_gpu=False``; those numbers say nothing about GPU speed.
"""
from __future__ import annotations

import hashlib
import time
from collections import OrderedDict

import numpy as np

from . import gpu_lock
from .candidate_spec import as_spec
from .results import BaselineTiming, BenchResult, VerifyResult


TIMED_CHECK_BYTES = 512 << 20
TIMED_SAMPLE = 8
REFERENCE_COLUMNS = 1024      # columns of B per fp64 reference product when checking timed launches


class BenchError(RuntimeError):
    """The candidate could not be benchmarked; ``result`` says why with the verify vocabulary
    (static_rejected, compile_error, runtime_error, crash, timeout, wrong_result, ...)."""

    def __init__(self, result: VerifyResult) -> None:
        super().__init__(f"{result.status}: {result.message}")
        self.result = result


def bench(candidate, matrix, n: int, *, dtype: str = "float16", backend: str = "auto",
          repeats: int = 50, warmup: int = 5, baselines=True, seed: int | None = None,
          timeout: float = 600.0, pool=None, check_static: bool = True, baseline_graphs: bool = False,
          recheck_baselines: bool = False, time_dense: bool = True,
          baseline_scope: str | None = None, chain: bool = False) -> BenchResult:
    """Time ``candidate`` on ``matrix`` @ B[K, n]. ``baselines`` is True (all), False (dense only),
    or a list of baseline names. ``time_dense=False`` skips dense cuBLAS (``dense`` and the
    speedups over it are None): for a caller that timed dense for this shape, dtype and N already
    (a batch times it once per shape, not once per layer). ``baseline_graphs`` also times the vendor baselines replayed from
    CUDA graphs; ``recheck_baselines`` re-checks each of them on a fresh B after timing (see
    `baselines.measure_baselines`). ``baseline_scope`` (a run id): the baselines are timed once per
    scope in the worker process and reused by every later bench of that scope there (the names in
    ``BenchResult.reused_baselines``); without it every bench times its own (an independent
    re-timing). ``seed=None`` draws a fresh one (the inputs of the timed launches must not be
    predictable). ``chain`` (GPU only) also times the candidate and dense cuBLAS chained: launches back
    to back from one CUDA graph, each on its own L2-cold copy of the weight (``candidate_chain``,
    ``dense_chain``), the cost of the layer inside a model's graph, without a lone replay's fixed cost;
    the chained outputs are checked like the timed ones. Raises `BenchError` when the candidate fails
    to run correctly."""
    from .baselines import check_names
    from .numerics import check_dtype
    from .sandbox import get_pool, resolve_backend
    from .static_checks import check_source
    from .timing import check_repeats
    from .verify import check_matrix, check_seed, fresh_seed, result_from_reply

    check_matrix(matrix)
    seed = check_seed(seed)
    seed = fresh_seed() if seed is None else seed
    if int(n) <= 0:
        raise ValueError(f"Expected a positive N, got {n!r}.")
    check_dtype(dtype)
    check_repeats(repeats, warmup)
    include = () if baselines is False else (None if baselines is True else check_names(baselines))
    spec = as_spec(candidate)
    exec_backend = resolve_backend(backend)
    common = dict(backend=exec_backend, gpu_timings=exec_backend == "cuda")
    if check_static and not spec.is_builtin:
        static = check_source(spec.source)
        if not static.ok:
            raise BenchError(VerifyResult(
                ok=False, status="compile_error" if static.syntax_error else "static_rejected",
                failure_class="syntax_error" if static.syntax_error else "static_violation",
                message="; ".join(static.violations[:6]), violations=static.violations, **common))
    if spec.backend == "cuda" and exec_backend != "cuda":
        raise BenchError(VerifyResult(ok=False, status="compile_error", failure_class="backend_unavailable",
                                      message="CUDA C++ (CuPy) candidates need a GPU", **common))
    payload = {"spec": spec, "matrix": matrix, "n": int(n), "dtype": dtype, "backend": exec_backend,
               "repeats": int(repeats), "warmup": int(warmup), "include": include, "seed": int(seed),
               "baseline_graphs": bool(baseline_graphs), "recheck_baselines": bool(recheck_baselines),
               "time_dense": bool(time_dense), "chain": bool(chain),
               "baseline_scope": None if baseline_scope is None else str(baseline_scope)}
    reply = get_pool(pool).call("bench", payload, backend=exec_backend, timeout=timeout)
    if reply.status == "ok" and "result" in reply.value:
        return BenchResult(**reply.value["result"])
    if reply.status == "ok":
        raise BenchError(VerifyResult(**reply.value["failure"]))
    raise BenchError(result_from_reply(reply, **common))


# ---- worker side ---------------------------------------------------------------------------------

def bench_task(payload: dict, wctx) -> dict:
    from .execution import CandidateFailure, failure_from_exception, load_candidate
    from .worker import is_sticky_cuda_error

    backend = payload["backend"]
    if backend == "cuda":
        gpu_lock.for_current_device()   # opened now, before any candidate scope (gpu_lock's docstring)
    start = time.perf_counter()
    try:
        module = load_candidate(payload["spec"], wctx)
        return {"result": _bench(module, payload, wctx).model_dump()}
    except Exception as exc:
        if isinstance(exc, CandidateFailure):
            failure = exc
        elif is_sticky_cuda_error(f"{type(exc).__name__}: {exc}"):
            failure = failure_from_exception(exc, "bench")  # an async fault of the candidate
        else:
            raise  # a harness bug: the pool reports it as an error reply
        return {"failure": VerifyResult(
            ok=False, status=failure.status, failure_class=failure.failure_class,
            message=failure.message, log=failure.log, seconds=time.perf_counter() - start,
            backend=backend, gpu_timings=backend == "cuda").model_dump()}


class _TimedInputs:
    """Fresh B contents before every launch of a timing loop, and the outputs kept for checking.

    ``before(i)`` runs outside the timed region: it writes new random values into B (the same
    buffer, so a CUDA graph sees them too) and remembers them when iteration i is sampled;
    ``after(i)`` copies the output of a sampled iteration aside. `check` compares every kept
    output with the fp64 reference of its B, after the timing loop (never while it runs)."""

    def __init__(self, B, out, dtype: str, rng: np.random.Generator, n_launches: int, matrix) -> None:
        import torch

        self.B, self.out, self.dtype, self.matrix = B, out, dtype, matrix
        per_launch = B.numel() * B.element_size() + out.numel() * out.element_size()
        if per_launch * n_launches <= TIMED_CHECK_BYTES:
            self.sampled = set(range(-n_launches, n_launches))
        else:
            picks = rng.choice(n_launches, size=min(TIMED_SAMPLE, n_launches), replace=False)
            self.sampled = set(int(p) for p in picks) | {n_launches - 1 - (n_launches // 2)}
        self.gen = torch.Generator(device=B.device)
        self.gen.manual_seed(int(rng.integers(0, 2 ** 62)))
        self.kept: list[tuple[int, object, object]] = []
        self._b = None

    def before(self, i: int) -> None:
        import torch

        with torch.no_grad():
            fresh = torch.rand(self.B.shape, generator=self.gen, device=self.B.device, dtype=torch.float32)
            self.B.copy_((fresh * 2 - 1).to(self.B.dtype))
        self._b = self.B.clone() if i in self.sampled else None

    def after(self, i: int) -> None:
        if self._b is not None:
            self.kept.append((i, self._b, self.out.clone()))
            self._b = None

    def check(self, values, label: str) -> list[str]:
        """Every kept output against the fp64 reference of its B. The kept B's go side by side into
        one product per REFERENCE_COLUMNS columns: a reference costs a densified fp64 A and index
        uploads whatever its width, and at N = 1 a timing keeps ~35 launches (H200: one bench of an
        11008x4096 weight took 57 s with one reference per launch)."""
        import torch

        from .numerics import Reference, compare

        problems: list[str] = []
        n = self.out.shape[1]
        per_chunk = max(1, REFERENCE_COLUMNS // max(1, n))
        for c0 in range(0, len(self.kept), per_chunk):
            chunk = self.kept[c0:c0 + per_chunk]
            b64 = np.concatenate([b.to(torch.float64).cpu().numpy() for _, b, _ in chunk], axis=1)
            ref = Reference.compute(self.matrix, values, b64, self.dtype)
            for j, (i, _, out) in enumerate(chunk):
                part = ref.columns(j * n, (j + 1) * n)
                cmp = compare(out.to(torch.float64).cpu().numpy(), part.value, part, what=f"{label} launch {i} output")
                if not cmp.ok:
                    problems.append(cmp.message)
                    break
            if problems:
                break
        self.kept.clear()
        return problems


def _bench(module, payload: dict, wctx) -> BenchResult:
    import torch

    from .baselines import BASELINE_NAMES, FreshInputs, measure_baselines
    from .execution import CandidateFailure, Snapshot, call_prepare, call_spmm, device_for, packed_nbytes, \
        run_candidate, synchronize
    from .numerics import Reference, compare, draw_dense, round_to_dtype, torch_dtype, with_values
    from .timing import LapClock, flush_buffer, time_cuda_graph, time_fn

    matrix, n, dtype, backend = payload["matrix"], payload["n"], payload["dtype"], payload["backend"]
    repeats, warmup = payload["repeats"], payload["warmup"]
    device = device_for(backend)
    tdtype = torch_dtype(dtype)
    on_gpu = backend == "cuda"
    notes: list[str] = []
    rng = np.random.default_rng(payload["seed"])
    candidate_module = getattr(module, "module", None)

    values = round_to_dtype(matrix.data, dtype)
    a = with_values(matrix, values, dtype)
    synchronize(device)
    stages = LapClock()
    packed = call_prepare(module, a, dtype, device, wctx)
    conversion_ms = stages.lap("prepare") * 1e3
    snapshot = run_candidate(wctx, "state snapshot", Snapshot.take, packed, candidate_module)
    a_bytes = run_candidate(wctx, "packed bytes", packed_nbytes, packed)

    m, k = matrix.shape
    b64 = draw_dense(rng, (k, n), dtype)
    B = torch.from_numpy(b64).to(device=device, dtype=tdtype)

    with gpu_lock.shared_section():   # never during another process's timing (gpu_lock)
        out = torch.full((m, n), float("nan"), dtype=tdtype, device=device)
        call_spmm(module, packed, B, out, device, wctx, source=getattr(module, "source", ""))
        got = out.to(torch.float64).cpu().numpy()
    ref = Reference.compute(matrix, values, b64, dtype)
    first = compare(got, ref.value, ref)
    if not first.ok:
        raise CandidateFailure("wrong_result", "wrong_values", f"N={n} (bench input): {first.message}")
    del ref
    stages.lap("first check")

    eager_inputs = _TimedInputs(B, out, dtype, rng, repeats + warmup, matrix)

    def run_eager():
        module.spmm(packed, B, out)

    candidate = run_candidate(wctx, "spmm (timing)", lambda: time_fn(
        run_eager, backend, repeats=repeats, warmup=warmup, before=eager_inputs.before, after=eager_inputs.after))
    timed_problems = eager_inputs.check(values, "eager")
    stages.lap("eager timing")

    candidate_graph = None
    if on_gpu:
        out_graph = torch.full((m, n), float("nan"), dtype=tdtype, device=device)
        graph_inputs = _TimedInputs(B, out_graph, dtype, rng, repeats + warmup, matrix)
        candidate_graph = _optional_timing(wctx, "spmm (graph timing)", lambda: time_cuda_graph(
            lambda: module.spmm(packed, B, out_graph), repeats=repeats, warmup=warmup,
            before=graph_inputs.before, after=graph_inputs.after),
            "CUDA graph capture of the candidate failed, eager timing kept", notes)
        if candidate_graph is not None:
            timed_problems += graph_inputs.check(values, "graph")
        stages.lap("graph timing")

    candidate_chain, copies_used = None, None
    if on_gpu and payload.get("chain") and candidate_graph is not None:
        why_not = _chain_refusal(packed, a_bytes)
        if why_not:
            notes.append(f"no chained timing: {why_not}")
        else:
            chained = _optional_timing(wctx, "spmm (chained timing)", lambda: _time_chained(
                module, packed, B, matrix, values, dtype, a_bytes, repeats, warmup),
                "chained timing of the candidate failed, single launches kept", notes)
            if chained is not None:
                candidate_chain, copies_used, chain_problems = chained
                timed_problems += chain_problems
        stages.lap("chained timing")

    # The baselines: dense (unless the caller has its time) and the vendor libraries asked for,
    # each measured here unless an earlier bench of the scope in this process did (ScopedBaselines).
    scoped = ScopedBaselines(payload, a, device)
    include = payload["include"]
    names = (["cublas_dense"] if payload.get("time_dense", True) else []) + \
        [b for b in (BASELINE_NAMES if include is None else include) if b != "cublas_dense"]
    missing = [b for b in names if scoped.get(b) is None]
    if missing:
        with torch.no_grad():   # the baselines see the bench input again (the timing loops overwrote B)
            B.copy_(torch.from_numpy(b64).to(device=device, dtype=tdtype))
        ref = Reference.compute(matrix, values, b64, dtype)
        fresh = FreshInputs(a, B, dtype, payload["seed"]) if payload.get("recheck_baselines") else None
        if "cublas_dense" in missing:
            dense_notes: list[str] = []
            timing, graph_timing, chain_timing = _time_dense(a, B, ref, m, n, tdtype, device, backend, repeats,
                                                             warmup, dense_notes, chain=bool(payload.get("chain")))
            entry = BaselineTiming(name="cublas_dense", ok=True, timing=timing, graph_timing=graph_timing,
                                   chain_timing=chain_timing, note=None if on_gpu else "CPU torch.matmul, not cuBLAS")
            if fresh is not None:
                entry.rechecked, entry.recheck_message = fresh.check("cublas_dense")
            scoped.put(entry, dense_notes)
            stages.lap("dense")
        others = [b for b in missing if b != "cublas_dense"]
        if others:
            for entry in measure_baselines(a, B, dtype, backend, ref=ref, repeats=repeats, warmup=warmup,
                                           include=others, graph=payload.get("baseline_graphs", False), fresh=fresh):
                scoped.put(entry)
            stages.lap("vendor baselines")
    baseline_results = []
    for name in names:
        entry, entry_notes = scoped.get(name)
        baseline_results.append(entry)
        notes += entry_notes
    dense_entry = baseline_results[0] if payload.get("time_dense", True) else None
    dense = dense_entry.timing if dense_entry is not None else None
    dense_graph = dense_entry.graph_timing if dense_entry is not None else None
    dense_chain = dense_entry.chain_timing if dense_entry is not None else None

    # Re-verification after timing: the outputs the timed launches wrote (checked above, one
    # reference per kept launch) and the packed state, which no launch may have changed.
    reverified, problems = not timed_problems, list(timed_problems)
    changed = run_candidate(wctx, "state check", snapshot.changed, packed, candidate_module)
    if changed:
        reverified = False
        problems.append(f"packed state changed during timing: {', '.join(changed[:5])}")
    stages.lap("state check")

    ok_baselines = [b for b in baseline_results if b.ok and b.timing is not None]
    best = min(ok_baselines, key=lambda b: b.timing.median_ms) if ok_baselines else None
    gpu_name = torch.cuda.get_device_name() if on_gpu else "cpu (Triton interpreter; not GPU timings)"
    return BenchResult(
        n=n, dtype=dtype, backend=backend, gpu_name=gpu_name, timings_are_gpu=on_gpu,
        candidate=candidate, candidate_graph=candidate_graph, candidate_chain=candidate_chain,
        chain_copies=copies_used, conversion_ms=conversion_ms, packed_bytes=a_bytes,
        dense=dense, dense_graph=dense_graph, dense_chain=dense_chain, baselines=baseline_results,
        speedup_vs_dense=_ratio(dense.median_ms, candidate.median_ms) if dense is not None else None,
        speedup_vs_dense_graph=(_ratio(dense_graph.median_ms, candidate_graph.median_ms)
                                if dense_graph is not None and candidate_graph is not None else None),
        speedup_vs_dense_chain=(_ratio(dense_chain.median_ms, candidate_chain.median_ms)
                                if dense_chain is not None and candidate_chain is not None else None),
        speedup_vs_best_baseline=_ratio(best.timing.median_ms, candidate.median_ms) if best else None,
        best_baseline=best.name if best else None,
        reverified=reverified, reverify_message="; ".join(problems) if problems else "outputs re-checked after timing",
        l2_flush_bytes=int(flush_buffer().numel() * 2) if on_gpu else 0, notes=notes,
        reused_baselines=scoped.reused, stage_seconds=stages.rounded())


_SCOPED_LIMIT = 64            # baseline timings a worker keeps (oldest dropped first)
_SCOPED: "OrderedDict[tuple, tuple[BaselineTiming, list[str]]]" = OrderedDict()


class ScopedBaselines:
    """The baselines of one bench call, timed once per ``baseline_scope`` in this worker process.

    Why: the profiler benchmarks every candidate of a run against the same baselines; dense cuBLAS
    and the vendor libraries do not change between candidates, so timing them beside each one
    only repeats the same measurement (and the vendor paths are candidates of their own in
    finalize). A timing is kept here, in the process that measured it, and reused by the later
    bench calls of the same scope: a speedup is always against a baseline timed in the process
    (and the run) that timed the candidate, by the same cold-L2 method. A worker replaced after a
    crash, a timeout or a tainting candidate starts empty, so its benches time the baselines again.

    Key: the scope, the baseline, what its time depends on (dense cuBLAS: the shape; a sparse
    library: the matrix itself, by content digest), dtype, N, backend, device and the timing
    settings. Only baselines that ran are kept (a failure is retried, never cached). The timings
    are plain numbers in harness memory that candidate code cannot reach (static checks and the
    audit hook, docs/security.md); each caller gets a copy."""

    def __init__(self, payload: dict, a, device) -> None:
        self.scope = payload.get("baseline_scope")
        self.reused: list[str] = []                         # names taken from an earlier bench
        self._own: dict[str, tuple[BaselineTiming, list[str]]] = {}
        self._common = (payload["dtype"], int(payload["n"]), payload["backend"], str(device),
                        int(payload["repeats"]), int(payload["warmup"]), bool(payload.get("baseline_graphs")),
                        bool(payload.get("recheck_baselines")))
        self._a = a
        self._digest: str | None = None

    def _key(self, name: str) -> tuple:
        if name == "cublas_dense":
            what = tuple(int(s) for s in self._a.shape)
        else:
            if self._digest is None:
                h = hashlib.sha256(repr((tuple(self._a.shape), self._a.dtype)).encode())
                for arr in (self._a.indptr, self._a.indices, self._a.data):
                    h.update(np.ascontiguousarray(arr).tobytes())
                self._digest = h.hexdigest()
            what = self._digest
        return (self.scope, name, what, *self._common)

    def get(self, name: str) -> tuple[BaselineTiming, list[str]] | None:
        """(timing, notes) of ``name``: measured by this call, else by an earlier bench of the
        scope in this process (then named in ``reused``); None when it must be measured."""
        if name in self._own:
            return self._own[name]
        if self.scope is None:
            return None
        hit = _SCOPED.get(self._key(name))
        if hit is None:
            return None
        self.reused.append(name)
        self._own[name] = (hit[0].model_copy(deep=True), list(hit[1]))
        return self._own[name]

    def put(self, entry: BaselineTiming, notes: list[str] | None = None) -> None:
        """This call's measurement of a baseline; kept for the scope when it ran."""
        self._own[entry.name] = (entry, list(notes or []))
        if self.scope is not None and entry.ok:
            _SCOPED[self._key(entry.name)] = (entry.model_copy(deep=True), list(notes or []))
            while len(_SCOPED) > _SCOPED_LIMIT:
                _SCOPED.popitem(last=False)


def _optional_timing(wctx, label: str, fn, failed: str, notes: list[str]):
    """run_candidate(fn) for a timing the bench can do without (a graph capture, the chained copies):
    a refusal (a cheat) still ends the bench; any other failure is noted and gives None."""
    import torch

    from .execution import CandidateFailure, run_candidate

    try:
        return run_candidate(wctx, label, fn)
    except CandidateFailure as failure:
        if failure.status == "refused":
            raise
        notes.append(f"{failed}: {failure.message[:300]}")
        torch.cuda.synchronize()
        return None


def _chain_refusal(packed, a_bytes) -> str | None:
    """Why the candidate cannot be timed chained (None when it can): its copies are made by
    timing.clone_packed, which walks a dict, and together must fit timing.CHAIN_MAX_BYTES."""
    from .timing import chain_fits

    if not isinstance(packed, dict):
        return f"prepare() returned a {type(packed).__name__}, not a dict the copies can be cloned from"
    if not a_bytes:
        return "the prepared matrix holds no tensor bytes to copy"
    if not chain_fits(a_bytes):
        return f"the prepared matrix ({a_bytes / 2**20:.0f} MiB) is too large to copy for a chained timing"
    return None


def _time_chained(module, packed: dict, B, matrix, values, dtype: str, a_bytes: int, repeats: int, warmup: int):
    """(Timing per launch, copies, problems): the candidate chained over L2-cold copies of its packed
    matrix, then the last chained output and a lone launch of the first copy checked against the
    fp64 reference of the B they read (a copy that computes something else is a wrong result)."""
    import torch

    from .numerics import Reference, compare
    from .timing import chain_copies, clone_packed, time_cuda_chain

    m, n = int(matrix.shape[0]), B.shape[1]
    copies = chain_copies(a_bytes)
    packs = [packed] + [clone_packed(packed) for _ in range(copies - 1)]
    out = torch.full((m, n), float("nan"), dtype=B.dtype, device=B.device)
    timing = time_cuda_chain([lambda p=p: module.spmm(p, B, out) for p in packs], repeats=repeats,
                             warmup=min(warmup, 3))
    lone = torch.full_like(out, float("nan"))
    module.spmm(packs[0], B, lone)
    torch.cuda.synchronize()
    ref = Reference.compute(matrix, values, B.to(torch.float64).cpu().numpy(), dtype)
    problems = []
    for what, got in (("chained launch (last copy)", out), ("first copy", lone)):
        cmp = compare(got.to(torch.float64).cpu().numpy(), ref.value, ref, what=what)
        if not cmp.ok:
            problems.append(cmp.message)
    del packs
    return timing, copies, problems


def _time_dense(a, B, ref, m: int, n: int, tdtype, device, backend: str, repeats: int, warmup: int,
                notes: list[str], chain: bool = False):
    """Dense torch.matmul on the densified A (eager, and on a GPU replayed from a CUDA graph and,
    with ``chain``, chained over L2-cold copies of the weight), checked against the fp64 reference
    (a disagreement is noted, not fatal)."""
    import torch

    from .numerics import compare
    from .timing import chain_copies, chain_fits, time_cuda_chain, time_cuda_graph, time_fn

    dense_a = a.to_torch(dtype=tdtype, device=device, layout="dense")
    out_dense = torch.empty((m, n), dtype=tdtype, device=device)
    dense = time_fn(lambda: torch.matmul(dense_a, B, out=out_dense), backend, repeats=repeats, warmup=warmup)
    dense_graph = None
    if backend == "cuda":
        try:
            dense_graph = time_cuda_graph(lambda: torch.matmul(dense_a, B, out=out_dense),
                                          repeats=repeats, warmup=warmup)
        except Exception as exc:
            notes.append(f"CUDA graph capture of dense matmul failed: {type(exc).__name__}: {exc}")
    dense_chain = None
    if backend == "cuda" and chain and dense_graph is not None and chain_fits(dense_a.nbytes):
        weights = [dense_a] + [dense_a.clone() for _ in range(chain_copies(dense_a.nbytes) - 1)]
        dense_chain = time_cuda_chain([lambda w=w: torch.matmul(w, B, out=out_dense) for w in weights],
                                      repeats=repeats, warmup=min(warmup, 3))
        del weights
    dense_check = compare(out_dense.to(torch.float64).cpu().numpy(), ref.value, ref, what="dense")
    if not dense_check.ok:
        notes.append(f"dense torch.matmul disagrees with the fp64 reference: {dense_check.message}")
    return dense, dense_graph, dense_chain


def _ratio(num: float, den: float) -> float:
    return float(num / den) if den > 0 else float("inf")
