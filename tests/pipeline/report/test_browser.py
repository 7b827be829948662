"""The page in a real browser: Debian's headless Chromium takes a screenshot of the report for
data_samples/ (clean + shard). It must show something (not a blank page), load in under 3 s,
and draw Chinese class names as glyphs, not as empty boxes.

CI installs chromium and fonts-noto-cjk (.ci/run); there a missing chromium fails the test,
elsewhere it is skipped. Chromium runs with networking shut off; the page's content-security
policy forbids fetching anything anyway.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from PIL import Image

from tests.clean_dirs import Spec, make_clean_dir
from tests.conftest import REPO

WINDOW = (1200, 1600)
OFFLINE = ["--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
           "--no-default-browser-check", "--disable-background-networking", "--disable-component-update",
           "--disable-sync", "--disable-extensions", "--disable-default-apps", "--disable-domain-reliability",
           "--disable-client-side-phishing-detection", "--metrics-recording-only", "--no-pings",
           "--host-resolver-rules=MAP * ~NOTFOUND", "--proxy-server=127.0.0.1:9", "--disable-dev-shm-usage"]

pytestmark = pytest.mark.slow  # a headless Chromium per test


def chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found:
        return found
    if os.environ.get("CI") == "true":
        pytest.fail("chromium is missing on CI: .ci/run installs it (apt-get install chromium fonts-noto-cjk)")
    pytest.skip("chromium is not installed (apt-get install chromium fonts-noto-cjk)")


def screenshot(url: str, png: Path, profile: Path) -> float:
    """Seconds the browser took to start, load ``url`` and write the screenshot."""
    cmd = [chromium(), *OFFLINE, f"--user-data-dir={profile}", f"--screenshot={png}",
           f"--window-size={WINDOW[0]},{WINDOW[1]}", url]
    t = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=180, check=False)
    took = time.perf_counter() - t
    assert done.returncode == 0 and png.is_file(), done.stderr[-2000:]
    return took


@pytest.fixture(scope="module")
def demo_report(tmp_path_factory) -> Path:
    from pipeline.clean import stage as clean
    from pipeline.report.stage import ReportConfig, run
    from pipeline.shard import stage as shard

    tmp = tmp_path_factory.mktemp("browser")
    clean.run(clean.CleanConfig(REPO / "data_samples" / "raw", tmp / "clean", workers=2), show_progress=False)
    shard.run(shard.ShardConfig(tmp / "clean", tmp / "shards", val_fraction=0.2, max_count=50, seed=0, workers=1),
              show_progress=False)
    run(ReportConfig([tmp / "clean", tmp / "shards"], tmp / "report.html"))
    return tmp / "report.html"


def test_the_data_samples_report_renders_and_loads_quickly(demo_report, tmp_path):
    blank = tmp_path / "blank.html"
    blank.write_text("<!DOCTYPE html><title>blank</title>", encoding="utf-8")
    start = screenshot(blank.as_uri(), tmp_path / "blank.png", tmp_path / "profile")  # the browser alone
    took = screenshot(demo_report.as_uri(), tmp_path / "report.png", tmp_path / "profile")
    assert took - start < 3.0, f"the page took {took - start:.2f} s beyond the browser's own {start:.2f} s"
    im = Image.open(tmp_path / "report.png").convert("RGB")
    assert im.size == WINDOW
    colours = im.getcolors(maxcolors=1 << 20)
    assert colours is not None and len(colours) > 200, "a page of text, tables, charts and previews has many colours"
    white = max(n for n, c in colours if c == (255, 255, 255)) if any(c == (255, 255, 255) for _, c in colours) else 0
    assert white < 0.97 * im.size[0] * im.size[1], "the screenshot is (almost) all white"


def test_chinese_class_names_are_drawn_as_glyphs(tmp_path):
    """A class named 猫 and one named with a character no font has (U+E000, drawn as an empty
    box): the screenshots differ only where the names are, so they differ only when 猫 has a font."""
    from pipeline.report.stage import ReportConfig, run

    shots = []
    for name, label in (("cjk", "猫猫猫"), ("box", "\ue000\ue000\ue000")):
        root = tmp_path / "clean"
        make_clean_dir(root, [Spec(f"k{i}", label, seed=i) for i in range(2)])
        run(ReportConfig([root], tmp_path / f"{name}.html", thumbnails=False))
        shutil.rmtree(root)
        shots.append(tmp_path / f"{name}.png")
        screenshot((tmp_path / f"{name}.html").as_uri(), shots[-1], tmp_path / "profile")
    a, b = (Image.open(p).convert("RGB") for p in shots)
    assert a.tobytes() != b.tobytes(), "猫 was drawn like a missing glyph: is fonts-noto-cjk installed?"
