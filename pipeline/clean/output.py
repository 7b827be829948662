"""CLEAN_DIR, wherever it is (`pipeline.storage.Folder`): claimed before a run, resumed from the
parts an earlier run finished, and changed by finalizing, all through the folder's methods.

What is in the folder is asked through `Folder.sizes` (a local folder answers from the file
system file by file; object storage is listed once and kept up to date), so finalizing costs a
system call per file here and no request per file there.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from pipeline import __version__
from pipeline.clean.config import CleanConfig
from pipeline.clean.discover import Candidate
from pipeline.clean.records import FileResult
from pipeline.core.errors import UsageError
from pipeline.core.files import STATE_DIR
from pipeline.executors.parts import PARTS_DIR
from pipeline.formats.vocabulary import Kind, Reason
from pipeline.storage import Folder, open_folder
from pipeline.storage import output as outputs
from pipeline.storage.folder import Sizes

TOOL = "pipe clean"
COMMIT = "manifest.parquet"
OWNED = ("data", "quarantine", COMMIT, "report.json", STATE_DIR)
# Outputs of files that did not end kept (duplicates) wait here, so a re-run where they become
# kept (their better copy was removed) need not decode them again.
PARKED = f"{STATE_DIR}/parked"
# the outputs the folder prior wrote in the last run, with their sizes (`pipeline.clean.prior`)
PRIOR = f"{STATE_DIR}/prior.json"


def marker(cfg: CleanConfig) -> dict:
    """What `.pipe/state.json` says about a CLEAN_DIR this run writes."""
    return {"schema_version": 1, "tool": TOOL, "version": __version__, "input": open_folder(cfg.input).identity(),
            "settings": cfg.fingerprint()}


def differs(cfg: CleanConfig, state: dict) -> str | None:
    """How a CLEAN_DIR begun by another run differs from this one, as the rest of a sentence (None: it does not)."""
    want = marker(cfg)
    if state.get("input") != want["input"]:
        return f"was cleaned from {state.get('input')}, not {want['input']}; pass --overwrite to replace it"
    old = state.get("settings")
    old = old if isinstance(old, dict) else {}
    if old != want["settings"]:
        changed = ", ".join(f"--{k.replace('_', '-')} {old.get(k)} -> {v}" for k, v in want["settings"].items() if old.get(k) != v)
        return f"was made with other settings ({changed}); pass --overwrite to redo it"
    return None


def reusable_result(old: FileResult | None, c: Candidate) -> bool:
    """What a part result must be to stand for ``c`` again, files aside."""
    if old is None or c.problem or old.key != c.key or old.kind != c.kind or old.reason == Reason.TIMEOUT:
        return False
    # an image written by a pipe that did not measure its outputs is redone, so the manifest has the sums
    return not (old.output and old.kind == Kind.IMAGE and old.pixel_sums is None)


class CleanDir:
    """CLEAN_DIR as one run sees it: its folder (``out``), the INPUT folder (``inp``) and the
    local folder where the manifest is made before it is committed (``staging``)."""

    def __init__(self, cfg: CleanConfig, out: Folder, inp: Folder, staging: Path):
        self.cfg, self.out, self.inp, self.staging = cfg, out, inp, staging
        self._sizes: Sizes | None = None
        self._stamps: Callable[[str], tuple[int, int, int] | None] | None = None
        self._prior: dict[str, int] | None = None

    def __str__(self) -> str:
        return self.out.url

    # ---------------------------------------------------------------- before the run

    @staticmethod
    def claim(cfg: CleanConfig, out: Folder) -> None:
        """Take the folder for this run (it holds the lock, where there is one): refuse a
        foreign one, clear ours with --overwrite, refuse one of other input or settings; then
        the marker, leftovers of a killed run gone, and no manifest until this run is complete."""
        outputs.claim(out, TOOL, COMMIT, cfg.overwrite, lambda state: differs(cfg, state), OWNED)
        try:
            outputs.write_marker(out, marker(cfg))
            out.clear_temporaries()
            out.delete(COMMIT)
        except OSError as e:
            raise UsageError(f"cannot write to the output folder {out.url}: {e.strerror or e}") from None

    def fresh(self) -> bool:
        """No part of an earlier run is here: everything will be processed."""
        return not self.out.child(PARTS_DIR).list()

    # ---------------------------------------------------------------- resuming

    def reusable(self, old: FileResult | None, c: Candidate) -> bool:
        """A recorded result still stands for ``c``: the input has the size and times it had then,
        and its output is here with its size (in data/, or parked)."""
        if old is None or not reusable_result(old, c) or not old.mtime_ns:
            return False
        if self._stamps is None:
            self._stamps = self.inp.stamps()
        if not _same_stamp(self._stamps(c.path), (old.bytes, old.mtime_ns, old.ctime_ns)):
            return False
        if old.output:
            sizes = self.sizes()
            here = (sizes.get(old.output), sizes.get(f"{PARKED}/{old.output}"))
            # an output the folder prior wrote is its reading's size: the prior writes it again either way
            return old.output_bytes in here or self.prior_wrote().get(old.output) in here
        return True

    def forget_prior(self) -> None:
        self._prior = None

    def prior_wrote(self) -> dict[str, int]:
        """The outputs the folder prior wrote in the last run, with their sizes (`PRIOR`; {}: none)."""
        if self._prior is None:
            import json

            try:
                got = json.loads(self.out.read(PRIOR))
                self._prior = {k: v for k, v in got["outputs"].items() if isinstance(k, str) and isinstance(v, int)}
            except (OSError, ValueError, KeyError, TypeError, AttributeError):
                self._prior = {}
        return self._prior

    def sizes(self) -> Sizes:
        if self._sizes is None:
            self._sizes = self.out.sizes()
        return self._sizes

    # ---------------------------------------------------------------- deciding and finalizing

    def outputs(self):
        """decide's reader of the cleaned outputs (the parts have written since the reuse check looked)."""
        from pipeline.clean.decide import Outputs

        self._sizes = None
        return Outputs(self.out, PARKED, self.cfg.resize_mode)

    def manifest_path(self) -> Path:
        return self.staging / COMMIT

    def write_if_changed(self, rel: str, data: bytes) -> None:
        sizes = self.sizes()
        if sizes.get(rel) == len(data) and self.out.read(rel) == data:
            return
        self.out.write(rel, data)
        sizes.changed(rel, len(data))

    def move(self, src: str, dest: str) -> None:
        """``src`` to ``dest`` if it is there (it is not when a rerun finds it moved already)."""
        sizes = self.sizes()
        size = sizes.get(src)
        if size is None:
            return
        self.out.move(src, dest)
        sizes.changed(src, None)
        sizes.changed(dest, size)

    def has(self, rel: str, size: int) -> bool:
        return self.sizes().get(rel) == size

    def copy_input(self, source: str, rel: str) -> None:
        """A rejected input copied to quarantine/ (streamed: it may be huge). FileNotFoundError:
        gone since, or a name that is not UTF-8."""
        self.sizes().changed(rel, self.out.copy_in(self.inp, source, rel))

    def link_input(self, source: str, rel: str) -> bool:
        """A rejected input put in quarantine/ without copying its bytes (a hard link), where the
        storage can; False where it cannot. FileNotFoundError: gone since."""
        size = self.out.link_in(self.inp, source, rel)
        if size is None:
            return False
        self.sizes().changed(rel, size)
        return True

    def sweep(self, folder: str, keep: set[str]) -> None:
        self.out.sweep(folder, keep)
        self._sizes = None

    def finish(self, report_text: str, writer) -> None:
        """report.json, then manifest.parquet last, only if no other run committed first."""
        self.out.write("report.json", report_text.encode("utf-8"))
        writer.close()
        outputs.commit(self.out, COMMIT, self.manifest_path(), scratch=(PARTS_DIR, PARKED))

    def committed_elsewhere(self) -> bool:
        """Whether another run committed this output while this one worked (this run removed the
        manifest when it began; where runs cannot lock, another may have written it since)."""
        return not self.out.exclusive and self.out.exists(COMMIT)


_SECOND = 1_000_000_000


def _same_stamp(now: tuple[int, int, int] | None, then: tuple[int, int, int]) -> bool:
    """The input is as it was. Object storage (ctime 0) has whole-second times in two formats, a
    listing's and an object's header, and some servers round one and truncate the other (rclone):
    there a second apart is the same time."""
    if now is None or now[0] != then[0] or now[2] != then[2]:
        return False
    return now[1] == then[1] or (now[2] == 0 and abs(now[1] - then[1]) <= _SECOND)
