"""Host latency between the start event and the launch: counted without the LEAD_US spin
(harness/timing.py), not with it; then three identical benches of delta_spmv, whose graph times
disagreed 2x before the spin. On the GPU: python3 benchmarks/timing_lead_probe.py (from the repo
root, the device set-up of benchmarks/device_run.sh)."""
import sys, torch
sys.path.insert(0, "benchmarks")
from llm_layers import prune, load
from sparseditto import harness
from sparseditto.harness import timing
from sparseditto.kernel_templates.registry import get_template
A = prune(4096, 4096, "magnitude", 0.7, seed=0)
mod = load("delta_spmv", {})
packed = mod.prepare(A, torch.float16, torch.device("cuda"))
b = torch.randn(4096, 1, device="cuda", dtype=torch.float16)
out = torch.empty(4096, 1, device="cuda", dtype=torch.float16)
g = timing.capture_graph(lambda: mod.spmm(packed, b, out))
for lead in (0.0, 100.0):
    timing.LEAD_US = lead
    for host in (0, 20, 60):
        t = timing._time_launches(timing.host_delayed(g.replay, host), 50, 5, True, None, None)
        print(f"LEAD_US {lead:5.0f}: host delay {host:3d} us before replay -> delta graph {t.median_ms*1e3:.1f} us", flush=True)
timing.LEAD_US = 100.0
for i in range(3):
    res = harness.bench(get_template("delta_spmv").instantiate({}), A, n=1, dtype="float16", backend="cuda", repeats=50, warmup=5, baselines=False)
    print(f"bench {i}: delta graph {res.candidate_graph.median_ms*1e3:.1f} eager {res.candidate.median_ms*1e3:.1f} | dense graph {res.dense_graph.median_ms*1e3:.1f} eager {res.dense.median_ms*1e3:.1f} us", flush=True)
