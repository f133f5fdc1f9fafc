"""The worker's Python audit hook: what candidate code may do while it runs (`install`, `Gate`).

The hook (``sys.addaudithook``) is installed by the worker before any candidate is imported and
can never be removed. It is quiet while the harness's own code runs and strict while a
candidate runs (its import, ``prepare`` and ``spmm``, entered through `Gate.scope`), where it
refuses, with a `SandboxViolation` that is also recorded so a candidate cannot hide it with
``try/except``:

* file opens outside the allow-list: reads only of the Python installation and site-packages,
  the CUDA toolkit, the kernel sources and compiler caches, the worker's private directory and a
  few system files; writes only under the private directory and the compiler caches. The
  memory database, checkpoints, artifacts and the user's home are out of reach;
* processes: ``os.system``/``exec``/``spawn``/``fork``; ``subprocess`` only when Triton or CuPy
  start a known compiler binary (ptxas, nvdisasm, cc, ...);
* sockets (always, even between candidates), ``ctypes`` from candidate code, loading libraries
  from outside the library directories, ``os.kill``, environment and rlimit changes;
* introspection that reaches the verifier: ``gc`` object walks, frames (``sys._getframe``,
  ``tb_frame``, ``gi_frame``, ``sys._current_frames``, trace/profile hooks), code objects,
  setting attributes of types (``torch.Tensor.__matmul__ = ...``), new threads;
* run-time code: ``exec``/``compile``/``eval`` unless Triton or CuPy (JIT, interpreter) or the
  import system loading an allowed file does it; imports that the candidate's own code makes
  outside the static checks' allow-list.

Who did it is decided from the call stack: the innermost frame that is not the standard library,
string-compiled code or this module. So ``typing.get_type_hints`` evaluating a string annotation
for the candidate counts as the candidate, while Triton compiling its launcher does not. The gate
state lives in closures handed to the worker's main loop, not in module globals, so code that
reaches this module through ``sys.modules`` finds nothing to switch off.

An audit hook is a tripwire inside one interpreter, not a wall: it is layered on top of the OS
isolation in `isolation` (scrubbed environment, own directory, limits, network namespace), the
static checks before it and the verification after it (`docs/security.md`).
"""
from __future__ import annotations

import os
import sys
import sysconfig
import threading
from dataclasses import dataclass, field
from pathlib import Path

from .static_checks import SPARSEDITTO_MODULES

#: Compiler and helper binaries that Triton and CuPy start (ptxas for PTX -> cubin, cc for
#: Triton's launcher stub, ldconfig to find libcuda).
ALLOWED_TOOLS = frozenset({"ptxas", "nvdisasm", "cuobjdump", "nvcc", "nvlink", "fatbinary", "cc", "gcc",
                           "clang", "g++", "c++", "ldconfig", "ldconfig.real"})
#: Libraries allowed to compile/exec code and start compiler processes while a candidate runs.
CODEGEN_PACKAGES = ("triton", "cupy", "cupy_backends", "cuda.pathfinder", "cuda.bindings", "cuda.core")
#: Modules candidate code may import itself (the static checks' allow-list, at run time).
CANDIDATE_IMPORTS = frozenset({
    "__future__", "math", "numpy", "torch", "triton", "triton.language", "cupy", "typing", "functools",
    "sparseditto", "sparseditto.kernel_templates", *SPARSEDITTO_MODULES,
})
FRAME_ATTRS = frozenset({"tb_frame", "gi_frame", "cr_frame", "ag_frame", "f_code", "gi_code", "cr_code",
                         "ag_code", "__code__", "f_back", "f_locals", "f_globals"})
SYSTEM_READ_FILES = ("/etc/ld.so.cache", "/etc/localtime", "/etc/os-release", "/etc/nsswitch.conf",
                     "/etc/host.conf", "/etc/mime.types", "/dev/null", "/dev/urandom", "/dev/random",
                     "/dev/zero", "/proc/cpuinfo", "/proc/meminfo", "/proc/stat", "/proc/self",
                     "/proc/thread-self", f"/proc/{os.getpid()}", "/proc/sys/kernel", "/proc/driver/nvidia",
                     "/sys/devices/system/cpu", "/sys/devices/system/node", "/sys/fs/cgroup", "/sys/bus/pci",
                     "/sys/module/nvidia", "/dev/nvidia", "/dev/shm")
