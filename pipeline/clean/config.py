"""The settings of `pipe clean`: `CleanConfig`, each declared once (`pipeline.core.settings`):
its flag, its `[clean]` key in a `--config` file, its schema and its range or choices."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pipeline.core import settings
from pipeline.core.config import parse_byte_size
from pipeline.core.errors import UsageError
from pipeline.core.settings import check as check_settings
from pipeline.core.settings import setting
from pipeline.executors import EXECUTORS, HELP, keep_warm_setting, require
from pipeline.media.image.clean import BACKGROUNDS
from pipeline.media.image.window import PATTERN as WINDOW
from pipeline.media.image.window import parse_window
from pipeline.storage import EXAMPLE_URL, Location, open_folder

RESIZE_MODES = ("pad", "crop", "stretch")
FORMATS = ("jpg", "png", "webp")
CONFLICT_POLICIES = ("quarantine", "majority", "first")
# Largest output side: 8192x8192 RGB is 192 MiB a picture in each worker (and its resize
# buffers); beyond that one output would exhaust a worker's memory and be blamed on the file
MAX_SIZE = 8192
# A byte count in a TOML file: a number, or what pipeline.core.config.parse_byte_size reads
BYTE_COUNT = {"oneOf": [{"type": "integer", "minimum": 1},
                        {"type": "string", "pattern": r"^\s*[0-9]+(\.[0-9]+)?\s*([bB]|[kKmMgG]|[kKmMgG][bB]|[kKmMgG][iI][bB])?\s*$"}]}
PART_FILES = 1000  # files per part on a cluster: a minute or so of one core on photos; what a killed run redoes at most


@dataclass
class CleanConfig:
    """Settings of `pipe clean` (flags of the same name; `[clean]` in a `--config` file)."""

    input: Location = setting(help=f"The raw dataset folder, or {EXAMPLE_URL} (never modified).",
                          argument=True, required=True, remote=True, toml=False)
    output: Location = setting(help="CLEAN_DIR to write (cleaned files, quarantine/, manifest.parquet, report.json), or "
                                    f"{EXAMPLE_URL}.", flags=("--output", "-o"), required=True, remote=True, toml=False)
    size: int = setting(512, "Side of the square output images, in pixels.", minimum=8, maximum=MAX_SIZE, unit="pixels")
    resize_mode: str = setting("pad", "pad (letterbox on the background colour), crop (centre) or stretch.",
                               choices=RESIZE_MODES)
    format: str = setting("jpg", "Output image format: jpg, png or webp.", choices=FORMATS)
    quality: int = setting(90, "JPEG/WebP quality, 1-100.", minimum=1, maximum=100)
    min_size: int = setting(32, "Quarantine images whose short side is below this (px) as too_small, never blown up.",
                            minimum=1)
    max_pixels: int = setting(178_956_970, "Decompression-bomb limit in pixels, from the header, before decoding.", minimum=1)
    window: str = setting(
        "auto", "How images of more than 8 bits a sample (16-bit PNG and TIFF, 32-bit, float) become 8-bit: auto (from "
                "the range the file declares, PNG sBIT or the TIFF's sample tags, else from the image's maximum "
                "rounded up to whole bits: 12-bit content in a 16-bit file gets all 256 levels, not 16), full (from the "
                "sample type's whole range, 0-65535 for 16 bits: one fixed scale) or P1,P2 (each image from its own "
                "P1-th to P2-th percentile, e.g. 0.5,99.5). The row's detail says what was done.", pattern=WINDOW)
    background: str = setting(
        "white", "Colour under transparency and padding: white, black, grey or #rrggbb. Artwork it would erase "
                 "(white on transparency under white) goes on the contrasting colour instead.")
    max_text_bytes: int | str = setting(
        "16MiB", "Quarantine text files larger than this as too_large, from their size before reading: bytes, or a "
                 "size such as 16MiB or 200MB (kB/MB/GB: powers of 1000; KiB/MiB/GiB: of 1024). 16 MiB is five long "
                 "novels; above that a .txt is a log or a dump, and judging it takes a few times its size in memory "
                 "per worker.", schema=BYTE_COUNT)
    labels: Path | None = setting(None, "labels.csv|jsonl with path,label[,text] instead of class folders.")
    label_conflicts: str = setting("quarantine", "Same content, different labels: quarantine (all copies), majority "
                                                 "or first.", choices=CONFLICT_POLICIES)
    near_dedup: bool = setting(True, "Find near duplicates too (perceptual hash + pixels for images, MinHash + Jaccard "
                                     "for texts).")
    near_image_distance: int = setting(8, "Perceptual-hash bits two images may differ in to be compared on pixels "
                                          "(0-12; above 8 is slower).", minimum=0, maximum=12, unit="bits")
    near_text_jaccard: float = setting(0.8, "Shingle Jaccard similarity from which two texts are near duplicates "
                                            "(0.5-1).", minimum=0.5, maximum=1)
    workers: int = setting(0, "Worker processes (0 = one per core).", minimum=0)
    file_timeout: float = setting(120.0, "Seconds one file may take before its worker is stopped and the file is "
                                         "quarantined as timeout (0 = no limit).", minimum=0, unit="seconds")
    overwrite: bool = setting(False, "Replace a CLEAN_DIR that pipe clean made from other input or settings (its "
                                     ".pipe/state.json says so); a folder pipe clean did not write is refused regardless.")
    executor: str = setting(
        "local", f"Who processes the files: {HELP}. On a cluster, a local INPUT and CLEAN_DIR must be on a file system "
                 "every node mounts at the same path; object storage is read and written by the nodes themselves.",
        choices=tuple(EXECUTORS))
    ray_address: str = setting("auto", "The Ray cluster for --executor ray: auto (the one started on this machine, or "
                                       "RAY_ADDRESS) or HOST:PORT.", schema={"type": "string", "minLength": 1})
    ray_keep_warm: float = keep_warm_setting()
    part_files: int = setting(PART_FILES, "Files per part: what one task on a cluster processes, and what a killed run "
                                          "redoes at most (the local executor's parts hold at most 256).", minimum=1)

    # settings that change what a worker writes for a file; a resumed run must match them
    OUTPUT_SETTINGS = ("size", "resize_mode", "format", "quality", "min_size", "max_pixels", "background",
                       "max_text_bytes", "window")

    def fingerprint(self) -> dict:
        return {k: getattr(self, k) for k in self.OUTPUT_SETTINGS}

    def text_limit(self) -> int:
        """--max-text-bytes in bytes: `validate` parsed a size such as 16MiB into its number."""
        if not isinstance(self.max_text_bytes, int):
            raise AssertionError(f"--max-text-bytes {self.max_text_bytes!r} was not parsed by validate()")
        return self.max_text_bytes

    def as_dict(self) -> dict:
        return settings.as_dict(self)


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
    check_settings(cfg)  # the declared ranges and choices
    require(cfg.executor)
    parse_colour(cfg.background)
    try:
        cfg.window = str(parse_window(cfg.window))  # one spelling of each window ("0.5, 99.5" -> "0.5,99.5")
    except ValueError as e:
        raise UsageError(str(e)) from None
    cfg.max_text_bytes = parse_byte_size(cfg.max_text_bytes, "--max-text-bytes")
    if cfg.labels is not None and not cfg.labels.is_file():
        raise UsageError(f"labels file not found: {cfg.labels}")
    return cfg
