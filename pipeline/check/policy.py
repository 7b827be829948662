"""The quality policy `pipe check` holds a dataset to: thresholds, and how much each check matters.

Read from a TOML file (`--policy policy.toml`) whose keys are top-level and named for what they
bound; validated against ``schemas/policy.schema.json``. An unknown key is a usage error (exit 2)
so that a typo cannot silently disable a check. Keys left out keep the defaults below, which are
also written in the schema.

    max_quarantined_fraction = 0.02
    min_samples_per_class = 50
    image_size = 384

    [severity]                 # error (exit 1 when violated) or warning (reported, exit 0)
    class_imbalance = "error"

The [severity] keys are the checks' names, and their defaults the checks' own
(`pipeline.check.registry`); any other key is a usage error too.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field, fields
from pathlib import Path

from pipeline.check import registry
from pipeline.check.result import ERROR
from pipeline.core.errors import UsageError


@dataclass(frozen=True)
class Policy:
    """Thresholds of `pipe check` (top-level keys of the --policy TOML file)."""

    max_quarantined_fraction: float = 0.05
    """Largest share of input files that may end quarantined (corrupt, undecodable, too small, ...)."""
    max_duplicate_fraction: float = 0.10
    """Largest share of input files that may be exact or near duplicates of another file."""
    min_samples_per_class: int = 10
    """Fewest samples a class may have (kept samples in a clean dir, train samples in a shard dir)."""
    max_class_imbalance: float = 10.0
    """Largest ratio between the biggest and the smallest class."""
    image_size: int | None = None
    """Exact side of every output image in pixels; unset: the size the folder declares
    (report.json settings.size for a clean dir, index.json image_size for a shard dir)."""
    image_mode: str = "RGB"
    """Pillow mode every output image must have."""
    classes: tuple[str, ...] | None = None
    """The exact class names expected (sorted or not); unset: whatever the data holds."""
    max_leaked_samples: int = 0
    """How many val samples may have an exact or near duplicate in train."""
    max_duplicate_samples: int = 0
    """How many kept samples (clean dir) or samples of one split (shard dir) may be an exact or
    near copy of another one there."""
    max_label_conflicts: int = 0
    """How many samples may be an exact or near copy of a sample under another label."""
    near_duplicate_phash_distance: int = 4
    """Two images whose 64-bit perceptual hashes differ in at most this many bits are the same picture."""
    near_duplicate_text_similarity: float = 0.8
    """Two texts whose estimated Jaccard similarity (MinHash of character 5-grams) is at least this are the same text."""
    severity: dict[str, str] = field(default_factory=registry.default_severity)
    """Check name -> error | warning: every check the registry holds, its default unless the file says."""

    def severity_of(self, check: str) -> str:
        return self.severity.get(check, ERROR)

    def as_dict(self) -> dict:
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d["classes"] = list(self.classes) if self.classes is not None else None
        return d


def load(path: Path | None) -> Policy:
    """The policy in ``path`` (defaults when None); any problem with the file is a UsageError."""
    if path is None:
        return Policy()
    from pipeline.core.config import tomllib
    from pipeline.core.schemas import load_schema, validate_or_usage_error

    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError:
        raise UsageError(f"policy file not found: {path}") from None
    except IsADirectoryError:
        raise UsageError(f"policy file {path} is a folder, not a TOML file") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise UsageError(f"policy file {path} is not valid TOML: {e}") from None
    _reject_unknown(data, set(load_schema("policy")["properties"]), path, "")
    _reject_unknown(data.get("severity", {}) if isinstance(data.get("severity"), dict) else {},
                    set(registry.names()), path, "[severity] ")
    validate_or_usage_error(data, "policy", what=f"policy file {path}")
    return from_dict(data)


def from_dict(data: dict) -> Policy:
    values = dict(data)
    values["severity"] = registry.default_severity() | dict(data.get("severity", {}))
    if values.get("classes") is not None:
        values["classes"] = tuple(values["classes"])
    return Policy(**values)


def _reject_unknown(data: dict, known: set[str], path: Path, where: str) -> None:
    for key in data:
        if key not in known:
            close = difflib.get_close_matches(key, sorted(known), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else f"; known keys: {', '.join(sorted(known))}"
            raise UsageError(f"policy file {path}: unknown {where}key {key!r}{hint}")
