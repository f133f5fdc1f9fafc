"""Tools the LLM coder may call while writing a kernel (LangChain ``@tool`` functions).

Why tools: a model writing Triton from memory hallucinates API calls and guesses parameter names.
These tools ground it in what is actually installed and measurable here:

* ``triton_language_api(query)`` introspects the installed ``triton.language`` (names, signatures,
  first doc line), so the model can check that ``tl.something`` exists before calling it;
* ``describe_template(name)`` / ``instantiate_template(name, params_json)`` read the template
  library (``sparseditto.kernel_templates.registry``);
* ``past_kernels(signature_or_pattern)`` returns the best verified sources of similar past runs
  from the SQLite memory;
* ``compile_kernel(source)`` / ``verify_kernel(source)`` run a draft through the same static checks,
  sandboxed compile and verification as any candidate, on the current matrix.

Each tool returns a short string (JSON where structured) and never raises: a failing tool call is
information for the model, not an error for the graph. Long logs are clipped (the tail, where the
error is, is kept). The graph fills a :class:`ToolContext` (matrix, dtype, backend, N values,
memory) before each step; tools read it through the ``get_context`` callable they were built with.
"""
from __future__ import annotations

import inspect
import json
from dataclasses import dataclass, field
from typing import Any, Callable

MAX_TOOL_OUTPUT = 6000
MAX_API_ENTRIES = 60


@dataclass
class ToolContext:
    """What the compile/verify/memory tools act on; set by the graph before each policy step."""

    matrix: Any = None              # sparseditto.matrix.SparseMatrix of the current run
    dtype: str = "float16"          # value dtype of A and B
    backend: str = "interpret"      # execution backend: 'cuda' or 'interpret' (TRITON_INTERPRET=1)
    n_values: list[int] = field(default_factory=lambda: [16])
    memory: Any = None              # sparseditto.memory.Memory, or None when memory is off
    signature: str | None = None    # pattern signature of the current matrix
    pattern: str | None = None      # pattern class of the current matrix
    timeout_s: float = 120.0        # per verify_kernel call


def clip(text: str, limit: int = MAX_TOOL_OUTPUT, *, keep: str = "head") -> str:
    """Shorten ``text`` to about ``limit`` characters, saying how much was cut. ``keep='tail'``
    keeps the end (compiler errors and tracebacks end with the useful line)."""
    text = str(text)
    if len(text) <= limit:
        return text
    cut = len(text) - limit
    if keep == "tail":
        return f"[... {cut} chars cut ...]\n" + text[-limit:]
    return text[:limit] + f"\n[... {cut} chars cut ...]"


def _dump(obj: Any, limit: int = MAX_TOOL_OUTPUT) -> str:
    if hasattr(obj, "model_dump"):
        obj = obj.model_dump(mode="json")
    return clip(json.dumps(obj, default=str), limit)


# ---- triton.language introspection -------------------------------------------------------------
def _doc_line(obj: Any) -> str:
    doc = inspect.getdoc(obj) or ""
    for line in doc.splitlines():
        line = line.strip()
        if line and not line.startswith("This function can also be called as a member function"):
            return line[:160]
    return ""


def _signature(obj: Any) -> str:
    target = getattr(obj, "fn", obj)  # JITFunction / InterpretedFunction wrap the Python function
    try:
        sig = inspect.signature(target)
    except (TypeError, ValueError):
        return ""
    params = [p for name, p in sig.parameters.items() if not name.startswith("_")]
    return str(sig.replace(parameters=params, return_annotation=inspect.Signature.empty))


def _api_entries() -> list[tuple[str, str, str]]:
    """(qualified name, signature, first doc line) for every public name of triton.language and
    its math submodule, as installed."""
    import triton.language as tl

    entries = []
    for prefix, module in (("", tl), ("math.", getattr(tl, "math", None))):
        if module is None:
            continue
        for name in sorted(dir(module)):
            if name.startswith("_"):
                continue
            obj = getattr(module, name)
            if inspect.ismodule(obj):
                continue
            kind = type(obj).__name__
            sig = _signature(obj) if callable(obj) and kind != "dtype" else ""
            entries.append((prefix + name, sig, _doc_line(obj) if sig else kind))
    return entries


def triton_language_api_text(query: str = "") -> str:
    """The introspection behind the ``triton_language_api`` tool (plain function, testable)."""
    import triton

    query = (query or "").strip().lower().removeprefix("tl.").removeprefix("triton.language.")
    entries = _api_entries()
    if not query:
        names = ", ".join(name for name, _, _ in entries)
        return clip(f"triton {triton.__version__}: triton.language (tl) has {len(entries)} public names: {names}")
    hits = [e for e in entries if query in e[0].lower()]
    if not hits:
        hits = [e for e in entries if query in e[2].lower()]
    if not hits:
        return (f"no name in triton.language {triton.__version__} matches '{query}'. "
                "Call triton_language_api('') for the full list; do not use names that are not listed.")
    lines = [f"tl.{name}{sig}  # {doc}" if sig else f"tl.{name}  ({doc})" for name, sig, doc in hits[:MAX_API_ENTRIES]]
    if len(hits) > MAX_API_ENTRIES:
        lines.append(f"... {len(hits) - MAX_API_ENTRIES} more; narrow the query")
    return clip(f"triton {triton.__version__}, {len(hits)} match(es) for '{query}':\n" + "\n".join(lines))


# ---- template library --------------------------------------------------------------------------
def _registry():
    from sparseditto.kernel_templates import registry

    return registry


def _template_names() -> list[str]:
    return sorted(t.name for t in _registry().list_templates())


