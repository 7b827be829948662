"""The settings of `pipe clean`: `CleanConfig`, with the choices and bounds its values are checked against."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from pipeline.distribute.parts import PART_FILES
from pipeline.media.text.clean import MAX_TEXT_BYTES

RESIZE_MODES = ("pad", "crop", "stretch")
FORMATS = ("jpg", "png", "webp")
CONFLICT_POLICIES = ("quarantine", "majority", "first")
# Largest output side: 8192x8192 RGB is 192 MiB a picture in each worker (and its resize
# buffers); beyond that one output would exhaust a worker's memory and be blamed on the file
MAX_SIZE = 8192


@dataclass
class CleanConfig:
    """Settings of `pipe clean` (flags of the same name; `[clean]` in a `--config` file)."""

    input: Path
    """The raw dataset folder. Never modified."""
    output: Path
    """CLEAN_DIR: cleaned files, quarantine/, manifest.parquet, report.json."""
    size: int = 512
    """Side of the square output images, in pixels."""
    resize_mode: str = "pad"
    """pad (letterbox on the background colour), crop (centre crop) or stretch."""
    format: str = "jpg"
    """Output image format: jpg, png or webp."""
    quality: int = 90
    """JPEG/WebP quality, 1-100."""
    min_size: int = 32
    """Images whose short side is below this are quarantined as too_small, never blown up."""
    max_pixels: int = 178_956_970
    """Images with more pixels than this (from the header, before decoding) are decompression bombs."""
    background: str = "white"
    """Colour transparent pixels are composited on, and the padding colour: white, black, grey or #rrggbb.
    Artwork drawn in the transparency in a colour it would erase goes on the contrasting colour instead."""
    max_text_bytes: int | str = MAX_TEXT_BYTES
    """Text files larger than this (from their size, before reading) are quarantined as too_large;
    a number of bytes or a size such as 16MiB or 200MB (see `MAX_TEXT_BYTES`)."""
    labels: Path | None = None
    """A labels.csv or labels.jsonl (path,label[,text]) instead of class folders."""
    label_conflicts: str = "quarantine"
    """Copies of one content under different labels: quarantine (all copies), majority or first."""
    near_dedup: bool = True
    """Look for near duplicates (perceptual hash + pixels for images, MinHash + Jaccard for texts)."""
    near_image_distance: int = 8
    """Perceptual-hash bits two images may differ in to be compared on pixels (0-12; above 8 is slower)."""
    near_text_jaccard: float = 0.8
    """Shingle Jaccard similarity from which two texts are near duplicates (0.5-1)."""
    workers: int = 0
    """Worker processes; 0 means one per available core."""
    file_timeout: float = 120.0
    """Seconds one file may take before its worker is stopped and the file quarantined as timeout (0 = no limit)."""
    overwrite: bool = False
    """Replace an existing CLEAN_DIR made from other input or settings instead of refusing."""
    executor: str = "local"
    """Where files are processed: local (a process pool on this machine) or ray (a Ray cluster, in parts)."""
    ray_address: str = "auto"
    """The Ray cluster to join with --executor ray: auto (the one started on this machine, or RAY_ADDRESS) or HOST:PORT."""
    part_files: int = PART_FILES
    """Files in one part with --executor ray: a part is one Ray task, and what a killed run redoes at most."""

    # settings that change what a worker writes for a file; a resumed run must match them
    OUTPUT_SETTINGS = ("size", "resize_mode", "format", "quality", "min_size", "max_pixels", "background",
                       "max_text_bytes")

    def fingerprint(self) -> dict:
        return {k: getattr(self, k) for k in self.OUTPUT_SETTINGS}

    def text_limit(self) -> int:
        """--max-text-bytes in bytes: `validate` parsed a size such as 16MiB into its number."""
        if not isinstance(self.max_text_bytes, int):
            raise AssertionError(f"--max-text-bytes {self.max_text_bytes!r} was not parsed by validate()")
        return self.max_text_bytes

    def as_dict(self) -> dict:
        return {f.name: (str(v) if isinstance(v, Path) else v)
                for f in dataclasses.fields(self) for v in [getattr(self, f.name)]}
