"""Batch jobs over a model's layers, on the Triton interpreter (small synthetic checkpoints).

One batch over a sharded safetensors checkpoint (module fixture, with a real memory file) serves
the report, bundle, patch and export tests (the bundle and both exports share one fresh process); the re-pruned model and the .pt state_dict run their
own small batches. The kill -9 / resume test is in test_batch_resume.py.
"""
from __future__ import annotations

import ast
import json
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest
import scipy.sparse as sp
import torch

from batch_models import llama_like, save_shards, small_unstructured, tiny_model
from sparseditto.batch.bundle import load_bundle
from sparseditto.batch.models import BatchReport
from sparseditto.batch.patch import patch_model, unpatch_model
from sparseditto.batch.runner import run_batch
from sparseditto.batch.weights import list_weights

RUN = dict(target="A100", n=[16], backend="interpret", budget=2, memory=False)


@pytest.fixture(scope="module")
def tensors():
    return llama_like()


@pytest.fixture(scope="module")
def batch(tmp_path_factory, tensors, pool):
    root = tmp_path_factory.mktemp("batch")
    shards = save_shards(tensors, root / "model")
    report = run_batch(shards, out=root / "out", **{**RUN, "memory": str(root / "memory.sqlite")})
    return shards, root / "out", report


def test_batch_over_safetensors_shards_groups_reuses_and_shares(batch):
    _, out, report = batch
    by = {x.name: x for x in report.layers}
    assert report.complete and set(by) == set(llama_like())
    assert by["norm.weight"].status == "skipped" and "1-D" in by["norm.weight"].reason
    assert by["embed.weight"].status == "skipped" and "below min_sparsity" in by["embed.weight"].reason
    lead, follow, same = (by[f"layers.{i}.mlp.up.weight"] for i in range(3))
    assert lead.status == "searched" and lead.template not in (None, "dense") and lead.run_id
    assert lead.group == follow.group == same.group
    # the second layer starts from the winner: same kernel, its own verification and timing
    assert follow.status == "reused", follow.reason
    assert (follow.template, follow.params, follow.source_hash) == (lead.template, lead.params, lead.source_hash)
    assert follow.verification["ok"] and follow.verification["seed"] is not None
    assert follow.signature != lead.signature and follow.expected_ms and follow.kernel_ms <= follow.expected_ms * 1.05
    # the same structure (other values): the same kernel outright
    assert same.status == "shared" and same.signature == lead.signature and same.source_hash == lead.source_hash
    q = by["layers.0.attn.q.weight"]
    assert q.status == "searched" and q.group != lead.group
    # where each layer's seconds went: the search, or the reuse's steps (no GPU: nothing timed)
    assert {"analyze", "load", "search"} <= set(lead.phase_seconds) and lead.phase_seconds["search"] <= lead.seconds
    assert {"analyze", "load", "verify"} <= set(follow.phase_seconds) and "search" not in follow.phase_seconds
    assert 0 < follow.phase_seconds["verify"] <= follow.seconds
    totals = report.phase_totals()
    assert totals["search"] == pytest.approx(sum(x.phase_seconds.get("search", 0) for x in report.layers))
    assert "batch seconds by phase: " in report.summary()
    for layer in (lead, follow, same):
        assert layer.speedup_vs_dense > 1.0 and layer.time_saved_ms > 0 and layer.timings_are_estimates
        assert layer.n_speedups == {16: layer.speedup_vs_dense}       # one N: its own ratio, for patch_model
    manifest = json.loads((out / "bundle" / "manifest.json").read_text())
    assert manifest["kernels"]["layers.0.mlp.up.weight"]["n_speedups"] == {"16": lead.speedup_vs_dense}
    on_disk = BatchReport.model_validate_json((out / "report.json").read_text())
    assert [x.name for x in on_disk.layers] == [x.name for x in report.layers]
    html = (out / "report.html").read_text()
    assert html.count("data:image/png;base64,") == 4 and "NOT GPU timings" in html.replace("Not GPU", "NOT GPU")
    assert "layers.1.mlp.up.weight" in html and "reused" in html


