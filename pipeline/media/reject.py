"""`Reject`: how an image check says "quarantine this file", with a reason and a message.

Raised anywhere inside the image checks (`jpeg`, `containers`, `decode`) and caught once, in
`images.clean_image`, where it becomes the file's reason. Reasons are the fixed vocabulary of
`pipeline.formats.vocabulary.Reason`.
"""

from __future__ import annotations

from pipeline.formats.vocabulary import Reason


class Reject(Exception):
    def __init__(self, reason: Reason, detail: str):
        super().__init__(f"{reason}: {detail}")
        self.reason, self.detail = Reason(reason), detail  # Reason(): a word outside the vocabulary fails here
