#!/usr/bin/env bash
# Runs a doorbell sweep on a Slurm cluster as a job array (one task per shard) and merges the
# shards in a job that starts when every task has succeeded.
#
#   examples/cluster/slurm-sweep.sh SWEEP.toml OUT_DIR [SHARDS]
#
# Each array task runs `doorbell sim sweep SWEEP --shard $SLURM_ARRAY_TASK_ID/SHARDS` into
# OUT_DIR/shard-$SLURM_ARRAY_TASK_ID; the merge job (--dependency=afterok on the array) joins
# them into OUT_DIR/merged, the same files one local `doorbell sim sweep` writes.
# OUT_DIR must be on a file system every node sees. DOORBELL names the binary (default:
# target/release/doorbell, built beforehand with `cargo build --release`). Extra sbatch
# options (partition, time limit) can be given in SBATCH_OPTS.
set -euo pipefail

sweep=${1:?usage: slurm-sweep.sh SWEEP.toml OUT_DIR [SHARDS]}
out=${2:?usage: slurm-sweep.sh SWEEP.toml OUT_DIR [SHARDS]}
shards=${3:-4}
doorbell=${DOORBELL:-$(pwd)/target/release/doorbell}
sweep=$(realpath "$sweep")
mkdir -p "$out"
out=$(realpath "$out")

# shellcheck disable=SC2086
array_id=$(sbatch --parsable ${SBATCH_OPTS:-} \
    --job-name=doorbell-sweep --array=0-$((shards - 1)) \
    --output="$out/shard-%a.log" \
    --wrap="exec '$doorbell' sim sweep '$sweep' --quiet --shard \$SLURM_ARRAY_TASK_ID/$shards --out '$out'/shard-\$SLURM_ARRAY_TASK_ID")

dirs=""
for ((i = 0; i < shards; i++)); do dirs="$dirs '$out/shard-$i'"; done
# shellcheck disable=SC2086
merge_id=$(sbatch --parsable ${SBATCH_OPTS:-} \
    --job-name=doorbell-merge --dependency=afterok:"$array_id" \
    --output="$out/merge.log" \
    --wrap="exec '$doorbell' sim merge $dirs --out '$out/merged'")

echo "array job $array_id ($shards shards), merge job $merge_id -> $out/merged"
