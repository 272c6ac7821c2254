"""Every front door of the explanation service, and the one table of them.

A door is a protocol adapter over the door-neutral serving core (:mod:`serving_core`: the task contract, the
services, the error table): it decodes its protocol into the task's rows, calls the model's service and encodes the
outcomes. Nothing about the maths, validation or errors lives in a door.

- :mod:`doors.launch`: the one launcher (``python -m doors serve|start|stop|package``, what ``make serve|start|stop``
  and ``explain-serve`` run): resolves the models (:mod:`doors.models`) and starts whichever door :data:`DOORS` names;
- :mod:`doors.explain_serve`: the ``explain-serve`` console script (checkpoint folders, any working directory);
- :mod:`doors.torchserve`: TorchServe (its handler entry points, the metrics exporter, the router and its OpenAI door);
- :mod:`doors.kserve`: KServe's model server (OIP v2 with the explain extension, KServe v1, the OpenAI routes) and Ray
  Serve replicas behind it.

This module imports nothing but the standard library: the Makefile reads :data:`DOORS` with the system's Python
before any virtualenv exists (``python3 -m doors make-goal SERVER``).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Door:
    """One front door.

    Attributes:
        name: what ``--server`` / ``make serve SERVER=`` / ``explain-serve --server`` call it.
        summary: one line for ``--help`` and the docs.
        module: the door's launch module: ``serve(options, models, example) -> int`` runs it in the foreground and
            ``stop(run_dir) -> bool`` stops one started from ``run_dir`` (:class:`doors.launch.LaunchOptions`).
        extras: the door needs the ``kserve``/``ray`` extras (``make extras``) beside the base install.
    """

    name: str
    summary: str
    module: str
    extras: bool


#: The doors, by name; the first is the default. The launcher, ``explain-serve``, the Makefile's ``SERVER=`` and the
#: docs' table (docs/SERVING.md, "Doors") read this one table.
DOORS: dict[str, Door] = {
    door.name: door
    for door in (
        Door(
            "torchserve",
            "TorchServe: REST and gRPC, dynamic batching, token auth, explanation pools, the OpenAI API for causal LMs",
            "doors.torchserve.launch",
            extras=False,
        ),
        Door(
            "kserve",
            "KServe's model server: OIP v2 REST and gRPC with the explain extension, KServe v1, the OpenAI API",
            "doors.kserve.launch",
            extras=True,
        ),
        Door(
            "ray",
            "Ray Serve replicas behind the KServe door (a local Ray, or RAY_ADDRESS)",
            "doors.kserve.launch",
            extras=True,
        ),
    )
}
DEFAULT_DOOR = next(iter(DOORS))


def get_door(name: str) -> Door:
    """The door called ``name``.

    Raises:
        ValueError: naming the doors, if ``name`` is not one.
    """
    if name not in DOORS:
        raise ValueError(f"unknown door {name!r}; doors: {', '.join(DOORS)}")
    return DOORS[name]


def make_goal(name: str) -> str:
    """The Makefile goal ``make serve SERVER=name`` depends on: ``extras`` for a door that needs the extras, else
    ``setup`` (an unknown name gets ``setup``: the launcher then refuses it, naming the doors)."""
    door = DOORS.get(name)
    return "extras" if door is not None and door.extras else "setup"
