"""Every check of `pipe check`, declared once, where it is written (cleanlab's registered checks):

    @check("shard")
    def check_leakage(d: ShardDir, p: Policy) -> CheckResult:
        \"\"\"at most max_leaked_samples val samples have an exact or near duplicate in train.\"\"\"

registers ``leakage`` (the function's name without ``check_``) as a check of shard dirs, with its
default severity (``severity=``; error unless said) and its description (the docstring's first
paragraph). A name both folder kinds have (``schema``) is one policy key for both.

Read by: the stage (`checks`: a kind's checks, in the order they are written), the policy (`names`
and `default_severity`: the [severity] keys that exist; any other is a usage error) and the
policy's schema (`severity_schema`: the documented [severity] table, kept equal by a test).

`KINDS` names the module that holds each kind's checks; it is imported when the registry is
read, so no reader depends on someone having imported the checks first.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from pipeline.check.result import ERROR, SEVERITIES, WARNING, CheckResult

KINDS = {"clean": "pipeline.check.clean_dir", "shard": "pipeline.check.shard_dir"}
"""Each folder kind pipe check judges, and the module whose @check functions are its checks."""

PREFIX = "check_"

Fn = TypeVar("Fn", bound=Callable[..., CheckResult])


@dataclass(frozen=True)
class Check:
    kind: str
    """clean | shard: the folder it reads."""
    name: str
    """Its result's name and its key in the policy's [severity] table."""
    severity: str
    """error | warning, unless the policy says otherwise."""
    description: str
    """What it holds the folder to, in a sentence or two (the docstring's first paragraph)."""
    run: Callable[[Any, Any], CheckResult]
    """(loaded folder, policy) -> CheckResult."""


_REGISTERED: dict[str, dict[str, Check]] = {kind: {} for kind in KINDS}


def check(kind: str, *, severity: str = ERROR) -> Callable[[Fn], Fn]:
    """Register the decorated ``check_NAME(folder, policy)`` as check NAME of folder ``kind``."""
    if kind not in KINDS:
        raise ValueError(f"no folder kind {kind!r}: {', '.join(KINDS)}")
    if severity not in SEVERITIES:
        raise ValueError(f"severity {severity!r} is none of {', '.join(SEVERITIES)}")

    def register(fn: Fn) -> Fn:
        if not fn.__name__.startswith(PREFIX) or not fn.__doc__:
            raise ValueError(f"{fn.__name__}: a check is a function check_NAME with a docstring that describes it")
        name = fn.__name__.removeprefix(PREFIX)
        about = " ".join(fn.__doc__.strip().split("\n\n")[0].split())
        _REGISTERED[kind][name] = Check(kind, name, severity, about, fn)
        return fn

    return register


def checks(kind: str) -> list[Check]:
    """The checks of folder ``kind``, in the order they are written (and reported)."""
    _import_all()
    return list(_REGISTERED[kind].values())


def names() -> list[str]:
    """Every check name, each kind's order kept (a name both kinds have is one entry): clean's
    checks first where the two orders leave a choice."""
    first, second = (names_of(kind) for kind in KINDS)
    out: list[str] = []
    while first or second:
        if first and (first[0] not in second or (second and second[0] == first[0])):
            out.append(first.pop(0))
            if out[-1] in second:
                second.remove(out[-1])
        elif second and second[0] not in first:
            out.append(second.pop(0))
        else:
            raise ValueError(f"the kinds order the checks {first[0]} and {second[0]} differently")
    return out


def names_of(kind: str) -> list[str]:
    return [c.name for c in checks(kind)]


def default_severity() -> dict[str, str]:
    """Check name -> its severity when the policy does not set one."""
    found: dict[str, str] = {}
    for c in (c for kind in KINDS for c in checks(kind)):
        if found.setdefault(c.name, c.severity) != c.severity:
            raise ValueError(f"check {c.name} is declared {found[c.name]} for one kind and {c.severity} for another")
    return {name: found[name] for name in names()}


def description(name: str) -> str:
    """What check ``name`` holds each kind of folder to, as the policy's schema documents it: one
    sentence when every kind says the same, else each kind's after its name."""
    said = [(kind, c.description) for kind in KINDS for c in checks(kind) if c.name == name]
    if len(said) > 1 and len({text for _, text in said}) == 1:
        text = said[0][1]
    else:
        text = " ".join(f"{kind.capitalize()} dir: {about}" for kind, about in said)
    return text + (" A warning unless set to error." if default_severity()[name] == WARNING else "")


def severity_schema() -> dict:
    """The [severity] table of schemas/policy.schema.json, every check with its default and description."""
    defaults = default_severity()
    warnings = [name for name, sev in defaults.items() if sev == WARNING]
    return {
        "type": "object",
        "additionalProperties": False,
        "description": 'Check name -> "error" (a violation makes pipe check exit 1) or "warning" (reported, exit 0). '
                       f"Default: every check is an error{' except ' + ', '.join(warnings) if warnings else ''}.",
        "properties": {name: {"enum": list(SEVERITIES), "description": description(name), "default": sev}
                       for name, sev in defaults.items()},
    }


def _import_all() -> None:
    for module in KINDS.values():
        importlib.import_module(module)
