"""The expert policy: the deterministic, no-LLM brain that runs on a fresh machine.

It plans like a performance engineer with a roofline in hand:

1. **Memory first.** An exact hit (same pattern signature, N bucket, dtype, GPU) is re-verified
   before anything else and, once verified, ends the search when it was found at about this N
   (each N within 2x of a stored one); a hit from farther along its bucket only goes first. A near
   neighbour's best template and parameters are tried first.
2. **Rank by the cost model, nudged by the pattern class.** Every applicable template comes with a
   roofline estimate at the main N on the target (bytes of A in its format + B + C over bandwidth,
   or flops over the relevant peak). The pattern class breaks near-ties the way the literature
   says it should (2:4 -> N:M compressed, blocks -> BSR on tensor cores, skewed rows -> nnz-balanced
   CSR, ...), since the cost model ignores load balance and launch shapes.
3. **Skip what cannot win.** A template whose estimate is far worse than dense's roofline is not
   worth a compile; when nothing is left, dense is the honest answer.
4. **Bounded autotuning.** Once a template has a measured time, try its neighbouring parameter
   values (one legal step in BLOCK_N / num_warps / ...), best estimate first.
5. **Stop** on budget, on a plateau (``plateau`` candidates without ``plateau_gain`` improvement),
   or when the best is within ``near_roofline`` of the best achievable roofline.

Interpreter timings (CPU) say nothing about GPU speed, so without GPU timings the policy neither
refines parameters nor applies the plateau/roofline tests: it walks the ranked template list.
"""
from __future__ import annotations

import json
import re
from typing import Any

from sparseditto.agents.policy import (
    CandidateSpec,
    CodingBrief,
    CodeProposal,
    Diagnosis,
    FailureReport,
    PlanDecision,
    PlanningInput,
    TriedCandidate,
)
from sparseditto.agents.records import params_key
from sparseditto.memory import found_at_this_n

# Failures that condemn a template for the rest of the run (not just one parameter set): the
# kernel computes the wrong thing, cheats, or kills its worker whatever the tile sizes.
FATAL_CLASSES = {"wrong_result", "unwritten_output", "unwritten", "input_modified", "unstable", "static_rejected",
                 "cheating", "crash", "timeout"}
# Parameters that set tile sizes / pipeline depth: shrinking them cuts shared memory and registers.
TILE_KEYS = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "BLOCK_SIZE", "BM", "BN", "BK", "TILE_M", "TILE_N", "TILE_K",
             "num_stages", "ROWS_PER_PROGRAM", "GROUP_SIZE")
# Parameters worth a neighbouring step when refining a measured template.
TUNE_KEYS = ("BLOCK_N", "num_warps", "BLOCK_M", "BLOCK_K", "num_stages", "ROWS_PER_PROGRAM", "SPLIT_K")

