"""``jaxrl-frag`` in this process, killed with SIGKILL at a chosen point.

    python resume_worker.py MODE N -- ARGV...

MODE ``commit``: die while the N-th checkpoint step is being committed (its files
written, the step directory not yet renamed into place); ``rows``: die right after the N-th row of metrics is
written (past the newest checkpoint); ``stall``: every compiled call after the N-th never
returns (its results never become ready: a program blocked inside XLA); ``none``: run to the end.
"""

from __future__ import annotations

import os
import signal
import sys

STARTED = "resume_worker: the command starts"
STALLED = "resume_worker: this call never returns"


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def main() -> int:
    mode, n = sys.argv[1], int(sys.argv[2])
    argv = sys.argv[sys.argv.index("--") + 1:]
    calls = {"count": 0}

    def on_nth(original, counts=lambda *args: True):
        def wrapped(*args, **kwargs):
            calls["count"] += counts(*args)
            if mode == "commit" and calls["count"] == n:
                _die()
            result = original(*args, **kwargs)
            if mode == "rows" and calls["count"] == n:
                _die()
            return result
        return wrapped

    if mode == "commit":
        from orbax.checkpoint._src.path import atomicity

        def is_step(path: atomicity.AtomicRenameTemporaryPath, *_: object) -> bool:
            return path.get_final().name.isdigit()

        atomicity.AtomicRenameTemporaryPath.finalize = on_nth(atomicity.AtomicRenameTemporaryPath.finalize, is_step)
    elif mode == "rows":
        from jaxrl_frag.app import rundir

        rundir.RunDir.append_metrics = on_nth(rundir.RunDir.append_metrics)
    elif mode == "stall":
        import threading

        import jax

        from jaxrl_frag import policy

        def blocked(x):
            threading.Event().wait()  # forever
            return x

        hold = jax.jit(lambda x: jax.pure_callback(blocked, jax.ShapeDtypeStruct(x.shape, x.dtype), x))
        original = policy.SpmdExecutor.call

        def call(self, *args):
            calls["count"] += 1
            state, chunk, rows, num_rows, ran, flags = original(self, *args)
            if calls["count"] > n:
                print(STALLED, file=sys.stderr, flush=True)
                ran = hold(jax.device_get(ran))
            return state, chunk, rows, num_rows, ran, flags

        policy.SpmdExecutor.call = call
    from jaxrl_frag.app.cli import main as cli

    print(STARTED, file=sys.stderr, flush=True)  # past Python's imports: the command's own signal handling from here
    return cli(argv)


if __name__ == "__main__":
    sys.exit(main())
