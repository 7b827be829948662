"""A captioned dataset the way users bring one: class folders of images, each with a caption file
beside it (same stem), captions in several languages and legacy encodings, many repeated word for
word; made into a SHARD_DIR through the real `pipe clean` and `pipe shard` (issue 22's "Done when").

Each class is a colour: its images show rectangles of that colour at random places over grey
noise (so perceptual hashes differ and pipe clean keeps them), its captions name the colour. A
third of the captions are the English "a photo of a {class}." word for word (the zero-shot
template's own words), the rest one of six languages, each file written in a legacy encoding of
its language: the colour in that language, in English after it (as tags on a multilingual site
are), and a sentence of ordinary prose (the length pipe clean's detection needs;
`tests.text_samples`). The English word is what ties the languages together: without it, nothing
in the data says that "rot" is "red" but the pictures, and a red picture captioned "rot" and one
captioned "a photo of a red." (negatives of each other: different texts) can only be told apart
by memorising them; the model did, and zero-shot accuracy stayed near 25%.

``mismatched``: that share of the samples get the caption of another class (the pairs `pipe
labels` must find); their keys are returned.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from tests.factories import image_bytes
from tests.text_samples import LANGUAGES

COLOURS = {  # class -> (RGB, its name in de, fr, ru, ja, zh, el)
    "red": ((220, 30, 30), ("rot", "rouge", "красный", "赤", "红色", "κόκκινο")),
    "green": ((30, 180, 40), ("grün", "vert", "зелёный", "緑", "绿色", "πράσινο")),
    "blue": ((30, 50, 220), ("blau", "bleu", "синий", "青", "蓝色", "μπλε")),
    "yellow": ((230, 220, 30), ("gelb", "jaune", "жёлтый", "黄色", "黄色", "κίτρινο")),
    "purple": ((130, 30, 170), ("lila", "violet", "фиолетовый", "紫", "紫色", "μωβ")),
    "orange": ((240, 140, 20), ("orange", "orange", "оранжевый", "橙色", "橙色", "πορτοκαλί")),
    "cyan": ((30, 210, 220), ("türkis", "cyan", "голубой", "水色", "青色", "κυανό")),
    "pink": ((240, 130, 190), ("rosa", "rose", "розовый", "桃色", "粉色", "ροζ")),
    "white": ((250, 250, 250), ("weiß", "blanc", "белый", "白", "白色", "λευκό")),
    "black": ((10, 10, 10), ("schwarz", "noir", "чёрный", "黒", "黑色", "μαύρο")),
}
LANGS = ("de", "fr", "ru", "ja", "zh-Hans", "el")  # in COLOURS' order
ENGLISH = "a photo of a {}."


def picture(rgb: tuple[int, int, int], seed: int, size: int = 48) -> bytes:
    """Three rectangles of ``rgb`` at random places over grey noise."""
    rng = np.random.default_rng(seed)
    img = rng.normal(128, 25, size=(size, size, 3))
    for _ in range(3):
        w, h = rng.integers(size // 4, size // 2, 2)
        x, y = rng.integers(0, size - w), rng.integers(0, size - h)
        img[y : y + h, x : x + w] = np.array(rgb) + rng.normal(0, 12, size=(h, w, 3))
    return image_bytes(np.clip(img, 0, 255).astype(np.uint8), "PNG")


def language(k: int) -> int:
    """The language of the ``k``-th caption of a class: 0 English, else 1 + an index into LANGS."""
    return 0 if k % 3 == 0 else 1 + (k // 3 * 2 + k % 3 - 1) % len(LANGS)


def caption(label: str, k: int) -> tuple[bytes, str]:
    """The ``k``-th caption of class ``label``: (file bytes, encoding)."""
    if language(k) == 0:
        return ENGLISH.format(label).encode("utf-8"), "utf-8"
    j = k // 3 * 2 + k % 3 - 1  # the j-th caption not in English: the languages in turn, then their encodings
    lang = LANGS[j % len(LANGS)]
    encodings, prose = LANGUAGES[lang]
    word = COLOURS[label][1][LANGS.index(lang)]
    sentence = prose.split("。")[0] if lang in ("ja", "zh-Hans") else prose.split(". ")[0]
    encoding = encodings[(j // len(LANGS)) % len(encodings)]
    return f"{word} ({label}): {sentence}".encode(encoding), encoding


def make_raw(root: Path, per_class: int = 40, mismatched: float = 0.0, seed: int = 0,
             classes: Sequence[str] | None = None) -> tuple[Path, set[str]]:
    """Class folders of captioned pictures under ``root`` (``classes``: some of COLOURS, default
    all); returns it and the stems whose caption is another class's (``mismatched`` of the samples)."""
    names = sorted(classes or COLOURS)
    rng = np.random.default_rng(seed)
    n = per_class * len(names)
    wrong = set(rng.choice(n, size=int(round(mismatched * n)), replace=False).tolist()) if mismatched else set()
    swapped: set[str] = set()
    for i in range(n):
        label = names[i % len(names)]
        stem = f"{label}{i // len(names):04d}"
        folder = root / label
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{stem}.png").write_bytes(picture(COLOURS[label][0], seed * 100_000 + i))
        said = label
        if i in wrong:
            said = names[(names.index(label) + 1 + int(rng.integers(len(names) - 1))) % len(names)]
            swapped.add(stem)
        (folder / f"{stem}.txt").write_bytes(caption(said, i // len(names))[0])
    return root, swapped


def make_shards(root: Path, per_class: int = 40, mismatched: float = 0.0, seed: int = 0, size: int = 32,
                val_fraction: float = 0.1, classes: Sequence[str] | None = None) -> tuple[Path, set[str]]:
    """raw -> pipe clean -> pipe shard under ``root``: the SHARD_DIR and the mismatched stems."""
    from pipeline.clean import stage as clean
    from pipeline.shard import stage as shard

    raw, swapped = make_raw(root / "raw", per_class, mismatched, seed, classes)
    clean.run(clean.CleanConfig(raw, root / "clean", workers=1, size=size, min_size=16), show_progress=False)
    shard.run(shard.ShardConfig(root / "clean", root / "shards", val_fraction=val_fraction, seed=seed, workers=1),
              show_progress=False)
    return root / "shards", swapped
