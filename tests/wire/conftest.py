import numpy as np
import pytest

from dart_jax.wire import Server, WireConfig
from dart_jax.wire.messages import Step, SubmitTrajectory, Trajectory, TrajectoryAck


LIMIT = 1 << 16  # max_message_bytes of the test server: oversize messages stay cheap to fuzz


def make_trajectory(n_steps: int = 2, traj_id: str = "t1") -> Trajectory:
    rng = np.random.default_rng(0)
    steps = [Step(prompt_ids=rng.integers(0, 151_936, 40, dtype=np.int32),
                  response_ids=rng.integers(0, 151_936, 7, dtype=np.int32),
                  logprobs=rng.normal(size=7).astype(np.float32), image_refs=[i],
                  policy_version=3, response_text="Thought: x\nAction: wait()", action="wait()")
             for i in range(n_steps)]
    return Trajectory(traj_id=traj_id, task_id="synthetic/button/1", steps=steps,
                      screenshots=[b"\x89PNG" + bytes(100)] * n_steps, reward=1.0, status="success")


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