@pytest.mark.slow
def test_patch_model_matches_dense_keeps_state_dict_and_falls_back(batch, tensors):
    _, out, _ = batch
    model = tiny_model(tensors)
    x = (torch.randn(2, 8, 1024, generator=torch.Generator().manual_seed(2)) * 0.1).half()   # N = 16 tokens
    with torch.no_grad():
        dense = model(x)
        state = {k: v.clone() for k, v in model.state_dict().items()}
        patched = patch_model(model, out)
        assert set(patched) == {f"layers.{i}.mlp.up" for i in range(3)}   # attn.q: dense won, not patched
        y = model(x)
        assert all(p.calls == 1 for p in patched.values())
        # copy-free: the kernels ran on the transposed views of x and y (checked against copies once)
        assert all(p.strided_ok == {("cpu", 16): True} for p in patched.values())
        scale = float(dense.abs().max())
        assert float((y - dense).abs().max()) / scale < 5e-3
        assert list(model.state_dict()) == list(state) and all(torch.equal(state[k], v) for k, v in model.state_dict().items())
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            model(x[:, :2])            # N = 4: not verified -> dense, one warning per layer
            model(x[:, :2])
        assert len([w for w in caught if "N=4" in str(w.message)]) == 3
        assert all(p.fallbacks == 2 for p in patched.values())
        compiled = torch.compile(model, backend="aot_eager")   # Dynamo + the op's fake implementation
        yc = compiled(x)
        assert float((yc - dense).abs().max()) / scale < 5e-3 and all(p.calls == 2 for p in patched.values())
    assert unpatch_model(model) == 3
    with torch.no_grad():
        assert torch.equal(model(x), dense)


# A kernel that reads B's storage as if B were contiguous: right on copies, wrong on x^T's view.
STRIDE_BLIND = textwrap.dedent('''
    import torch

    def prepare(A, dtype, device):
        return {"a": A.to_torch(dtype=dtype, device=device)}

    def spmm(packed, B, out):
        flat = torch.as_strided(B, B.shape, (B.shape[1], 1))
        out.copy_(packed["a"] @ flat)
''')


def test_patch_keeps_copies_for_a_kernel_that_ignores_strides(tensors):
    from sparseditto.api import SpMMKernel
    from sparseditto.batch.patch import PatchedLinear
    from sparseditto.io import load_matrix

    W = tensors["layers.0.attn.q.weight"]
    kernel = SpMMKernel(load_matrix(W, name="q"), STRIDE_BLIND, "stride_blind", verified_ns=[8],
                        verified_dtype="float16", verify_new_n=False)
    layer = PatchedLinear(name="q", kernel=kernel, verified_ns=frozenset([8]), verified_dtype="float16",
                          out_features=W.shape[0])
    x = torch.randn(8, W.shape[1], generator=torch.Generator().manual_seed(4)).half()
    for _ in range(2):
        y = torch.empty(8, W.shape[0], dtype=torch.float16)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            layer.linear_into(x, y)
        assert torch.allclose(y.float(), (x.float() @ W.float().t()), atol=1e-2, rtol=1e-2)
    assert layer.strided_ok == {("cpu", 8): False} and len(layer.warned) == 1


