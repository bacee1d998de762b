#!/usr/bin/env bash
# GPU_FIX_NOTES.md's checks as one run that fits a short GPU lease: every step has its own time cap, the whole run a
# deadline (BUDGET seconds, default 540), and a step that fails or runs out of time is recorded and the next one runs.
# Each step's output goes to $OUT/<step>.log; the summary table is printed last.
#
#   OUT=/tmp/gpu BUDGET=540 bash benchmarks/gpu_checks.sh
#   ONLY="pytest-cuda engine-convnet" OUT=/tmp/gpu bash benchmarks/gpu_checks.sh      # some steps only
#   DEVICE=cpu QUICK=1 WHEELS=none PY=.venv/bin/python OUT=/tmp/gpu bash benchmarks/gpu_checks.sh   # a CPU dry pass
#
# Issue 48's steps come first (GPU_FIX_NOTES.md, "Issue 48: what the prepared run measures"): paper-seed (the
# paper's seed estimated from a slice of each method, today's settings and $NEW in the same run), then the
# precision and FedRevive steps. One 15-minute lease each:
#   ONLY="paper-seed env" OUT=/tmp/g BUDGET=540 bash benchmarks/gpu_checks.sh
#   ONLY="fedrevive-variants engine-precision engine-levers equivalence-precision env" OUT=/tmp/g BUDGET=540 \
#     bash benchmarks/gpu_checks.sh
#   ONLY="precision-curve pytest-cuda-precision engine-convnet env" OUT=/tmp/g BUDGET=400 bash benchmarks/gpu_checks.sh
#
# Where the machine lacks NVFlare (or its dependencies), put their wheels in .whl/ (README of the GPU lease): they
# are installed into /tmp/site first.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu-checks}
BUDGET=${BUDGET:-540}
DEVICE=${DEVICE:-cuda}
QUICK=${QUICK:-0}
PY=${PY:-python3}
ONLY=${ONLY:-}  # a space-separated list of step names: run only these
WHEELS=${WHEELS:-.whl}
# the settings paper-seed measures against today's: bf16 autocast and the teachers in one pass
NEW=${NEW:---precision bf16 --fr-batched-teachers on}
SEED_DEADLINE=${SEED_DEADLINE:-420}  # seconds paper-seed's slices may take, both sides together
mkdir -p "$OUT"
START=$(date +%s)
SUMMARY="$OUT/summary.txt"
: >"$SUMMARY"
export PYTHONUNBUFFERED=1 MPLBACKEND=Agg

