"""tests/rewrite_share.py: each pytest worker writes pytest's rewritten bytecode of its share of the modules."""

from __future__ import annotations

from pathlib import Path

import pytest

import rewrite_share


def test_the_workers_shares_cover_every_module_once() -> None:
    files = [Path(f"test_{k}.py") for k in range(7)]
    shares = [rewrite_share.share(files, f"gw{k}", 3) for k in range(3)]
    assert sorted(path for mine in shares for path in mine) == sorted(files)
    assert shares[1] == [files[1], files[4]]
    assert rewrite_share.share(files, None, 1) == [] and rewrite_share.share(files, "gw0", 1) == []


def test_only_the_modules_under_the_given_paths_are_shared() -> None:
    tests = rewrite_share.TESTS
    everything = rewrite_share.collected_modules([str(tests)])
    assert tests / "test_rewrite_share.py" in everything and all(p.name.startswith("test_") for p in everything)
    assert rewrite_share.collected_modules([str(tests.parent)]) == everything
    assert rewrite_share.collected_modules([f"{tests / 'test_rewrite_share.py'}::test_x"]) == [
        tests / "test_rewrite_share.py"]
    assert rewrite_share.collected_modules([str(tests.parent / "captioner")]) == []


def test_a_written_module_is_read_back_by_pytest_with_its_asserts_rewritten(tmp_path: Path,
                                                                            pytestconfig: pytest.Config) -> None:
    from _pytest.assertion.rewrite import PYC_TAIL, _read_pyc

    module = tmp_path / "test_sample.py"
    module.write_text("def check(x):\n    assert x == 1\n")
    assert rewrite_share.write_rewritten([module], pytestconfig) == 1
    pyc = tmp_path / "__pycache__" / f"test_sample{PYC_TAIL}"
    code = _read_pyc(module, pyc)
    assert code is not None
    namespace: dict = {}
    exec(code, namespace)
    with pytest.raises(AssertionError, match=r"assert 2 == 1"):  # plain Python would say nothing
        namespace["check"](2)
    assert rewrite_share.write_rewritten([module], pytestconfig) == 0  # cached: not written again