def describe_template_text(name: str) -> str:
    try:
        return _dump(_registry().describe_template(name))
    except ValueError as exc:   # an unknown template: the message lists the known ones
        return _template_error(exc)


def _template_error(exc: BaseException) -> str:
    text = f"error: {type(exc).__name__}: {exc}"
    if "known templates" not in text.lower():
        text += f" Known templates: {', '.join(_template_names())}"
    return clip(text, 1500)


def instantiate_template_text(name: str, params_json: str = "{}") -> str:
    try:
        params = json.loads(params_json or "{}")
    except json.JSONDecodeError as exc:
        return f"error: params_json is not valid JSON ({exc}); pass e.g. '{{\"BLOCK_N\": 32}}'"
    if not isinstance(params, dict):
        return f"error: params_json must be a JSON object, got {type(params).__name__}"
    try:
        cand = _registry().get_template(name).instantiate(params)
    except ValueError as exc:   # unknown template or illegal parameters: the message says which
        return _template_error(exc)
    return clip(cand.source, 12000)


# ---- memory ------------------------------------------------------------------------------------
def past_kernels_text(ctx: ToolContext, key: str = "") -> str:
    if ctx.memory is None:
        return "memory is off for this run: no past kernels"
    key = (key or ctx.signature or ctx.pattern or "").strip()
    if not key:
        return "error: give a pattern signature or a pattern class (e.g. 'unstructured', 'block')"
    try:
        found = ctx.memory.past_kernels(key, limit=2)
    except Exception as exc:
        return f"error: {type(exc).__name__}: {exc}"
    if not found:
        return f"no verified kernel in memory for '{key}'"
    parts = []
    for k in found:
        head = (f"# run {k['run_id'][:8]} {k['matrix_name']} ({k['pattern']}, {k['dtype']}, {k['gpu']}): "
                f"{k['template']} {json.dumps(k['params'])}, speedup vs dense {k['speedup_vs_dense']}")
        parts.append(head + "\n" + clip(k["source"] or "", 3500))
    return "\n\n".join(parts)


# ---- compile and verify through the harness ----------------------------------------------------
def compile_kernel_text(ctx: ToolContext, source: str) -> str:
    """Static checks, then the harness compile (the harness accepts a source string as a candidate)."""
    from sparseditto import harness

    try:
        checked = harness.check_source(source)
        if not checked.ok:
            return _dump({"ok": False, "stage": "static_check", "violations": checked.violations,
                          "syntax_error": checked.syntax_error})
        result = harness.compile_candidate(source, backend=ctx.backend)
    except Exception as exc:
        return f"error: {type(exc).__name__}: {clip(str(exc), 2000, keep='tail')}"
    return _dump({"ok": result.ok, "stage": "compile", "failure_class": result.failure_class,
                  "violations": result.violations, "log": clip(result.log, 3000, keep="tail")})


def verify_kernel_text(ctx: ToolContext, source: str) -> str:
    """The full sandboxed verification on the current matrix (static checks included)."""
    if ctx.matrix is None:
        return "error: no matrix in the tool context (the graph sets it before each step)"
    from sparseditto import harness

    try:
        result = harness.run_and_verify(source, ctx.matrix, n_values=tuple(ctx.n_values), dtype=ctx.dtype,
                                        backend=ctx.backend, timeout=ctx.timeout_s)
    except Exception as exc:
        return f"error: {type(exc).__name__}: {clip(str(exc), 2000, keep='tail')}"
    checks = [{"n": c.n, "kind": c.kind, "ok": c.ok, "rel_err": c.rel_err} for c in result.checks[:8]]
    return _dump({"ok": result.ok, "status": result.status, "failure_class": result.failure_class,
                  "message": clip(result.message, 1500), "checks": checks,
                  "log": clip(result.log, 2500, keep="tail")})


# ---- the LangChain tools -----------------------------------------------------------------------
def build_tools(get_context: Callable[[], ToolContext]) -> list:
    """The coder's tools, bound to a context provider (the policy's current ToolContext)."""
    from langchain_core.tools import tool

    @tool
    def triton_language_api(query: str = "") -> str:
        """List names in the installed triton.language (tl) matching `query` (substring, e.g. 'dot',
        'load', 'atomic'), with their signatures and one doc line. Empty query lists every name.
        Use it before calling any tl function you are not sure exists."""
        return triton_language_api_text(query)

    @tool
    def describe_template(name: str) -> str:
        """Describe a kernel template of the library: its format, parameters with legal values,
        defaults and when it wins."""
        return describe_template_text(name)

    @tool
    def instantiate_template(name: str, params_json: str = "{}") -> str:
        """Return the full source of template `name` instantiated with the parameters in
        `params_json` (a JSON object, e.g. '{"BLOCK_N": 32}')."""
        return instantiate_template_text(name, params_json)

    @tool
    def past_kernels(signature_or_pattern: str = "") -> str:
        """Best verified kernel sources from past runs whose pattern signature or pattern class
        (e.g. 'unstructured', 'block', 'nm_2_4') matches; empty means the current matrix's."""
        return past_kernels_text(get_context(), signature_or_pattern)

    @tool
    def compile_kernel(source: str) -> str:
        """Run the static checks and compile a complete candidate source; returns ok and the log."""
        return compile_kernel_text(get_context(), source)

    @tool
    def verify_kernel(source: str) -> str:
        """Compile, run and verify a complete candidate source on the current matrix against an
        fp64 reference (sandboxed); returns status, errors and per-N checks."""
        return verify_kernel_text(get_context(), source)

    return [triton_language_api, describe_template, instantiate_template, past_kernels, compile_kernel,
            verify_kernel]