def test_patch_runs_dense_where_the_batch_measured_dense_faster(tensors):
    """A bundle's n_speedups below 1.0 at an N: that N runs the dense forward, by design (counted,
    no warning); at the others the kernel runs, through the direct eager path (no op dispatch)."""
    from sparseditto.api import SpMMKernel
    from sparseditto.batch.patch import _KERNELS, _forward, PatchedLinear
    from sparseditto.io import load_matrix

    W = tensors["layers.0.attn.q.weight"]
    calls = []

    class Spy(SpMMKernel):
        def spmm_into(self, B, out):
            calls.append(B.shape[1])
            out.copy_((W.float() @ B.float()).to(out.dtype))

    linear = torch.nn.Linear(W.shape[1], W.shape[0], bias=False).half()
    with torch.no_grad():
        linear.weight.copy_(W)
    kernel = Spy(load_matrix(W, name="q"), "", "spy", verified_ns=[1, 8], verified_dtype="float16", verify_new_n=False)
    state = PatchedLinear(name="q", kernel=kernel, verified_ns=frozenset([1, 8]), verified_dtype="float16",
                          out_features=W.shape[0], n_speedups={1: 1.6, 8: 0.4})
    _KERNELS["test:q"] = state
    state.strided_ok[("cpu", 1)] = True
    forward = _forward(linear, "test:q")
    x = torch.randn(8, W.shape[1], generator=torch.Generator().manual_seed(5)).half()
    with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        y8 = forward(x)                  # N = 8: dense measured faster
        y1 = forward(x[:1])              # N = 1: the kernel
        forward(x[:1])
    assert not caught
    assert calls == [1, 1] and state.calls == 2 and state.dense_by_choice == 1 and state.fallbacks == 0
    assert torch.equal(y8, torch.nn.functional.linear(x, linear.weight))
    assert torch.allclose(y1.float(), x[:1].float() @ W.float().t(), atol=1e-2, rtol=1e-2)
    assert state.decisions == {(torch.float16, 8, "cpu", False): "dense", (torch.float16, 1, "cpu", False): None}
    del _KERNELS["test:q"]


def test_n_speedups_measured_on_the_cost_model_without_a_gpu_and_inherited(tensors):
    from sparseditto.analysis import analyze
    from sparseditto.batch import n_speedups
    from sparseditto.batch.models import LayerResult
    from sparseditto.batch.reuse import BatchSettings, estimates
    from sparseditto.io import load_matrix
    from sparseditto.targets import resolve_target

    W = tensors["layers.0.mlp.up.weight"]
    A = load_matrix(W, name="up")
    report = analyze(A).model_dump(mode="json")
    settings = BatchSettings(target=resolve_target("A100")[0], n_values=[1, 64], dtype="float16",
                             backend="interpret", budget=2, tolerance=0.1, memory=False, checkpoint="off")
    layer = LayerResult(name="up", shape=tuple(W.shape), dtype="float16", status="searched", template="csr_rowsplit",
                        params={}, speedup_vs_dense=1.7)
    ratios = n_speedups.measured(layer, A, report, settings)
    at64 = estimates(report, n_speedups._at_n(settings, 64), "csr_rowsplit", {})
    assert ratios[1] == 1.7 and ratios[64] == pytest.approx(at64["dense"] / at64["kernel"])
    follower = layer.model_copy(update=dict(name="up2", status="reused", speedup_vs_dense=1.5, n_speedups={}))
    assert n_speedups.inherited(follower, layer.model_copy(update=dict(n_speedups=ratios)), settings) == \
        {1: 1.5, 64: ratios[64]}


def test_patch_model_refuses_a_changed_weight(batch, tensors):
    _, out, _ = batch
    model = tiny_model(tensors)
    with torch.no_grad():
        model.layers[1].mlp.up.weight[0, :] = 1.0          # the structure changed: row 0 is dense now
    with pytest.raises(ValueError, match="layers.1.mlp.up.weight: the weight's sparsity structure changed"):
        patch_model(model, out)
    assert all("forward" not in m.__dict__ for m in model.modules())   # nothing was patched


def test_re_pruned_model_reuses_unchanged_kernels_and_flags_slower_layers(batch, tmp_path, tensors):
    shards, out, report = batch
    old = BatchReport.model_validate_json((out / "report.json").read_text())
    # pretend layer 0 ran faster last time, so this batch must flag it as slower
    for x in old.layers:
        if x.name == "layers.0.mlp.up.weight":
            x.kernel_ms = x.kernel_ms / 2
    prev = tmp_path / "prev"
    prev.mkdir()
    (prev / "report.json").write_text(old.model_dump_json())
    repruned = llama_like(up_seeds=(0, 7))          # layer 1 re-pruned, the rest unchanged
    new = run_batch(save_shards(repruned, tmp_path / "model"), out=tmp_path / "out", previous=prev, **RUN)
    by = {x.name: x for x in new.layers}
    assert by["layers.0.mlp.up.weight"].status == "previous"
    assert by["layers.0.mlp.up.weight"].slower_than_previous
    changed = by["layers.1.mlp.up.weight"]
    assert changed.status == "reused" and changed.signature != report.layer("layers.1.mlp.up.weight").signature
    assert by["layers.2.mlp.up.weight"].status == "shared"
    assert by["layers.0.attn.q.weight"].status == "previous" and by["layers.0.attn.q.weight"].template == "dense"
    assert not any(x.status == "searched" for x in new.layers)
    assert "SLOWER than previous" in (tmp_path / "out" / "report.html").read_text()


