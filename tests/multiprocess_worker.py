"""One process of a multi-process data-parallel PPO run, started by launch/local.sh
(or alone, as the single-process reference).

    python tests/multiprocess_worker.py OUT.npz DEVICES_PER_PROCESS [CHECKPOINT_DIR]

Process 0 saves the final parameters to OUT.npz; with CHECKPOINT_DIR every process
takes part in saving the sharded state there every 2 iterations. With JAXRL_FRAG_TEST_DIE=I,
process I dies right after joining, to test that its peers do not hang.
"""

import os
import sys

import jax

jax.config.update("jax_num_cpu_devices", int(sys.argv[2]))

from jaxrl_frag import distributed  # noqa: E402

distributed.initialize()
if os.environ.get("JAXRL_FRAG_TEST_DIE") == str(jax.process_index()):
    os._exit(3)

import numpy as np  # noqa: E402

import jaxrl_frag as jf  # noqa: E402
from jaxrl_frag.checkpoints import Checkpoints  # noqa: E402
from jaxrl_frag.sharding import DataParallel  # noqa: E402

algo = jf.recipes.PPO.create("CartPole-v1", num_envs=8, num_steps=32, total_steps=8 * 32 * 4)
checkpoints = Checkpoints(sys.argv[3], every=2) if len(sys.argv) > 3 else None
history = jf.compile(algo, DataParallel(), chunk_iterations=2).run(jax.random.PRNGKey(3), checkpoints=checkpoints)
params = [np.asarray(x) for x in jax.tree.leaves(history.state.params)]
if distributed.is_main_process():
    np.savez(sys.argv[1], *params)
    print(f"processes={jax.process_count()} devices={jax.device_count()} rows={len(history.rows)}")
