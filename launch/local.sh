#!/usr/bin/env bash
# N processes of one command on this machine, joined into one JAX runtime.
#
#   launch/local.sh N COMMAND [ARG ...]
#   launch/local.sh 2 jaxrl-frag train ppo --env CartPole-v1 --policy data-parallel --devices 2
#
# Each process gets JAXRL_FRAG_COORDINATOR (127.0.0.1 and a free port),
# JAXRL_FRAG_NUM_PROCESSES and JAXRL_FRAG_PROCESS_ID; jaxrl_frag.distributed reads
# them. If any process fails, the others get GRACE seconds (default 5) to end
# themselves (a run that stops everywhere, as for a dead environment worker, has each
# print why and exit with the same status), then are killed, and this script exits
# with the first failed process's status: a dead peer never leaves the rest hanging.
set -uo pipefail
if [ $# -lt 2 ] || ! [[ $1 =~ ^[1-9][0-9]*$ ]]; then
    echo "usage: launch/local.sh N COMMAND [ARG ...]  (N: number of processes)" >&2
    exit 2
fi
n=$1; shift
port=${JAXRL_FRAG_PORT:-$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')}
grace=${GRACE:-5}
pids=()
killer=
for ((i = 0; i < n; i++)); do
    JAXRL_FRAG_COORDINATOR="127.0.0.1:$port" JAXRL_FRAG_NUM_PROCESSES="$n" JAXRL_FRAG_PROCESS_ID="$i" "$@" &
    pids+=($!)
done
trap 'kill "${pids[@]}" 2>/dev/null; exit 130' INT TERM
status=0
remaining=$n
while ((remaining > 0)); do
    wait -n -p done_pid "${pids[@]}"
    code=$?
    remaining=$((remaining - 1))
    if ((code != 0)) && ((status == 0)); then
        status=$code
        for ((i = 0; i < n; i++)); do
            [ "${pids[$i]}" = "$done_pid" ] && echo "launch/local.sh: process $i exited with status $code; stopping the others (killed after ${grace} s)" >&2
        done
        (sleep "$grace"; kill "${pids[@]}" 2>/dev/null) &
        killer=$!
    fi
done
[ -n "$killer" ] && kill "$killer" 2>/dev/null
exit $status