if ls "$WHEELS"/*.whl >/dev/null 2>&1; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$WHEELS"/*.whl \
    >"$OUT/wheels.log" 2>&1 || echo "wheels: install failed (see wheels.log)" >>"$SUMMARY"
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi

# step NAME CAP COMMAND...: run COMMAND for at most CAP seconds (less if the deadline is nearer); log its outcome.
step() {
  local name=$1 cap=$2
  shift 2
  [[ -n $ONLY && " $ONLY " != *" $name "* ]] && return
  local left=$((BUDGET - ($(date +%s) - START)))
  if ((left < 15)); then
    printf '%-22s skipped (deadline)\n' "$name" >>"$SUMMARY"
    return
  fi
  ((cap > left - 5)) && cap=$((left - 5))
  local t0=$(date +%s)
  timeout -k 5 "$cap" bash -c '"$@"' _ "$@" >"$OUT/$name.log" 2>&1  # bash -c: a step may be a function
  local rc=$?
  printf '%-22s rc=%-3s %4ss (cap %ss)\n' "$name" "$rc" "$(($(date +%s) - t0))" "$cap" >>"$SUMMARY"
}

env_report() {
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,utilization.gpu --format=csv || true
  nproc
  free -g
  $PY - <<'PY'
import platform, torch
print("python", platform.python_version(), "torch", torch.__version__, "cuda", torch.version.cuda,
      "available", torch.cuda.is_available())
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    print(p.name, p.multi_processor_count, "SMs", round(p.total_memory / 2**30, 1), "GiB")
import nvflare
print("nvflare", nvflare.__version__)
PY
}

# FedBuff with the paper's delays at K concurrent devices (GPU_FIX_NOTES.md item 9): groups and GPU utilisation.
fedbuff_job() {
  local k=$1 versions=$2 model=$3
  shift 3
  local flags="$*"
  local name="fedbuff-$model-k$k${flags// /}"
  $PY jobs/pt_job_fedrevive.py --method fedbuff --compute-device "$DEVICE" --num-leaf-nodes 2 \
    --devices-per-leaf $((k / 2)) --device-selection-size "$k" --max-model-version "$versions" --model "$model" \
    --eval-frequency 100 --checkpoint-every -1 --workspace /tmp/edgesim-ws --output "$OUT/$name" "$@" &&
    $PY - "$OUT/$name/metrics.json" "$k $flags" <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))
vs = m["versions"]
gpu = [v["system"].get("gpu_util_percent") for v in vs[1:]]
gpu = [g for g in gpu if g is not None]
vram = [v["system"].get("vram_used_gb") for v in vs[1:] if v["system"].get("vram_used_gb") is not None]
print(f"RESULT K={sys.argv[2]}: groups {m.get('groups')}; GPU% mean {sum(gpu) / max(1, len(gpu)):.0f} "
      f"min {min(gpu, default=0):.0f} over {len(gpu)} records; VRAM max {max(vram, default=0)} GB; "
      f"devices/s {m['summary'].get('devices_per_second')}; wall {vs[-1].get('wall_seconds')} s; "
      f"system {m.get('system')}; "
      f"final acc {m['summary'].get('final_accuracy')}; plans "
      f"{[(p.get('workers'), p.get('group_size'), p.get('engine')) for p in m.get('leaf_plans', {}).values()]}")
PY
}

# issue 59: N trials of the convnet's FedBuff (K devices each, N local learning rates from 1e-4 to 1e-1) as one
# pack (the job script's --runs, as the sweep's --pack N runs them): is the GPU at least 80% busy? Each run's
# metrics.json samples the whole GPU; the line gives run t0's mean and every run's devices/s.
pack_job() {
  local n=$1 k=$2 versions=$3
  local name="pack-convnet-n$n-k$k"
  mkdir -p "$OUT"
  $PY -c "import json, sys; n = int(sys.argv[1]); json.dump({f't{i}': {'local-lr': 10 ** (-4 + 3 * i / max(1, n - 1))}
    for i in range(n)}, open(sys.argv[2], 'w'))" "$n" "$OUT/$name.json" &&
    $PY jobs/pt_job_fedrevive.py --method fedbuff --compute-device "$DEVICE" --num-leaf-nodes 2 \
      --devices-per-leaf $((k / 2)) --device-selection-size "$k" --max-model-version "$versions" \
      --model cifar10_convnet --eval-frequency 100 --checkpoint-every -1 --workspace /tmp/edgesim-ws \
      --runs "$OUT/$name.json" --output "$OUT/$name" &&
    $PY - "$OUT/$name" "$n" "$k" <<'PY'
import json, os, sys
out, n, k = sys.argv[1], int(sys.argv[2]), sys.argv[3]
ms = [json.load(open(os.path.join(out, f"t{i}", "metrics.json"))) for i in range(n)]
gpu = [g for v in ms[0]["versions"][1:] if (g := v["system"].get("gpu_util_percent")) is not None]
rates = [m["summary"].get("devices_per_second") or 0 for m in ms]
print(f"RESULT pack of {n} trials, K={k} each: GPU% mean {sum(gpu) / max(1, len(gpu)):.0f} "
      f"min {min(gpu, default=0):.0f} over {len(gpu)} records (goal: at least 80); devices/s summed "
      f"{sum(rates):.1f} ({', '.join(f'{r:.1f}' for r in rates)}); wall {ms[0]['versions'][-1].get('wall_seconds')} s")
PY
}

# FedAvg at K devices a version, the synchronous side of the same comparison.
fedavg_job() {
  local k=$1 versions=$2
  shift 2
  local flags="$*"
  local name="fedavg-k$k${flags// /}"
  $PY jobs/pt_job_fedavg.py --compute-device "$DEVICE" --num-leaf-nodes 2 --devices-per-leaf $((k / 2)) \
    --device-selection-size "$k" --max-model-version "$versions" --checkpoint-every -1 --workspace /tmp/edgesim-ws \
    --output "$OUT/$name" "$@" &&
    $PY -c "import json,sys; m=json.load(open(sys.argv[1])); print('RESULT FedAvg K=$k $*:', m['summary'], m.get('system'))" \
      "$OUT/$name/metrics.json"
}

# devices/s of two runs' metrics.json side by side, and their ratio: one worker per GPU against the planner's default.
worker_ratio() {
  $PY - "$OUT/$1/metrics.json" "$OUT/$2/metrics.json" <<'PY'
import json, sys
rates = [json.load(open(p))["summary"].get("devices_per_second") for p in sys.argv[1:]]
print(f"RESULT one worker vs default: {rates[0]} vs {rates[1]} devices/s, ratio {rates[0] / rates[1]:.2f}x")
PY
}

# the engines' samples/s at each precision (ResNet-18, the paper's local work), one device and a group of 8
engine_precisions() {
  for precision in fp32 tf32 bf16; do
    echo "== precision $precision"
    $PY benchmarks/perf/bench_engine.py --device "$DEVICE" --model resnet18 --ks 1,8 --iters 25 --precision "$precision" \
      --no-extras || return
  done
}

# the device-step levers (each off by default until measured), one device of ResNet-18 at bf16: each alone, then all
engine_levers() {
  for levers in "" "--channels-last" "--batches-on-device" "--compile reduce-overhead" \
    "--channels-last --batches-on-device --compile reduce-overhead"; do
    echo "== levers: ${levers:-none}"
    # shellcheck disable=SC2086
    $PY benchmarks/perf/bench_engine.py --device "$DEVICE" --model resnet18 --ks 1 --iters 25 --repeats 3 \
      --precision bf16 --no-extras $levers || echo "== levers ${levers}: failed"
  done
}


# devices/s of two runs' metrics.json side by side, and their ratio: bulk arrays through shared memory (the default,
# --bulk auto) against NVFlare's wire (issue 47), with the choice each run recorded.
bulk_ratio() {
  $PY - "$OUT/$1/metrics.json" "$OUT/$2/metrics.json" <<'PY'
import json, sys
runs = [json.load(open(p)) for p in sys.argv[1:]]
rates = [m["summary"].get("devices_per_second") for m in runs]
print(f"RESULT shared memory vs wire: {rates[0]} vs {rates[1]} devices/s, ratio {rates[0] / rates[1]:.2f}x; "
      f"bulk {runs[0].get('bulk')} vs {runs[1].get('bulk')}")
PY
}

export -f env_report fedbuff_job fedavg_job worker_ratio engine_precisions engine_levers bulk_ratio pack_job
export OUT DEVICE PY
nvidia-smi dmon -s um -o T >"$OUT/dmon.log" 2>&1 &
DMON=$!

# issue 48 first: the seed estimate, today's settings against $NEW in one run (its last line is the estimate)
if [[ $QUICK == 1 ]]; then
  step paper-seed 180 $PY benchmarks/repro/paper_seed.py --device "$DEVICE" --tiny --new "$NEW" --output "$OUT/paper-seed"
else
  step paper-seed $((SEED_DEADLINE + 60)) $PY benchmarks/repro/paper_seed.py --device "$DEVICE" --deadline "$SEED_DEADLINE" \
    --new "$NEW" --output "$OUT/paper-seed"
fi
step env 30 env_report
if [[ $QUICK == 1 ]]; then
  step fedrevive-variants 120 $PY benchmarks/perf/bench_fedrevive_round.py --device "$DEVICE" --repeats 1 \
    --fr-gen-width 8 --fr-synth-batch-size 8 --fr-synth-per-teacher 4 --fr-kd-iters 1 --fr-synth-every-versions 1 \
    --variants fp32:off,fp32:on,bf16:on
else
  # FedRevive's server per stale update: the loop against the teachers in one pass, at each precision
  step fedrevive-variants 120 $PY benchmarks/perf/bench_fedrevive_round.py --model resnet18 --device "$DEVICE" --repeats 2 \
    --fr-synth-every-versions 1 --variants fp32:off,tf32:off,fp32:on,tf32:on,bf16:on
  step engine-precision 100 engine_precisions
  step engine-levers 150 engine_levers
  # how far each precision moves the diffs (grouped vs alone, CUDA vs CPU) and whether a seeded group repeats
  step equivalence-precision 90 $PY benchmarks/checks/gpu_equivalence.py --model resnet18 --precisions fp32,tf32,bf16
  step pytest-cuda-precision 60 $PY -m pytest -q -p no:cacheprovider tests/processors/test_cuda.py
  # the accuracy curves of 2 seeds at each precision (the convnet, FedBuff): inside the seed spread?
  step precision-curve 150 $PY benchmarks/repro/precision_curve.py --device "$DEVICE" --seeds 0,1 --precisions fp32,tf32,bf16 \
    --output "$OUT/precision-curve"
fi
if [[ $QUICK == 1 ]]; then
  step engine-convnet 120 $PY benchmarks/perf/bench_engine.py --device "$DEVICE" --ks 1,4 --iters 2 --samples 64
  step fedbuff-k8 200 fedbuff_job 8 6 cifar10_convnet
  step fedavg-k8 200 fedavg_job 8 3
  step fedavg-k8-w1 200 fedavg_job 8 3 --num-workers 1
  step pack-convnet 200 pack_job 2 4 3
else
  step pytest-cuda 60 $PY -m pytest -q -p no:cacheprovider tests/processors/test_cuda.py
  step engine-convnet 100 $PY benchmarks/perf/bench_engine.py --device "$DEVICE" --ks 1,8,32,100 --iters 25
  step fedbuff-k1000 100 fedbuff_job 1000 1000 cifar10_convnet
  step fedavg-k1000 60 fedavg_job 1000 6
  step fedbuff-k10000 110 fedbuff_job 10000 1000 cifar10_convnet
  step engine-resnet18 75 $PY benchmarks/perf/bench_engine.py --device "$DEVICE" --model resnet18 --ks 1,8,32 --iters 25
  step equivalence 60 $PY benchmarks/checks/gpu_equivalence.py
  step fedrevive-round 60 $PY benchmarks/perf/bench_fedrevive_round.py --model resnet18 --device "$DEVICE" --repeats 2 \
    --fr-synth-every-versions 1 --no-previous
  step fedbuff-k100 60 fedbuff_job 100 1000 cifar10_convnet
  step pack-convnet 150 pack_job 16 20 60
  # left by the first GPU run: ResNet-18's grouped-vs-alone agreement, and whether fewer workers with larger groups
  # beat the planner's cores-sized plan on a GPU leaf (8 workers of 63 devices at K = 1,000)
  step equivalence-resnet18 90 $PY benchmarks/checks/gpu_equivalence.py --model resnet18
  step fedavg-k1000-w1 60 fedavg_job 1000 6 --num-workers 1
  step fedavg-k1000-w2 60 fedavg_job 1000 6 --num-workers 2
  # the protocol's ceiling on this machine's own cores (null training: no GPU work), against the H200's measured
  # engine floor (197,092 samples/s, bench_engine K = 100 in GPU_FIX_NOTES.md)
  step fedbuff-k1000-w1 100 fedbuff_job 1000 1000 cifar10_convnet --num-workers 1
  step protocol-null 120 $PY benchmarks/perf/bench_protocol.py --null-training --only fedavg,fedbuff-paper \
    --gpu-samples-per-second 197092
  # the paper's ResNet-18: does one worker per GPU (the light models' plan) pay for it too, or do the cores' workers
  # (its default plan) keep the GPU busier?
  step fedbuff-resnet18-k100 90 fedbuff_job 100 40 resnet18
  step fedbuff-resnet18-k100-w1 90 fedbuff_job 100 40 resnet18 --num-workers 1
  step ratio-resnet18 15 worker_ratio fedbuff-resnet18-k100--num-workers1 fedbuff-resnet18-k100
  # issue 47: does the paper's ResNet-18 wait on the wire on a GPU? Its protocol ceiling on this machine's cores
  # (null training, shared memory and wire), and the real job on the GPU both ways (the default shares memory)
  step null-resnet18-bulk 150 $PY benchmarks/perf/bench_protocol.py --null-training --model resnet18 \
    --only fedbuff-paper --bulk shm,wire
  step fedbuff-resnet18-k100-wire 90 fedbuff_job 100 40 resnet18 --bulk wire
  step bulk-resnet18 15 bulk_ratio fedbuff-resnet18-k100 fedbuff-resnet18-k100--bulkwire
fi
kill "$DMON" 2>/dev/null

echo "==== results"
grep -h -E "^RESULT|speedup|samples/s|trackers:|augment:|dp:|vs |high vs|defaults:|^device |passed|failed|error|^FedAvg|^FedBuff|devices/s|seed estimate|per stale update|precision|within the seed" \
  "$OUT"/*.log 2>/dev/null | cut -c1-300 | tail -60
echo "==== steps (total $(($(date +%s) - START)) s)"
cat "$SUMMARY"
