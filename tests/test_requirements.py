"""The rule for tests that need Java, ../shared/data or Chromium: skip locally, fail in CI."""

from __future__ import annotations

import helpers
import pytest


def test_missing_requirement_skips_locally(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(helpers, "IN_CI", False)
    with pytest.raises(pytest.skip.Exception, match="no java here"):
        helpers.require(False, "no java here")
    helpers.require(True, "present: nothing happens")


def test_missing_requirement_fails_in_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(helpers, "IN_CI", True)
    with pytest.raises(pytest.fail.Exception, match="CI=true and a test's requirement is missing: no java here"):
        helpers.require(False, "no java here")
    helpers.require(True, "present: nothing happens")
