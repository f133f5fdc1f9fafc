"""The kernel template library: discovery, applicability, parameter grids, cost and instantiation.

Why a registry of *files*: every template is a self-contained candidate source
(`kernel_templates/triton/<name>.py`, or `kernel_templates/cuda/<name>.py` + `<name>.cu`) whose
`META` dict literal says what it is. The registry reads META with `ast.literal_eval` (nothing is
imported: importing Triton or CuPy code is slow and may fail on a machine without a GPU), so the
planner can list, reason about and cost every template anywhere. A `Candidate` is the unit the
harness runs: the template's text with one line rewritten, `PARAMS = dict(META["defaults"])` ->
`PARAMS = {...chosen params...}`; for CUDA templates the `.cu` file is also inlined into the
`CUDA_SRC = r\"\"\"@SPARSEDITTO_INLINE <file>.cu@\"\"\"` placeholder, so the candidate needs no file.

META keys: name (== file stem), backend ("triton" | "cuda", == its directory), format (a
`sparseditto.formats` name: csr, bsr, nm, bitmap, ell, blocked_ell, compact), description,
params {name: [legal values]}, defaults {name: value}, patterns [pattern classes where it is a
natural candidate]. Optional: "grid" (a list of param dicts param_grid tries first), "cost"
({"unit": ..., "launches": ...} overrides for the cost model), "cuda_source" (the .cu file name).
The built-in "dense" entry (backend "builtin") stands for torch.matmul, which the harness runs
itself: its Candidate has an empty source.
"""
from __future__ import annotations

import ast
import difflib
import hashlib
import math
import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, model_validator

from .cost import FORMAT_DOCS, CostEstimate, balanced_nnz_per_program, estimate, format_name

__all__ = ["Candidate", "CostEstimate", "Template", "list_templates", "get_template", "describe_template",
           "discovery_problems", "TEMPLATE_ROOT"]

TEMPLATE_ROOT = Path(__file__).resolve().parent
BACKEND_DIRS = {"triton": TEMPLATE_ROOT / "triton", "cuda": TEMPLATE_ROOT / "cuda"}
PARAMS_LINE = 'PARAMS = dict(META["defaults"])'
_PARAMS_LINE_RE = re.compile(r'^PARAMS = dict\(META\["defaults"\]\)[ \t]*$', re.MULTILINE)
_CUDA_PLACEHOLDER_RE = re.compile(r'^CUDA_SRC = r"""@SPARSEDITTO_INLINE (?P<file>[\w.\-]+)@"""[ \t]*$', re.MULTILINE)
_REQUIRED_META = ("name", "backend", "format", "description", "params", "defaults")
DEFAULT_GRID_LIMIT = 8


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


