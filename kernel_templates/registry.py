"""The kernel template library: discovery, validation and instantiation of template files.

Why a registry of *files*: every template is a self-contained candidate source
(`kernel_templates/triton/<name>.py`, or `kernel_templates/cuda/<name>.py` + `<name>.cu`) whose
`META` dict literal says what it is, plus a planning module beside it
(`kernel_templates/<backend>/planning/<name>.py`) holding everything the planner asks of it:
applicability, a parameter grid and its cost terms. The registry reads META with
`ast.literal_eval` and imports nothing at discovery (importing Triton or CuPy code is slow and may
fail on a machine without a GPU); a planning module is imported only when the planner first asks
its template something, and imports no kernel code itself, so the planner can list, reason about
and cost every template anywhere. A `Candidate` is the unit the harness runs: the template's text
with one line rewritten, `PARAMS = dict(META["defaults"])` -> `PARAMS = {...chosen params...}`; for
CUDA templates the `.cu` file is also inlined into the
`CUDA_SRC = r\"\"\"@SPARSEDITTO_INLINE <file>.cu@\"\"\"` placeholder (several files, space-separated,
are inlined in order: a shared `dtypes.cuh` before the `.cu`), so the candidate needs no file.

META keys: name (== file stem), backend ("triton" | "cuda", == its directory), format (a
`sparseditto.formats` name: csr, bsr, nm, bitmap, ell, blocked_ell, compact), description,
params {name: [legal values]}, defaults {name: value}, patterns [pattern classes where it is a
natural candidate]. Optional: "grid" (a list of param dicts param_grid tries first), "cuda_source"
(the .cu file name).

A planning module defines (`ReportStats` and `CostTerms` come from `kernel_templates.cost`):
  APPLICABILITY: str                                  one line: when the template applies
  COST_MODEL: str                                     one line: what its cost formula counts
  applicable(stats, template) -> (bool, str)          fits this pattern at all, and why
  grid(stats, n, target, template) -> list[dict]      tailored param sets, best first (may be [])
  cost(stats, n, dtype, target, params) -> CostTerms  bytes, flops, unit, launches of one instance
The built-in "dense" entry (backend "builtin", `kernel_templates/dense.py`) stands for
torch.matmul, which the harness runs itself: its Candidate has an empty source.
"""
from __future__ import annotations

import ast
import difflib
import functools
import importlib
import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Literal

from pydantic import BaseModel, model_validator

from sparseditto.harness.source_loader import source_hash

from .cost import CostEstimate, ReportStats, estimate, format_name, with_a_bytes

__all__ = ["Candidate", "CostEstimate", "Template", "list_templates", "get_template", "describe_template",
           "discovery_problems", "TEMPLATE_ROOT"]

TEMPLATE_ROOT = Path(__file__).resolve().parent
BACKEND_DIRS = {"triton": TEMPLATE_ROOT / "triton", "cuda": TEMPLATE_ROOT / "cuda"}
PLANNING_DIR = "planning"
PLANNING_NAMES = ("APPLICABILITY", "COST_MODEL", "applicable", "grid", "cost")
PARAMS_LINE = 'PARAMS = dict(META["defaults"])'
_PARAMS_LINE_RE = re.compile(r'^PARAMS = dict\(META\["defaults"\]\)[ \t]*$', re.MULTILINE)
# One or more files, space-separated, inlined in that order (a shared .cuh before the template's .cu).
_CUDA_PLACEHOLDER_RE = re.compile(r'^CUDA_SRC = r"""@SPARSEDITTO_INLINE (?P<files>[\w.\-]+(?: [\w.\-]+)*)@"""[ \t]*$',
                                  re.MULTILINE)
_REQUIRED_META = ("name", "backend", "format", "description", "params", "defaults")
DEFAULT_GRID_LIMIT = 8


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
        digest = source_hash(self.source)
        if not self.source_hash:
            self.source_hash = digest
        elif not digest.startswith(self.source_hash.lower()):
            raise ValueError(f"source_hash {self.source_hash!r} is not the sha256 of the candidate source "
                             f"(expected {digest}).")
        return self


# ---- discovery --------------------------------------------------------------------------------

_META_CACHE: dict[Path, tuple[tuple, dict]] = {}
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
    format_name(meta["format"])  # raises for a format name sparseditto does not know
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
        for name in found["files"].split():
            if not (path.parent / name).is_file():
                raise ValueError(f"{path.name}: CUDA source {name} not found beside it.")
    _check_planning(planning_path(path))


def planning_path(path: Path) -> Path:
    """Where a template file's planning module lives: ``<backend>/planning/<name>.py``."""
    return path.parent / PLANNING_DIR / path.name


