"""`pipe clean`'s settings: the config (command line > TOML > defaults) and the checks of the
operator's choices, each problem one sentence and exit 2 (`validate`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from pipeline.core.config import parse_byte_size
from pipeline.core.errors import UsageError
from pipeline.executors import require
from pipeline.media.image.clean import BACKGROUNDS
from pipeline.media.text.clean import MAX_TEXT_BYTES
from pipeline.storage import Location, open_folder

RESIZE_MODES = ("pad", "crop", "stretch")
FORMATS = ("jpg", "png", "webp")
CONFLICT_POLICIES = ("quarantine", "majority", "first")
# Largest output side: 8192x8192 RGB is 192 MiB a picture in each worker (and its resize
# buffers); beyond that one output would exhaust a worker's memory and be blamed on the file
MAX_SIZE = 8192
PART_FILES = 1000  # files per part on a cluster: a minute or so of one core on photos; what a killed run redoes at most


@dataclass
class CleanConfig:
    """Settings of `pipe clean` (flags of the same name; `[clean]` in a `--config` file)."""

    input: Location
    """The raw dataset folder. Never modified."""
    output: Location
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


def parse_colour(value: str) -> tuple[int, int, int]:
    v = value.strip().lower()
    if v in BACKGROUNDS:
        return BACKGROUNDS[v]
    if v.startswith("#") and len(v) == 7:
        try:
            return tuple(int(v[i : i + 2], 16) for i in (1, 3, 5))  # type: ignore[return-value]
        except ValueError:
            pass
    raise UsageError(f"--background {value!r} is not a colour: use white, black, grey or #rrggbb")


def validate(cfg: CleanConfig) -> CleanConfig:
    """Check the operator's choices; every problem is one sentence and exit 2."""
    inp, out = open_folder(cfg.input), open_folder(cfg.output)
    state = inp.state()
    if state == "absent":
        raise UsageError(f"input folder not found: {inp.url}")
    if state == "file":
        raise UsageError(f"input is not a folder: {inp.url}")
    if inp.contains(out):
        raise UsageError(f"the output folder {out.url} is inside the input folder {inp.url}; pipe never writes into its input")
    checks = [
        (8 <= cfg.size <= MAX_SIZE, f"--size must be between 8 and {MAX_SIZE} pixels, got {cfg.size}"),
        (cfg.resize_mode in RESIZE_MODES, f"--resize-mode must be one of {', '.join(RESIZE_MODES)}, got {cfg.resize_mode!r}"),
        (cfg.format in FORMATS, f"--format must be one of {', '.join(FORMATS)}, got {cfg.format!r}"),
        (1 <= cfg.quality <= 100, f"--quality must be between 1 and 100, got {cfg.quality}"),
        (cfg.min_size >= 1, f"--min-size must be at least 1, got {cfg.min_size}"),
        (cfg.max_pixels >= 1, f"--max-pixels must be positive, got {cfg.max_pixels}"),
        (cfg.workers >= 0, f"--workers must be 0 (all cores) or more, got {cfg.workers}"),
        (cfg.label_conflicts in CONFLICT_POLICIES,
         f"--label-conflicts must be one of {', '.join(CONFLICT_POLICIES)}, got {cfg.label_conflicts!r}"),
        (0 <= cfg.near_image_distance <= 12, f"--near-image-distance must be between 0 and 12 bits, got {cfg.near_image_distance}"),
        (cfg.file_timeout >= 0, f"--file-timeout must be 0 (no limit) or more seconds, got {cfg.file_timeout}"),
        (0.5 <= cfg.near_text_jaccard <= 1, f"--near-text-jaccard must be between 0.5 and 1, got {cfg.near_text_jaccard}"),
        (cfg.part_files >= 1, f"--part-files must be at least 1, got {cfg.part_files}"),
    ]
    for ok, message in checks:
        if not ok:
            raise UsageError(message)
    require(cfg.executor)
    parse_colour(cfg.background)
    cfg.max_text_bytes = parse_byte_size(cfg.max_text_bytes, "--max-text-bytes")
    if cfg.labels is not None and not cfg.labels.is_file():
        raise UsageError(f"labels file not found: {cfg.labels}")
    return cfg
