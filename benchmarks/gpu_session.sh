#!/bin/bash
# The checks to run when a GPU machine is lent (docs/performance.md "On a GPU", docs/discrete.md
# "On a GPU"), in one call: the whole test suite with CUDA present (the CUDA tests run, and the
# CPU tests meet fit's device="auto" choosing the GPU), the CUDA bench, and the MNIST mixture
# models until a deadline, then their scores.
#
#   OUT=runs/gpu DATA=../shared/data/binarized_mnist.npz bash benchmarks/gpu_session.sh
#
# On the lent machine: copy binarized_mnist.npz into the checkout (an ignored folder carried
# along) and point DATA at it. MNIST_UNTIL: seconds after the start after which no further
# model is started (default 380); MODELS_PER_ORDER: seeds per ordering (default 16). The models
# are written to /tmp/runs on that machine (only $OUT comes back: logs, the scores and the
# bench JSON), and a mixture needs all its models in one session, so seeds start at 0 again.
set -u
OUT=${OUT:-runs/gpu}
DATA=${DATA:-../shared/data/binarized_mnist.npz}
mkdir -p "$OUT"
T0=$(date +%s)
el() { echo "[$(( $(date +%s) - T0 )) s]"; }
export PYTHONUNBUFFERED=1
nvidia-smi -L
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$OUT/install.log" 2>&1 \
  || { echo "install failed"; tail "$OUT/install.log"; exit 1; }
python3 -c "import torch, flowkit; print(torch.__version__, torch.cuda.get_device_name())" || exit 1

echo "$(el) bench"
timeout 150 flowkit bench --device cuda --sections density sampling bernoulli staircase mnist \
  memory --mnist-data "$DATA" --out /tmp/bench-cuda --json "$OUT/cuda.json" --quiet \
  > "$OUT/bench.log" 2>&1
echo "bench rc $?"

echo "$(el) tests"  # SIGINT at the limit: pytest still prints its summary of failures
timeout -s INT 270 python3 -m pytest -q -m "not slow" -n 14 -p no:cacheprovider -p no:benchmark \
  -rfEs --timeout 120 --no-header > "$OUT/pytest.log" 2>&1
echo "pytest rc $?"; grep "FAILED\|ERROR\|passed\|failed" "$OUT/pytest.log" | tail -n 20

echo "$(el) mnist"  # eight trainings at a time share the GPU
DEADLINE=$(( T0 + ${MNIST_UNTIL:-380} ))
for seed in $(seq 0 $(( ${MODELS_PER_ORDER:-16} - 1 ))); do for order in natural random; do
  while [ "$(jobs -rp | wc -l)" -ge 8 ]; do sleep 1; done
  [ "$(date +%s)" -ge "$DEADLINE" ] && break 2
  flowkit mnist --data "$DATA" --hidden 8000 --direct --masks 1 --order $order --epochs 12 \
    --lr-schedule cosine --checkpoint-every 12 --seed "$seed" --device cuda --threads 1 --quiet \
    --out "/tmp/runs/h8000_${order}_s$seed" > "/tmp/runs_${order}_$seed.log" 2>&1 &
done; done
wait
echo "$(el) trained"
python3 - > "$OUT/mnist.log" 2>&1 <<'PY'
import glob, json
for f in sorted(glob.glob("/tmp/runs/*/metrics.json")):
    m = json.load(open(f))["metrics"]
    print(f.split("/")[3], "valid %.2f +- %.2f" % (m["valid"]["nll"], m["valid"]["nll_se"]),
          "best epoch", m["best_epoch"], "s/epoch %.2f" % m["seconds_per_epoch"])
PY
cat "$OUT/mnist.log"
grep -h -i "error\|Traceback" /tmp/runs_*.log | head -n 10
echo "$(el) eval"
timeout 120 flowkit mnist-eval /tmp/runs/*/model.pt --file "$DATA" --key valid --device cuda \
  --quiet --out /tmp/eval > "$OUT/eval.log" 2>&1
echo "eval rc $?"; tail -n 2 "$OUT/eval.log"
echo "$(el) done"