def test_every_n_of_the_batch_gets_a_ratio_and_the_group_inherits_them(tmp_path, pool):
    """Found on the H200: the group's reused layers took the winner's record from before its per-N
    ratios were measured, so at N = 16 they ran a decode kernel 4x slower than dense."""
    from batch_models import block_weight

    weights = {"a.weight": block_weight(0), "b.weight": block_weight(1)}
    report = run_batch(weights, out=tmp_path / "out", **{**RUN, "n": [16, 4]})
    lead, follow = report.layer("a.weight"), report.layer("b.weight")
    assert lead.status == "searched" and follow.status == "reused", (lead.reason, follow.reason)
    assert set(lead.n_speedups) == set(follow.n_speedups) == {16, 4}
    assert follow.n_speedups[4] == lead.n_speedups[4] and follow.n_speedups[16] == follow.speedup_vs_dense
    bundle = load_bundle(tmp_path / "out")
    assert bundle.kernels["b.weight"].n_speedups == follow.n_speedups


def test_batch_over_a_torch_state_dict_and_a_module(tmp_path, pool):
    sd = {"enc.0.weight": small_unstructured(64, 96, 5), "enc.0.bias": torch.zeros(64).half(),
          "conv.weight": torch.zeros(8, 4, 3, 3).half()}
    torch.save(sd, tmp_path / "model.pt")
    report = run_batch(tmp_path / "model.pt", out=tmp_path / "out", select=r"^(enc|conv)\.", min_sparsity=0.5, **RUN)
    by = {x.name: x for x in report.layers}
    assert by["enc.0.weight"].status == "searched" and by["enc.0.weight"].kind == "linear"
    assert by["enc.0.bias"].status == "skipped"
    assert by["conv.weight"].kind == "conv" and "all zeros" in by["conv.weight"].reason
    refs = {r.name: r for r in list_weights(tiny_model(llama_like()))}
    assert refs["layers.0.mlp.up.weight"].matrix_shape == (256, 1024) and refs["layers.0.mlp.up.bias"].matrix_shape is None
    assert list_weights(torch.nn.Conv2d(4, 8, 3))[0].matrix_shape == (8, 36)


def test_bad_inputs_are_clear_value_errors(tmp_path, batch):
    shards, out, _ = batch
    with pytest.raises(ValueError, match="does not exist"):
        run_batch(tmp_path / "nope.safetensors", out=tmp_path / "o", **RUN)
    with pytest.raises(ValueError, match="not a valid regular expression"):
        run_batch(shards, select="(", out=tmp_path / "o", **RUN)
    with pytest.raises(ValueError, match="min_sparsity must be in"):
        run_batch(shards, min_sparsity=1.5, out=tmp_path / "o", **RUN)
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match="is a file"):
        run_batch(shards, out=tmp_path / "file", **RUN)
    with pytest.raises(ValueError, match="holds no report.json"):
        run_batch(shards, out=tmp_path / "o", previous=tmp_path, **RUN)
    with pytest.raises(ValueError, match="already holds a batch"):
        run_batch(shards, out=out, **RUN)                      # nothing in out is touched
    with pytest.raises(ValueError, match=r"settings differ in \['n'\]"):
        run_batch(shards, out=out, resume=True, **{**RUN, "n": [8]})
    assert BatchReport.model_validate_json((out / "report.json").read_text()).complete
    with pytest.raises(ValueError, match="not a kernel bundle"):
        load_bundle(tmp_path)
    (tmp_path / "idx").mkdir()
    (tmp_path / "idx" / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"a": "gone.safetensors"}}))
    with pytest.raises(ValueError, match="missing from"):
        run_batch(tmp_path / "idx", out=tmp_path / "o2", **RUN)


