"""Every message that crosses a process boundary, typed and versioned.

Messages are msgspec structs tagged by class name (`type` on the wire). Token ids and
log-probs are numpy arrays, which the codec sends as raw frames. Bump PROTOCOL_VERSION on
any incompatible change; peers speaking another version get a `version` error reply.
This module imports neither JAX nor torch: every role uses it.
"""

from __future__ import annotations

from typing import Literal, Union

import msgspec
import numpy as np

PROTOCOL_VERSION = 1

ErrorCode = Literal["bad_request", "unknown_message", "too_large", "version", "timeout",
                    "internal", "not_found", "unavailable", "conflict"]
Scalar = Union[str, int, float, bool]


class Msg(msgspec.Struct, tag=True, tag_field="type", kw_only=True, forbid_unknown_fields=True):
    """Base of all wire messages."""


# ---- common -------------------------------------------------------------------------

class Error(Msg):
    """The typed error reply: what failed and why. The request may be retried."""
    code: ErrorCode
    message: str


class Ping(Msg):
    """Health check; any server answers with Pong."""


class Pong(Msg):
    role: str
    pid: int
    uptime_s: float
    info: dict[str, Scalar] = {}


# ---- data contracts (ARCHITECTURE.md "Data contracts") ---------------------------------

TrajectoryStatus = Literal["success", "failure", "env_error", "parse_error", "truncated"]


class TaskSpec(Msg):
    """One task: `task_id` is unique across backends (e.g. "miniwob/click-button/7")."""
    task_id: str
    backend: str
    name: str
    seed: int = 0
    split: Literal["train", "eval"] = "train"
    config: str = ""  # backend-specific JSON (an OSWorld task file, difficulty, ...)


class Step(Msg):
    """One model call: exactly what the policy saw and sampled (the training unit)."""
    prompt_ids: np.ndarray  # int32 [P]: prompt token ids, image pads expanded
    response_ids: np.ndarray  # int32 [R]: sampled token ids
    logprobs: np.ndarray  # float32 [R]: the sampler's log-probs of response_ids
    image_refs: list[int]  # indices into Trajectory.screenshots, in prompt order
    policy_version: int
    response_text: str
    action: str = ""  # canonical action text after parsing; "" when invalid
    valid: bool = True


class Trajectory(Msg):
    """One episode with its steps, screenshots (PNG) and the evaluator's reward."""
    traj_id: str
    task_id: str
    steps: list[Step]
    screenshots: list[bytes]
    reward: float
    status: TrajectoryStatus
    worker_id: str = ""
    temperature: float = 1.0
    created_at: float = 0.0
    source: Literal["rollout", "pool", "demo"] = "rollout"


# ---- rollout worker <-> data manager --------------------------------------------------

class TaskRequest(Msg):
    worker_id: str
    policy_version: int


class TaskAssignment(Msg):
    """Run `num_rollouts` episodes of `task`, each at most `max_steps` steps."""
    task: TaskSpec
    num_rollouts: int
    max_steps: int


class NoTask(Msg):
    reason: str
    retry_after_s: float


class SubmitTrajectory(Msg):
    trajectory: Trajectory


class TrajectoryAck(Msg):
    """Sent only after the trajectory is committed; `duplicate` on an idempotent retry."""
    traj_id: str
    duplicate: bool


# ---- trainer <-> data manager ----------------------------------------------------------

class BatchRequest(Msg):
    """The batch after `after_batch_id`: replayed if it exists (resume), else assembled."""
    trainer_version: int
    after_batch_id: int


class CuratedBatch(Msg):
    """GRPO groups (trajectories grouped by task_id); `injected` came from the pool."""
    batch_id: int
    trainer_version: int
    trajectories: list[Trajectory]
    injected: list[str] = []


class NoBatch(Msg):
    reason: str
    retry_after_s: float


Message = Union[Error, Ping, Pong, TaskSpec, Step, Trajectory, TaskRequest, TaskAssignment,
                NoTask, SubmitTrajectory, TrajectoryAck, BatchRequest, CuratedBatch, NoBatch]
