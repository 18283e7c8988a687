"""Packages depend downwards only: every import (module level or inside a function, read
with ``ast``) goes from a module to one of the same or a lower layer. The layers, lowest
first (a module belongs to the longest prefix listed):

0 foundations: errors, registry, types, io, safe_read (bounded reads), limits (number
  ranges), interrupt (SIGTERM unwinds), lifecycle, callbacks (the user's hooks),
  usercode (running code the user named: workers, call contracts, process sweeps),
  schema (the config's typed sections, dtype names, secret masking, where keys moved,
  memory units)
1 pure pieces: algorithms, data, checkpoint
2 models, rewards' building blocks, logging
3 rollout (generation engines)
4 agent (the multi-turn loop over a rollout engine)
5 rewards (the reward computer, which also scores agent answers), planning (memory
  plans and the engine choice), config (loading and validation read every registry),
  diagnose (the run doctor's checks), model_card (what a checkpoint says about its run)
6 distributed, step (one training step: its stages, records, forwards, update)
7 trainer (the run around the step: build, fit, outputs, checkpoints, resume)
8 the user's commands: tools, rm, cli, commands, api, the package itself

Above the engines, the step and the trainer see the rollout through its interface only
(``danka.rollout`` and ``danka.rollout.base``): what the engines and the training forward
share (the prefix layout, the model inside its wrappers) lives below both, in
``danka.models``.
"""

from __future__ import annotations

from tests.test_import_graph import import_graph

LAYERS = {
    "danka.errors": 0,
    "danka.registry": 0,
    "danka.types": 0,
    "danka.io": 0,
    "danka.safe_read": 0,
    "danka.limits": 0,
    "danka.interrupt": 0,
    "danka.lifecycle": 0,
    "danka.callbacks": 0,
    "danka.schema": 0,
    "danka.algorithms": 1,
    "danka.data": 1,
    "danka.checkpoint": 1,
    "danka.usercode": 0,
    "danka.models": 2,
    "danka.logging": 2,
    "danka.rollout": 3,
    "danka.agent": 4,
    "danka.rewards": 5,
    "danka.planning": 5,
    "danka.config": 5,
    "danka.diagnose": 5,
    "danka.model_card": 5,
    "danka.distributed": 6,
    "danka.step": 6,
    "danka.trainer": 7,
    "danka.tools": 8,
    "danka.rm": 8,
    "danka.cli": 8,
    "danka.commands": 8,
    "danka.api": 8,
    "danka.__main__": 8,
    "danka": 8,
}


def layer_of(module: str) -> int:
    parts = module.split(".")
    for n in range(len(parts), 0, -1):
        prefix = ".".join(parts[:n])
        if prefix in LAYERS:
            return LAYERS[prefix]
    raise KeyError(f"{module} belongs to no layer: add its package to LAYERS")


def test_every_module_has_a_layer():
    for module in import_graph():
        layer_of(module)


def test_imports_go_downwards_only():
    upward = sorted(
        f"{a} (layer {layer_of(a)}) imports {b} (layer {layer_of(b)})"
        for a, targets in import_graph().items()
        for b in targets
        if layer_of(b) > layer_of(a) and b != "danka"
    )
    assert not upward, "\n".join(upward)


ROLLOUT_INTERFACE = {"danka.rollout", "danka.rollout.base"}


def test_the_trainer_reaches_the_rollout_through_its_interface_only():
    internal = sorted(
        f"{a} imports {b}"
        for a, targets in import_graph().items()
        if a.startswith(("danka.trainer", "danka.step"))
        for b in targets
        if b.startswith("danka.rollout.") and b not in ROLLOUT_INTERFACE
    )
    assert not internal, "\n".join(internal)
