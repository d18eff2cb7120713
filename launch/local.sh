#!/usr/bin/env bash
# N processes of one command on this machine, joined into one JAX runtime.
#
#   launch/local.sh N COMMAND [ARG ...]
#   launch/local.sh 2 jaxrl-frag train ppo --env CartPole-v1 --policy data-parallel --devices 2
#
# Each process gets JAXRL_FRAG_COORDINATOR (127.0.0.1 and a free port, or
# JAXRL_FRAG_PORT), JAXRL_FRAG_NUM_PROCESSES and JAXRL_FRAG_PROCESS_ID;
# jaxrl_frag.distributed reads them. If any process fails, the others get GRACE
# seconds (default 5) to end themselves (a run that stops everywhere, as for a dead
# environment worker, has each print why and exit with the same status); those still
# running then are killed (SIGKILL), and this script exits with the first failed
# process's status: a dead peer never leaves the rest hanging. Interrupted (Ctrl-C,
# SIGTERM), it passes SIGTERM on, gives the processes GRACE seconds to stop with a
# checkpoint, kills those still running, and exits with 130 (143 for SIGTERM). The
# "[Gloo] Rank I is connected to ..." lines gloo's C++ code prints are left out.
set -uo pipefail
if [ $# -lt 2 ] || ! [[ $1 =~ ^[1-9][0-9]*$ ]]; then
    echo "usage: launch/local.sh N COMMAND [ARG ...]  (N: number of processes)" >&2
    exit 2
fi
n=$1; shift
grace=${GRACE:-5}
if ! [[ $grace =~ ^[0-9]+([.][0-9]+)?$ ]]; then
    echo "launch/local.sh: GRACE=$grace: give the seconds the others get to stop, e.g. GRACE=5" >&2
    exit 2
fi
# stdout through a filter of gloo's lines, one deaf to Ctrl-C and SIGTERM (they reach the whole terminal's
# group): what the processes print as they stop still shows; it ends when the last writer has gone
exec > >(trap '' INT TERM; exec grep --line-buffered -v '^\[Gloo\] ')
filter=$!
# this script's own messages; the loop that waits for the processes writes its stderr nowhere: bash's notes of the
# jobs it killed (which the messages say) are all it would hold
exec 3>&2
port=${JAXRL_FRAG_PORT:-$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')}
pids=()    # every process, by process id
live=()    # those not yet reaped
timer=     # a sleep of GRACE seconds, once a process failed or a signal came; when it ends, kill the rest
killed=
status=0

start_timer() {
    if [ -z "$timer" ] && [ -z "$killed" ]; then
        sleep "$grace" &
        timer=$!
    fi
}

# shellcheck disable=SC2329  # called by the traps below
on_signal() {  # $1: the status to exit with
    ((status == 0)) && status=$1
    echo "launch/local.sh: interrupted; stopping the processes (killed after ${grace} s)" >&3
    ((${#live[@]})) && kill -TERM "${live[@]}" 2>/dev/null
    start_timer
}
trap 'on_signal 130' INT
trap 'on_signal 143' TERM

# each process in a session of its own where setsid exists (Linux), so that killing its process group kills what
# it started too (environment workers)
own_group=()
command -v setsid >/dev/null && own_group=(setsid)
for ((i = 0; i < n; i++)); do
    JAXRL_FRAG_COORDINATOR="127.0.0.1:$port" JAXRL_FRAG_NUM_PROCESSES="$n" JAXRL_FRAG_PROCESS_ID="$i" \
        "${own_group[@]+"${own_group[@]}"}" "$@" 3>&- &
    pids+=($!)
    live+=($!)
done

while ((${#live[@]})); do
    done_pid=
    wait -n -p done_pid "${live[@]}" ${timer:+"$timer"} 2>/dev/null
    code=$?
    if [ -z "${done_pid:-}" ]; then
        ((code == 127)) && break  # none left to wait for (never expected: a guard against spinning)
        continue                  # a signal's trap ran
    fi
    if [ "$done_pid" = "${timer:-}" ]; then  # the grace period is over
        timer=
        killed=1
        for ((i = 0; i < n; i++)); do
            [[ " ${live[*]} " == *" ${pids[$i]} "* ]] && echo "launch/local.sh: process $i still running after ${grace} s; killed" >&3
        done
        for pid in "${live[@]}"; do
            kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null
        done
        continue
    fi
    rest=()
    for pid in "${live[@]}"; do
        [ "$pid" != "$done_pid" ] && rest+=("$pid")
    done
    live=("${rest[@]+"${rest[@]}"}")
    if ((code != 0)) && ((status == 0)); then
        status=$code
        for ((i = 0; i < n; i++)); do
            if [ "${pids[$i]}" = "$done_pid" ]; then
                if ((${#live[@]})); then
                    echo "launch/local.sh: process $i exited with status $code; stopping the others (killed after ${grace} s)" >&3
                else
                    echo "launch/local.sh: process $i exited with status $code" >&3
                fi
            fi
        done
        ((${#live[@]})) && start_timer
    fi
done 2>/dev/null
if [ -n "$timer" ]; then
    kill "$timer" 2>/dev/null
    wait "$timer" 2>/dev/null
fi
exec >&-
wait "$filter" 2>/dev/null  # the filter has written the last lines once every writer has gone
exit "$status"
