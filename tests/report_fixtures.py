"""Folders for `pipe report` tests: a raw dataset with hostile names, a bomb, a garbled text and a
Chinese class, cleaned and sharded by the real stages; a run dir with a metrics.jsonl as
train/components/monitor.py writes it."""

from __future__ import annotations

import json
import os
import re
import struct
import zlib
from pathlib import Path

from tests.check_fixtures import run_clean, run_shard
from tests.factories import photo, write
from tests.nasty import PNG_SIG, png_chunk

SCRIPT_NAME = "<script>alert(1)\"q'.jpg"
RLO_NAME = "gpj\u202eexe.jpg"
BAD_BYTES_NAME = b"bad\xff\xfename.jpg"


def bomb_png(w: int = 60000, h: int = 60000) -> bytes:
    """A PNG whose header claims w x h pixels (a decompression bomb by its header)."""
    ihdr = png_chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
    return PNG_SIG + ihdr + png_chunk(b"IDAT", zlib.compress(b"\0" * 64)) + png_chunk(b"IEND", b"")


def build_raw(root: Path) -> Path:
    for i in range(5):
        photo(root / "猫" / f"cat{i}.jpg", 80, 60, seed=i + 1)
        photo(root / "dogs" / f"dog{i}.jpg", 80, 60, seed=100 + i)
    dogs = root / "dogs"
    (dogs / SCRIPT_NAME).write_bytes((dogs / "dog0.jpg").read_bytes()[:300])  # truncated
    (dogs / RLO_NAME).write_bytes(b"")  # zero bytes
    with open(os.path.join(os.fsencode(dogs), BAD_BYTES_NAME), "wb") as f:
        f.write((dogs / "dog1.jpg").read_bytes())  # an exact duplicate with an undecodable name
    (dogs / "huge.png").write_bytes(bomb_png())
    write(root / "猫" / "cat0.txt", "一只灰色的猫坐在沙发上".encode("gbk"))
    write(root / "dogs" / "dog0.txt", b"\x81\x00\xfe\xff\x00garbage\x00\x01\x02" * 8)
    return root


def build_all(tmp: Path) -> dict[str, Path]:
    raw = build_raw(tmp / "raw")
    clean = run_clean(raw, tmp / "clean")
    shards = run_shard(clean, tmp / "shards")
    return {"raw": raw, "clean": clean, "shards": shards, "run": build_run(tmp / "run")}


def build_run(root: Path, steps: int = 30, drift_host: str = "<b>node\u202e1</b>") -> Path:
    root.mkdir(parents=True, exist_ok=True)
    rows = []
    for s in range(1, steps + 1):
        rows.append({"kind": "train", "step": s, "epoch": 1 + s // 10, "loss": 2.0 / s, "loss_per_rank": [2.0 / s, 2.1 / s],
                     "lr": 1e-3, "samples_per_s": 100.0, "data_wait_share": 0.2,
                     "data_wait_share_per_rank": [0.1, 0.3], "memory_mb": 10.0, "memory_mb_per_rank": [10.0, 11.0],
                     "time": 1.0})
        if s % 10 == 0:
            rows.append({"kind": "val", "step": s, "epoch": s // 10, "val_loss": 1.0 / s, "val_acc": 0.5 + s / 100,
                         "val_samples": 12, "time": 1.0})
    rows.append({"kind": "drift", "step": 20, "rank": 1, "host": drift_host, "what": "loss",
                 "message": f"drift: rank 1 on {drift_host}: running loss 9.0 vs the other ranks' median 1.0 at step 20"})
    (root / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return root


def page_counts(html: str) -> dict[str, int]:
    """The numbers the page marks with data-count="what:value" (commas removed)."""
    return {k: int(v.replace(",", "")) for k, v in re.findall(r'data-count="([^"]*)">([\d,]+)<', html)}