def test_a_tampered_bundle_source_is_never_run(batch, tmp_path, tensors):
    import shutil

    _, out, _ = batch
    copy = tmp_path / "bundle"
    shutil.copytree(out / "bundle", copy)
    entry = load_bundle(copy).kernels["layers.0.mlp.up.weight"]
    path = copy / entry.source_file
    path.write_text(path.read_text() + "\n# changed\n")
    with pytest.raises(ValueError, match="does not match its recorded sha256"):
        patch_model(tiny_model(tensors), copy)


def test_cli_batch_resumes_a_finished_batch_and_reports_bad_input(batch, capsys, tmp_path):
    from sparseditto.cli.app import main

    shards, out, report = batch
    code = main(["batch", str(shards), "--out", str(out), "--resume", "--target", "A100", "-n", "16",
                 "--backend", "interpret", "--budget", "2", "-q"])
    printed = capsys.readouterr()
    assert code == 0, printed.err
    assert f"{len(report.layers)} tensors in {report.groups} group(s)" in printed.out and "1 reused" in printed.out
    assert main(["batch", str(tmp_path / "missing"), "--out", str(tmp_path / "o")]) == 2
    assert "does not exist" in capsys.readouterr().err


# ---- sparseditto export: one kernel as a standalone module ----------------------------------------

ALLOWED_THIRD_PARTY = {"torch", "numpy", "triton"}
# One fresh process. First, refusing SparseDitto and scipy outright (the exported files must run
# without them): the memory run's kernel on W (C saved for the parent's scipy product, another
# structure refused), then the bundle layer's file's own self-check on its real weight. Then,
# SparseDitto allowed: the bundle itself loaded and run through load_bundle, without the agents.
CHILD_EXPORT = textwrap.dedent('''
    import contextlib, importlib.abc, importlib.util, io, json, sys
    class Refuse(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in ("sparseditto", "scipy", "kernel_templates"):
                raise ImportError(f"the exported kernel imported {name}")
    sys.meta_path.insert(0, Refuse())
    import numpy as np, torch
    def load(name, path):
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        return module
    kernel, up1 = load("kernel", sys.argv[1]), load("up1", sys.argv[5])
    W, B = np.load(sys.argv[2]), np.load(sys.argv[3])
    k = kernel.SpMM(torch.from_numpy(W).half())
    np.save(sys.argv[4], k(torch.from_numpy(B).half()).float().numpy())
    other = W.copy(); other[0, :] = 1.0
    try:
        kernel.SpMM(other)
        refused = ""
    except ValueError as exc:
        refused = str(exc)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        code = up1.self_check(["--weight", sys.argv[6]])
    modules = sorted(m for m in sys.modules if m.startswith(("sparseditto", "scipy")))
    del sys.meta_path[0]
    from sparseditto import load_bundle
    from sparseditto.io import load_matrix
    name = "layers.1.mlp.up.weight"
    W1 = torch.from_numpy(np.load(sys.argv[6])).half()
    bundled = load_bundle(sys.argv[7]).kernel(name, load_matrix(W1, name=name))
    B1 = torch.randn(W1.shape[1], 16, generator=torch.Generator().manual_seed(1)).half()
    ref = W1.double() @ B1.double()
    err = float((bundled(B1).double() - ref).abs().max() / ref.abs().max())
    agents = sorted(m for m in sys.modules if m.startswith(("sparseditto.graphs", "langgraph")))
    print(json.dumps({"refused": refused, "template": kernel.EXPORT["template"], "self_check": code,
                      "check": json.loads(printed.getvalue()), "modules": modules,
                      "bundle_err": err, "agents": agents}))
''')


def _imported_roots(path) -> set[str]:
    roots = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            roots |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            roots.add((node.module or "").split(".")[0])
    return roots