SYSTEM_READ_DIRS = ("/usr/lib", "/usr/lib64", "/usr/local/lib", "/lib", "/lib64", "/usr/include",
                    "/usr/local/include", "/usr/share/zoneinfo", "/opt/nvidia", "/opt/cuda")
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
_PATH_EVENTS_WRITE = {"os.mkdir": (0,), "os.rmdir": (0,), "os.remove": (0,), "os.rename": (0, 1),
                      "os.link": (0, 1), "os.symlink": (1,), "os.truncate": (0,), "os.chmod": (0,),
                      "os.chown": (0,), "os.utime": (0,), "os.chflags": (0,), "os.lchmod": (0,),
                      "os.setxattr": (0,), "os.removexattr": (0,), "shutil.rmtree": (0,),
                      "shutil.copyfile": (1,), "shutil.copymode": (1,), "shutil.copystat": (1,),
                      "shutil.copytree": (1,), "shutil.move": (1,), "tempfile.mkstemp": (0,),
                      "tempfile.mkdtemp": (0,)}
_PATH_EVENTS_READ = {"os.listdir": (0,), "os.scandir": (0,), "os.chdir": (0,), "os.listxattr": (0,),
                     "os.getxattr": (0,), "glob.glob": (0,), "shutil.unpack_archive": (0,)}
_ALWAYS_REFUSED_PREFIXES = ("socket.",)
_REFUSED_WHEN_ACTIVE = {
    "os.system": "runs a shell command", "os.exec": "replaces the worker with another program",
    "os.spawn": "starts a process", "os.posix_spawn": "starts a process", "os.fork": "forks the worker",
    "os.forkpty": "forks the worker", "pty.spawn": "starts a process", "os.kill": "sends a signal",
    "os.killpg": "sends a signal", "signal.pthread_kill": "sends a signal",
    "os.putenv": "changes the environment", "os.unsetenv": "changes the environment",
    "resource.setrlimit": "changes the resource limits", "resource.prlimit": "changes the resource limits",
    "sys.addaudithook": "adds an audit hook", "gc.get_objects": "walks the garbage collector's objects",
    "gc.get_referrers": "walks object references (reaches the verifier's data)",
    "gc.get_referents": "walks object references (reaches the verifier's data)",
    "sys._current_frames": "reads other threads' frames", "sys.settrace": "installs a trace hook",
    "sys.setprofile": "installs a profile hook", "webbrowser.open": "opens a browser",
    "builtins.input": "reads stdin", "builtins.breakpoint": "starts a debugger",
    "mmap.__new__": "maps memory", "os.memfd_create": "creates an anonymous file",
    "sys.monitoring.register_callback": "installs a monitoring hook",
}
_REFUSED_FOR_CANDIDATE = {
    "sys._getframe": "reads interpreter frames (the verifier's locals live there)",
    "sys._getframemodulename": "reads interpreter frames",
    "code.__new__": "builds code objects", "function.__new__": "builds functions from code objects",
    "marshal.loads": "loads marshalled code", "marshal.load": "loads marshalled code",
    "pickle.find_class": "unpickles objects", "object.__setattr__": "sets an attribute of a type (monkeypatching)",
    "object.__delattr__": "deletes an attribute of a type (monkeypatching)",
    "_thread.start_new_thread": "starts a thread (work outside the traced call)",
    "_thread.start_joinable_thread": "starts a thread (work outside the traced call)",
    "ctypes.dlopen": "loads a native library", "ctypes.dlsym": "looks up native symbols",
    "ctypes.call_function": "calls native code", "ctypes.cdata": "reads raw memory",
    "ctypes.addressof": "reads raw addresses", "ctypes.string_at": "reads raw memory",
    "ctypes.wstring_at": "reads raw memory", "ctypes.create_string_buffer": "creates raw buffers",
    "ctypes.create_unicode_buffer": "creates raw buffers", "ctypes.PyObj_FromPtr": "turns an address into an object",
    "ctypes.cdata/buffer": "reads raw memory", "ctypes.set_errno": "calls native code",
    "ctypes.get_errno": "calls native code", "ctypes.seh_exception": "calls native code",
}


