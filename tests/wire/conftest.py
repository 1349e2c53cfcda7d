import pytest

from dart_jax.wire import Server, WireConfig
from dart_jax.wire.messages import SubmitTrajectory, TrajectoryAck


LIMIT = 1 << 16  # max_message_bytes of the test server: oversize messages stay cheap to fuzz


def ack_handler(msg):
    if isinstance(msg, SubmitTrajectory):
        return TrajectoryAck(traj_id=msg.trajectory.traj_id, duplicate=False)
    raise ValueError(f"unexpected {type(msg).__name__}")


@pytest.fixture
def server():
    srv = Server(WireConfig(endpoint="tcp://127.0.0.1:0", max_message_bytes=LIMIT),
                 ack_handler, role="test").start()
    yield srv
    srv.stop()
