#!/bin/bash
# submit.sh PLAN N SHARDS_DIR RUN_DIR [sbatch options...]
# N shards of PLAN as a Slurm job array, then the merge job that waits for all of them
# (afterok). Prints the two job ids. SHARDS_DIR and RUN_DIR must be on a shared file system.
set -euo pipefail
if [ $# -lt 4 ]; then
  echo "usage: $0 PLAN N SHARDS_DIR RUN_DIR [sbatch options...]" >&2
  exit 2
fi
plan=$1 n=$2 shards=$3 out=$4
shift 4
case $n in '' | *[!0-9]* | 0) echo "$0: N must be a whole number >= 1, got '$n'" >&2; exit 2 ;; esac
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$shards"
export LAB_PLAN=$plan LAB_SHARDS=$shards LAB_OUT=$out
array=$(sbatch --parsable --array=0-$((n - 1)) "$@" "$here/lab-shard.sbatch")
array=${array%%;*}  # "id;cluster" on multi-cluster set-ups
merge=$(sbatch --parsable --dependency=afterok:"$array" --kill-on-invalid-dep=yes "$@" \
  "$here/lab-merge.sbatch")
echo "shards: job $array (array 0-$((n - 1))); merge: job ${merge%%;*} -> $out"
