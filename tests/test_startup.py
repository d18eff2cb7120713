"""Starting a run of several processes, as a user meets it: a coordinator address that
cannot work is refused at once, a process whose peers never start says what it waits for
and gives up naming them, and launch/local.sh kills what ignores SIGTERM, quietly (gloo's lines left out)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from processes import free_port

pytestmark = pytest.mark.slow  # real processes meeting, or failing to meet, at a coordinator

ROOT = Path(__file__).resolve().parents[1]
LAUNCH = str(ROOT / "launch" / "local.sh")
SCRIPT = str(Path(sys.executable).parent / "jaxrl-frag")
TRAIN = [SCRIPT, "train", "ppo", "--env", "CartPole-v1", "--num-envs", "4", "--num-steps", "8", "--total-steps", "64",
         "--chunk-iterations", "1"]


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS" and not k.startswith("JAXRL_FRAG_")}
    return {**env, **extra}


def tagged(token: str) -> list[int]:
    """The processes whose environment holds ``token`` (those a test started, and theirs)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if token.encode() in (entry / "environ").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def sleeping(token: str) -> list[int]:
    """Those of ``tagged`` that are ``sleep 60``."""
    found = []
    for pid in tagged(token):
        try:
            if (Path("/proc") / str(pid) / "cmdline").read_bytes() == b"sleep\x0060\x00":
                found.append(pid)
        except OSError:
            continue
    return found


@pytest.mark.parametrize(("flags", "words"), [
    (["--coordinator", "127.0.0.1:99999", "--num-processes", "2", "--process-id", "0"],
     ["coordinator='127.0.0.1:99999'", "--coordinator", "port '99999'", "1 to 65535"]),
    (["--coordinator", "127.0.0.1", "--num-processes", "2", "--process-id", "0"],
     ["coordinator='127.0.0.1'", "--coordinator takes HOST:PORT"]),
    (["--coordinator", "127.0.0.1:12345", "--num-processes", "2", "--process-id", "2"],
     ["process_id=2", "0 to 1", "--process-id"]),
    (["--coordinator", "127.0.0.1:12345", "--num-processes", "2", "--process-id", "0", "--join-timeout", "0"],
     ["join_timeout=0.0", "positive number of seconds"]),
])
def test_a_coordinator_setting_that_cannot_work_exits_2_at_once(flags: list[str], words: list[str]) -> None:
    start = time.monotonic()
    run = subprocess.run([*TRAIN, *flags], env=clean_env(), capture_output=True, text=True, timeout=120)
    assert run.returncode == 2, run.stderr[-2000:]
    assert time.monotonic() - start < 60
    assert run.stderr.startswith("jaxrl-frag: error: "), run.stderr
    for word in words:
        assert word in run.stderr, run.stderr
    assert "Traceback" not in run.stderr


def test_a_coordinator_port_out_of_range_from_the_environment_names_the_variable() -> None:
    run = subprocess.run(TRAIN, env=clean_env(JAXRL_FRAG_COORDINATOR="127.0.0.1:0", JAXRL_FRAG_NUM_PROCESSES="2",
                                              JAXRL_FRAG_PROCESS_ID="1"), capture_output=True, text=True, timeout=120)
    assert run.returncode == 2, run.stderr[-2000:]
    assert "JAXRL_FRAG_COORDINATOR='127.0.0.1:0'" in run.stderr and "1 to 65535" in run.stderr, run.stderr
    assert "Traceback" not in run.stderr


def test_a_process_whose_peer_never_starts_says_what_it_waits_for_and_gives_up_naming_it(tmp_path: Path) -> None:
    """Process 0 of 2, with the join timeout shortened through JAXRL_FRAG_JOIN_TIMEOUT:
    after half of it, one line on what it waits for; at it, exit 2 naming process 1."""
    address = f"127.0.0.1:{free_port()}"
    start = time.monotonic()
    run = subprocess.run([*TRAIN, "--coordinator", address, "--num-processes", "2", "--process-id", "0",
                          "--run-dir", str(tmp_path / "run")], env=clean_env(JAXRL_FRAG_JOIN_TIMEOUT="3"),
                         capture_output=True, text=True, timeout=120)
    elapsed = time.monotonic() - start
    assert run.returncode == 2, run.stderr[-2000:]
    assert 3 <= elapsed < 60
    lines = run.stderr.strip().splitlines()
    assert lines == [
        f"jaxrl-frag: process 0: waiting for the other processes at the coordinator {address}: 1 of 2 joined, missing "
        f"process 1; giving up after 3 s (--join-timeout, or $JAXRL_FRAG_JOIN_TIMEOUT)",
        f"jaxrl-frag: error: process 0: gave up waiting after 3 s: missing process 1 at {address} (1 of 2 joined): "
        f"start it with --coordinator {address} --num-processes 2 --process-id 1; or allow longer with --join-timeout "
        "SECONDS (or $JAXRL_FRAG_JOIN_TIMEOUT)"], run.stderr
    assert not (tmp_path / "run").exists()


