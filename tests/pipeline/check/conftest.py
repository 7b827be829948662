"""The clean dir most check tests start from: made once per test module, copied before breaking."""

from __future__ import annotations

import pytest

from tests.check_fixtures import build_raw, policy_file, run_clean


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    """(raw folder, a clean dir made from it, a policy file): every check passes on it."""
    root = tmp_path_factory.mktemp("good")
    raw = build_raw(root / "raw")
    return raw, run_clean(raw, root / "clean"), policy_file(root)
