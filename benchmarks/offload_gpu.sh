#!/bin/bash
# Offload on CUDA (issue #11): the native offload test, then the Llama budget frontier with
# --offload. Run on the device machine from the repo root with $OUT set; results land in $OUT.
cd "$(dirname "$0")/.."
python3 -m pip install -q --no-deps --no-build-isolation -e . > $OUT/install.log 2>&1
export TRAINC_CACHE_DIR=/tmp/tc TRITON_CACHE_DIR=/tmp/trc TORCHINDUCTOR_CACHE_DIR=/tmp/ind TRAINC_CACHE_ARTIFACTS=0
nvidia-smi --query-gpu=name --format=csv,noheader > $OUT/gpu.txt
TRITON_INTERPRET=0 timeout -s ABRT 200 python3 -m pytest -q -x -m gpu tests/triton/test_triton_offload.py > $OUT/gputest.log 2>&1; echo "offload test rc=$?" >> $OUT/rc.txt
timeout -s ABRT 330 python3 -W ignore -m trainc report zoo:llama --device cuda --dtype bfloat16 --budgets none 0.6 0.45 0.3 0.0 --offload --torch-budgets --steps 3 --out $OUT/report > $OUT/report.log 2>&1; echo "report rc=$?" >> $OUT/rc.txt
cat $OUT/gpu.txt $OUT/rc.txt; tail -5 $OUT/gputest.log | cut -c1-600; grep -v "^\s*$" $OUT/report.log | tail -16 | cut -c1-300