def test_a_process_without_its_coordinator_gives_up_naming_process_0() -> None:
    address = f"127.0.0.1:{free_port()}"
    start = time.monotonic()
    run = subprocess.run([*TRAIN, "--coordinator", address, "--num-processes", "2", "--process-id", "1",
                          "--join-timeout", "2"], env=clean_env(), capture_output=True, text=True, timeout=120)
    assert run.returncode == 2, run.stderr[-2000:]
    assert 2 <= time.monotonic() - start < 60
    assert f"jaxrl-frag: process 1: waiting for process 0's coordinator at {address}, which does not answer" \
           in run.stderr, run.stderr
    assert f"gave up waiting after 2 s: process 0's coordinator at {address} never answered" in run.stderr
    assert "Traceback" not in run.stderr


def test_of_three_processes_the_two_started_both_name_the_third(tmp_path: Path) -> None:
    """Process 1 starts first, so its own deadline passes first: it gives up on process
    0's word, not before (else process 0 would see it leave and name it missing too). 8 s:
    process 0, started 1.5 s later, listens long before process 1's deadline, under load too."""
    address = f"127.0.0.1:{free_port()}"
    procs = {}
    for i in (1, 0):
        procs[i] = subprocess.Popen([*TRAIN, "--coordinator", address, "--num-processes", "3", "--process-id",
                                     str(i), "--join-timeout", "8"], env=clean_env(), stdout=subprocess.DEVNULL,
                                    stderr=subprocess.PIPE, text=True)
        time.sleep(1.5)
    errs = {i: proc.communicate(timeout=120)[1] for i, proc in procs.items()}
    # process 1's notice may come before process 0 listens (it says so); process 0's names process 2
    assert "2 of 3 joined, missing process 2" in errs[0], errs[0]
    for i, proc in procs.items():
        err = errs[i]
        assert proc.returncode == 2, err[-2000:]
        assert f"jaxrl-frag: error: process {i}: gave up waiting after 8 s: missing process 2" in err, err
        assert "--process-id 2;" in err, err


def test_processes_with_different_counts_are_refused(tmp_path: Path) -> None:
    address = f"127.0.0.1:{free_port()}"
    first = subprocess.Popen([*TRAIN, "--coordinator", address, "--num-processes", "2", "--process-id", "0",
                              "--join-timeout", "20"], env=clean_env(), stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True)
    try:
        other = subprocess.run([*TRAIN, "--coordinator", address, "--num-processes", "3", "--process-id", "1",
                                "--join-timeout", "20"], env=clean_env(), capture_output=True, text=True, timeout=120)
    finally:
        first.kill()
        first.communicate()
    assert other.returncode == 2, other.stderr[-2000:]
    assert "process 1 was started with --num-processes 3, process 0 at" in other.stderr, other.stderr
    assert "give every process the same --num-processes" in other.stderr


