#!/bin/bash
# Round 4 datasets at HEAD (engine-arg series recorded). Two at a time on 2 cores.
cd "$(git -C "$(dirname "$0")" rev-parse --show-toplevel)"
DATA=${SLA_DATA:-/tmp/sla8}; mkdir -p "$DATA"
P=.venv/bin/python
gen() { local seed=$1 hours=$2 services=$3 start=$4 out=$5; shift 5
  $P -m serving.dataset generate --seed $seed --hours $hours --services $services --start $start --out $DATA/$out --backfill "$@" > $DATA/$out.log 2>&1; echo "done $out $?" >> $DATA/progress; }
( gen 7 1.5 3 1767225600 ds7x3; gen 13 1 2 1767283200 ds13; gen 9 1 2 1767254400 ds9; gen 21 1 2 1767312000 ds21; gen 41 1 3 1767355200 ds41 --profile-change 1.0; gen 31 1.5 3 1767340800 ds31 --profile-change 1.0 ) &
( gen 11 1.5 2 1767268800 ds11; gen 8 1.5 3 1767240000 ds8x3; gen 17 1 2 1767297600 ds17; gen 23 1 2 1767326400 ds23; gen 51 1.5 4 1767369600 ds51 ) &
wait
echo ALLDONE >> $DATA/progress