def _check_planning(path: Path) -> None:
    """The planning module exists and defines the contract's names (read from its syntax tree)."""
    if not path.is_file():
        raise ValueError(f"{path.stem}: no planning module {PLANNING_DIR}/{path.name} beside the template "
                         f"(it defines {', '.join(PLANNING_NAMES)}).")
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    defined = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    defined |= {t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
    missing = [name for name in PLANNING_NAMES if name not in defined]
    if missing:
        raise ValueError(f"{path.stem}: planning module {PLANNING_DIR}/{path.name} lacks {missing}.")


def _stamp(path: Path) -> tuple[int, int] | None:
    try:
        stat = path.stat()
    except FileNotFoundError:
        return None
    return stat.st_mtime_ns, stat.st_size


def _discover() -> list[tuple[Path, dict]]:
    found = []
    for backend, folder in BACKEND_DIRS.items():
        for path in sorted(folder.glob("*.py")):
            if path.name.startswith("_"):
                continue
            key = (_stamp(path), _stamp(planning_path(path)))
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
    """{file: reason} for template files skipped by the last discovery (bad META, no PARAMS line,
    no planning module...)."""
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
    planning_module: str           # dotted name of its planning module
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

    # -- planning (the template's planning module) --
    def planning(self) -> ModuleType:
        """The planning module: imported on first use, never at discovery."""
        return importlib.import_module(self.planning_module)

    def arch_reason(self, target: Any) -> str | None:
        """Why this template cannot run on ``target`` (a Target: its compute capability is below
        META's "min_compute_capability"), or None when it can. The tensor-core decode tier's kernels
        use Hopper-only instructions and do not compile for an A100 or an Ada GPU at all."""
        need = self.meta.get("min_compute_capability")
        have = getattr(target, "compute_capability", None)
        if not need or have is None or tuple(have) >= tuple(need):
            return None
        return f"compute capability {need[0]}.{need[1]} required, {target.name} has {have[0]}.{have[1]}"

    def applicable(self, report: Any) -> tuple[bool, str]:
        """Whether this template fits the analyzed pattern at all, and why (not whether it wins)."""
        return self.planning().applicable(ReportStats(report), self)

    def param_grid(self, report: Any, n: int, target: Any = None, limit: int = DEFAULT_GRID_LIMIT) -> list[dict]:
        """A small ranked list of full param dicts worth trying (best guess first), all valid:
        META's "grid" first, then the planning module's tailored sets, then the defaults and one
        parameter changed at a time."""
        if not isinstance(limit, int) or limit < 1:
            raise ValueError(f"limit must be a positive integer, got {limit!r}.")
        proposals = [dict(p) for p in self.meta.get("grid", []) if isinstance(p, dict)]
        proposals += self.planning().grid(ReportStats(report), int(n), target, self)
        proposals += _generic(self)
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

    def cost(self, report: Any, n: int, dtype: Any, target: Any, params: dict | None = None, *,
             a_bytes: float | None = None) -> CostEstimate:
        """Roofline estimate (kernel_templates.cost) for these params at N = n on `target`;
        ``a_bytes``: A's bytes as a kernel adapted from this template packs them (measured)."""
        merged = self.validate_params(params)
        terms = self.planning().cost if a_bytes is None else with_a_bytes(self.planning().cost, a_bytes)
        return estimate(terms, report, n, dtype, target, merged)

    def describe(self) -> dict:
        planning = self.planning()
        return {
            **{k: v for k, v in self.meta.items()},
            "name": self.name, "backend": self.backend, "format": self.format,
            "description": self.description, "params": self.params, "defaults": self.defaults,
            "patterns": list(self.patterns),
            "path": str(self.path.relative_to(TEMPLATE_ROOT)) if self.path else None,
            "cost_model": planning.COST_MODEL,
            "applicability": planning.APPLICABILITY,
            "source_chars": len(self.source()),
        }


def _inline_cuda(text: str, path: Path) -> str:
    found = _CUDA_PLACEHOLDER_RE.search(text)
    if not found:
        raise ValueError(f"{path.name}: no CUDA_SRC placeholder to inline the .cu file into.")
    texts = []
    for name in found["files"].split():
        cu = (path.parent / name).read_text(encoding="utf-8")
        if '"""' in cu or cu.rstrip().endswith("\\"):
            raise ValueError(f"{name} cannot be embedded in a raw triple-quoted string "
                             "(contains \"\"\" or ends with a backslash).")
        texts.append(cu.rstrip("\n"))
    replacement = 'CUDA_SRC = r"""\n' + "\n\n".join(texts) + '\n"""'
    return text[:found.start()] + replacement + text[found.end():]


def _template(meta: dict, path: Path | None, planning_module: str) -> Template:
    return Template(name=meta["name"], backend=meta["backend"], format=meta["format"], description=meta["description"],
                    params={k: list(v) for k, v in meta["params"].items()}, defaults=dict(meta["defaults"]),
                    patterns=list(meta.get("patterns", [])), path=path, planning_module=planning_module,
                    meta=dict(meta))


DENSE = _template(_read_meta(TEMPLATE_ROOT / "dense.py"), None, f"{__package__}.dense")


def list_templates() -> list[Template]:
    """Every template: the built-in dense entry, then triton/*.py and cuda/*.py with a valid META."""
    return [DENSE] + [_template(meta, path, f"{__package__}.{meta['backend']}.{PLANNING_DIR}.{meta['name']}")
                      for path, meta in _discover()]


@functools.lru_cache(maxsize=None)
def backend_unavailable(backend: str) -> str | None:
    """Why templates of ``backend`` cannot run in this environment, or None when they can.

    The CUDA C++ templates launch through CuPy, an optional extra: without it every such candidate
    would fail to compile, so the planner leaves them out and says why instead."""
    if backend != "cuda":
        return None
    try:
        import cupy  # noqa: F401
    except Exception as exc:  # ImportError, or a CuPy built for another CUDA version
        return (f"CuPy cannot be imported ({type(exc).__name__}: {exc}); install the extra matching the driver: "
                "pip install 'sparseditto[gpu]' (CUDA 13) or 'sparseditto[gpu-cuda12]'")
    return None


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


# ---- generic parameter grid --------------------------------------------------------------

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