class Candidate(BaseModel):
    """One runnable kernel: self-contained source plus where it came from.

    `source_hash` is the sha256 hex digest of `source` (computed when left empty; a given hash must
    be that digest or a prefix of it, so a mismatched source/hash pair is caught at construction).
    """

    template: str
    params: dict = {}
    source: str
    source_hash: str = ""
    backend: Literal["triton", "cuda", "builtin"]
    origin: Literal["template", "llm", "memory"] = "template"
    format: str = "unknown"

    @model_validator(mode="before")
    @classmethod
    def _fill(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("format") is None:
            data = {**data, "format": "unknown"}
        return data

    @model_validator(mode="after")
    def _check_hash(self) -> "Candidate":
        digest = _sha256(self.source)
        if not self.source_hash:
            self.source_hash = digest
        elif not digest.startswith(self.source_hash.lower()):
            raise ValueError(f"source_hash {self.source_hash!r} is not the sha256 of the candidate source "
                             f"(expected {digest}).")
        return self


# ---- discovery --------------------------------------------------------------------------------

_META_CACHE: dict[Path, tuple[tuple[int, int], dict]] = {}
_PROBLEMS: dict[Path, str] = {}


def _read_meta(path: Path) -> dict:
    """META of a template file via ast.literal_eval; ValueError when absent or not a literal."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "META" for t in node.targets):
            try:
                meta = ast.literal_eval(node.value)
            except ValueError as exc:
                raise ValueError(f"{path.name}: META must be a pure literal ({exc}).") from None
            if not isinstance(meta, dict):
                raise ValueError(f"{path.name}: META must be a dict, got {type(meta).__name__}.")
            return meta
    raise LookupError(f"{path.name} defines no META")


def _check_meta(meta: dict, path: Path, backend_dir: str) -> None:
    missing = [k for k in _REQUIRED_META if k not in meta]
    if missing:
        raise ValueError(f"{path.name}: META lacks {missing}.")
    if meta["name"] != path.stem:
        raise ValueError(f"{path.name}: META name {meta['name']!r} must equal the file stem {path.stem!r}.")
    if meta["backend"] != backend_dir:
        raise ValueError(f"{path.name}: META backend {meta['backend']!r} but the file is under {backend_dir}/.")
    format_name(meta["format"])  # raises for a format without a cost model
    params, defaults = meta["params"], meta["defaults"]
    if not isinstance(params, dict) or not all(isinstance(v, list) and v for v in params.values()):
        raise ValueError(f"{path.name}: META params must map each name to a non-empty list of legal values.")
    if set(defaults) != set(params):
        raise ValueError(f"{path.name}: META defaults keys {sorted(defaults)} differ from params {sorted(params)}.")
    for name, value in defaults.items():
        if not _is_legal(value, params[name]):
            raise ValueError(f"{path.name}: default {name}={value!r} is not among its legal values {params[name]}.")
    text = path.read_text(encoding="utf-8")
    if len(_PARAMS_LINE_RE.findall(text)) != 1:
        raise ValueError(f"{path.name}: needs exactly one line `{PARAMS_LINE}` for instantiate() to rewrite.")
    if backend_dir == "cuda":
        found = _CUDA_PLACEHOLDER_RE.search(text)
        if not found:
            raise ValueError(f'{path.name}: CUDA templates need a line CUDA_SRC = r"""@SPARSEDITTO_INLINE <file>.cu@""".')
        if not (path.parent / found["file"]).is_file():
            raise ValueError(f"{path.name}: CUDA source {found['file']} not found beside it.")


def _discover() -> list[tuple[Path, dict]]:
    found = []
    for backend, folder in BACKEND_DIRS.items():
        for path in sorted(folder.glob("*.py")):
            if path.name.startswith("_"):
                continue
            stat = path.stat()
            key = (stat.st_mtime_ns, stat.st_size)
            cached = _META_CACHE.get(path)
            if cached and cached[0] == key:
                found.append((path, cached[1]))
                continue
            try:
                meta = _read_meta(path)
                _check_meta(meta, path, backend)
            except LookupError:
                _PROBLEMS.pop(path, None)
                continue  # a helper module, not a template
            except (SyntaxError, ValueError) as exc:
                if _PROBLEMS.get(path) != str(exc):
                    warnings.warn(f"Skipping template file {path}: {exc}", stacklevel=3)
                _PROBLEMS[path] = str(exc)
                _META_CACHE.pop(path, None)
                continue
            _PROBLEMS.pop(path, None)
            _META_CACHE[path] = (key, meta)
            found.append((path, meta))
    return found


def discovery_problems() -> dict[str, str]:
    """{file: reason} for template files skipped by the last discovery (bad META, no PARAMS line...)."""
    _discover()
    return {str(p): msg for p, msg in sorted(_PROBLEMS.items()) if p.exists()}


# ---- parameter validation ---------------------------------------------------------------------

def _same(value: Any, legal: Any) -> bool:
    """Equality that keeps True apart from 1 and "32" apart from 32."""
    if isinstance(legal, bool) or isinstance(value, bool):
        return isinstance(legal, bool) and isinstance(value, bool) and value == legal
    if isinstance(legal, (list, tuple)) and isinstance(value, (list, tuple)):
        return len(legal) == len(value) and all(_same(v, l) for v, l in zip(value, legal))
    if type(legal) is not type(value) and not (isinstance(legal, int) and isinstance(value, int)):
        return False
    return value == legal


def _is_legal(value: Any, legal_values: list) -> bool:
    return any(_same(value, legal) for legal in legal_values)


def _canonical(value: Any) -> Any:
    """numpy scalars -> Python scalars; lists stay lists (the META form)."""
    if hasattr(value, "item") and not isinstance(value, (list, tuple, dict, str)):
        try:
            return value.item()
        except (TypeError, ValueError):
            return value
    return value


# ---- templates --------------------------------------------------------------------------------

@dataclass(frozen=True, eq=False)
class Template:
    """One template: its META, where its file is, and what the planner asks of it."""

    name: str
    backend: str
    format: str
    description: str
    params: dict
    defaults: dict
    patterns: list
    path: Path | None
    meta: dict = field(default_factory=dict)

    # -- source and instances --
    def source(self) -> str:
        """The template's candidate source with default PARAMS (CUDA: the .cu inlined)."""
        if self.path is None:
            return ""
        text = self.path.read_text(encoding="utf-8")
        if self.backend == "cuda":
            text = _inline_cuda(text, self.path)
        return text

    def validate_params(self, params: dict | None = None) -> dict:
        """Defaults merged with `params` in META order; ValueError naming a bad name or value."""
        params = dict(params or {})
        unknown = [k for k in params if k not in self.params]
        if unknown:
            known = ", ".join(self.params) or "none"
            raise ValueError(f"Unknown parameter {unknown[0]!r} for template {self.name!r}; "
                             f"its parameters are: {known}.")
        merged = {}
        for name, legal in self.params.items():
            value = _canonical(params.get(name, self.defaults[name]))
            if not _is_legal(value, legal):
                raise ValueError(f"Illegal value {value!r} for parameter {name!r} of template {self.name!r}; "
                                 f"legal values: {legal}.")
            merged[name] = value
        return merged

    def instantiate(self, params: dict | None = None) -> Candidate:
        """The Candidate for `params` (merged with defaults): the PARAMS line rewritten, nothing else."""
        merged = self.validate_params(params)
        if self.backend == "builtin":
            return Candidate(template=self.name, params=merged, source="", backend="builtin", format=self.format)
        text = self.source()
        literal = "PARAMS = " + repr(merged)
        ast.literal_eval(literal.split("=", 1)[1].strip())  # the params must round-trip as a literal
        source, count = _PARAMS_LINE_RE.subn(lambda _m: literal, text, count=1)
        if count != 1:
            raise ValueError(f"Template file {self.path} lost its `{PARAMS_LINE}` line.")
        return Candidate(template=self.name, params=merged, source=source, backend=self.backend,
                         format=self.format, origin="template")

    # -- planning --
    def applicable(self, report: Any) -> tuple[bool, str]:
        """Whether this template fits the analyzed pattern at all, and why (not whether it wins)."""
        return _applicable(self, report)

    def param_grid(self, report: Any, n: int, target: Any = None, limit: int = DEFAULT_GRID_LIMIT) -> list[dict]:
        """A small ranked list of full param dicts worth trying (best guess first), all valid."""
        if not isinstance(limit, int) or limit < 1:
            raise ValueError(f"limit must be a positive integer, got {limit!r}.")
        proposals = _proposals(self, report, int(n), target)
        grid, seen = [], set()
        for proposal in proposals:
            try:
                merged = self.validate_params(proposal)
            except ValueError:
                continue  # a heuristic produced a value this template version does not allow
            key = repr(sorted(merged.items(), key=lambda kv: kv[0]))
            if key in seen:
                continue
            seen.add(key)
            grid.append(merged)
            if len(grid) >= limit:
                break
        return grid

    def cost(self, report: Any, n: int, dtype: Any, target: Any, params: dict | None = None) -> CostEstimate:
        """Roofline estimate (kernel_templates.cost) for these params at N = n on `target`."""
        merged = self.validate_params(params)
        return estimate(self.name, self.format, report, n, dtype, target, merged, hints=self.meta.get("cost"))

    def describe(self) -> dict:
        fmt = format_name(self.format)
        return {
            **{k: v for k, v in self.meta.items()},
            "name": self.name, "backend": self.backend, "format": self.format,
            "description": self.description, "params": self.params, "defaults": self.defaults,
            "patterns": list(self.patterns),
            "path": str(self.path.relative_to(TEMPLATE_ROOT)) if self.path else None,
            "cost_model": FORMAT_DOCS[fmt],
            "applicability": APPLICABILITY_DOCS.get(self.name, APPLICABILITY_DOCS.get(fmt, "always")),
            "source_chars": len(self.source()),
        }


def _inline_cuda(text: str, path: Path) -> str:
    found = _CUDA_PLACEHOLDER_RE.search(text)
    if not found:
        raise ValueError(f"{path.name}: no CUDA_SRC placeholder to inline the .cu file into.")
    cu = (path.parent / found["file"]).read_text(encoding="utf-8")
    if '"""' in cu or cu.rstrip().endswith("\\"):
        raise ValueError(f"{found['file']} cannot be embedded in a raw triple-quoted string "
                         "(contains \"\"\" or ends with a backslash).")
    replacement = 'CUDA_SRC = r"""\n' + cu.rstrip("\n") + '\n"""'
    return text[:found.start()] + replacement + text[found.end():]


DENSE = Template(
    name="dense", backend="builtin", format="dense",
    description="Dense cuBLAS GEMM (torch.matmul) run by the harness itself: the floor every sparse kernel must beat",
    params={}, defaults={}, patterns=["dense"], path=None,
    meta={"name": "dense", "backend": "builtin", "format": "dense", "params": {}, "defaults": {},
          "description": "Dense cuBLAS GEMM (torch.matmul) run by the harness itself", "patterns": ["dense"]},
)


def list_templates() -> list[Template]:
    """Every template: the built-in dense entry, then triton/*.py and cuda/*.py with a valid META."""
    out = [DENSE]
    for path, meta in _discover():
        out.append(Template(
            name=meta["name"], backend=meta["backend"], format=meta["format"], description=meta["description"],
            params={k: list(v) for k, v in meta["params"].items()}, defaults=dict(meta["defaults"]),
            patterns=list(meta.get("patterns", [])), path=path, meta=dict(meta)))
    return out


def get_template(name: str) -> Template:
    templates = {t.name: t for t in list_templates()}
    if name in templates:
        return templates[name]
    close = difflib.get_close_matches(str(name), list(templates), n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    raise ValueError(f"Unknown template {name!r}.{hint} Known templates: {', '.join(sorted(templates))}.")


def describe_template(name: str) -> dict:
    """JSON-able description for an LLM tool: META, the cost model, applicability, source length."""
    return get_template(name).describe()


# ---- applicability ----------------------------------------------------------------------------

NM_CONFORMANCE_MIN = 0.9
BITMAP_MIN_DENSITY = 0.02

APPLICABILITY_DOCS = {
    "dense": "always (the baseline)",
    "csr": "always: CSR represents any pattern",
    "csr_balanced": "always; it is the natural choice when row lengths are skewed (row cv > 1)",
    "compact": "needs empty rows or empty columns to drop",
    "bsr": "needs a block shape from the analyzer (report.best_block_shape)",
    "nm": f"needs row-direction N:M conformance >= {NM_CONFORMANCE_MIN} for a ratio the template supports",
    "bitmap": f"density >= {BITMAP_MIN_DENSITY} (below, one bit per element costs more than the values)",
    "ell": "row lengths nearly equal (max row <= 2x mean): padding stays bounded",
    "blocked_ell": "needs a block shape from the analyzer (report.best_block_shape)",
}


def _rget(report: Any, name: str, default: Any = None) -> Any:
    return report.get(name, default) if isinstance(report, dict) else getattr(report, name, default)


def _nm_ratios(template: Template) -> list[tuple[int, int]]:
    """The N:M ratios a template supports, from its params (default 2:4)."""
    for key in ("NM", "nm", "ratio", "RATIO"):
        if key in template.params:
            out = []
            for v in template.params[key]:
                if isinstance(v, str) and ":" in v:
                    a, b = v.split(":")
                    out.append((int(a), int(b)))
            if out:
                return out
    return [(2, 4)]


def _applicable(template: Template, report: Any) -> tuple[bool, str]:
    from .cost import ReportStats

    if template.backend == "builtin":
        return True, "dense cuBLAS is always a candidate (the floor to beat)"
    stats = ReportStats(report)
    fmt = format_name(template.format)
    if fmt == "csr":
        if template.name == "csr_balanced":
            return True, (f"CSR fits any pattern; nnz splitting balances rows (row cv {stats.row_cv:.2f}, "
                          f"longest row {int(stats.row_max)} vs mean {stats.row_mean:.1f})")
        return True, f"CSR fits any pattern ({stats.nnz} nonzeros, mean row {stats.row_mean:.1f})"
    if fmt == "compact":
        if stats.nnz == 0:
            return True, "all rows are empty: C is zero, compaction writes zeros only"
        if stats.empty_rows or stats.empty_cols:
            kept = (stats.m - stats.empty_rows) * (stats.k - stats.empty_cols)
            return True, (f"{stats.empty_rows} empty rows and {stats.empty_cols} empty columns to drop; the kept "
                          f"block is {kept / (stats.m * stats.k):.1%} of A, {stats.nnz / max(1, kept):.1%} full")
        return False, "no empty rows or columns: compaction would be a plain dense GEMM"
    if fmt in ("bsr", "blocked_ell"):
        best = _rget(report, "best_block_shape")
        if best:
            return True, f"analyzer found block structure, best block shape {tuple(best)}"
        return False, "analyzer found no block shape (report.best_block_shape is None)"
    if fmt == "nm":
        results = [(stats.nm_conformance(n, m, "row"), f"{n}:{m}") for n, m in _nm_ratios(template)]
        conf, ratio = max(results)
        if conf >= NM_CONFORMANCE_MIN:
            return True, f"{ratio} row conformance {conf:.3f} >= {NM_CONFORMANCE_MIN}"
        return False, f"best N:M row conformance is {conf:.3f} ({ratio}) < {NM_CONFORMANCE_MIN}"
    if fmt == "bitmap":
        if stats.density >= BITMAP_MIN_DENSITY:
            return True, f"density {stats.density:.3f}: a bitmap costs 1/8 byte per element, values dominate"
        return False, f"density {stats.density:.4f} < {BITMAP_MIN_DENSITY}: bitmap index bytes exceed the values'"
    if fmt == "ell":
        if stats.row_max <= 2 * max(stats.row_mean, 1.0):
            return True, f"rows nearly equal (max {int(stats.row_max)} vs mean {stats.row_mean:.1f})"
        return False, f"rows too skewed for ELL padding (max {int(stats.row_max)} vs mean {stats.row_mean:.1f})"
    return True, "dense format: always"


# ---- parameter grids --------------------------------------------------------------------------

def _pow2_at_least(x: float) -> int:
    return 1 if x <= 1 else 1 << (int(math.ceil(x)) - 1).bit_length()


def _sm_count(target: Any) -> int:
    if target is None:
        return 132
    try:
        from sparseditto.targets import get_target

        return int(get_target(target).sm_count)
    except (ImportError, ValueError):
        return 132


def _proposals(template: Template, report: Any, n: int, target: Any) -> list[dict]:
    """Candidate param dicts, best guess first; invalid ones are filtered by param_grid."""
    from .cost import ReportStats

    if template.backend == "builtin":
        return [{}]
    stats = ReportStats(report)
    explicit = [dict(p) for p in template.meta.get("grid", []) if isinstance(p, dict)]
    maker = _GRID_MAKERS.get(template.name)
    tailored = maker(template, stats, n, target) if maker else []
    return explicit + tailored + _generic(template)


# Parameters that trade accuracy for speed (tf32 products): a grid never flips them on its own,
# because verification tolerances are set for the dtype's own precision.
NUMERICS_PARAMS = frozenset({"FP32_DOT", "ALLOW_TF32"})


def _generic(template: Template) -> list[dict]:
    """Defaults, then one parameter changed at a time, round-robin over parameters."""
    out = [{}]
    alternatives = {k: [v for v in vals if not _same(v, template.defaults[k])]
                    for k, vals in template.params.items() if k not in NUMERICS_PARAMS}
    depth = max((len(v) for v in alternatives.values()), default=0)
    for i in range(depth):
        for name, vals in alternatives.items():
            if i < len(vals):
                out.append({name: vals[i]})
    return out


def _rows_per_program(mean_row: float) -> int:
    """Enough nonzeros per program to amortize it: short rows are grouped."""
    if mean_row < 8:
        return 8
    if mean_row < 24:
        return 4
    if mean_row < 64:
        return 2
    return 1


def _csr_rowsplit_grid(t: Template, s, n: int, target: Any) -> list[dict]:
    rows = _rows_per_program(s.row_mean)
    reorder = "length" if s.row_cv > 0.5 else "none"
    bn = min(_pow2_at_least(n), 128)
    base = {"ROWS_PER_PROGRAM": rows, "REORDER": reorder}
    return [
        base,
        {**base, "BLOCK_N": max(1, bn // 2)},
        {**base, "ROWS_PER_PROGRAM": max(1, rows // 2)},
        {**base, "ROWS_PER_PROGRAM": min(16, rows * 2)},
        {**base, "REORDER": "none" if reorder == "length" else "length"},
        {**base, "BLOCK_NNZ": 64 if s.row_mean >= 32 else 16},
        {**base, "INDEX_BITS": 32},
        {**base, "num_stages": 3},
        {**base, "BLOCK_N": min(256, bn * 2)},
    ]


def _csr_balanced_grid(t: Template, s, n: int, target: Any) -> list[dict]:
    sms = _sm_count(target)
    # About four programs per SM per N tile, within the legal range.
    per = _pow2_at_least(max(1, s.nnz) / (4 * sms))
    per = int(min(4096, max(64, per)))
    auto = balanced_nnz_per_program(s.nnz, {})
    bn = min(_pow2_at_least(n), 128)
    block_nnz = 64 if s.row_mean >= 32 else 32
    return [
        {"NNZ_PER_PROGRAM": per, "BLOCK_NNZ": block_nnz},
        {"NNZ_PER_PROGRAM": auto, "BLOCK_NNZ": block_nnz},
        {"NNZ_PER_PROGRAM": min(4096, per * 4), "BLOCK_NNZ": block_nnz},
        {"NNZ_PER_PROGRAM": max(64, per // 2), "BLOCK_NNZ": 16},
        {"NNZ_PER_PROGRAM": per, "BLOCK_NNZ": block_nnz, "BLOCK_N": max(1, bn // 2)},
        {"NNZ_PER_PROGRAM": per, "BLOCK_NNZ": block_nnz, "INDEX_BITS": 32},
        {"NNZ_PER_PROGRAM": per, "BLOCK_NNZ": block_nnz, "FIXUP": "launch"},
    ]


def _compact_grid(t: Template, s, n: int, target: Any) -> list[dict]:
    kept_m = max(1, s.m - s.empty_rows)
    bm = 64 if kept_m >= 512 else (32 if kept_m >= 64 else 16)
    bn = max(16, min(_pow2_at_least(n), 128))
    return [
        {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": 64, "num_warps": 4, "num_stages": 3},
        {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": 128, "num_warps": 4, "num_stages": 3},
        {"BLOCK_M": min(128, bm * 2), "BLOCK_N": bn, "BLOCK_K": 64, "num_warps": 8, "num_stages": 3},
        {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": 64, "num_warps": 4, "num_stages": 4},
        {"BLOCK_M": max(16, bm // 2), "BLOCK_N": bn, "BLOCK_K": 64, "num_warps": 4, "num_stages": 3},
        {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": 32, "num_warps": 4, "num_stages": 5},
    ]


def _csr_vector_grid(t: Template, s, n: int, target: Any) -> list[dict]:
    group = max(2, min(32, _pow2_at_least(s.row_mean)))
    out = [{}]
    if n <= 8:
        tile = min(_pow2_at_least(n), 8)
        out += [{"LAYOUT": "nnz", "GROUP": group, "TILE_N": tile},
                {"LAYOUT": "nnz", "GROUP": max(2, group // 2), "TILE_N": tile},
                {"LAYOUT": "nnz", "GROUP": min(32, group * 2), "TILE_N": tile},
                {"LAYOUT": "cols", "VEC": 1}]
    else:
        vec = max(1, min(8, _pow2_at_least(n / 32)))
        out += [{"LAYOUT": "cols", "VEC": vec},
                {"LAYOUT": "cols", "VEC": max(1, vec // 2)},
                {"LAYOUT": "cols", "VEC": vec, "WARPS_PER_BLOCK": 8},
                {"LAYOUT": "nnz", "GROUP": group, "TILE_N": 8}]
    out += [{"WARPS_PER_BLOCK": 2}, {"WARPS_PER_BLOCK": 8}]
    return out


def _bsr_grid(t: Template, s, n: int, target: Any) -> list[dict]:
    """The analyzer's best block shape first, then the template's own "auto" re-blocking."""
    best = _rget(s.report, "best_block_shape")
    shaped = {"BM": int(best[0]), "BK": int(best[1])} if best else {}
    bn = max(16, min(_pow2_at_least(n), 128))
    return [shaped, {}, {**shaped, "BLOCK_N": bn}, {**shaped, "ORDER": "natural"},
            {**shaped, "num_stages": 4}, {**shaped, "SPLIT": 1}, {**shaped, "BLOCK_N": max(16, bn // 2)}]


def _nm_grid(t: Template, s, n: int, target: Any) -> list[dict]:
    """The best-conforming ratio the template supports, then its expand variants and tiles."""
    ratios = [(s.nm_conformance(a, b, "row"), -b, f"{a}:{b}") for a, b in _nm_ratios(t)]
    best = max(ratios)[2] if ratios else "2:4"
    base = {"NM": best}
    return [base, {**base, "EXPAND": "planes"}, {**base, "EXPAND": "select"}, {**base, "BLOCK_M": 128},
            {**base, "BLOCK_M": 32}, {**base, "BLOCK_G": 64}, {**base, "num_stages": 4}]


def _bitmap_grid(t: Template, s, n: int, target: Any) -> list[dict]:
    return [{}, {"KW": 4}, {"KW": 1}, {"OFFSETS": "stored"}, {"BLOCK_M": 128}, {"BLOCK_M": 32},
            {"num_stages": 4}]


_GRID_MAKERS = {
    "bsr_tc": _bsr_grid,
    "nm_compressed": _nm_grid,
    "bitmap_tiles": _bitmap_grid,
    "csr_rowsplit": _csr_rowsplit_grid,
    "csr_balanced": _csr_balanced_grid,
    "compact_rows_cols": _compact_grid,
    "csr_vector": _csr_vector_grid,
}
