"""``jaxrl-frag envs``: the environment ids ``--env`` takes, the plugins' among them."""

from __future__ import annotations

import argparse

_WIDTH = 17  # the id column of the families' lines


def list_envs(args: argparse.Namespace) -> int:
    from jaxrl_frag.envs import registry

    print("\n".join(registry.available()))
    # where --env-backend auto steps them (envs.HostEnv.make)
    print("gymnasium:<id>   any Gymnasium environment, in worker processes (--env-backend)\n"
          "ale:<Game>       an Atari game (ale-py), standard preprocessing, on ale-py's threads in this process "
          "(--env-backend)\n"
          "<id>@obs=I,J     a JAX environment observing only entries I, J, ... of its observation vector "
          "(CartPole-v1@obs=0,2: no velocities)")
    for prefix, entry_point in registry.plugin_families().items():
        dist = getattr(entry_point, "dist", None)
        source = f"package {dist.name}" if dist is not None else "a plugin"
        print(f"{prefix + '<id>':<{_WIDTH - 1}} {source} ({entry_point.value})")
    return 0
