#!/usr/bin/env bash
# Data-parallel PPO across every host of a TPU pod slice.
#
#   launch/tpu_pod.sh TPU_NAME ZONE [jaxrl-frag train flags ...]
#   launch/tpu_pod.sh my-v4-32 us-central2-b --env CartPole-v1 --num-envs 8192 --total-steps 1e9
#
# Runs the same command on all workers (--worker=all) with
# JAXRL_FRAG_DISTRIBUTED=auto, so jax.distributed detects the pod topology itself, and the mesh spans every chip
# of every host. Assumes the package is installed on each worker
# (pip install this repository there first). Only worker 0 writes the run directory.
set -euo pipefail
if [ $# -lt 2 ]; then
    echo "usage: launch/tpu_pod.sh TPU_NAME ZONE [jaxrl-frag train flags ...]" >&2
    exit 2
fi
tpu=$1 zone=$2
shift 2
gcloud compute tpus tpu-vm ssh "$tpu" --zone "$zone" --worker=all \
    --command "JAXRL_FRAG_DISTRIBUTED=auto jaxrl-frag train ppo --policy data-parallel $(printf '%q ' "$@")"
