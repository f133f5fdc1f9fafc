#!/usr/bin/env bash
# Run SparseDitto's GPU stages on the lent GPU machine (it has torch, triton, cupy, ncu, nvcc but not
# langgraph/pydantic/sqlite-utils...). From the repo root, with `.whl` (../shared/tools/device-wheels.sh)
# and `.gpu/data` (a copy of the shared matrices) carried:
#   bash benchmarks/device_run.sh env tests bench graph demo decode wide
# Everything worth keeping is written under $OUT (default ./out).
# Stage `bench` runs `sparseditto bench --out $OUT/bench${BENCH_NAME:+-$BENCH_NAME} $BENCH_ARGS`; to continue an
# earlier call's run, carry its returned folder (e.g. .gpu/bench/llm) and set BENCH_FROM to it: its files are
# copied into the output folder first, and BENCH_ARGS should then hold --resume. Example (llm core, 8 minutes):
#   BENCH_NAME=llm BENCH_ARGS="--suite llm --budget-s 480" bash benchmarks/device_run.sh bench
#   BENCH_NAME=llm BENCH_FROM=.gpu/bench/llm BENCH_ARGS="--suite llm --budget-s 480 --resume" bash ...
# The device returns at most 8 files under $OUT: a bench call brings back install.log, bench.log and the bench
# folder's results.jsonl, environment.json, summary.md, summary.json, report.html, memory.sqlite; write nothing else.
set -uo pipefail
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1 || { echo "wheel install failed"; exit 1; }
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >"$OUT/install.log" 2>&1 || { cat "$OUT/install.log"; exit 1; }
export SPARSEDITTO_DATA=$PWD/.gpu/data SPARSEDITTO_MEMORY=$OUT/memory.sqlite
# caches inside the (ignored) .gpu/ folder survive between calls on a warm machine: generated bench
# matrices, kernel sources and Triton's compiled kernels
export SPARSEDITTO_CACHE_DIR=${SPARSEDITTO_CACHE_DIR:-$PWD/.gpu/cache} TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-$PWD/.gpu/cache/triton}
for stage in "$@"; do
  echo "=== stage $stage ($(date +%T))"
  case "$stage" in
    env)
      nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv
      python3 -c 'import torch, triton, sys; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "triton", triton.__version__); p = torch.cuda.get_device_properties(0); print(p.name, "SMs", p.multi_processor_count, "L2", p.L2_cache_size)'
      python3 -c 'import cupy; print("cupy", cupy.__version__)' ; which ncu nvcc compute-sanitizer ;;
    tests)
      python3 -m pytest -q -m gpu -p no:cacheprovider tests 2>&1 | tee "$OUT/gpu_tests.log" | tail -40 ;;
    tests-all)
      python3 -m pytest -q -x -p no:cacheprovider tests -m "not integration" 2>&1 | tee "$OUT/all_tests.log" | tail -40 ;;
    bench)
      BOUT="$OUT/bench${BENCH_NAME:+-$BENCH_NAME}"; mkdir -p "$BOUT"
      if [ -n "${BENCH_FROM:-}" ]; then cp -r "$BENCH_FROM"/. "$BOUT"/ || exit 1; fi
      python3 -m sparseditto.cli bench --out "$BOUT" --quiet ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench.log" | tail -80
      # the memory's SQLite side files (empty once the run closed it) would count against the device's 8 returned
      # files: with them, install.log and bench.log, results.jsonl was left out once (session 37)
      rm -f "$BOUT"/memory.sqlite-shm "$BOUT"/memory.sqlite-wal ;;
    templates)
      python3 benchmarks/templates.py --out "$OUT/templates" --quiet ${TEMPLATES_ARGS:-} 2>&1 | tee "$OUT/templates.log" | tail -80 ;;
    demo)
      # `make demo`'s run (measured on this GPU), then the driver's CUDA major and the CuPy extra make setup would pick
      python3 -m sparseditto demo -v 2>&1 | tee "$OUT/demo.log" | tail -40
      python3 -c 'import sys; sys.path.insert(0, "scripts"); import install; c = install.gpu_cuda_major(); print("CUDA driver major", c, "-> extras", install.extras_for(c, ["dev"]))' ;;
    graph)
      python3 benchmarks/graph_runs.py --out "$OUT/graph_runs" --quiet ${GRAPH_ARGS:-} 2>&1 | tee "$OUT/graph.log" | tail -60 ;;
    batch7b)
      # issue 12: the synthetic Llama-7B-shaped checkpoint (made once into .gpu/llama7b, ~13 GB), batched into
      # .gpu/batch7b-out (its memory inside it; SQLite WAL files kept, they may hold committed layers) and returned as one file, $OUT/batch7b.tgz (the device returns 8
      # files, and a bundle holds one source per kernel); to continue (--resume) a call that ran out of time, unpack
      # that file into a carried folder and set BATCH_FROM to it (a .tgz works too)
      CK=${BATCH_CKPT:-$PWD/.gpu/llama7b}; T0=$(date +%s)
      [ -f "$CK/model.safetensors.index.json" ] || python3 benchmarks/batch_7b.py make --dir "$CK" ${BATCH_BLOCKS:+--blocks $BATCH_BLOCKS} 2>&1 | tail -3
      echo "checkpoint ready in $(( $(date +%s) - T0 )) s"
      BO="$PWD/.gpu/batch7b-out"; rm -rf "$BO"; mkdir -p "$BO"; RES=""
      if [ -n "${BATCH_FROM:-}" ]; then
        case "$BATCH_FROM" in *.tgz) tar -xzf "$BATCH_FROM" -C "$BO" ;; *) cp -r "$BATCH_FROM"/. "$BO"/ ;; esac && RES=--resume
      fi
      BT=${BATCH_TIMEOUT:-420}; [ -n "${BATCH_DEADLINE:-}" ] && BT=$(( BATCH_DEADLINE - $(date +%s) ))   # epoch s: end in time to pack
      echo "batch timeout $BT s"
      SPARSEDITTO_MEMORY="$BO/memory.sqlite" timeout $BT python3 ${BATCH_PROFILE:+-m cProfile -o $OUT/batch7b.prof} \
        benchmarks/batch_7b.py batch --dir "$CK" --out "$BO" $RES ${BATCH_ARGS:-} 2>&1 | tee "$OUT/batch7b.log" | tail -20
      # without the searches' LangGraph checkpoints (36 MB after 7 searches; --resume reads the journal): session 39's
      # second call's tgz came to more than the 16 MiB a returned file may have, and did not come back
      tar --exclude='./checkpoint.sqlite*' -czf "$OUT/batch7b.tgz" -C "$BO" . ; cp "$BO/report.json" "$OUT/" 2>/dev/null ;;
    batch7b-retime)
      python3 benchmarks/batch_7b.py retime --dir "${BATCH_CKPT:-$PWD/.gpu/llama7b}" --out "${BATCH_FROM:-$PWD/.gpu/batch7b-out}" 2>&1 | tee "$OUT/retime.log" | tail -20 ;;
    decode)
      # issue 10's open checks (docs/kernels.md, "fourth H200 session"): the timing spin, then delta_spmv's
      # unmeasured variants (PIPE 6 under the register cap; ROW_SPLIT; B_HALF) beside the default, N = 1, 2, 4
      python3 benchmarks/timing_lead_probe.py 2>&1 | grep --line-buffered -v Warn | tee "$OUT/lead.log" | tail -12
      DV='{"delta_spmv": [{}, {"PIPE": 6}, {"ROW_SPLIT": 1}, {"B_HALF": 1}]}'; [ -n "${DECODE_VARIANTS:-}" ] && DV=$DECODE_VARIANTS
      python3 benchmarks/llm_layers.py --preset decode --n 1 2 4 --cases "${DECODE_CASES:-magnitude|nm24}" \
        --variants "$DV" --repeats 20 --out "$OUT/decode.json" 2>&1 | grep --line-buffered -v Warn | tee "$OUT/decode.log" | tail -60 ;;
    overhead)
      # issue 12: the host cost of an eager decode-kernel call, piece by piece (written in session 25, not yet run),
      # with CuPy's launch and again with runtime.DirectLaunch (SPARSEDITTO_DIRECT_LAUNCH=1, session 40)
      for direct in 0 1; do
        echo "--- SPARSEDITTO_DIRECT_LAUNCH=$direct"
        SPARSEDITTO_DIRECT_LAUNCH=$direct python3 benchmarks/launch_overhead_probe.py ${OVERHEAD_ARGS:---shape 11008x4096 --template delta_spmv --style magnitude --sparsity 0.7 -n 1} 2>&1 | grep --line-buffered -v Warn
      done > "$OUT/overhead.log"; grep -E "^(---|==)|us/call" "$OUT/overhead.log" ;;
    session40)
      # the GPU tests of what session 40 built without a GPU: the cross-process GPU lock, the direct launch,
      # workers sharing a GPU (two-worker batches), and patch_model's eager measurement (session 42); then what
      # run_graph chooses on 11008x4096 70% at N = 16, then N = 1
      python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_gpu_lock.py tests/test_direct_launch.py \
        tests/test_batch_workers.py tests/test_patch_eager.py 2>&1 | tee "$OUT/session40_tests.log" | tail -15
      RUN_WEIGHT=11008x4096:magnitude:0.7 RUN_N="16 1" bash "$0" rungraph ;;
    session41)
      # issue 11, session 41 (written without a GPU): csr_rowdecomp's pipelined walk (ITEMS > 1, WALK grid / block)
      # through its GPU tests, then against ITEMS 1 and torch's cuSPARSE on the large graphs and meshes at N = 32 /
      # 128 / 256
      timeout 300 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_csr_rowdecomp.py 2>&1 \
        | tee "$OUT/session41_tests.log" | tail -6
      GV='{"csr_rowdecomp": [{}, {"ITEMS": 4}, {"ITEMS": 8}, {"ITEMS": 16}, {"ITEMS": 8, "WALK": "grid"}, {"ITEMS": 8, "WALK": "block"}, {"ITEMS": 4, "UNROLL": 8}]}'
      timeout ${GK_TIMEOUT:-400} python3 benchmarks/graph_kernels.py --data "$SPARSEDITTO_DATA" --out "$OUT/graph_kernels.json" \
        --matrices "${GK_MATRICES:-rmat|kronecker|laplacian|fem|dnn_n1024-l1|pushpull}" --n ${GK_N:-32 128 256} \
        --variants "${GK_VARIANTS:-$GV}" 2>&1 | grep --line-buffered -v Warn | tee "$OUT/graph_kernels.log" | tail -60 ;;
    session41b)
      # issue 10, session 41 (written without a GPU): why bsr_tc on block-32 75% was slower at N = 1 than at N = 16,
      # and bsr_spmv beside it: its GPU tests first, then the "block" preset (bsr_spmv's variants, bsr_tc, delta_spmv,
      # csr_vector, cuBLAS at N = 1 2 8 15 16)
      timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_bsr_spmv.py 2>&1 | tail -4
      timeout ${BLOCK_TIMEOUT:-150} python3 benchmarks/llm_layers.py --preset block --repeats 20 --out "$OUT/block.json" 2>&1 \
        | grep --line-buffered -v Warn | tee "$OUT/block.log" | grep "N=" | sed 's/  */ /g' | cut -c1-200 ;;
    wide)
      # issue 10, wide N on Hopper (session 27): tc_sp24's wgmma kernel — layout probe, the 2:4 check rows,
      # the decode sweep against mma.sync (WIDE_VARIANTS to try others), ncu at N = 64, then what run_graph
      # chooses at N = 64 on 11008x4096 2:4 (measured in session 28: tc_sp24, 1.10-1.12x; stage rungraph)
      timeout 120 python3 benchmarks/wgmma_probe.py --n 8 64 128 --mma wgmma 2>&1 | grep -v Warn > "$OUT/probe.log"; echo "probe: $(grep -c ': ok$' "$OUT/probe.log") ok, $(grep -vc ': ok$' "$OUT/probe.log") not"
      python3 benchmarks/llm_layers.py --preset check --cases nm24 --out "$OUT/check.json" > "$OUT/check.log" 2>&1; echo "check: $(grep -c 'ok=True' "$OUT/check.log") of $(grep -c 'N=' "$OUT/check.log") rows ok"
      WV='{"tc_sp24": [{"MMA": "sync"}, {}]}'; [ -n "${WIDE_VARIANTS:-}" ] && WV=$WIDE_VARIANTS
      python3 benchmarks/llm_layers.py --preset decode --cases nm24 --n ${WIDE_N:-32 64 128} --repeats 20 --variants "$WV" \
        --out "$OUT/wide.json" 2>&1 | grep --line-buffered -v Warn | tee "$OUT/wide.log" | tail -40
      timeout 120 python3 benchmarks/ncu_probe.py --shape 11008x4096 --style nm24 -n 64 tc_sp24 2>&1 | grep -v Warn | tail -25
      mkdir -p /tmp/mats; python3 -c "import sys; sys.path.insert(0, 'benchmarks'); from llm_layers import prune; from sparseditto.io import save_matrix; save_matrix(prune(11008, 4096, 'nm24', 0.5, 0), '/tmp/mats/w11008x4096_2of4.npz')"
      timeout ${WIDE_RUN_TIMEOUT:-300} python3 -m sparseditto run /tmp/mats/w11008x4096_2of4.npz --target H200 -n 64 --budget 3 2>&1 | grep --line-buffered -v Warn | tee "$OUT/run64.log" | tail -25 ;;
    tma)
      # issue 10, session 28: tc_sp24tma (wgmma fed by the copy engine) — the 2:4 check rows across its
      # params and cp's, the wide-N sweep against tc_sp24wg (WLOAD=cp), ncu of the default at N = 64.
      # Next (not yet run): TMA_VARIANTS='{"tc_sp24": [{}, {"ASTAGES": 6}, {"ASTAGES": 8}, {"ASTAGES": 12}]}' 
      timeout 90 python3 benchmarks/tma_smoke.py 2>&1 | grep -v Warn | tail -8
      TC='{"tc_sp24": [{}, {"WLOAD": "cp"}, {"WSTAGES": 2, "SPLIT": 1}, {"TWARPS": 8, "WSTAGES": 6}, {"SPLIT": 8, "WSTAGES": 3}, {"TWARPS": 16}, {"ASTAGES": 8, "SPLIT": 1}, {"ASTAGES": 6, "TWARPS": 8, "WSTAGES": 2}]}'
      timeout 240 python3 benchmarks/llm_layers.py --preset check --cases nm24 --dtype float16 bfloat16 --variants "$TC" \
        --out "$OUT/check.json" > "$OUT/check.log" 2>&1; echo "check: $(grep -c 'ok=True' "$OUT/check.log") of $(grep -c 'N=' "$OUT/check.log") rows ok"
      grep -v 'ok=True' "$OUT/check.log" | grep 'N=' | head -8
      TV='{"tc_sp24": [{"WLOAD": "cp"}, {}, {"WSTAGES": 3}, {"WSTAGES": 6}, {"TWARPS": 8}]}'; [ -n "${TMA_VARIANTS:-}" ] && TV=$TMA_VARIANTS
      timeout ${TMA_SWEEP_TIMEOUT:-300} python3 benchmarks/llm_layers.py --preset decode --cases nm24 --n ${TMA_N:-32 64 128} --repeats 20 \
        --variants "$TV" --out "$OUT/tma.json" 2>&1 | grep --line-buffered -v Warn | tee "$OUT/tma.log" | grep "N=" | sed 's/  */ /g' | cut -c1-170
      [ -n "${TMA_BF16-1}" ] && timeout 120 python3 benchmarks/llm_layers.py --preset decode --cases nm24 --n 64 128 --repeats 20 \
        --dtype bfloat16 --variants '{"tc_sp24": [{}]}' --out "$OUT/tma_bf16.json" 2>&1 | grep "N=" | sed 's/  */ /g' | cut -c1-170
      timeout 120 python3 benchmarks/ncu_probe.py --shape 11008x4096 --style nm24 -n 64 tc_sp24 2>&1 | grep -v Warn | tail -25 ;;
    mcast)
      # issue 10, session 29: tc_sp24tma's B multicast across neighbouring row blocks (MCAST) and uneven
      # K splits (SPLIT 3 / 6) — smoke, the sweep at MC_N against the default, ncu of the default and of
      # MC_NCU_PARAMS (L2 traffic), the 2:4 check rows over the new params, the sandboxed verifier
      timeout 120 python3 benchmarks/tma_smoke.py > "$OUT/smoke.log" 2>&1; rc=$?; grep -v Warn "$OUT/smoke.log" | tail -14
      [ $rc -ne 0 ] && { echo "smoke rc=$rc: skipping the rest of this stage"; continue; }
      MV='{"tc_sp24": [{}, {"MCAST": 2}, {"MCAST": 4}, {"SPLIT": 3}, {"SPLIT": 3, "MCAST": 2}, {"TWARPS": 8, "SPLIT": 3}, {"TWARPS": 8, "MCAST": 2}, {"ASTAGES": 8}]}'
      [ -n "${MC_VARIANTS:-}" ] && MV=$MC_VARIANTS
      timeout ${MC_SWEEP_TIMEOUT:-240} python3 benchmarks/llm_layers.py --preset decode --cases nm24 --n ${MC_N:-64} --repeats 20 \
        --variants "$MV" --out "$OUT/mcast.json" 2>&1 | grep --line-buffered -v Warn | tee "$OUT/mcast.log" | grep "N=" | sed 's/  */ /g' | cut -c1-230
      [ -n "${MC_NCU-1}" ] && for p in '{}' "${MC_NCU_PARAMS:-{\"MCAST\": 2\}}"; do
        timeout 90 python3 benchmarks/ncu_probe.py --shape 11008x4096 --style nm24 -n 64 --params "$p" tc_sp24 2>&1 | grep -v Warn \
          | grep -E "==|time|dram__|lts__|issue_active|warps_active.avg.per|registers_per|grid_size|waves|long_score|_wait_" | cut -c1-160
      done
      [ -n "${MC_CHECK-1}" ] && { TC='{"tc_sp24": [{}, {"MCAST": 2}, {"MCAST": 4, "SPLIT": 2}, {"SPLIT": 3, "MCAST": 2}, {"TWARPS": 8, "MCAST": 2, "SPLIT": 3}, {"SPLIT": 6, "WSTAGES": 3}]}'
        timeout ${MC_CHECK_TIMEOUT:-200} python3 benchmarks/llm_layers.py --preset check --cases nm24 --dtype float16 bfloat16 --variants "$TC" \
          --out "$OUT/check.json" > "$OUT/check.log" 2>&1; echo "check: $(grep -c 'ok=True' "$OUT/check.log") of $(grep -c 'N=' "$OUT/check.log") rows ok"
        grep -v 'ok=True' "$OUT/check.log" | grep 'N=' | head -8; }
      [ -n "${MC_VERIFY-1}" ] && timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_tc_templates.py \
        -k "test_gpu_wgmma_kernel_verifies_against_fp64 and ((params7 and float16) or (params8 and bfloat16))" 2>&1 | tail -4 ;;
    stalls)
      # where tc_sp24tma's warps wait, per SASS line (ncu SourceCounters), for the default and each of
      # STALL_PARAMS (space-separated JSON objects without spaces), 11008x4096 2:4 at STALL_N (64)
      for p in '{}' ${STALL_PARAMS:-}; do
        timeout 200 python3 benchmarks/ncu_source.py tc_sp24 --shape 11008x4096 --style nm24 -n ${STALL_N:-64} --params "$p" \
          --out "$OUT/stalls-$(echo "$p" | tr -dc 'A-Za-z0-9')" 2>&1 | grep -v Warn | tail -45
      done ;;
    sparse816)
      # issue 10: the per-nonzero and bitmap decode kernels at N = 8 and 16 on 70% / 90% unstructured
      # weights (where run_graph picks dense or tc_lanemask today), cuBLAS beside every row
      SV='{"delta_spmv": [{}], "tc_lanemask": [{}], "csr_vector": [{}]}'; [ -n "${SPARSE_VARIANTS:-}" ] && SV=$SPARSE_VARIANTS
      timeout ${SPARSE_TIMEOUT:-300} python3 benchmarks/llm_layers.py --preset decode --cases "${SPARSE_CASES:-magnitude/0.(7|9)}" \
        --n ${SPARSE_N:-8 16} --dtype ${SPARSE_DTYPE:-float16} --repeats 20 --variants "$SV" --out "$OUT/sparse816.json" 2>&1 | grep --line-buffered -v Warn \
        | tee "$OUT/sparse816.log" | grep "N=" | sed 's/  */ /g' | cut -c1-200 ;;
    tma-verify)
      # session 28: tc_sp24tma through the sandboxed verifier (ctypes tensor map inside the worker), the
      # default geometry's times at N = 64 / 128, and what run_graph chooses at N = 64 on 11008x4096 2:4
      timeout 90 python3 benchmarks/tma_smoke.py 2>&1 | grep -v Warn | tail -8
      timeout 240 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_tc_templates.py \
        -k "test_gpu_wgmma_kernel_verifies_against_fp64 and ((params3 and float16) or (params4 and bfloat16))" 2>&1 | tail -4
      timeout 150 python3 benchmarks/llm_layers.py --preset decode --cases nm24 --n 64 128 --repeats 20 \
        --variants '{"tc_sp24": [{}]}' --out "$OUT/tma_default.json" 2>&1 | grep "N=" | sed 's/  */ /g' | cut -c1-170
      mkdir -p /tmp/mats; python3 -c "import sys; sys.path.insert(0, 'benchmarks'); from llm_layers import prune; from sparseditto.io import save_matrix; save_matrix(prune(11008, 4096, 'nm24', 0.5, 0), '/tmp/mats/w11008x4096_2of4.npz')"
      timeout ${WIDE_RUN_TIMEOUT:-300} python3 -m sparseditto run /tmp/mats/w11008x4096_2of4.npz --target H200 -n 64 --budget 3 2>&1 | grep --line-buffered -v Warn | tee "$OUT/run64.log" | tail -25 ;;
    rungraph)
      # what run_graph chooses at each RUN_N (default 64 32) on RUN_WEIGHT (SHAPE:style:sparsity, default
      # the 11008x4096 2:4 weight), one memory
      IFS=: read -r RS RST RSP <<< "${RUN_WEIGHT:-11008x4096:nm24:0.5}"; W=/tmp/mats/w${RS}_${RST}_${RSP}.npz
      mkdir -p /tmp/mats; python3 -c "import sys; sys.path.insert(0, 'benchmarks'); from llm_layers import prune; from sparseditto.io import save_matrix; m, k = map(int, '$RS'.split('x')); save_matrix(prune(m, k, '$RST', $RSP, 0), '$W')"
      for n in ${RUN_N:-64 32}; do
        timeout ${WIDE_RUN_TIMEOUT:-240} python3 -m sparseditto run "$W" --target H200 -n $n --budget ${RUN_BUDGET:-3} 2>&1 \
          | grep --line-buffered -v Warn | tee "$OUT/run$n.log" | grep -E "planner|finalize|best:|speedup|candidates:|profile:" | cut -c1-260
      done ;;
    example)
      python3 examples/prune_and_batch.py --out "$OUT/example" ${EXAMPLE_ARGS:-} 2>&1 | grep --line-buffered -v '^  layers' | tee "$OUT/example.log" | tail -40 ;;
    graphkernels)
      # issue 11 (session 30): csr_rowdecomp's variants, csr_vector, csr_rowsplit and torch's cuSPARSE on the
      # graphs suite's matrices, fp32 (GK_ARGS e.g. "--n 32 128 256 --matrices rmat" or "--variants JSON")
      timeout ${GK_TIMEOUT:-400} python3 benchmarks/graph_kernels.py --data "$SPARSEDITTO_DATA" --out "$OUT/graph_kernels.json" \
        ${GK_ARGS:-} 2>&1 | grep --line-buffered -v Warn | tee "$OUT/graph_kernels.log" | tail -40 ;;
    *) echo "unknown stage $stage" ;;
  esac
done
