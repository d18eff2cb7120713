"""Meshes, and the placement of a training state on one: the pieces the mesh policies share."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jaxrl_frag import primitives
from jaxrl_frag.errors import ConfigError, check
from jaxrl_frag.policy import BatchAxes, NamedAxes
from jaxrl_frag.primitives import Shared

PyTree = Any


def make_mesh(devices: Sequence[jax.Device] | None = None, **axes: int | None) -> Mesh:
    """A mesh over the first of ``devices`` (default: all global devices), one named
    axis per keyword: ``make_mesh(data=4)``, ``make_mesh(pop=2, data=2)``. One axis may
    be ``None``: it takes every device the others leave."""
    available = list(jax.devices() if devices is None else devices)
    for name, size in axes.items():
        check(size is None or size > 0, "devices", size, f"the {name!r} axis needs a positive device count")
    fixed = int(np.prod([s for s in axes.values() if s is not None], dtype=np.int64))
    sizes = {name: (len(available) // fixed if size is None else size) for name, size in axes.items()}
    count = int(np.prod(list(sizes.values()), dtype=np.int64))
    if count > len(available) or count == 0:
        raise ConfigError(
            "devices", count,
            f"only {len(available)} {available[0].platform} device(s) exist; ask for at most {len(available)} "
            "(on CPU the command line's --devices forces that many host devices)",
        )
    return Mesh(np.array(available[:count]).reshape(tuple(sizes.values())), tuple(sizes))


def device_groups(sizes: Sequence[int]) -> list[list[jax.Device]]:
    """Disjoint groups of devices, group ``i`` taking ``sizes[i]`` devices of every process:
    in each process (in process order) its next ``sizes[i]`` devices. Within one process the
    groups are its devices in order; across processes every group holds the same share of
    each process, so data split along any group's devices in order puts the same rows on
    the same process in every group (``move``)."""
    by_process: dict[int, list[jax.Device]] = {}
    for device in sorted(jax.devices(), key=lambda d: (d.process_index, d.id)):
        by_process.setdefault(device.process_index, []).append(device)
    starts = np.cumsum([0, *sizes])
    return [[d for devices in by_process.values() for d in devices[start:end]]
            for start, end in itertools.pairwise(starts)]


def move(values: PyTree, targets: PyTree) -> PyTree:
    """``jax.device_put(values, targets)`` from one of ``device_groups`` to another. Within one
    process, device-to-device copies; across processes, each process copies its own share
    between its own devices (the same rows on both sides, by ``device_groups``' layout),
    and nothing moves between processes."""
    if jax.process_count() == 1:
        return jax.device_put(values, targets)
    return jax.tree.map(_move_own_share, values, targets)


def _move_own_share(value: jax.Array, target: NamedSharding) -> jax.Array:
    source = value.sharding
    local_source = NamedSharding(source.mesh.local_mesh, source.spec)
    local_target = NamedSharding(target.mesh.local_mesh, target.spec)
    shape = list(source.shard_shape(value.shape))
    for dim, names in enumerate(source.spec):
        for name in (names,) if isinstance(names, str) else (names or ()):
            shape[dim] *= source.mesh.local_mesh.shape[name]
    own = jax.make_array_from_single_device_arrays(tuple(shape), local_source,
                                                   [s.data for s in value.addressable_shards])
    moved = jax.device_put(own, local_target)
    return jax.make_array_from_single_device_arrays(value.shape, target, [s.data for s in moved.addressable_shards])


def set_up_mesh(policy: Any, axes: dict[str, int | None]) -> None:
    """Check a mesh policy's ``shuffle``, build its mesh from ``axes`` unless one was
    given, and check that the mesh has those axes."""
    check(policy.shuffle in primitives.SHUFFLES, "shuffle", policy.shuffle,
          f"choose one of {', '.join(primitives.SHUFFLES)}")
    if policy.mesh is None:
        object.__setattr__(policy, "mesh", make_mesh(**axes))
    check(set(axes) <= set(policy.mesh.axis_names), "mesh", policy.mesh.axis_names,
          f"this policy needs mesh axes {', '.join(map(repr, axes))}")


def check_runs(policy: Any, algorithm: Any) -> None:
    """``ConfigError`` where ``policy`` declares it does not run populations and
    ``algorithm`` is one (it declares ``population``), or the reverse (``sharding.runs``)."""
    populations = getattr(policy, "populations", "allowed")
    population = bool(getattr(algorithm, "population", False))
    check(populations != "refused" or not population, "policy", policy.name,
          "runs one algorithm and does not run populations (on the command line: --seeds, --sweep): use a policy "
          "that does (SingleDevice, PopulationParallel: --policy single or population), or train one algorithm")
    check(populations != "required" or population, "policy", policy.name,
          "places a population's members, and this algorithm is not a population: make one "
          "(transforms.Population.of; on the command line --seeds N or --sweep), or use SingleDevice or "
          "DataParallel (--policy single or data-parallel)")


def split_state(state: PyTree, batch_axes: BatchAxes, mesh: Mesh, data_axis: str,
                 member_axis: str | None = None, named_axes: NamedAxes | None = None,
                 settings: Mapping[str, str] | None = None) -> PyTree:
    """Shardings for ``state``: each environment-batched field split along ``data_axis``
    on its batch axis (``Shared`` nodes and leaves without that axis excepted); with
    ``member_axis``, every leaf's leading (member) axis split along it too, and the other
    axes counted after it; each of ``named_axes`` (``Algorithm.named_axes``) that names an
    axis of ``mesh`` split along that mesh axis in its fields' leaves that carry it.
    ``settings`` names the policy setting that sizes a mesh axis, for the messages
    (``devices`` where it names none)."""
    lead = 0 if member_axis is None else 1
    _check_declared(_fields(state), batch_axes, lead)
    named = {name: fields for name, fields in (named_axes or {}).items() if name in mesh.axis_names}
    for name, fields in named.items():
        for field in set(fields) & set(batch_axes):
            check(fields[field] != batch_axes[field] and name != data_axis, f"named_axes[{name!r}]", dict(fields),
                  f"puts axis {name!r} of state field {field!r} where its environment batch is: name another axis")

    def spec(ndim: int, axes: dict[int, str]) -> NamedSharding:
        parts: list[str | None] = [None] * ndim
        if member_axis is not None:
            parts[0] = member_axis
        for axis, mesh_axis in axes.items():
            parts[axis + lead] = mesh_axis
        return NamedSharding(mesh, PartitionSpec(*parts))

    def check_divides(field: str, size: int, axis_name: str, what: str) -> None:
        count = mesh.shape[axis_name]
        if size % count:
            raise ConfigError(
                (settings or {}).get(axis_name, "devices"), count,
                f"the {what} of {size} (state field {field!r}) does not divide across {count} devices; "
                f"use a device count that divides it, or a multiple of {count}",
            )

    def field_shardings(field: str, subtree: PyTree) -> PyTree:
        wanted = {name: fields[field] for name, fields in named.items() if field in fields}
        if field in batch_axes:
            wanted[data_axis] = batch_axes[field]

        def place(node: Any) -> Any:
            if isinstance(node, Shared):
                return jax.tree.map(lambda x: spec(len(x.shape), {}), node)
            if member_axis is not None:
                check_divides(field, node.shape[0], member_axis, "population")
            split = {axis: name for name, axis in wanted.items() if len(node.shape) > axis + lead}  # counters stay whole
            for axis, name in split.items():
                check_divides(field, node.shape[axis + lead], name,
                              "environment batch" if name == data_axis else f"{name!r} axis")
            return spec(len(node.shape), split)

        return jax.tree.map(place, subtree, is_leaf=lambda n: isinstance(n, Shared))

    return _map_fields(field_shardings, state)


def _check_declared(fields: dict[str, PyTree], batch_axes: BatchAxes, lead: int) -> None:
    """Raise ``ConfigError`` for a field that no fragment declares batched but whose every
    array (random keys and ``Shared`` nodes aside) leads with the environment batch:
    split along it everywhere else, it would be kept whole on every device."""

    def arrays(subtree: PyTree) -> list[Any]:
        leaves = jax.tree.leaves(subtree, is_leaf=lambda n: isinstance(n, Shared))
        return [x for x in leaves if not isinstance(x, Shared)]

    sizes = {x.shape[axis + lead] for name, axis in batch_axes.items() for x in arrays(fields.get(name))
             if len(x.shape) > axis + lead}
    if len(sizes) != 1:
        return
    (size,) = sizes
    for name, subtree in fields.items():
        found = arrays(subtree)
        if name not in batch_axes and found and all(
                len(x.shape) > lead and x.shape[lead] == size and not _is_key(x) for x in found):
            raise ConfigError(
                f"state.{name}", ", ".join(f"{np.dtype(x.dtype).name}{list(x.shape)}" for x in found[:3]),
                f"leads with the environment batch ({size}) but no fragment declares it batched, so this policy "
                f"would keep it whole on every device while it splits the environments: declare it in the batched= "
                f"of the fragments that read and write it (e.g. batched={{{name!r}: 0}}), or, if it is meant to be "
                f"whole on every device, hold it in a primitives.Shared node")


def _is_key(x: Any) -> bool:
    """A random key, typed or raw (``uint32[..., 2]``)."""
    return jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key) or (x.dtype == np.uint32 and x.shape[-1:] == (2,))


def _fields(state: PyTree) -> dict[str, PyTree]:
    """The top-level fields of a dataclass or dict state (``""``: a state of one field)."""
    if isinstance(state, Mapping):
        return {str(k): v for k, v in state.items()}
    if dataclasses.is_dataclass(state):
        return {f.name: getattr(state, f.name) for f in dataclasses.fields(state)}
    return {"": state}


def _map_fields(fn: Callable[[str, PyTree], PyTree], state: PyTree) -> PyTree:
    """Apply ``fn(field name, subtree)`` to each top-level field of a dataclass or dict state."""
    fields = {name: fn(name, subtree) for name, subtree in _fields(state).items()}
    if isinstance(state, Mapping):
        return type(state)(zip(state.keys(), fields.values(), strict=True))
    if dataclasses.is_dataclass(state):
        return dataclasses.replace(state, **fields)
    return fields[""]
