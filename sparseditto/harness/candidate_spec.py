"""The plain, picklable description of "what to run" that crosses into the worker process.

Callers hand the harness a registry ``Candidate`` (pydantic, duck-typed here so the harness does not
depend on the template package) or a raw source string. Both become a `CandidateSpec`, which is
what travels over the pipe to the sandboxed worker.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from .source_loader import source_hash
from .vendor_kernels import VENDOR_NAMES

CANDIDATE_BACKENDS = ("triton", "cuda", "builtin")
BUILTIN_TEMPLATES = VENDOR_NAMES   # dense cuBLAS and the vendor sparse libraries (harness code, no source)
_CUPY_IMPORT = re.compile(r"^\s*(import\s+cupy|from\s+cupy\b)", re.MULTILINE)


@dataclass(frozen=True)
class CandidateSpec:
    source: str
    backend: str            # "triton" | "cuda" | "builtin"
    template: str = "custom"
    params: dict = field(default_factory=dict)
    source_hash: str = ""

    @property
    def is_builtin(self) -> bool:
        """A vendor path run by the harness itself (dense cuBLAS, cuSPARSE, ...): no source to check."""
        return self.backend == "builtin"

    @property
    def label(self) -> str:
        return f"{self.template}[{self.source_hash[:10]}]" if self.source_hash else self.template


def source_backend(source: str) -> str:
    """The kernel language of a raw candidate source: 'cuda' when it imports CuPy (the only way a
    candidate reaches CUDA C++: cupy.RawModule / RawKernel), else 'triton'."""
    return "cuda" if _CUPY_IMPORT.search(source) else "triton"


def vendor_spec(name: str) -> CandidateSpec:
    """The spec of vendor path ``name`` (one of `BUILTIN_TEMPLATES`), a candidate like any other."""
    if name not in BUILTIN_TEMPLATES:
        raise ValueError(f"Unknown vendor kernel {name!r}; expected one of {BUILTIN_TEMPLATES}.")
    return CandidateSpec(source="", backend="builtin", template=name)


def as_spec(candidate) -> CandidateSpec:
    """Normalize a Candidate-like object or a source string into a `CandidateSpec`."""
    if isinstance(candidate, CandidateSpec):
        return candidate
    if isinstance(candidate, str):
        return CandidateSpec(source=candidate, backend=source_backend(candidate), source_hash=source_hash(candidate))
    source = getattr(candidate, "source", None)
    backend = getattr(candidate, "backend", None)
    if backend is None:
        raise ValueError(f"Expected a Candidate (with .source and .backend) or a source string, "
                         f"got {type(candidate).__name__}.")
    backend = str(backend)
    if backend not in CANDIDATE_BACKENDS:
        raise ValueError(f"Unknown candidate backend {backend!r}; expected one of {CANDIDATE_BACKENDS}.")
    template = str(getattr(candidate, "template", None) or "custom")
    if backend == "builtin":
        if template not in BUILTIN_TEMPLATES:
            raise ValueError(f"Unknown builtin template {template!r}; expected one of {BUILTIN_TEMPLATES}.")
        source = source or ""
    elif not isinstance(source, str) or not source.strip():
        raise ValueError(f"Candidate {template!r} has no source text (got {type(source).__name__}).")
    params = dict(getattr(candidate, "params", None) or {})
    digest = getattr(candidate, "source_hash", None) or source_hash(source)
    return CandidateSpec(source=source, backend=backend, template=template, params=params,
                         source_hash=str(digest))
