"""`Reject`: how an image check says "quarantine this file", with a reason and a message.

Raised anywhere inside the image checks (`jpeg`, `containers`, `decode`) and caught once, in
`images.clean_image`, where it becomes the file's reason. Reasons are the fixed vocabulary of
`pipeline.clean.records.REASONS`.
"""

from __future__ import annotations

from pipeline.clean.records import REASONS


class Reject(Exception):
    def __init__(self, reason: str, detail: str):
        assert reason in REASONS, reason
        super().__init__(f"{reason}: {detail}")
        self.reason, self.detail = reason, detail
