"""Griffe extension: find the subpackages that setuptools maps from other folders.

``pyproject.toml`` maps ``jaxrl_frag.envs`` to ``envs/`` (and likewise ``sharding``,
``recipes``, ``transforms``) through ``[tool.setuptools.package-dir]``. Griffe reads
a package from its own folder only, so after it loads ``jaxrl_frag`` this extension
loads each mapped folder as the subpackage it installs as. The mapping is read from
``pyproject.toml``, so the documentation follows it.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import griffe

_ROOT = Path(__file__).resolve().parent.parent


def _mapping() -> dict[str, Path]:
    with (_ROOT / "pyproject.toml").open("rb") as f:
        package_dir = tomllib.load(f)["tool"]["setuptools"].get("package-dir", {})
    return {name: _ROOT / folder for name, folder in package_dir.items() if name and "." in name}


class PackageDir(griffe.Extension):
    """Attach each ``package-dir`` subpackage to its loaded parent package."""

    def on_package(self, *, pkg: griffe.Module, loader: griffe.GriffeLoader, **kwargs: Any) -> None:
        for name, folder in sorted(_mapping().items(), key=lambda item: item[0].count(".")):
            parent_path, _, child = name.rpartition(".")
            if parent_path.split(".")[0] != pkg.name:
                continue
            parent = pkg if parent_path == pkg.name else pkg.get_member(parent_path.split(".", 1)[1])
            if child in parent.members and parent.members[child].is_module:
                continue
            module = loader._load_module(child, folder / "__init__.py", submodules=True, parent=parent)
            parent.set_member(child, module)
            loader.expand_exports(module)
            loader.expand_wildcards(module, external=False)
