"""The layers hold: every import in the package points down (or within a layer), and no
module imports itself through others.

    facade      the package's root (``jaxrl_frag``: its public names; ``python -m jaxrl_frag``)
    app         app/: the command line, run directory, evaluation, plots, summaries, sweeps
    recipes     recipes/: algorithms written once
    sharding    sharding/: distribution policies, each with its executor
    transforms  transforms/: Algorithm -> Algorithm rewrites, transfer encodings
    envs        envs/: environment families with declared capabilities
    core        jaxrl_frag/: fragments, graph, tracing, algorithm base, primitives, program,
                policy seam, explain, checkpoints

A module's layer is its folder, as pyproject.toml maps folders to subpackages: no list of
modules is kept here. The import graph is read from the source with ``ast`` (imports
inside functions and under ``TYPE_CHECKING`` count too).
"""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "jaxrl_frag"
LAYERS = ("core", "envs", "transforms", "sharding", "recipes", "app", "facade")


def _modules() -> dict[str, Path]:
    """Every module of the package, by dotted name, from pyproject's packages and their
    package-dir mapping (a package it does not map lies in its parent's folder)."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    folders = dict(config["package-dir"])
    for package in sorted(config["packages"], key=lambda p: p.count(".")):
        if package not in folders:
            parent, _, leaf = package.rpartition(".")
            folders[package] = f"{folders[parent]}/{leaf}"
    found = {}
    for package, folder in folders.items():
        for path in sorted((ROOT / folder).glob("*.py")):
            name = package if path.stem == "__init__" else f"{package}.{path.stem}"
            found[name] = path
    return found


MODULES = _modules()


def _layer(module: str) -> str:
    """The layer of ``module``: the package's root is its facade; a module of a folder that
    pyproject maps to a subpackage (``jaxrl_frag.app``, ...) is of that folder's layer; the
    rest of the package's own folder is the core."""
    if module in (PACKAGE, f"{PACKAGE}.__main__"):
        return "facade"
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in LAYERS else "core"


def _imports(module: str, path: Path) -> set[str]:
    """The package's modules that ``module`` imports (``from jaxrl_frag import envs`` names the subpackage)."""
    out = set()
    package = module if path.stem == "__init__" else module.rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            out |= {f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base for alias in node.names}
    return {name for name in out if name in MODULES}


def _violations() -> list[str]:
    rank = {layer: i for i, layer in enumerate(LAYERS)}
    found = []
    for module, path in MODULES.items():
        for target in sorted(_imports(module, path)):
            if rank[_layer(target)] > rank[_layer(module)]:
                found.append(f"{module} ({_layer(module)}) imports {target} ({_layer(target)})")
    return found


def test_imports_point_down_the_layers() -> None:
    assert _violations() == []


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of ``graph`` with more than one module, or with one
    that imports itself (Tarjan's algorithm, iteratively), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, successors = work[-1]
            for target in successors:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(graph[target]))))
                    break
                if target in on_stack:
                    low[node] = min(low[node], index[target])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1 or node in graph[node]:
                        found.append(sorted(component))
    return found


def _graph() -> dict[str, set[str]]:
    return {module: _imports(module, path) for module, path in MODULES.items()}


def test_no_module_imports_itself_through_others() -> None:
    assert _cycles(_graph()) == []


def test_the_check_sees_a_cycle_through_a_function_level_import() -> None:
    """A core module importing, inside a function, one that imports it would be reported."""
    graph = _graph()
    graph["jaxrl_frag.metrics"] = graph["jaxrl_frag.metrics"] | {"jaxrl_frag.program"}
    assert any({"jaxrl_frag.metrics", "jaxrl_frag.program"} <= set(cycle) for cycle in _cycles(graph))
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"d"}, "e": {"a"}}) == [["a", "b", "c"], ["d"]]


