"""Watching the processes a test starts: their children, and a file they write."""

from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path


def children(pid: int) -> list[tuple[int, bytes, bytes]]:
    """``(pid, command line, environment)`` of each child of process ``pid``."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat, command = (entry / "stat").read_text(), (entry / "cmdline").read_bytes()
                environ = (entry / "environ").read_bytes()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append((int(entry.name), command, environ))
    return found


def workers_of(pid: int) -> list[int]:
    """The host environment workers that process ``pid`` started."""
    return sorted(child for child, command, _ in children(pid) if b"host_worker.py" in command)


def wait_for(path: Path, proc: subprocess.Popen[str], seconds: float) -> None:
    """Wait until ``path`` exists, failing (with ``proc``'s stderr) if ``proc`` ends first or
    ``seconds`` pass."""
    deadline = time.monotonic() + seconds
    while not path.exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1][-3000:]
        time.sleep(0.2)


def free_port() -> int:
    """A TCP port of this machine that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
