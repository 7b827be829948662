"""`CleanConfig`'s declared defaults that mirror a constant of the code they configure."""

from pipeline.clean.config import CleanConfig
from pipeline.core.config import parse_byte_size
from pipeline.media.text.clean import MAX_TEXT_BYTES


def test_defaults_agree_with_the_layers_they_configure():
    # the command line's "16MiB" and the text judge's own default are one limit
    default = CleanConfig.__dataclass_fields__["max_text_bytes"].default
    assert parse_byte_size(default, "--max-text-bytes") == MAX_TEXT_BYTES
