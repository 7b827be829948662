"""The real S3 servers (tests/s3server.py) for the storage tests."""

from tests.s3server import moto_conditional_server, s3_server  # noqa: F401
