"""Every name the command line offers is read from its registry: the choices of every flag of
every command are a registry's names, and the help of each flag that takes a name lists every
name of its registry (a list copied into a help text falls behind the registry that grows)."""

from __future__ import annotations

import argparse
import typing

import pytest

from psgdlab.cli import build_parser
from psgdlab.core.algorithms import ALGORITHMS
from psgdlab.core.convergence import OBJECTIVES
from psgdlab.core.graphs.topology import INNER_KINDS, KINDS
from psgdlab.core.platform.failure import ON_FAILURE
from psgdlab.core.platform.workloads import BY_MODEL, WORKLOADS
from psgdlab.core.schedules import LR_SCHEDULES
from psgdlab.models.recipes import MODEL_RECIPES
from psgdlab.runtime.transports.backends import BACKENDS, cpu_backends
from psgdlab.validate.convergence_plan import SCALES
from psgdlab.validate.plan import ALGORITHM_CASES

#: every registry whose names a flag may offer as choices
REGISTRIES = {
    "lr schedules": tuple(LR_SCHEDULES),
    "backends": tuple(BACKENDS),
    "backends without a GPU": cpu_backends(),
    "failure policies": tuple(ON_FAILURE),
    "inner rings": INNER_KINDS,
    "plan objectives": tuple(OBJECTIVES),
    "convergence scales' sources": SCALES,
}


def _commands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


COMMANDS = _commands()


def _action(command: str, flag: str) -> argparse.Action:
    parser = COMMANDS[command]
    return next(a for a in parser._actions if flag in a.option_strings or a.dest == flag)


def test_every_choices_is_a_registry():
    copied = [
        f"{name} {'/'.join(a.option_strings) or a.dest}: {tuple(a.choices)}"
        for name, parser in COMMANDS.items()
        for a in parser._actions
        if a.choices is not None
        and not isinstance(a, argparse._SubParsersAction)  # a command's subcommands: its parsers themselves
        and tuple(a.choices) not in REGISTRIES.values()
    ]
    assert not copied, "choices that are no registry's names:\n" + "\n".join(copied)


def _variants() -> tuple[str, ...]:
    return tuple(v for cls in ALGORITHMS.values() for v in cls.variants)


#: (command, flag, names its help must list)
HELPS = [
    *((c, "--algorithm", tuple(ALGORITHMS)) for c in ("predict", "emulate", "train")),
    *((c, "--variant", _variants()) for c in ("predict", "emulate", "train")),
    *((c, "--lr-schedule", tuple(LR_SCHEDULES)) for c in ("emulate", "train")),
    *((c, "--on-failure", tuple(ON_FAILURE)) for c in ("predict", "train")),
    ("train", "--backend", tuple(BACKENDS)),
    ("train", "--model", tuple(MODEL_RECIPES)),
    ("emulate", "--model", tuple(MODEL_RECIPES)),
    ("predict", "--workload", (*WORKLOADS, *BY_MODEL)),
    ("topology", "kind", KINDS),
    ("validate", "--algorithm", tuple(dict.fromkeys(a for a, _ in ALGORITHM_CASES.values()))),
]


@pytest.mark.parametrize("command, flag, names", HELPS, ids=[f"{c} {f}" for c, f, _ in HELPS])
def test_the_help_of_a_flag_that_takes_a_name_lists_its_registry(command, flag, names):
    text = " ".join((_action(command, flag).help or "").split())
    missing = [n for n in names if n not in text]
    assert not missing, f"psgdlab {command} {flag}'s help leaves out {missing}: {text}"


def test_the_plan_objective_type_is_the_registry():
    from psgdlab.sim.plan import Objective

    assert typing.get_args(Objective) == tuple(OBJECTIVES)


def test_train_refuses_a_schedule_it_cannot_run_and_names_the_ones_it_can(tmp_path):
    from psgdlab.core.errors import ConfigError
    from psgdlab.runtime.config import TrainConfig

    refused = [n for n, s in LR_SCHEDULES.items() if s.follows_heldout]
    assert refused
    for name in refused:
        with pytest.raises(ConfigError) as info:
            TrainConfig(lr_schedule=name, steps=1, out=str(tmp_path))
        hint = str(info.value).split("use ", 1)[1]
        assert all(n in hint for n in LR_SCHEDULES if n not in refused) and name in hint  # "psgdlab emulate runs it"
