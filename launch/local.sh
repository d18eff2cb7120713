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
# checkpoint, kills those still running, and exits with 130 (143 for SIGTERM); interrupted
# before it has started them, it starts none (and stops the Ray head below). The
# "[Gloo] Rank I is connected to ..." lines gloo's C++ code prints are left out.
#
# RAY=1 first starts a Ray cluster's head on this machine (`ray start --head`, port
# RAY_PORT or a free one, RAY_CPUS CPUs for actors or all of them) and gives each
# process its address as RAY_ADDRESS, for `--env-backend ray`: the processes share one
# cluster, which CPU-only machines join with the `ray start --address ...` line this
# script prints. The head stops (SIGTERM to its `ray start --block`) once the
# processes have ended; it is this script's own, nothing else of Ray is touched.
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
    ((${#pids[@]})) || return 0  # none started yet: the script ends before it starts them
    echo "launch/local.sh: interrupted; stopping the processes (killed after ${grace} s)" >&3
    ((${#live[@]})) && kill -TERM "${live[@]}" 2>/dev/null
    start_timer
}
# set before anything runs in the foreground: bash runs a trap once the command in progress has ended, where without
# one a SIGINT to this script alone (not its group) is dropped if that command did not die of it too
trap 'on_signal 130' INT
trap 'on_signal 143' TERM

ray_head=  # RAY=1: the `ray start --head --block` this script started
ray_log=
stop_ray_head() {  # SIGTERM to it: Ray drains the node and stops every process of it
    [ -n "$ray_head" ] || return 0
    kill -TERM "$ray_head" 2>/dev/null
    wait "$ray_head" 2>/dev/null
    rm -f "$ray_log"
}

port=${JAXRL_FRAG_PORT:-$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')}
# each process in a session of its own where setsid exists (Linux), so that killing its process group kills what
# it started too (environment workers)
own_group=()
command -v setsid >/dev/null && own_group=(setsid)

if [ -n "${RAY:-}" ]; then
    if [ "$RAY" != 1 ]; then
        echo "launch/local.sh: RAY=$RAY: RAY=1 starts a Ray head for the processes; leave RAY unset for none" >&3
        exit 2
    fi
    if ! command -v ray >/dev/null; then
        echo "launch/local.sh: RAY=1 needs Ray's command line on PATH: pip install 'jaxrl_frag[ray]'" >&3
        exit 2
    fi
    # one authentication mode for the head and the processes: `ray start` turns token authentication on where a
    # token exists (RAY_AUTH_TOKEN, or the file a local ray.init leaves in ~/.ray), but ray.init(address=...) does not
    if [ -z "${RAY_AUTH_MODE:-}" ]; then
        RAY_AUTH_MODE=disabled
        [ -n "${RAY_AUTH_TOKEN:-}" ] || [ -f "${RAY_AUTH_TOKEN_PATH:-$HOME/.ray/auth_token}" ] && RAY_AUTH_MODE=token
    fi
    export RAY_AUTH_MODE
    ray_port=${RAY_PORT:-$(python3 -c 'import socket; s = socket.socket(); s.bind(("", 0)); print(s.getsockname()[1])')}
    ray_log=$(mktemp "${TMPDIR:-/tmp}/ray-head.XXXXXX")
    # Ray's sockets live under its temp dir, whose path AF_UNIX caps: /tmp, not a deep $TMPDIR
    "${own_group[@]+"${own_group[@]}"}" ray start --head --block --port "$ray_port" ${RAY_CPUS:+--num-cpus "$RAY_CPUS"} \
        --include-dashboard=false --disable-usage-stats --temp-dir "/tmp/ray-$(id -u)" >"$ray_log" 2>&1 3>&- &
    ray_head=$!
    for ((waited = 0; waited < 120 && status == 0; waited++)); do
        grep -q "Ray runtime started" "$ray_log" && break
        kill -0 "$ray_head" 2>/dev/null || break
        sleep 0.5
    done
    RAY_ADDRESS=$(grep -o -m1 "ray start --address='[^']*'" "$ray_log" | cut -d"'" -f2)
    if [ -z "$RAY_ADDRESS" ] && ((status == 0)); then
        echo "launch/local.sh: the Ray head did not start within 60 s; its output:" >&3
        cat "$ray_log" >&3
        stop_ray_head
        exit 1
    fi
    if ((status == 0)); then
        export RAY_ADDRESS
        echo "launch/local.sh: Ray head at $RAY_ADDRESS; CPU-only machines join it with: ray start --address $RAY_ADDRESS" >&3
    fi
fi

if ((status)); then
    echo "launch/local.sh: interrupted before the processes started" >&3
    stop_ray_head
    exit "$status"
fi
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
stop_ray_head
exec >&-
wait "$filter" 2>/dev/null  # the filter has written the last lines once every writer has gone
exit "$status"
