#!/bin/bash
# Final round-4 model: one `tailguard train` over the training seeds kept + all validation seeds; scored once on B, C, D.
# usage: final.sh "ds7x3 ds11 ds13 [ds31]"
set -e
cd "$(git -C "$(dirname "$0")" rev-parse --show-toplevel)"
DATA=${SLA_DATA:-/tmp/sla8}; mkdir -p "$DATA"
TRAIN="$1 ds9 ds21 ds23 ds41"
T=$DATA/train-data; rm -rf $T; mkdir -p $T
for d in $TRAIN; do cp -r $DATA/$d/data/01* $T/; done
printf 'global: {}\n' > $DATA/empty.yml
serve() { prometheus --storage.tsdb.path=$1 --config.file=$DATA/empty.yml --web.listen-address=127.0.0.1:9390 \
  --storage.tsdb.retention.time=100y > $DATA/prom-$(basename $(dirname $1)).log 2>&1 & PROM=$!
  for i in $(seq 50); do curl -sf http://127.0.0.1:9390/-/ready >/dev/null && break; sleep 0.2; done; }
serve $T
.venv/bin/tailguard train --prometheus http://127.0.0.1:9390 --policy p99-rollback --start 1767225600 --end 1767358800 \
  --threshold gpu=2.5 --holdout 0 --out $DATA/model 2>&1 | tail -5
kill $PROM; wait $PROM || true
for pair in "ds8x3 1767240000 1767245400 B" "ds17 1767297600 1767301200 C" "ds51 1767369600 1767375000 D"; do
  set -- $pair
  serve $DATA/$1/data
  .venv/bin/tailguard evaluate --model $DATA/model --prometheus http://127.0.0.1:9390 --start $2 --end $3 --out $DATA/eval-$4 2>&1 | tail -3
  kill $PROM; wait $PROM || true
done
