#!/bin/bash
# Offload on CUDA (issue #11): the native offload test, then the Llama step at budgets with and
# without offload, interleaved in one process (benchmarks/llama_step.py), with a per-kernel-class
# profile of the offloading plans (PROFILE= empty skips it). Run on the device machine from the repo root with $OUT set.
cd "$(dirname "$0")/.."
python3 -m pip install -q --no-deps --no-build-isolation -e . > $OUT/install.log 2>&1
export TRAINC_CACHE_DIR=/tmp/tc TRITON_CACHE_DIR=/tmp/trc TORCHINDUCTOR_CACHE_DIR=/tmp/ind TRAINC_CACHE_ARTIFACTS=0
nvidia-smi --query-gpu=name --format=csv,noheader > $OUT/gpu.txt
TRITON_INTERPRET=0 timeout -s ABRT 150 python3 -m pytest -q -x -m gpu tests/triton/test_triton_offload.py > $OUT/gputest.log 2>&1; echo "offload test rc=$?" >> $OUT/rc.txt
MODES=${MODES:-trainc,trainc:memory_budget=0.3,trainc:memory_budget=0.3:offload=1,trainc:memory_budget=0.25:offload=1,trainc:memory_budget=0.2:offload=1}
timeout -s ABRT ${STEP_S:-360} python3 -W ignore benchmarks/llama_step.py --out $OUT --modes $MODES --iters 10 --profile "${PROFILE-trainc,trainc:memory_budget=0.25:offload=1}" > $OUT/step.log 2>&1; echo "step rc=$?" >> $OUT/rc.txt
cat $OUT/gpu.txt $OUT/rc.txt; tail -5 $OUT/gputest.log | cut -c1-600; grep -v "^\s*$" $OUT/step.log | tail -30 | cut -c1-300