# Pattern class -> templates in the order the literature favours for it. The first gets the
# biggest nudge; templates not listed compete on their estimate alone.
PATTERN_PREFERENCES: dict[str, tuple[str, ...]] = {
    # tc_sp24 (mma.sp) measured 1.41-2.28x cuBLAS at N <= 16 on the H200 (session 25, chained and
    # lone replay), nm_compressed ~1.1x; at N >= 64 its measured floor puts its estimate past
    # DENSE_MARGIN and the rule skips it (0.67x cuBLAS there)
    "nm": ("tc_sp24", "nm_compressed", "nm_cusparselt", "bitmap_tiles", "csr_rowsplit"),
    "nm_2_4": ("tc_sp24", "nm_compressed", "nm_cusparselt", "bitmap_tiles"),
    "block": ("bsr_tc", "blocked_ell", "bitmap_tiles"),
    "row_pruned": ("compact_rows_cols", "csr_rowsplit"),
    "column_pruned": ("compact_rows_cols", "bitmap_tiles"),
    "power_law": ("csr_balanced", "csr_rowsplit"),
    "banded": ("bsr_tc", "csr_rowsplit", "bitmap_tiles"),
}
NUDGE = (0.7, 0.85, 0.95)
DENSE_STREAM_MAX_N = 32  # tc_dense beats cuBLAS only at skinny N (decode)
DELTA_MAX_N = 4          # delta_spmv: measured ahead of cuBLAS at N <= 4 from 45% (16-bit B copy)
# the per-nonzero CUDA kernels at N <= 8 on >= 85% sparse weights: H200, session 29, chained x cuBLAS at
# N = 8, 90% per-row magnitude, 4096x4096 / 11008x4096 / 4096x11008: csr_vector 1.36 / 1.27 / 1.35x,
# delta_spmv 1.68 / 1.35 / 0.45x (K = 11008 rows of B fill its shared memory), tc_lanemask 1.08 / 1.06 /
# 0.97x; at 70% all three stay below cuBLAS (0.38-0.90x), at N = 16 none passes 1.03x
PER_NONZERO_MAX_N = 8
# tc_words ahead of the dense stream from this sparsity (N 5-16): at 50% it keeps 3/4 of the words and
# measured 0.85-1.03x cuBLAS (session 34), the dense stream ~1.0-1.1x; at 70% 1.03-1.19x
WORDS_FIRST_SPARSITY = 0.6
WORDS_MEASURED_N = 16     # tc_words goes first only up to the widest N measured (N = 17-32: second)
# ... and, on weights with K >= WORDS_LONG_K at N > PER_NONZERO_MAX_N below 85%, second behind the dense
# stream: on 4096x11008 at N = 16 each CTA stages a long B slice (58-62 KB of shared memory) and tc_words
# measured 0.80-0.84x cuBLAS at 50-70% (session 34) and 0.75 / 0.83x (session 35, any SPLIT / WARPS)
WORDS_LONG_K = 8192
DELTA_SECOND = ("block", "row_pruned", "column_pruned", "banded")   # patterns it is explored second on
BLOCK_SPMV_MAX_N = 8      # bsr_spmv: block patterns at decode N (explored second, after bsr_tc)
# graphs and meshes: the row-decomposed CUDA CSR kernel (items of <= CHUNK nonzeros, hub rows split, lane
# groups per short row) goes first on power-law and banded rows from N = 8, and on >= 95%-sparse
# unstructured matrices above ROWDECOMP_FIRST_N
ROWDECOMP_MIN_N = 8
ROWDECOMP_FIRST_N = 32   # unstructured >= 95%: csr_rowdecomp first above this N, second from N = 9
ROWDECOMP_PATTERNS = ("power_law", "banded")
DENSE_MARGIN = 1.25      # skip templates estimated slower than 1.25x dense's roofline
EXPLORE_TEMPLATES = 2    # distinct templates to measure before refining the best one
GRID_REFINEMENTS = 2     # planned parameter sets tried for a best template with no tile parameter to step