def is_allowed_tool(name: str) -> bool:
    """A compiler binary Triton/CuPy may start: the names of `ALLOWED_TOOLS`, versioned or
    target-prefixed variants of them (ptxas-blackwell, x86_64-linux-gnu-gcc-12, clang-18)."""
    if name in ALLOWED_TOOLS:
        return True
    base = name.split("-")
    return any(part in ALLOWED_TOOLS for part in base) and all(
        part in ALLOWED_TOOLS or part.replace(".", "").isdigit() or part in ("x86_64", "aarch64", "linux", "gnu",
                                                                           "blackwell", "hopper")
        for part in base)


class SandboxViolation(PermissionError):
    """A candidate did something the sandbox refuses; the message names the operation."""


def _real(path) -> str:
    try:
        return os.path.realpath(os.fsdecode(path))
    except (TypeError, ValueError):
        return ""


def _under(path: str, roots) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


@dataclass
class Policy:
    """What the worker may touch while a candidate runs (absolute, resolved paths)."""

    read_roots: list[str] = field(default_factory=list)
    write_roots: list[str] = field(default_factory=list)
    deny_roots: list[str] = field(default_factory=list)
    stdlib_roots: list[str] = field(default_factory=list)
    site_roots: list[str] = field(default_factory=list)

    @classmethod
    def for_worker(cls, workdir: str, cache_dir: str, cache_subdirs: list[str]) -> "Policy":
        import site

        prefixes = {_real(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix)}
        sites = set()
        for getter in (site.getsitepackages, lambda: [site.getusersitepackages()]):
            try:
                sites |= {_real(p) for p in getter()}
            except Exception:
                pass
        stdlib = {_real(os.path.dirname(os.__file__)), _real(sysconfig.get_paths()["stdlib"])}
        path_dirs = {_real(p) for p in sys.path if p and os.path.isdir(p)}
        package_root = _real(Path(__file__).resolve().parents[2])
        cuda = {_real(os.environ[v]) for v in ("CUDA_HOME", "CUDA_PATH", "CUDA_ROOT") if os.environ.get(v)}
        cuda |= {_real(p) for p in Path("/usr/local").glob("cuda*")} if Path("/usr/local").is_dir() else set()
        cache = _real(cache_dir)
        kernels = os.path.join(cache, "kernels")
        # /dev/null: Triton and CuPy send their compilers' output there (subprocess.DEVNULL).
        writable = [_real(workdir), "/dev/null"] + [_real(p) for p in cache_subdirs]
        readable = sorted(prefixes | sites | path_dirs | cuda | {package_root, kernels}
                          | {_real(p) for p in SYSTEM_READ_DIRS} | set(SYSTEM_READ_FILES)) + writable
        # The cache root holds the memory database, checkpoints and matrices: closed, except the
        # kernel sources and compiler caches opened above.
        return cls(read_roots=readable, write_roots=writable, deny_roots=[cache], stdlib_roots=sorted(stdlib),
                   site_roots=sorted(sites))

    def may_read(self, path: str) -> bool:
        kernels = [os.path.join(root, "kernels") for root in self.deny_roots]
        if _under(path, self.write_roots) or _under(path, kernels):
            return True
        if _under(path, self.deny_roots):
            return False
        return _under(path, self.read_roots)

    def may_write(self, path: str) -> bool:
        return _under(path, self.write_roots)


class Gate:
    """Opens and closes candidate scopes; holds the violations seen in the current scope.

    Only the worker's main loop holds the gate (it is passed down to the task functions as an
    argument), so candidate code has no reference through which to close it.
    """

    def __init__(self, state: dict, policy: Policy) -> None:
        self._state = state
        self.policy = policy

    def add_candidate_file(self, path: str | os.PathLike) -> None:
        self._state["candidate_files"].add(_real(path))

    def scope(self, what: str) -> "_Scope":
        return _Scope(self._state, what)

    @property
    def active(self) -> bool:
        return bool(self._state["active"])