def as_from_a_terminal() -> None:
    """SIGINT at its default in the launched script, as a terminal starts it, whatever this process inherited: a suite
    started in the background of a script has SIGINT ignored (POSIX), a disposition that bash cannot trap or reset."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def local_sh(tmp_path: Path, body: str, token: str, grace: str = "1") -> subprocess.Popen[str]:
    child = tmp_path / "child.sh"
    child.write_text(f"#!/usr/bin/env bash\n{body}\n")
    child.chmod(0o755)
    return subprocess.Popen([LAUNCH, "2", str(child)], env=clean_env(GRACE=grace, TEST_TOKEN=token),
                            preexec_fn=as_from_a_terminal,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


# process 1 fails; process 0 ignores SIGTERM (and so does its own child, as an environment worker would run on)
FAIL_AND_IGNORE = """if [ "$JAXRL_FRAG_PROCESS_ID" = 1 ]; then sleep 0.3; exit 3; fi
trap '' TERM
sleep 60 &
wait"""


def test_local_sh_kills_a_process_that_ignores_sigterm_after_the_grace_period(tmp_path: Path) -> None:
    token = uuid.uuid4().hex
    start = time.monotonic()
    proc = local_sh(tmp_path, FAIL_AND_IGNORE, token)
    try:
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    elapsed = time.monotonic() - start
    assert proc.returncode == 3, err
    assert 1 <= elapsed < 10
    assert err.splitlines() == ["launch/local.sh: process 1 exited with status 3; stopping the others (killed after 1 s)",
                                "launch/local.sh: process 0 still running after 1 s; killed"], err
    time.sleep(0.2)
    assert tagged(token) == []  # process 0, its own child and the grace timer are all gone


@pytest.mark.parametrize(("sig", "status"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_local_sh_interrupted_stops_every_process(tmp_path: Path, sig: signal.Signals, status: int) -> None:
    token = uuid.uuid4().hex
    proc = local_sh(tmp_path, "trap '' TERM\nsleep 60 &\nwait", token)
    err, seconds = interrupt(proc, sig, lambda: len(sleeping(token)) == 2)  # once both processes are under way
    assert proc.returncode == status, err
    assert seconds < 10
    assert err.splitlines() == ["launch/local.sh: interrupted; stopping the processes (killed after 1 s)",
                                "launch/local.sh: process 0 still running after 1 s; killed",
                                "launch/local.sh: process 1 still running after 1 s; killed"], err
    time.sleep(0.2)
    assert tagged(token) == []


def interrupt(proc: subprocess.Popen[str], sig: signal.Signals, ready: Callable[[], bool]) -> tuple[str, float]:
    """``sig`` sent to ``proc`` once ``ready()`` (or after 10 s): its stderr, and the seconds it then took to end."""
    try:
        deadline = time.monotonic() + 10
        while not ready() and time.monotonic() < deadline:
            time.sleep(0.05)
        start = time.monotonic()
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=30)
        return err, time.monotonic() - start
    finally:
        proc.kill()


def starting_child(tmp_path: Path) -> Path:
    """A command that leaves the file ``started`` beside it once it runs."""
    child = tmp_path / "child.sh"
    child.write_text(f"#!/usr/bin/env bash\ntouch {tmp_path / 'started'}\n")
    child.chmod(0o755)
    return child


def test_local_sh_refuses_a_bad_ray_setting_and_a_missing_ray(tmp_path: Path) -> None:
    child = starting_child(tmp_path)
    for extra, message in (({"RAY": "2"}, "launch/local.sh: RAY=2: RAY=1 starts a Ray head for the processes; "
                                          "leave RAY unset for none"),
                           ({"RAY": "1", "PATH": "/usr/bin:/bin"},  # no ray command there
                            "launch/local.sh: RAY=1 needs Ray's command line on PATH: pip install 'jaxrl_frag[ray]'")):
        done = subprocess.run([LAUNCH, "2", str(child)], env=clean_env(**extra), capture_output=True, text=True,
                              timeout=30)
        assert (done.returncode, done.stderr.strip()) == (2, message)
    assert not (tmp_path / "started").exists()


@pytest.mark.parametrize(("sig", "status"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_local_sh_interrupted_while_its_ray_head_starts_starts_no_process(tmp_path: Path, sig: signal.Signals,
                                                                          status: int) -> None:
    """A signal to the script alone while it waits for its Ray head (a ``ray`` that never starts one) ends it
    within seconds with the signal's status, the head stopped and no process started (a SIGINT had been dropped
    there, a foreground ``sleep`` not dying of it, and the script went on waiting for a minute)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    head = tmp_path / "head.pid"
    (bin_dir / "ray").write_text(f"#!/usr/bin/env bash\necho $$ > {head}\nexec sleep 60\n")
    (bin_dir / "ray").chmod(0o755)
    proc = subprocess.Popen([LAUNCH, "2", str(starting_child(tmp_path))], stdout=subprocess.PIPE, preexec_fn=as_from_a_terminal,
                            stderr=subprocess.PIPE, text=True, env=clean_env(RAY="1", PATH=f"{bin_dir}:/usr/bin:/bin"))
    err, seconds = interrupt(proc, sig, head.exists)  # once the script waits for its head
    assert proc.returncode == status, err
    assert seconds < 5
    assert err.strip() == "launch/local.sh: interrupted before the processes started"
    assert not (tmp_path / "started").exists()
    assert not Path(f"/proc/{head.read_text().strip()}").exists()  # the head's process stopped


# what gloo's C++ code prints as the processes connect
GLOO = "[Gloo] Rank $JAXRL_FRAG_PROCESS_ID is connected to 1 peer ranks. Expected number of connected peer ranks is : 1"


def test_local_sh_prints_nothing_of_its_own_when_every_process_succeeds(tmp_path: Path) -> None:
    token = uuid.uuid4().hex
    proc = local_sh(tmp_path, f'echo "{GLOO}"; sleep 0.$((JAXRL_FRAG_PROCESS_ID + 1)); echo "process $JAXRL_FRAG_PROCESS_ID"',
                    token)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert err == ""
    assert sorted(out.splitlines()) == ["process 0", "process 1"]
    assert tagged(token) == []
