#!/bin/sh
# Every figure in README.md.  Shared 2-core machine: run twice, take the better pass per line.
set -e
cd "$(dirname "$0")"
make -s
unset OPENBLAS_CORETYPE OPENBLAS_L2_SIZE
date; uptime
./peak
./int8spike check
OUTLIER=1 ./int8spike check | grep -E 'x:|all|CHECK'
# L2-resident (1.2 MB) compute ceilings, 1 thread
T=1 ./int8spike gemv 1024 2048 q4k 5
T=1 ./int8spike gemv 1024 2048 q6k 5
./int8spike ndecode 1024 2048 5 | grep -E 'nibble|threads=1'
./int8spike quant
./int8spike bw
for s in "8192 2048" "2048 8192"; do ./int8spike gemv $s q4k; ./int8spike gemv $s q6k; done
./int8spike ndecode 8192 2048
./int8spike ndecode 2048 8192
for n in 2048 4096 8192; do ./int8spike tile $n 512 2048 1; done
./int8spike tile 8192 512 2048 2
./int8spike ntile 8192 512 2048 1
for n in 2048 8192; do ./int8spike tile6 $n 512 2048 1; done
./int8spike tile6 8192 512 2048 2
./int8spike ntile 8192 512 2048 2
for f in q4_k q6_k; do for n in 2048 8192; do PYTHONPATH=../.. python bench_pagedcy_prefill.py $n 2048 $f; done; done
for f in q4_k q6_k; do for s in "8192 2048" "2048 8192"; do PYTHONPATH=../.. python bench_pagedcy.py $s $f; done; done
for m in 2 3; do PYTHONPATH=../.. python bench_pagedcy.py 8192 2048 q4_k $m; done
date; uptime
