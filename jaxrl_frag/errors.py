"""The errors a user can cause."""

from __future__ import annotations

from typing import Any


class ConfigError(ValueError):
    """A configuration value that cannot work, raised before anything is traced.

    The message names the parameter, the value given and how to fix it.
    """

    def __init__(self, field: str, value: Any, fix: str):
        self.field, self.value, self.fix = field, value, fix
        super().__init__(f"{field}={value!r}: {fix}")


def check(condition: bool, field: str, value: Any, fix: str) -> None:
    """Raise ``ConfigError(field, value, fix)`` unless ``condition`` holds."""
    if not condition:
        raise ConfigError(field, value, fix)