def pattern_preferences(report: dict, n: int) -> tuple[str, ...]:
    """Templates the pattern class points to, most natural first (see PATTERN_PREFERENCES)."""
    pattern = str(report.get("pattern") or "unstructured")
    if pattern.startswith("nm") and not fits_sparse_mma(report):
        # n:m the sparse MMA cannot take exactly (4:8 keeping 3 + 1 in a group's halves) plans like
        # unstructured weights of its sparsity: in session 39's llm suite (H200) the 4:8 weights' winners
        # were the unstructured ones (delta_spmv at N = 1: 12.6 / 21.6 us, 1.28x / 1.29x cuBLAS; tc_words at
        # N = 16, level with cuBLAS), and nm_compressed, first there, took 208-237 us (`pattern_exclusions`)
        pattern = "unstructured"
    if pattern in ROWDECOMP_PATTERNS and n >= ROWDECOMP_MIN_N:
        return ("csr_rowdecomp",) + PATTERN_PREFERENCES[pattern]
    if pattern in PATTERN_PREFERENCES:
        prefs = PATTERN_PREFERENCES[pattern]
        second = pattern in DELTA_SECOND
        if n <= DELTA_MAX_N and second and "delta_spmv" not in prefs:
            # the decode SpMV reads 2.5 B per fp16 nonzero on any pattern; measured ahead of
            # cuBLAS at N <= 4 on unstructured and 2:4 weights, not yet on these: explored second
            prefs = prefs[:1] + ("delta_spmv",) + prefs[1:]
        if pattern == "block" and n <= BLOCK_SPMV_MAX_N:
            # H200 llm suite (session 39), block-32 75% at N = 1: bsr_tc 16.4 / 18.0 us on 4096x4096 /
            # 11008x4096 (cuBLAS 16.0 / 27.5), delta_spmv 22.4 / 27.1; bsr_spmv (session 41, written for
            # this, not yet measured) reads the blocks at N <= 8 without the tensor cores' 16 columns:
            # explored second, ahead of the per-nonzero kernel
            prefs = prefs[:1] + ("bsr_spmv",) + prefs[1:]
        return prefs
    sparsity = float(report.get("sparsity") or 0.0)
    if pattern == "unstructured" or pattern not in ("dense", "near_dense"):
        # H200, fp16, Llama shapes, read-flushed L2 (docs/kernels.md, delta_spmv, session 20): the
        # delta-coded CUDA-core SpMV is the fastest measured kernel at N <= 4 from 50%
        # (11008x4096, N = 1 / 2 / 4: 1.08 / 1.70 / 1.25x cuBLAS at 50%, 1.5 / 2.1 / 1.65x at 70%).
        # tc_words (kept fragment words through a blob ring, session 34), chained x cuBLAS at N = 1 / 8 / 16
        # on 4096x4096 / 11008x4096: 0.97-1.03 / 0.85-0.87x at 50%, 1.09-1.19 / 1.03-1.09x at 70%,
        # 1.30-1.39 / 1.26-1.39x at 90%: the first sparse kernel here above cuBLAS at 70% and N = 16,
        # level with csr_vector at 90% and N = 8 (1.32-1.39x), ahead of everything at 90% and N = 16
        if sparsity >= 0.85 and n <= DELTA_MAX_N:
            return ("delta_spmv", "tc_words", "csr_rowsplit", "tc_bitmap", "csr_balanced")
        if sparsity >= 0.85 and n <= PER_NONZERO_MAX_N:
            return ("csr_vector", "tc_words", "delta_spmv", "csr_rowsplit")
        if sparsity >= 0.45 and n <= DELTA_MAX_N:
            return ("delta_spmv", "tc_words", "tc_dense", "bitmap_tiles", "csr_rowsplit")
        # H200, fp32, session 30 (benchmarks/graph_kernels.py) on the unstructured SuiteSparse files: at
        # N = 32 the Triton row split was ahead on 2 of 3 (dnn 6.6 vs 8.3 us, pushpull 10.9 vs 11.2), at
        # N = 128 csr_rowdecomp on 3 of 3 (dnn 8.3 vs 8.8, pushpull 17.1 vs 24.4, cryg2500 6.1 vs 12.5)
        if sparsity >= 0.95 and n > ROWDECOMP_FIRST_N:
            return ("csr_rowdecomp", "csr_rowsplit", "csr_balanced", "bitmap_tiles")
        if sparsity >= 0.95 and n > PER_NONZERO_MAX_N:
            return ("csr_rowsplit", "csr_rowdecomp", "csr_balanced", "bitmap_tiles")
        if sparsity >= 0.95:
            return ("csr_rowsplit", "csr_balanced", "bitmap_tiles")
        # H200, fp16, 4096x4096 / 11008x4096 (docs/benchmarks.md): at 85-95% and small N the row-split
        # CSR kernels and the tensor-core bitmap are the ones that beat cuBLAS (1.1-1.8x at N = 1);
        # at 50-85% the dense stream (1.0-1.1x) was the best bet until tc_words (session 34, above),
        # which leads from 60% where it was measured (N <= 16).
        if sparsity >= 0.85 and n <= WORDS_MEASURED_N:
            return ("tc_words", "csr_rowsplit", "tc_bitmap", "csr_balanced", "bitmap_tiles")
        if sparsity >= 0.85 and n <= DENSE_STREAM_MAX_N:
            return ("csr_rowsplit", "tc_words", "tc_bitmap", "csr_balanced", "bitmap_tiles")
        long_k = int((report.get("shape") or (0, 0))[1]) >= WORDS_LONG_K and n > PER_NONZERO_MAX_N
        if sparsity >= WORDS_FIRST_SPARSITY and n <= WORDS_MEASURED_N and not long_k:
            return ("tc_words", "tc_dense", "bitmap_tiles", "csr_rowsplit", "csr_balanced")
        if sparsity >= 0.5 and n <= DENSE_STREAM_MAX_N:
            return ("tc_dense", "tc_words", "bitmap_tiles", "csr_rowsplit", "csr_balanced")
        if sparsity >= 0.5 and n <= 64:
            return ("bitmap_tiles", "csr_rowsplit", "csr_balanced")
        return ("csr_rowsplit", "bitmap_tiles", "csr_balanced")
    return ()


def pattern_exclusions(report: dict) -> dict[str, str]:
    """{template: why} for templates measured far behind cuBLAS on this pattern class: never planned
    there (the planner names them among what it skipped)."""
    pattern = str(report.get("pattern") or "")
    if pattern.startswith("nm") and not fits_sparse_mma(report):
        return {"nm_compressed": ("n:m outside the sparse MMA's 2:4 (4:8): measured 208-237 us against cuBLAS's "
                                  "16-29 us on the H200 (llm suite, session 39, N = 1 and 16)")}
    return {}


