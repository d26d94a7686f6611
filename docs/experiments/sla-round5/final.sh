#!/bin/bash
# Round-5 final model (57 features: round 4's + queue_time_p50), trained exactly as round 4's final.sh, scored once
# on held out B, C, D and the new E. With "info", also scores round 4's model (kept in $DATA/model) on E.
# usage: final.sh [info]
set -e
MODE=${1:-}
cd "$(git -C "$(dirname "$0")" rev-parse --show-toplevel)"
DATA=${SLA_DATA:-/tmp/sla8}
TRAIN="ds7x3 ds11 ds13 ds31 ds9 ds21 ds23 ds41"
T=$DATA/train-data; rm -rf $T; mkdir -p $T
for d in $TRAIN; do cp -r $DATA/$d/data/01* $T/; done
printf 'global: {}\n' > $DATA/empty.yml
serve() { prometheus --storage.tsdb.path=$1 --config.file=$DATA/empty.yml --web.listen-address=127.0.0.1:9390 \
  --storage.tsdb.retention.time=100y > $DATA/prom-$(basename $(dirname $1)).log 2>&1 & PROM=$!
  for i in $(seq 50); do curl -sf http://127.0.0.1:9390/-/ready >/dev/null && break; sleep 0.2; done; }
serve $T
.venv/bin/tailguard train --prometheus http://127.0.0.1:9390 --policy p99-rollback --start 1767225600 --end 1767358800 \
  --threshold gpu=2.5 --holdout 0 --out $DATA/model5 2>&1 | tail -5
kill $PROM; wait $PROM || true
for pair in "ds8x3 1767240000 1767245400 B" "ds17 1767297600 1767301200 C" "ds51 1767369600 1767375000 D" \
            "ds61 1767384000 1767389400 E"; do
  set -- $pair
  serve $DATA/$1/data
  .venv/bin/tailguard evaluate --model $DATA/model5 --prometheus http://127.0.0.1:9390 --start $2 --end $3 --out $DATA/eval5-$4 2>&1 | tail -3
  kill $PROM; wait $PROM || true
done
if [ "$MODE" = info ]; then  # information only: round 4's model (56 features) on E, with round 4's code (f4e7364)
  R4=$DATA/round4-code; [ -d $R4 ] || { mkdir -p $R4 && git archive f4e7364 | tar -x -C $R4; }
  serve $DATA/ds61/data
  (cd $R4 && "$OLDPWD/.venv/bin/python" -c 'import sys; from predictors.evaluate import main; sys.exit(main(sys.argv[1:]))' --model $DATA/model --prometheus http://127.0.0.1:9390 \
    --start 1767384000 --end 1767389400 --out $DATA/eval4-E 2>&1 | tail -3)
  kill $PROM; wait $PROM || true
fi
