"""Weights & Biases beside metrics.csv and TensorBoard (``--wandb PROJECT``; the ``wandb``
extra): each row logged as metrics.csv gets it, config.json's configuration as the W&B run's
config, W&B's files in the run directory's ``wandb/``. wandb is imported only for a run that
logs to it, and reads its mode, entity and credentials from its own settings:
``WANDB_MODE=offline`` logs without a network, and ``wandb sync`` uploads such a run later."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from jaxrl_frag.errors import ConfigError, check


def check_project(project: str) -> None:
    """``ConfigError`` naming ``wandb`` unless a run can log to the W&B project ``project``: the
    name is a project's, wandb is installed, its settings (``WANDB_MODE``, ...) are valid, and
    where it logs online, it has an API key."""
    check(0 < len(project) <= 128 and not re.search(r"[/\\#?%:]", project), "wandb", project,
          "give a W&B project name: 1 to 128 characters, none of / \\ # ? % :")
    try:
        import wandb
    except ImportError:
        raise ConfigError("wandb", project, "logging to W&B needs the wandb package: pip install "
                                            "'jaxrl-frag[wandb]'") from None
    from pydantic import ValidationError

    try:
        settings = wandb.setup().settings
    except ValidationError as error:
        refused = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in error.errors())
        raise ConfigError("wandb", project, f"W&B refuses its settings, from its WANDB_ environment variables or "
                                            f"settings files: {refused}") from None
    if settings.mode in ("online", "run"):
        try:
            wandb.login(verify=False)
        except wandb.errors.UsageError as error:
            raise ConfigError("wandb", project, f"{str(error).rstrip('.')}; or log offline, WANDB_MODE=offline, "
                                                "and upload the run later with `wandb sync`") from None


class WandbLog:
    """A W&B run of ``project`` that a run directory's rows are logged to: started, or
    continued by its id ``run_id``, named as the directory, with ``config`` as its config
    and its files in ``directory/wandb``."""

    def __init__(self, directory: Path, project: str, run_id: str, config: dict[str, Any]):
        import wandb

        # create_new: a run of its own beside any the caller has (wandb.run is left alone)
        self._run = wandb.init(project=project, id=run_id, resume="allow", name=directory.name, dir=directory,
                               config=config, reinit="create_new")
        self._charted: set[str] = set()

    def log(self, row: dict[str, Any]) -> None:
        """Log ``row``, its values as metrics.csv holds them, at step ``iteration``, charted
        against ``env_steps``; a population member's (``member``) as ``memberN/NAME``."""
        prefix = f"member{int(row['member'])}/" if "member" in row else ""
        if prefix not in self._charted:
            self._run.define_metric(f"{prefix}*", step_metric=f"{prefix}env_steps")
            self._charted.add(prefix)
        self._run.log({prefix + name: value if isinstance(value, int) else float(value)
                       for name, value in row.items() if name != "member"}, step=int(row["iteration"]))

    def close(self, exit_code: int) -> None:
        """Finish the W&B run, as failed where ``exit_code`` is not 0."""
        self._run.finish(exit_code=exit_code)
