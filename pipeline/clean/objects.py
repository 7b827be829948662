"""CLEAN_DIR on object storage written in place by `pipe clean --executor ray`: the Ray tasks
put each part's outputs and then its results file straight into the bucket; the driver reads what
it needs from there, and `ObjectCleanDir` is what `stage.run_in_parts` decides and finalizes on,
the object-storage counterpart of `stage.LocalCleanDir`."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from pipeline.clean.columns import OutputRef
from pipeline.clean.decide import Outputs
from pipeline.clean.discover import Candidate
from pipeline.clean.records import FileResult
from pipeline.clean.remote import COMMIT, copy_input
from pipeline.core.errors import StageFailed
from pipeline.core.files import atomic_write_bytes
from pipeline.storage import Folder, is_remote, open_folder
from pipeline.storage.transfer import parallel


class ObjectCleanDir:
    """CLEAN_DIR on object storage, as `stage.run_in_parts` reads and changes it: what a local
    CLEAN_DIR's `stage.LocalCleanDir` does with files, done with objects. What is there is listed
    once (for reuse, and again for finalizing) instead of asked object by object; only the
    manifest passes through the driver's disk (``staging``) before its conditional write, and
    the few outputs near-duplicate confirmation compares."""

    def __init__(self, cfg, folder: Folder, staging: Path):
        self.cfg, self.folder, self.staging = cfg, folder, staging
        self._inputs: dict[str, tuple[int, int]] | None = None
        self._present: dict[str, int] | None = None  # rel -> size, listed when first needed

    def __str__(self) -> str:
        return self.folder.url

    def present(self) -> dict[str, int]:
        if self._present is None:
            self._present = {e.rel: e.size for e in self.folder.list()}
        return self._present

    def reusable(self, old: FileResult | None, c: Candidate) -> bool:
        """A part result still stands for ``c``: the input is unchanged (an object: its size and
        Last-Modified as the listing gives them; a local file: size and times) and its output is
        there with its size, in data/ or parked."""
        from pipeline.clean.stage import PARKED, input_unchanged, reusable_result

        if old is None or not reusable_result(old, c):
            return False
        if is_remote(self.cfg.input):
            if self._inputs is None:
                self._inputs = {e.rel: (e.size, e.mtime_ns) for e in open_folder(str(self.cfg.input)).list()}
            if self._inputs.get(c.source) != (old.bytes, old.mtime_ns) or not old.mtime_ns:
                return False
        elif not input_unchanged(old, c):
            return False
        if old.output:
            present = self.present()
            if old.output_bytes not in (present.get(old.output), present.get(f"{PARKED}/{old.output}")):
                return False
        return True

    def outputs(self) -> Outputs:
        self._present = None  # the parts have written since the reuse check listed: list again when finalizing
        return _ObjectOutputs(self.folder, self.staging / "outputs", self.cfg.resize_mode)

    def manifest_path(self) -> Path:
        return self.staging / COMMIT

    def write_if_changed(self, rel: str, data: bytes) -> None:
        present = self.present()
        if present.get(rel) == len(data) and self.folder.read(rel) == data:
            return
        self.folder.write(rel, data)
        present[rel] = len(data)

    def move(self, src: str, dest: str) -> None:
        present = self.present()
        if src in present:
            self.folder.move(src, dest)
            present[dest] = present.pop(src)

    def has(self, rel: str, size: int) -> bool:
        return self.present().get(rel) == size

    def copy_input(self, source: str, rel: str) -> None:
        """A rejected input copied to quarantine/, from a local file (an object comes through a
        temporary one: it may be huge). FileNotFoundError: the input is gone since."""
        remote = is_remote(self.cfg.input)
        path = self.staging / "quarantine.tmp" if remote else Path(self.cfg.input) / source
        try:
            if remote:
                copy_input(str(self.cfg.input), source, path)
            size = os.path.getsize(path)
            self.folder.upload(rel, path)
        finally:
            if remote:
                path.unlink(missing_ok=True)
        self.present()[rel] = size

    def sweep(self, folder: str, keep: set[str]) -> None:
        present = self.present()
        stale = [rel for rel in present if rel.startswith(folder + "/") and rel not in keep]
        parallel(self.folder.delete, stale)
        for rel in stale:
            del present[rel]

    def rewrite_journal(self):
        """No journal on object storage: the part results are what a rerun reuses."""
        return contextlib.nullcontext(lambda r: None)

    def finish(self, report_text: str, writer) -> None:
        """report.json, then manifest.parquet only if no other run committed first."""
        self.folder.write("report.json", report_text.encode("utf-8"))
        writer.close()
        if not self.folder.write_if_absent(COMMIT, self.manifest_path().read_bytes()):
            raise StageFailed(f"{self.folder.url}/{COMMIT} was committed by another run while this one worked; that "
                              "run's output stands and this run's was not committed")


class _ObjectOutputs(Outputs):
    """decide's reader of cleaned outputs when they are objects: each output it compares (only
    near-duplicate candidates are ever read) is fetched once into a local cache folder."""

    def __init__(self, folder: Folder, cache: Path, resize_mode: str):
        from pipeline.clean.stage import PARKED

        super().__init__(cache, PARKED, resize_mode)
        self.folder, self.cache, self.parked = folder, cache, PARKED

    def _path(self, r: OutputRef) -> str | None:
        if not r.output:
            return None
        local = self.cache / r.output
        if not local.is_file():
            for rel in (r.output, f"{self.parked}/{r.output}"):
                try:
                    data = self.folder.read(rel)
                except FileNotFoundError:
                    continue
                atomic_write_bytes(local, data)
                break
            else:
                return None
        return os.fspath(local)