class _Scope:
    def __init__(self, state: dict, what: str) -> None:
        self._state, self.what = state, what
        self.violations: list[str] = []

    def __enter__(self) -> "_Scope":
        self._state["violations"] = []
        self._state["active"] = True
        self._state["owner"] = threading.get_ident()
        return self

    def __exit__(self, *exc) -> None:
        self._state["active"] = False
        self.violations = list(self._state["violations"])
        self._state["violations"] = []


def install(policy: Policy) -> Gate:
    """Install the audit hook (once per process) and return the only `Gate` that drives it."""
    state = {"active": False, "violations": [], "candidate_files": set(), "owner": None}
    local = threading.local()
    guard_file = _real(__file__)
    trusted_root = os.path.dirname(os.path.dirname(guard_file))   # the sparseditto package
    # The harness's own code inside a scope (tracers, the import of the candidate) may compile.
    codegen_roots = [root for root in (_package_dir(name) for name in CODEGEN_PACKAGES) if root]
    codegen_roots.append(os.path.dirname(guard_file))

    def actor() -> tuple[str, str]:
        """('candidate' | 'codegen' | 'library', filename) of the innermost frame that counts:
        the standard library, string-compiled code and this module are looked through."""
        frame = sys._getframe(1)
        while frame is not None:
            filename = frame.f_code.co_filename
            frame = frame.f_back
            if filename in state["candidate_files"]:
                return "candidate", filename
            if filename.startswith("<"):
                continue
            real = filename if filename.startswith("/") else _real(filename)
            if real == guard_file:
                continue
            if real in state["candidate_files"]:
                return "candidate", real
            if _under(real, codegen_roots):
                return "codegen", real
            if _under(real, policy.site_roots) or _under(real, [trusted_root]):
                return "library", real
            if _under(real, policy.stdlib_roots):
                continue
            return "library", real
        return "library", "?"

    def refuse(event: str, why: str) -> None:
        message = f"sandbox refused {event}: {why}"
        state["violations"].append(message)
        raise SandboxViolation(message)

    def check_path(event: str, path, write: bool) -> None:
        if isinstance(path, int) or path is None:
            # A descriptor: the candidate may not reach the task pipes; Triton / CuPy reading their
            # compiler's output pipes (subprocess with stdout=PIPE opens those descriptors) may.
            if isinstance(path, int) and path > 2 and actor()[0] != "codegen":
                refuse(event, f"opens inherited file descriptor {path} (the task pipes)")
            return
        real = _real(path)
        if not real:
            return
        if write and not policy.may_write(real):
            refuse(event, f"writes '{real}' (allowed: the worker's own directory and the compiler caches)")
        if not write and not policy.may_read(real):
            refuse(event, f"reads '{real}' (outside the libraries, kernel sources and caches)")

    def hook(event: str, args: tuple) -> None:
        if getattr(local, "busy", False):
            return
        if event.startswith(_ALWAYS_REFUSED_PREFIXES):
            local.busy = True
            try:
                refuse(event, "network access is not available to kernels")
            finally:
                local.busy = False
        if not state["active"]:
            return
        local.busy = True
        try:
            _check(event, args)
        finally:
            local.busy = False

    def _check(event: str, args: tuple) -> None:
        if event == "open":
            path, mode, flags = (tuple(args) + (None, None, None))[:3]
            write = bool(mode and any(c in str(mode) for c in "wax+")) or bool(
                isinstance(flags, int) and flags & _WRITE_FLAGS)
            check_path(event, path, write)
            return
        positions = _PATH_EVENTS_WRITE.get(event) or _PATH_EVENTS_READ.get(event)
        if positions:
            for i in positions:
                if i < len(args):
                    check_path(event, args[i], event in _PATH_EVENTS_WRITE)
            return
        if event in ("os.posix_spawn", "os.posix_spawnp"):
            # subprocess.Popen (already checked above for its caller and tool) starts the child this way
            who, _ = actor()
            tool = os.path.basename(os.fsdecode(args[0])) if args and args[0] else ""
            if who == "codegen" and is_allowed_tool(tool):
                return
        if event in _REFUSED_WHEN_ACTIVE or event.startswith(("os.exec", "os.spawn")):
            refuse(event, _REFUSED_WHEN_ACTIVE.get(event, "starts a process"))
        if event == "subprocess.Popen":
            who, where = actor()
            exe = args[0] if args and args[0] else (args[1][0] if len(args) > 1 and args[1] else "")
            tool = os.path.basename(os.fsdecode(exe)) if exe else ""
            if who != "codegen" or not is_allowed_tool(tool):
                refuse(event, f"starts '{tool or exe}' (only Triton/CuPy may start their compilers)")
            return
        if event in ("exec", "compile"):
            who, where = actor()
            if who == "codegen":
                return
            if event == "compile":
                source, filename = (tuple(args) + (None, None))[:2]
            else:
                source, filename = None, getattr(args[0] if args else None, "co_filename", "") or ""
            fname = os.fsdecode(filename) if isinstance(filename, (bytes, str)) else ""
            if fname and not fname.startswith("<"):
                real = _real(fname)
                known = real in state["candidate_files"] or policy.may_read(real)
                # The import system compiling a module file: the source must BE that file, or a
                # candidate could compile its own text under a library's name (and its frames would
                # then pass for the library's). Code objects of such files are then safe to exec.
                if known and (event == "exec" or _same_as_file(real, source)):
                    return
            refuse(event, f"run-time {event} of {fname or 'a string'} by {where} (only Triton/CuPy may "
                          f"generate code while a kernel runs)")
        if event == "import":
            who, where = actor()
            module = str(args[0]) if args else ""
            if who == "candidate" and module not in CANDIDATE_IMPORTS and not module.startswith("triton.language."):
                refuse(event, f"import of '{module}' by the candidate (allowed: {', '.join(sorted(CANDIDATE_IMPORTS - {'__future__'}))})")
            return
        if event == "object.__getattr__":
            name = str(args[1]) if len(args) > 1 else ""
            if name in FRAME_ATTRS:
                who, where = actor()
                if who == "candidate":
                    refuse(event, f"reads '.{name}' (frames and code objects reach the verifier)")
            return
        if event in _REFUSED_FOR_CANDIDATE:
            who, where = actor()
            if event == "ctypes.dlopen" and who != "candidate":
                name = args[0] if args else None
                text = os.fsdecode(name) if isinstance(name, (str, bytes)) else ""
                if text and "/" in text and not policy.may_read(_real(text)):
                    refuse(event, f"loads the native library '{text}' from outside the library directories")
                return
            if who == "candidate":
                refuse(event, _REFUSED_FOR_CANDIDATE[event])

    sys.addaudithook(hook)
    _guard_threads(state, actor_fn=actor, refuse_fn=refuse, local=local)
    return Gate(state, policy)