def test_bundle_and_exported_kernels_run_in_a_fresh_process(batch, tensors, tmp_path):
    """A memory run's kernel and a bundle layer's kernel exported by the CLI (no SparseDitto
    needed), and the bundle itself (no agents needed), in one fresh process."""
    from sparseditto.cli.app import main

    shards, out, report = batch
    bundle = load_bundle(out)
    assert set(bundle.kernels) == {f"layers.{i}.mlp.up.weight" for i in range(3)}
    entry = bundle.kernels["layers.1.mlp.up.weight"]
    assert entry.packed_format["format"] and entry.verification["ok"] and 16 in entry.verified_ns
    lead = report.layer("layers.0.mlp.up.weight")
    path, up1 = tmp_path / "kernel.py", tmp_path / "up1.py"
    assert main(["export", lead.run_id[:8], "--out", str(path), "--memory", str(out.parent / "memory.sqlite")]) == 0
    assert main(["export", "layers.1.mlp.up.weight", "--bundle", str(out), "--out", str(up1)]) == 0
    for exported in (path, up1):
        roots = _imported_roots(exported)
        assert roots - sys.stdlib_module_names == ALLOWED_THIRD_PARTY, roots    # no sparseditto, scipy, cupy
    W = tensors["layers.0.mlp.up.weight"].float().numpy()
    B = np.random.default_rng(3).uniform(-1, 1, (W.shape[1], 16)).astype(np.float16).astype(np.float32)
    for name, value in (("W", W), ("B", B), ("W1", tensors["layers.1.mlp.up.weight"].float().numpy())):
        np.save(tmp_path / f"{name}.npy", value)
    env = dict(__import__("os").environ, TRITON_INTERPRET="1")
    done = subprocess.run([sys.executable, "-I", "-c", CHILD_EXPORT, str(path), str(tmp_path / "W.npy"),
                           str(tmp_path / "B.npy"), str(tmp_path / "C.npy"), str(up1), str(tmp_path / "W1.npy"),
                           str(out)],
                          capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["modules"] == [] and got["template"] == lead.template
    assert "sparsity structure" in got["refused"]               # another structure is refused
    ref = sp.csr_array(W.astype(np.float64)) @ B.astype(np.float64)
    C = np.load(tmp_path / "C.npy")
    assert float(np.abs(C - ref).max() / np.abs(ref).max()) < 2e-3
    # the bundle layer's file checks itself at every N the batch verified it for
    verified = report.layer("layers.1.mlp.up.weight").verified_ns
    assert got["self_check"] == 0 and got["check"]["ok"] and 16 in verified
    assert [c["n"] for c in got["check"]["checks"]] == sorted(verified)
    assert got["bundle_err"] < 2e-3 and got["agents"] == []     # load_bundle ran without the graph


def test_export_bad_refs_are_clear_errors(batch, tmp_path, capsys):
    from sparseditto.cli.app import main

    _, out, report = batch
    memory = str(out.parent / "memory.sqlite")
    assert main(["export", "nosuchrun", "--out", str(tmp_path / "k.py"), "--memory", memory]) == 2
    assert "Unknown run id 'nosuchrun'" in capsys.readouterr().err
    q = report.layer("layers.0.attn.q.weight")          # dense won: nothing to export
    assert main(["export", q.run_id, "--out", str(tmp_path / "k.py"), "--memory", memory]) == 2
    assert "best answer is dense" in capsys.readouterr().err
    assert main(["export", "layers.9.nope", "--bundle", str(out), "--out", str(tmp_path / "k.py")]) == 2
    assert "has no layer or run id 'layers.9.nope'" in capsys.readouterr().err
    lead = report.layer("layers.0.mlp.up.weight")       # its run id is the kernel of three layers
    assert main(["export", lead.run_id, "--bundle", str(out), "--out", str(tmp_path / "k.py")]) == 2
    assert "give the layer name" in capsys.readouterr().err
    assert main(["export", "layers.1.mlp.up.weight", "--bundle", str(out), "--out", str(tmp_path / "k.txt")]) == 2
    assert "must end in .py" in capsys.readouterr().err
    assert not list(tmp_path.glob("k.*"))


def test_export_refuses_a_kernel_that_needs_another_library():
    from sparseditto.batch.export import module_text

    fields = {"source": "import scipy.sparse as sp\n\ndef prepare(A, dtype, device):\n    return sp\n",
              "template": "llm_kernel", "layer": "w", "matrix_shape": [4, 4], "dtype": "float16",
              "verified_ns": [1], "verification": {}}
    with pytest.raises(ValueError, match=r"may not import: \['sp'\]"):
        module_text(fields)