def test_the_check_sees_an_upward_import(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A core module that imported a recipe would be reported (the check can fail)."""
    program = tmp_path / "program.py"
    program.write_text(MODULES["jaxrl_frag.program"].read_text() + "\nfrom jaxrl_frag.recipes import ppo\n")
    monkeypatch.setitem(MODULES, "jaxrl_frag.program", program)
    assert _violations() == ["jaxrl_frag.program (core) imports jaxrl_frag.recipes.ppo (recipes)"]


def test_every_subpackage_has_its_layer() -> None:
    """Each folder pyproject maps is a layer of its own, in ``LAYERS``' order (a new folder
    must be placed there), and every layer holds modules."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    folders = {name.split(".")[1] for name in config["package-dir"] if name.count(".") == 1}
    assert folders == set(LAYERS) - {"core", "facade"}
    assert {_layer(m) for m in MODULES} == set(LAYERS)
    assert _layer("jaxrl_frag.program") == "core" and _layer("jaxrl_frag.sharding.actor_learner") == "sharding"


def _names(path: Path) -> set[str]:
    return {n.id for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Name)} | {
        n.attr for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Attribute)}


def test_the_core_names_no_policy_and_only_envs_name_host_environments() -> None:
    from jaxrl_frag import sharding

    policies = {cls.__name__ for cls in sharding.POLICIES.values()} - {"SingleDevice"}  # the core's default
    assert policies == {"DataParallel", "PopulationParallel", "ActorLearner"}
    for module, path in MODULES.items():
        names = _names(path)
        if _layer(module) == "core":
            assert not names & policies, f"{module} names {names & policies}"
        if _layer(module) != "envs":
            assert "HostEnv" not in names, f"{module} names HostEnv"


# The one internal allowed, where it is used. jax.distributed exposes initialize and
# shutdown only; its runtime's key-value store (how one process stops every process,
# distributed.stop_everywhere) is reached as orbax-checkpoint and jax's own
# experimental.multihost_utils reach it: jax._src.distributed.global_state.client.
INTERNALS_ALLOWED = {"jaxrl_frag.distributed": {"jax._src.distributed", "jax._src.distributed.global_state"}}


def test_jax_internals_only_through_jax_extend() -> None:
    """No module imports ``jax._src`` (or its re-exports of internals): they change between
    jax versions. The one exception is named in ``INTERNALS_ALLOWED``."""
    for module, path in MODULES.items():
        imported = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and not node.level:
                imported |= {node.module or ""} | {f"{node.module}.{alias.name}" for alias in node.names}
        internal = {name for name in imported if name.startswith(("jax._src", "jax.interpreters", "jaxlib"))}
        internal -= INTERNALS_ALLOWED.get(module, set())
        assert not internal, f"{module} imports {sorted(internal)}"


def test_the_allowed_internal_still_has_what_is_used() -> None:
    """``distributed`` reads ``global_state.client`` and calls two of its methods: a jax
    that moves them fails here, not only in a run of several processes."""
    from jax._src import distributed
    from jax._src.lib import _jax

    assert "client" in type(distributed.global_state).__annotations__
    assert {"key_value_set", "blocking_key_value_get"} <= set(dir(_jax.DistributedRuntimeClient))


def _imported_at(path: Path) -> tuple[set[str], set[str]]:
    """The top-level package names that the module at ``path`` imports anywhere, and those
    it imports in its body (at import time)."""
    tree = ast.parse(path.read_text())

    def names(nodes: object) -> set[str]:
        out = set()
        for node in nodes:
            if isinstance(node, ast.Import):
                out |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                out.add(node.module.split(".")[0])
        return out

    return names(ast.walk(tree)), names(tree.body)


def test_only_the_ray_backend_names_ray_and_only_when_chosen() -> None:
    """Ray is an optional extra (``jaxrl_frag[ray]``): only the ``--env-backend ray`` pool
    (``envs.host_ray``) and the actor it sends to Ray's workers (``host_worker.Worker``,
    asking for its node there) import it, and only inside the functions that run once the
    backend is chosen; the core and every other layer never."""
    importing = {module for module, path in MODULES.items() if "ray" in _imported_at(path)[0]}
    assert importing == {f"{PACKAGE}.envs.host_ray", f"{PACKAGE}.envs.host_worker"}
    for module in importing:
        assert "ray" not in _imported_at(MODULES[module])[1], f"{module} imports ray when it is imported"