def fits_sparse_mma(report: dict) -> bool:
    """Every group of 4 along the rows keeps at most 2 values (the analyzer's 2:4 row conformance is
    exact): what tc_sp24's mma.sp takes. A report without the field is given the benefit of the doubt."""
    conformance = (report.get("nm_conformance") or {}).get("2:4")
    return conformance is None or float(conformance.get("row", 0.0)) >= 1.0


def is_dense_pattern(report: dict) -> bool:
    pattern = str(report.get("pattern") or "")
    density = float(report.get("density") or 0.0)
    return pattern in ("dense", "near_dense") or density >= 0.9


class ExpertPolicy:
    """Rules + roofline cost model + memory priors + bounded autotuning. Deterministic."""

    name = "expert"

    def __init__(self, near_roofline: float = 0.8, plateau: int = 2, plateau_gain: float = 0.03,
                 explore_templates: int = EXPLORE_TEMPLATES):
        if not 0.0 < near_roofline <= 1.0:
            raise ValueError(f"near_roofline must be in (0, 1], got {near_roofline}.")
        if plateau < 1:
            raise ValueError(f"plateau must be >= 1 candidate, got {plateau}.")
        self.near_roofline = float(near_roofline)
        self.plateau = int(plateau)
        self.plateau_gain = float(plateau_gain)
        self.explore_templates = int(explore_templates)

    # ---- plan ---------------------------------------------------------------------------------
    def plan(self, inp: PlanningInput) -> PlanDecision:
        tried = {params_key(t.template, t.params) for t in inp.tried}
        gpu_timings = bool(inp.target.get("timings_are_gpu", True))
        n = int(inp.n_values[0]) if inp.n_values else 16
        report = inp.report

        if inp.budget_left <= 0:
            return self._stop(f"budget exhausted after {len(inp.tried)} candidate(s)", inp)

        exact = next((h for h in inp.memory_hits if h.get("kind") == "exact"), None)
        if exact is not None:
            decision = self._exact_hit(exact, inp, tried)
            if decision is not None:
                return decision

        if gpu_timings and inp.best is not None:
            stop = self._convergence(inp)
            if stop:
                return self._stop(stop, inp)

        if is_dense_pattern(report) and not inp.tried:
            stream = self._dense_stream(inp, n)
            if stream is not None:
                return PlanDecision(action="try", candidates=[stream], rationale=stream.rationale)
            return self._stop(
                f"pattern '{report.get('pattern')}' at density {float(report.get('density') or 0):.2f}: "
                "no sparse format reads fewer bytes than dense, so cuBLAS dense is the answer", inp)

        ranked, skipped = self._rank(inp, n)
        if not ranked:
            why = "; ".join(skipped[:3]) if skipped else "no applicable template"
            return self._stop(f"nothing left worth trying ({why}); dense stays", inp)

        plan: list[CandidateSpec] = []
        seen = set(tried)

        def add(spec: CandidateSpec) -> None:
            key = params_key(spec.template, spec.params)
            if key not in seen:
                seen.add(key)
                plan.append(spec)

        # Neighbour prior: the closest remembered pattern's winner goes first.
        neighbour = self._neighbour_prior(inp, ranked)
        if neighbour is not None:
            add(neighbour)

        failed_templates = self._failed_templates(inp.tried)
        explore = [self._first_spec(t, ranked_pos, inp) for ranked_pos, t in enumerate(ranked)
                   if t["name"] not in {x.template for x in inp.tried} and t["name"] not in failed_templates]
        refine = self._refinements(inp, ranked) if (gpu_timings and inp.best is not None) else []

        distinct_measured = {t.template for t in inp.tried if t.status == "verified"}
        if len(distinct_measured) < self.explore_templates:
            head = self.explore_templates - len(distinct_measured)
            for spec in explore[:head]:
                add(spec)
            for spec in refine:
                add(spec)
            for spec in explore[head:]:
                add(spec)
        else:
            for spec in refine:
                add(spec)
            for spec in explore:
                add(spec)
        # Last resort: other grid points of templates that verified but were never refined
        # (interpreter runs never refine, so this is what keeps a big budget busy there).
        if not plan:
            for t in ranked:
                if t["name"] in failed_templates:
                    continue
                for g in t.get("grid") or []:
                    add(CandidateSpec(template=t["name"], params=dict(g["params"]), expected_ms=g.get("estimate_ms"),
                                      rationale=f"{t['name']} at another grid point "
                                                f"(estimate {_fmt_ms(g.get('estimate_ms'))})"))
        if not gpu_timings and inp.best is not None:
            # Without GPU timings the cost model makes the final choice, so a candidate whose
            # estimate is no better than the verified best's can never be chosen: skip it.
            best_est = self._estimate_of(inp, inp.best.template, inp.best.params)
            if best_est is not None:
                plan = [s for s in plan if s.expected_ms is not None and s.expected_ms < best_est * 0.99]
                if not plan:
                    return self._stop(
                        f"no GPU timings here, so the roofline cost model decides: verified {inp.best.template} "
                        f"already has the lowest estimate ({_fmt_ms(best_est)}) of what is left", inp)
        if not plan:
            return self._stop("every applicable template and parameter set has been tried", inp)
        plan = plan[: max(inp.budget_left, 1)]
        first = plan[0]
        rationale = first.rationale or f"try {first.template}"
        if len(plan) > 1:
            rationale += f"; then {', '.join(s.template for s in plan[1:4])}"
        return PlanDecision(action="try", candidates=plan, rationale=rationale)

    @staticmethod
    def _estimate_of(inp: PlanningInput, template: str, params: dict) -> float | None:
        for t in inp.templates:
            if t.get("name") != template:
                continue
            for g in t.get("grid") or []:
                if params_key(template, g.get("params")) == params_key(template, params):
                    return g.get("estimate_ms")
            return t.get("estimate_ms")
        return None

    @staticmethod
    def _dense_stream(inp: PlanningInput, n: int) -> CandidateSpec | None:
        """A (near-)dense weight at skinny N: the streaming dense kernel can still beat cuBLAS (which
        reads decode-size weights at ~43-63% of the bandwidth on the H200); only with GPU timings."""
        if n > DENSE_STREAM_MAX_N or not bool(inp.target.get("timings_are_gpu", True)):
            return None
        t = next((x for x in inp.templates if x.get("name") == "tc_dense"), None)
        if t is None:
            return None
        grid = t.get("grid") or []
        params = dict(grid[0]["params"]) if grid else dict(t.get("default_params") or {})
        return CandidateSpec(template="tc_dense", params=params, expected_ms=t.get("estimate_ms"),
                             rationale=f"dense pattern at N = {n}: try the dense stream (tc_dense, "
                                       f"estimate {_fmt_ms(t.get('estimate_ms'))}) against cuBLAS")

    def _stop(self, why: str, inp: PlanningInput) -> PlanDecision:
        return PlanDecision(action="stop", candidates=[], rationale=why)

    def _exact_hit(self, exact: dict, inp: PlanningInput, tried: set) -> PlanDecision | None:
        template = exact.get("template") or "dense"
        params = exact.get("params") or {}
        settled = found_at_this_n(exact.get("n_values"), inp.n_values)
        if not settled and (template == "dense" or exact.get("origin") == "vendor"):
            return None   # found at another N of the bucket: search; finalize times dense and vendors anyway
        if template == "dense" or exact.get("origin") == "vendor":
            return self._stop(
                f"memory exact hit (run {exact.get('run_id', '?')}): {template} was best for this pattern, "
                f"{exact.get('reason') or 'no sparse kernel beat it'}", inp)
        key = params_key(template, params)
        if key not in tried:
            spec = CandidateSpec(
                template=template, params=params, source=exact.get("source"), origin="memory",
                expected_ms=exact.get("median_ms"),
                rationale=(f"memory exact hit: {template} {_fmt_params(params)} was best for this pattern "
                           f"(speedup {_fmt_x(exact.get('speedup_vs_dense'))} on {exact.get('gpu', '?')}); "
                           + ("re-verify it first" if settled else
                              f"found at N = {_fmt_ns(exact.get('n_values'))}: re-verify it first, then search "
                              f"at N = {_fmt_ns(inp.n_values)}")))
            return PlanDecision(action="try", candidates=[spec], rationale=spec.rationale)
        mine = next((t for t in inp.tried if params_key(t.template, t.params) == key), None)
        if mine is not None and mine.status == "verified" and settled:
            timing = f" ({_fmt_ms(mine.median_ms)})" if inp.target.get("timings_are_gpu", True) else ""
            return self._stop(f"memory exact hit {template} re-verified{timing}; the earlier search already "
                              "covered this pattern", inp)
        return None  # failed here, or verified at an N far from the hit's: search on from it

    def _convergence(self, inp: PlanningInput) -> str | None:
        best = inp.best
        if best.median_ms and inp.roofline_ms and best.median_ms <= inp.roofline_ms / self.near_roofline:
            return (f"best {best.template} at {_fmt_ms(best.median_ms)} is within "
                    f"{self.near_roofline:.0%} of the best roofline ({_fmt_ms(inp.roofline_ms)})")
        if best.pct_of_roofline is not None and best.pct_of_roofline >= self.near_roofline * 100:
            rival = self._untried_rival(inp)
            if rival is None:
                return (f"best {best.template} runs at {best.pct_of_roofline:.0f}% of its cost-model bound "
                        f"(>= {self.near_roofline:.0%})")
        timed = [t.median_ms for t in inp.tried if t.status == "verified" and t.median_ms]
        if len(timed) > self.plateau:
            running = timed[0]
            since = 0
            for ms in timed[1:]:
                if ms < running * (1.0 - self.plateau_gain):
                    running, since = ms, 0
                else:
                    since += 1
                    running = min(running, ms)
            if since >= self.plateau:
                return (f"plateau: the last {since} candidates improved less than "
                        f"{self.plateau_gain:.0%} on {_fmt_ms(running)}")
        return None

    def _untried_rival(self, inp: PlanningInput) -> str | None:
        """An untried template of the pattern's preferences whose estimate, on the GPU that measures, is
        below the best measured time.

        "The best runs near its own bound" says that template cannot get faster, not that no other
        one can: on 11008x4096 at 70% and N = 1 (H200, session 39's llm suite) a memory prior put
        tc_words first, it measured 23.4 us at 83% of its bound and the search stopped, while
        delta_spmv (estimate 10.9 us, measured ~15.6-17.4 us there in session 21) was never tried.
        The estimates are on the plan target; the best's own bound on the measuring GPU
        (pct_of_roofline x its time) over its plan-target estimate rescales them."""
        best = inp.best
        if not best.median_ms:
            return None
        best_est = self._estimate_of(inp, best.template, best.params)
        scale = 1.0
        if best_est and best.pct_of_roofline:
            scale = best.pct_of_roofline / 100.0 * best.median_ms / best_est
        tried = {t.template for t in inp.tried}
        failed = self._failed_templates(inp.tried)
        # only templates the pattern class points to: a raw roofline estimate of one it does not (nm_compressed's
        # 15.7 us on an unstructured 70% weight at N = 16, no expand cost in it) is no reason to search on
        prefs = pattern_preferences(inp.report, int(inp.n_values[0]) if inp.n_values else 16)
        bar = best.median_ms * (1.0 - self.plateau_gain)
        rivals = [(t["estimate_ms"] * scale, t["name"]) for t in inp.templates
                  if t.get("name") in prefs and t.get("name") not in tried and t.get("name") not in failed
                  and t.get("estimate_ms") is not None and t["estimate_ms"] * scale < bar]
        return min(rivals)[1] if rivals else None

    def _rank(self, inp: PlanningInput, n: int) -> tuple[list[dict], list[str]]:
        dense = next((t for t in inp.templates if t.get("name") == "dense"), None)
        dense_est = dense.get("estimate_ms") if dense else None
        prefs = pattern_preferences(inp.report, n)
        failed = self._failed_templates(inp.tried)
        excluded = pattern_exclusions(inp.report)
        scored, skipped = [], []
        for t in inp.templates:
            name = t.get("name")
            if name == "dense" or t.get("builtin"):
                continue
            if name in excluded:
                skipped.append(f"{name}: {excluded[name]}")
                continue
            if name in failed:
                skipped.append(f"{name}: failed earlier ({failed[name]})")
                continue
            est = t.get("estimate_ms")
            if est is None:
                continue
            if dense_est and est > dense_est * DENSE_MARGIN:
                skipped.append(f"{name}: estimate {_fmt_ms(est)} vs dense {_fmt_ms(dense_est)}")
                continue
            nudge = NUDGE[prefs.index(name)] if name in prefs[: len(NUDGE)] else 1.0
            scored.append((est * nudge, name, t))
        scored.sort(key=lambda x: (x[0], x[1]))
        return [t for _, _, t in scored], skipped

    def _first_spec(self, t: dict, pos: int, inp: PlanningInput) -> CandidateSpec:
        grid = t.get("grid") or []
        params = dict(grid[0]["params"]) if grid else dict(t.get("default_params") or {})
        est = grid[0].get("estimate_ms") if grid else t.get("estimate_ms")
        prefs = pattern_preferences(inp.report, int(inp.n_values[0]) if inp.n_values else 16)
        why = f"{t['name']}: roofline estimate {_fmt_ms(est)}"
        dense = next((x for x in inp.templates if x.get("name") == "dense"), None)
        if dense and dense.get("estimate_ms") and est:
            why += f" vs dense {_fmt_ms(dense['estimate_ms'])}"
        if t["name"] in prefs:
            why += f", natural fit for pattern '{inp.report.get('pattern')}'"
        if t.get("bound"):
            why += f" ({t['bound']}-bound)"
        return CandidateSpec(template=t["name"], params=params, expected_ms=est, rationale=why)

    def _neighbour_prior(self, inp: PlanningInput, ranked: list[dict]) -> CandidateSpec | None:
        names = {t["name"] for t in ranked}
        tried_templates = {t.template for t in inp.tried}
        for hit in inp.memory_hits:
            if hit.get("kind") != "neighbour":
                continue
            template = hit.get("template")
            if not template or template == "dense" or template not in names or template in tried_templates:
                continue
            est = next((t.get("estimate_ms") for t in ranked if t["name"] == template), None)
            return CandidateSpec(
                template=template, params=dict(hit.get("params") or {}), origin="memory", expected_ms=est,
                rationale=(f"memory neighbour '{hit.get('matrix_name', '?')}' ({hit.get('pattern', '?')}, "
                           f"distance {float(hit.get('distance') or 0):.3f}) was fastest with {template} "
                           f"{_fmt_params(hit.get('params') or {})}"))
        return None

    @staticmethod
    def _failed_templates(tried: list[TriedCandidate]) -> dict[str, str]:
        """Templates to drop: one fatal failure, or two failures of any kind."""
        counts: dict[str, int] = {}
        out: dict[str, str] = {}
        for t in tried:
            if t.status == "verified":
                continue
            cls = t.failure_class or t.status
            counts[t.template] = counts.get(t.template, 0) + 1
            if cls in FATAL_CLASSES or counts[t.template] >= 2:
                out[t.template] = cls
        return out

    def _refinements(self, inp: PlanningInput, ranked: list[dict]) -> list[CandidateSpec]:
        """Neighbouring parameter values of the best measured template, best estimate first."""
        best = inp.best
        t = next((x for x in ranked if x["name"] == best.template), None)
        if t is None:
            return []
        legal: dict[str, list] = t.get("params") or {}
        estimates = {json.dumps(g["params"], sort_keys=True, default=str): g.get("estimate_ms")
                     for g in t.get("grid") or []}
        out = []
        for key in TUNE_KEYS:
            if key not in best.params or key not in legal:
                continue
            current = best.params[key]
            # Only concrete numbers have neighbours: "auto" resolves inside the kernel.
            values = [v for v in legal[key] if isinstance(v, (int, float)) and not isinstance(v, bool)]
            if isinstance(current, bool) or not isinstance(current, (int, float)) or current not in values:
                continue
            values.sort()
            i = values.index(current)
            for j in (i - 1, i + 1):
                if 0 <= j < len(values):
                    params = dict(best.params, **{key: values[j]})
                    est = estimates.get(json.dumps(params, sort_keys=True, default=str), best.median_ms)
                    out.append(CandidateSpec(
                        template=best.template, params=params, expected_ms=est,
                        rationale=(f"refine best {best.template} ({_fmt_ms(best.median_ms)}): "
                                   f"{key} {best.params[key]} -> {values[j]}")))
        out.sort(key=lambda s: (s.expected_ms if s.expected_ms is not None else float("inf")))
        if not out:
            # no tile parameter to step (delta_spmv's launch shape is set by its packing): the
            # template's own planned parameter sets, in its planning module's order
            tried = {params_key(x.template, x.params) for x in inp.tried}
            untried = [g for g in t.get("grid") or [] if params_key(best.template, g["params"]) not in tried]
            out = [CandidateSpec(template=best.template, params=dict(g["params"]), expected_ms=g.get("estimate_ms"),
                                 rationale=f"refine best {best.template} ({_fmt_ms(best.median_ms)}): its planned "
                                           f"parameter set {_changed(t.get('default_params') or {}, g['params'])}")
                   for g in untried[:GRID_REFINEMENTS]]
        return out

    # ---- code ---------------------------------------------------------------------------------
    def code(self, spec: CandidateSpec, template_source: str, feedback: str | None = None,
             brief: CodingBrief | None = None) -> CodeProposal:
        if spec.source:
            return CodeProposal(source=spec.source, origin=spec.origin,
                                rationale=f"reuse the given {spec.template} source ({spec.origin})")
        from sparseditto.kernel_templates.registry import get_template

        cand = get_template(spec.template).instantiate(spec.params)
        origin = spec.origin if spec.origin != "llm" else "template"
        return CodeProposal(source=cand.source, origin=origin,
                            rationale=f"instantiate template {spec.template} with {_fmt_params(spec.params)}")

    # ---- diagnose -----------------------------------------------------------------------------
    def diagnose(self, failure: FailureReport, source: str) -> Diagnosis:
        status = (failure.status or "").lower()
        text = f"{failure.message}\n{failure.log}".lower()
        if failure.failure_class == "backend_unavailable":
            return Diagnosis(failure_class="backend_unavailable", action="give_up",
                             rationale=f"this machine cannot run it ({_first_line(failure.message)}); "
                                       "a fact of the execution backend, not a bug of the source")
        if status in ("static_rejected", "cheating") or "static check" in text:
            return Diagnosis(failure_class="static_rejected", action="give_up",
                             rationale=f"static checks rejected the source ({_first_line(failure.message)}); "
                                       "not fixable by tuning")
        if _is_resource_overflow(text):
            smaller = self._smaller_tiles(failure.template, failure.params)
            if smaller is not None:
                changed = ", ".join(f"{k} {failure.params.get(k)}->{v}" for k, v in smaller.items()
                                    if failure.params.get(k) != v)
                return Diagnosis(failure_class="shared_memory_overflow", action="retry_params", params=smaller,
                                 rationale=f"out of on-chip resources; retry with smaller tiles ({changed})")
            return Diagnosis(failure_class="shared_memory_overflow", action="switch_template",
                             rationale="out of on-chip resources at the smallest legal tiles; try another template")
        if status in ("compile_error", "compile_failed") or "compil" in status:
            return Diagnosis(failure_class="compile_error", action="switch_template",
                             rationale=f"does not compile ({_first_line(failure.message)}); try another template")
        for cls in ("wrong_result", "unwritten_output", "unwritten", "input_modified", "unstable"):
            if status == cls:
                return Diagnosis(failure_class=cls, action="give_up",
                                 rationale=f"{cls.replace('_', ' ')}: {_first_line(failure.message)}; "
                                           "a correctness bug, not a tuning problem")
        if status in ("timeout",) or "timed out" in text:
            return Diagnosis(failure_class="timeout", action="give_up",
                             rationale="the worker timed out; give up on this candidate")
        if status in ("crash", "illegal_address", "worker_died") or "illegal" in text or "segmentation" in text:
            return Diagnosis(failure_class="crash", action="give_up",
                             rationale=f"the worker crashed ({_first_line(failure.message)}); give up")
        if status == "runtime_error":
            return Diagnosis(failure_class="runtime_error", action="give_up",
                             rationale=f"prepare()/spmm() raised ({_first_line(failure.message)}); "
                                       "drop this parameter set")
        if "wrong" in status or "mismatch" in text:
            return Diagnosis(failure_class="wrong_result", action="give_up",
                             rationale=f"numeric mismatch: {_first_line(failure.message)}")
        return Diagnosis(failure_class=status or "unknown", action="give_up",
                         rationale=f"unclassified failure '{status}': {_first_line(failure.message)}")

    @staticmethod
    def _smaller_tiles(template: str, params: dict) -> dict | None:
        """Same parameters with every tile size one legal step smaller (None when none can shrink)."""
        from sparseditto.kernel_templates.registry import get_template

        try:
            legal = get_template(template).params
        except ValueError:   # not a registry template (an LLM's own kernel): nothing to shrink
            return None
        out, changed = dict(params), False
        for key in TILE_KEYS:
            if key not in params or key not in legal:
                continue
            values = [v for v in legal[key] if isinstance(v, (int, float)) and not isinstance(v, bool)]
            smaller = sorted(v for v in values if v < params[key]) if isinstance(params[key], (int, float)) else []
            if smaller:
                out[key] = smaller[-1]
                changed = True
        return out if changed else None


def _is_resource_overflow(text: str) -> bool:
    return bool(re.search(r"out of resource|shared memory|smem|too many resources|register", text))


def _first_line(text: str | None, limit: int = 160) -> str:
    for line in (text or "").splitlines():
        line = line.strip()
        if line:
            return line[:limit]
    return "no message"


def _changed(defaults: dict, params: dict) -> str:
    """'LANES=16' for the parameters that differ from the defaults ('the defaults' when none do)."""
    diff = [f"{k}={v}" for k, v in sorted(params.items()) if defaults.get(k) != v]
    return ", ".join(diff) or "the defaults"


def _fmt_ms(ms: Any) -> str:
    if ms is None:
        return "?"
    ms = float(ms)
    return f"{ms * 1000:.1f} us" if ms < 1.0 else f"{ms:.3f} ms"


def _fmt_x(x: Any) -> str:
    return "?" if x is None else f"{float(x):.2f}x"


def _fmt_ns(values: Any) -> str:
    return ", ".join(str(v) for v in values or []) or "?"


def _fmt_params(params: dict) -> str:
    return "{" + ", ".join(f"{k}={v}" for k, v in sorted((params or {}).items())) + "}"