def _same_as_file(path: str, source) -> bool:
    """True when ``source`` (str or bytes, as compile() received it) is the content of ``path``."""
    if source is None:
        return False
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except OSError:
        return False
    if isinstance(source, str):
        try:
            return data.decode("utf-8") == source
        except UnicodeDecodeError:
            return False
    return bytes(source) == data


def _package_dir(name: str) -> str | None:
    import importlib.util

    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return _real(list(spec.submodule_search_locations)[0])


def _guard_threads(state: dict, actor_fn, refuse_fn, local) -> None:
    """Python < 3.12 raises no audit event when a thread starts: wrap the thread primitives, so a
    candidate's side thread (computing outside the traced call) is refused like the rest."""
    import _thread

    original = _thread.start_new_thread

    def start_new_thread(function, args, kwargs=None):
        if state["active"] and not getattr(local, "busy", False):
            local.busy = True
            try:
                who, _ = actor_fn()
                if who == "candidate":
                    refuse_fn("_thread.start_new_thread", "starts a thread (work outside the traced call)")
            finally:
                local.busy = False
        return original(function, args, *(() if kwargs is None else (kwargs,)))

    _thread.start_new_thread = start_new_thread
    if hasattr(threading, "_start_new_thread"):
        threading._start_new_thread = start_new_thread


