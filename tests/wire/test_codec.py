import msgspec
import numpy as np
import pytest

from dart_jax.testing.trajectories import make_trajectory
from dart_jax.wire import codec
from dart_jax.wire.codec import WireError
from dart_jax.wire.messages import PROTOCOL_VERSION, Ping, SubmitTrajectory, Trajectory


def test_arrays_travel_as_raw_frames():
    traj = make_trajectory(steps=3)
    frames = codec.encode(SubmitTrajectory(trajectory=traj), rid=7)
    assert len(frames) == 1 + 3 * 3  # header + (prompt, response, logprobs) per step
    assert bytes(frames[1]) == traj.steps[0].prompt_ids.tobytes()
    rid, back = codec.decode([bytes(f) for f in frames], max_bytes=1 << 20)
    assert rid == 7
    for a, b in zip(back.trajectory.steps, traj.steps):
        np.testing.assert_array_equal(a.prompt_ids, b.prompt_ids)
        assert a.logprobs.dtype == np.float32 and a.response_text == b.response_text
    assert back.trajectory.screenshots == traj.screenshots


def test_file_bytes_roundtrip():
    traj = make_trajectory()
    back = codec.from_bytes(codec.to_bytes(traj), Trajectory)
    np.testing.assert_array_equal(back.steps[1].response_ids, traj.steps[1].response_ids)
    with pytest.raises(WireError, match="bad_request: Trajectory"):
        codec.from_bytes(codec.to_bytes(traj)[:-5], Trajectory)


def _header(body: dict, v: int = PROTOCOL_VERSION, rid: int = 1) -> bytes:
    return msgspec.msgpack.encode([v, rid, body])


def _array_msg(array: dict) -> dict:
    step = {"type": "Step", "prompt_ids": array, "response_ids": array, "logprobs": array,
            "image_refs": [], "policy_version": 0, "response_text": ""}
    return step


@pytest.mark.parametrize("frames, code", [
    ([], "bad_request"),
    ([b"\xc1"], "bad_request"),
    ([_header({"type": "Ping"}, v=99)], "version"),
    ([_header({"type": "Launch"})], "unknown_message"),
    ([_header({"type": "Ping", "extra": 1})], "bad_request"),
    ([_header({"type": "Error", "code": "nope", "message": ""})], "bad_request"),
    ([_header(_array_msg({"dtype": "<i4", "shape": [2], "frame": 3})), b"\0" * 8], "bad_request"),
    ([_header(_array_msg({"dtype": "<i4", "shape": [3], "frame": 0})), b"\0" * 8], "bad_request"),
    ([_header(_array_msg({"dtype": "|O", "shape": [1], "frame": 0})), b"\0" * 8], "bad_request"),
    ([_header(_array_msg({"dtype": "<i4", "shape": [-1], "frame": 0})), b"\0" * 8], "bad_request"),
    ([_header({"type": "Ping"}), b"\0" * 2048], "too_large"),
])
def test_malformed_messages_raise_typed_errors(frames, code):
    with pytest.raises(WireError) as err:
        codec.decode(frames, max_bytes=1024)
    assert err.value.code == code


def test_valid_array_message_decodes():
    arr = {"dtype": "<i4", "shape": [2], "frame": 0}
    _, step = codec.decode([_header(_array_msg(arr)), b"\1\0\0\0\2\0\0\0"], max_bytes=1024)
    assert step.prompt_ids.tolist() == [1, 2]


def test_ping_roundtrip_has_no_frames():
    assert codec.decode(codec.encode(Ping(), 5), 1024) == (5, Ping())
