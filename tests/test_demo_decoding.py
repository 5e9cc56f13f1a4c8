"""The demo's decoding process: the captions of the model in this process, decoded in another, its errors raised
here, a child that dies replaced, and nothing left running after `close`.

The session's tiny trained LSTM (conftest.py `shapes_lstm`, loaded by `shapes_model`) captions the shapes test
images (`shapes_pictures`), each differently.
"""

from __future__ import annotations

import copy
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import exits_frozen, subprocess_env
import warm_start

from captioner.apps.demo import decoding
from captioner.apps.demo.decoding import DecodeProcess, LocalDecoder, discard_prestarted, prestart
from captioner.core.errors import CaptionerError, ConfigError

OPTIONS = {"beam_size": 3, "max_length": 8}


@pytest.fixture(scope="module")
def decoder(shapes_model) -> Iterator[DecodeProcess]:
    """One child for the tests that need no other, started as `captioner demo` starts it: a new interpreter (the
    suite forks the others warm: conftest.py)."""
    served = DecodeProcess([shapes_model])
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(decoding, "child_process", decoding.child_process.func)  # conftest's partial: the real start
        served.start()
    assert not isinstance(served._child, warm_start.Popen)
    yield served
    served.close()


def alive(pid: int) -> bool:
    """Whether process `pid` runs (a zombie, ended but not yet waited for, does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_a_batch_decoded_in_the_child_equals_the_same_batch_decoded_here(decoder, shapes_model,
                                                                         shapes_pictures) -> None:
    """Same words, scores and attention maps, from a process that is not this one."""
    served = decoder.caption(shapes_model, shapes_pictures[:4], **OPTIONS)
    child = decoder._child
    assert child is not None and child.pid != os.getpid() and alive(child.pid)
    local = LocalDecoder([shapes_model]).caption(shapes_model, shapes_pictures[:4], **OPTIONS)
    assert [c.text for c in served] == [c.text for c in local] and len(set(c.text for c in local)) > 1
    assert [c.score for c in served] == [c.score for c in local]
    for one, other in zip(served, local):
        np.testing.assert_array_equal(one.attn, other.attn)


class Exit:
    """Unpickled, it ends the process that reads it: a child dying in the middle of a request."""

    def __reduce__(self):
        return os._exit, (3,)


def test_the_childs_error_is_raised_here_and_a_child_that_died_is_replaced(shapes_model, shapes_pictures) -> None:
    """A refused option is the model's own one-line error; a child dying during a request fails it with one line,
    and one that died between requests is replaced: the next request is answered."""
    decoder = DecodeProcess([shapes_model])
    try:
        with pytest.raises(ConfigError, match="beam_size must be a whole number"):
            decoder.caption(shapes_model, shapes_pictures[:1], beam_size=0)
        with pytest.raises(CaptionerError, match=r"decoding process stopped \(exit code 3\); the next caption"):
            decoder.caption(shapes_model, [Exit()], **OPTIONS)
        expected = [c.text for c in shapes_model.caption(shapes_pictures[:2], **OPTIONS)]
        assert [c.text for c in decoder.caption(shapes_model, shapes_pictures[:2], **OPTIONS)] == expected
        first = decoder._child
        assert first is not None
        os.kill(first.pid, signal.SIGKILL)
        first.wait()
        assert [c.text for c in decoder.caption(shapes_model, shapes_pictures[:2], **OPTIONS)] == expected
        assert decoder._child is not None and decoder._child.pid != first.pid
    finally:
        decoder.close()


class Wedge:
    """Unpickled, it holds the process that reads it for an hour: a child that stops answering but lives."""

    def __reduce__(self):
        return time.sleep, (3600,)


def test_close_kills_a_child_that_stops_answering_and_its_request_fails_in_one_line(
        shapes_model, monkeypatch: pytest.MonkeyPatch) -> None:
    """`close` waited for the request's lock, which a wedged child holds for ever: the server's stop never ended.
    Past the grace the child is killed, the request says so in one line, and `close` returns."""
    monkeypatch.setattr(decoding, "CLOSE_TIMEOUT_S", 0.5)
    decoder = DecodeProcess([shapes_model])
    failed: list[str] = []

    def ask() -> None:
        with pytest.raises(CaptionerError, match=r"decoding process stopped \(exit code -9\); the next caption") as e:
            decoder.caption(shapes_model, [Wedge()], **OPTIONS)
        failed.append(str(e.value))

    asking = threading.Thread(target=ask, daemon=True)
    asking.start()
    while decoder._child is None and asking.is_alive():  # the request is on its way
        time.sleep(0.01)
    child = decoder._child
    closing = threading.Thread(target=decoder.close, daemon=True)
    closing.start()
    closing.join(30)
    try:
        assert not closing.is_alive(), "close() waits for a child that never answers"
        asking.join(30)
        assert len(failed) == 1 and "\n" not in failed[0]
        assert child is not None and not alive(child.pid) and decoder._child is None
    finally:
        if child is not None and alive(child.pid):
            child.kill()  # without the fix: let the stuck threads go


def test_the_child_decodes_on_the_threads_it_is_told_or_times(decoder) -> None:
    """No cores given: this process's count; one core: one thread, nothing timed."""
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        assert decoder.choose_threads(None) == (2, {})
        assert decoder.choose_threads(1) == (1, {})
        assert decoder.threads == 1
    finally:
        torch.set_num_threads(before)


def test_a_prestarted_child_is_the_next_decoders_and_one_nobody_takes_is_ended(shapes_model, shapes_pictures) -> None:
    """`captioner demo` starts its child before loading the models (`prestart`); `close` ends it, and a server that
    stops before its page is built ends one nobody took (`discard_prestarted`)."""
    prestart()
    waiting = decoding._PRESTARTED[0]
    decoder = DecodeProcess([shapes_model])
    try:
        assert len(decoder.caption(shapes_model, shapes_pictures[:1], **OPTIONS)) == 1
        assert decoder._child is waiting and not decoding._PRESTARTED
    finally:
        decoder.close()
    assert not alive(waiting.pid) and decoder._child is None  # `close` ended it
    prestart()
    unclaimed = decoding._PRESTARTED[0]
    discard_prestarted()
    assert not decoding._PRESTARTED and unclaimed.poll() is not None and not alive(unclaimed.pid)


def test_a_model_the_decoder_was_not_given_is_refused_before_anything_starts(shapes_model, shapes_pictures) -> None:
    """The decoder tells its models apart by identity: a copy with the same weights is not one of them."""
    decoder = DecodeProcess([shapes_model])
    with pytest.raises(ValueError, match="a model this decoder was not given"):
        decoder.caption(copy.deepcopy(shapes_model), shapes_pictures[:1], **OPTIONS)
    assert decoder._child is None and not decoding._PRESTARTED


def test_the_child_freezes_its_objects_once_its_pipe_closes() -> None:
    """The server waits for the child's exit (`end_child`): frozen, that exit does not collect torch's objects."""
    done = warm_start.run([sys.executable, "-c", exits_frozen("captioner.apps.demo.decoding")],
                          stdin=subprocess.DEVNULL, env=subprocess_env(), capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stderr.endswith(b"frozen 1")
