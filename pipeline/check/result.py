"""What one check reports: its name, how much it matters, whether the data passed, and why.

A check is a small function that looks at a loaded dataset folder and returns a `CheckResult`
(datatrove style: keep, or a reason). `severity` comes from the policy: a failed ``error`` makes
`pipe check` exit 1, a failed ``warning`` is reported and allowed. A check that could not run
(its input is missing, or it needs ``--deep``) is *skipped*, never counted as passed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

ERROR = "error"
WARNING = "warning"
SEVERITIES = (ERROR, WARNING)

PASS, FAIL, SKIP = "pass", "fail", "skip"
MAX_EXAMPLES = 10  # offending items listed per check; the counts are always complete


@dataclass
class CheckResult:
    name: str
    """Stable identifier, e.g. ``quarantined_fraction``; also the key in the policy's [severity]."""
    status: str
    """pass | fail | skip."""
    message: str
    """One human sentence: what was found (with the first offender when there is one)."""
    numbers: dict[str, Any] = field(default_factory=dict)
    """What was measured and the limit it was held to, for machines (JSON, JUnit properties)."""
    examples: list[str] = field(default_factory=list)
    """Up to MAX_EXAMPLES offending items (paths, keys, pairs)."""
    severity: str = ERROR
    """error | warning, set from the policy when the check is run."""
    seconds: float = 0.0

    @property
    def passed(self) -> bool:
        """False only for a violation; a skipped check is not a violation (but not a pass either)."""
        return self.status != FAIL

    @property
    def blocking(self) -> bool:
        return self.status == FAIL and self.severity == ERROR

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name, "severity": self.severity, "status": self.status, "passed": self.passed,
            "message": self.message, "numbers": self.numbers, "examples": self.examples,
            "seconds": round(self.seconds, 4),
        }


def ok(name: str, message: str, **numbers) -> CheckResult:
    return CheckResult(name, PASS, message, numbers)


def fail(name: str, message: str, examples: list[str] | None = None, **numbers) -> CheckResult:
    return CheckResult(name, FAIL, message, numbers, list(examples or [])[:MAX_EXAMPLES])


def skip(name: str, message: str, **numbers) -> CheckResult:
    return CheckResult(name, SKIP, message, numbers)


def verdict(name: str, offenders: list[str], total: int, what: str, good: str, **numbers) -> CheckResult:
    """Pass when ``offenders`` is empty; else fail naming how many of ``total`` and the first one."""
    if not offenders:
        return ok(name, good, checked=total, **numbers)
    return fail(name, f"{len(offenders)} of {total} {what}: {offenders[0]}", offenders,
                checked=total, violations=len(offenders), **numbers)


def at_most(name: str, offenders: list[str], limit: int, total: int, what: str, good: str, **numbers) -> CheckResult:
    """Pass while ``offenders`` are at most the policy's ``limit`` (listed as examples all the same);
    else fail naming how many of ``total`` and the first one."""
    nums = dict(samples=total, found=len(offenders), limit=limit, **numbers)
    if len(offenders) > limit:
        return fail(name, f"{len(offenders)} of {total} {what}: {offenders[0]}", offenders, **nums)
    result = ok(name, f"{len(offenders)} of {total} {good} (limit {limit})", **nums)
    result.examples = offenders[:MAX_EXAMPLES]
    return result