def python_threads() -> set[int]:
    """Idents of the threads running Python code now (compared before and after a candidate call)."""
    return set(sys._current_frames())


# ---- integrity of what the verifier relies on -------------------------------------------------------

INTEGRITY_MODULES = ("builtins", "math", "operator", "functools", "hashlib", "hmac", "json", "numpy",
                     "scipy.sparse", "torch", "torch.nn.functional", "torch.linalg", "sparseditto.matrix",
                     *SPARSEDITTO_MODULES, "sparseditto.harness.numerics", "sparseditto.harness.verify",
                     "sparseditto.harness.execution", "sparseditto.harness.bench", "sparseditto.harness.timing",
                     "sparseditto.harness.tracing", "sparseditto.harness.worker", "sparseditto.harness.guard")


def _namespaces() -> dict[str, dict]:
    out = {}
    for name in INTEGRITY_MODULES:
        module = sys.modules.get(name)
        if module is not None:
            out[name] = vars(module)
    try:
        import torch

        out["torch.Tensor"] = torch.Tensor.__dict__
        out["torch._C.TensorBase"] = torch._C.TensorBase.__dict__
    except Exception:
        pass
    return out


def _torch_globals() -> dict:
    """Process-wide torch state a candidate could change to fool the checks that follow it: an
    ambient function/dispatch mode left pushed would run its code on every harness torch call."""
    out: dict = {}
    torch = sys.modules.get("torch")
    if torch is None:
        return out
    probes = {
        "function_mode_stack": lambda: torch._C._len_torch_function_stack(),
        "dispatch_mode_stack": lambda: torch._C._len_torch_dispatch_stack(),
        "default_dtype": lambda: str(torch.get_default_dtype()),
        "grad_enabled": lambda: torch.is_grad_enabled(),
        "deterministic": lambda: torch.are_deterministic_algorithms_enabled(),
        "float32_matmul_precision": lambda: torch.get_float32_matmul_precision(),
        "cuda_matmul_tf32": lambda: torch.backends.cuda.matmul.allow_tf32,
        "cudnn_tf32": lambda: torch.backends.cudnn.allow_tf32,
        "fp16_reduced_precision": lambda: torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction,
    }
    for name, probe in probes.items():
        try:
            out[name] = probe()
        except Exception:
            pass
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        out["numpy_errstate"] = tuple(sorted(numpy.geterr().items()))
    return out


@dataclass
class Integrity:
    """Identity of every attribute of the modules and types the verifier uses.

    A candidate that monkeypatches ``numpy.abs``, ``torch.equal`` or a harness function would make
    the checks that follow its call lie; comparing identities after each call finds that (the
    worker is then replaced, since it can no longer be trusted).
    """

    ids: dict[str, dict[str, int]]
    flags: dict = field(default_factory=dict)

    @classmethod
    def take(cls) -> "Integrity":
        return cls({name: {k: id(v) for k, v in list(ns.items())} for name, ns in _namespaces().items()},
                   _torch_globals())

    def changed(self) -> list[str]:
        now_flags = _torch_globals()
        out = [f"torch state {k}: {v!r} -> {now_flags.get(k)!r}" for k, v in self.flags.items()
               if now_flags.get(k) != v]
        for name, ns in _namespaces().items():
            before = self.ids.get(name)
            if before is None:
                continue
            now = {k: id(v) for k, v in list(ns.items())}
            # Names that were there before and now point elsewhere (or are gone). New names in a
            # module are harmless to checks that only use the old ones (lazy submodule imports add
            # some); in a class they shadow inherited methods (torch.Tensor.__mul__), so they count.
            out += [f"{name}.{key}" for key, ident in before.items() if now.get(key) != ident]
            if name.startswith("torch.") and name[6:7].isupper() or name == "torch._C.TensorBase":
                out += [f"{name}.{key} (added)" for key in now if key not in before]
        return out

    def refresh(self) -> None:
        """Accept new attributes that importing allowed modules added (lazy submodules)."""
        fresh = Integrity.take()
        self.ids, self.flags = fresh.ids, fresh.flags
