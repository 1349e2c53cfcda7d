"""Every message that crosses a process boundary, typed and versioned.

Messages are msgspec structs tagged by class name (`type` on the wire). Token ids and
log-probs are numpy arrays, which the codec sends as raw frames. Bump PROTOCOL_VERSION on
any incompatible change; peers speaking another version get a `version` error reply.
This module imports neither JAX nor torch: every role uses it.
"""

from __future__ import annotations

from typing import Annotated, Literal, Union

import msgspec
import numpy as np

PROTOCOL_VERSION = 5  # 3: weight versions travel as pieces of tensors, served by every trainer host;
                      # 4: a worker on a trainer host's machine takes buckets through shared memory;
                      # 5: an env lease names its client's session (a restart voids the old ones)

ErrorCode = Literal["bad_request", "unknown_message", "too_large", "version", "timeout",
                    "internal", "not_found", "unavailable", "conflict"]
Scalar = Union[str, int, float, bool]

# ---- what ids, names, paths and numbers may be -----------------------------------------
# Fields that name something are refused at decoding (a `bad_request` naming the field,
# e.g. `$.trajectory.traj_id`) unless short and drawn from a safe alphabet: they become
# SQL values, log fields and file names (`<traj_id>.traj`), so no separators, no leading
# dot or dash, no whitespace or control characters. The patterns end in `\Z`: `$` would
# also match before a trailing newline. Integers that reach SQLite fit its int64.
_NAME = r"[A-Za-z0-9_][A-Za-z0-9_.:-]*"
Id = Annotated[str, msgspec.Meta(min_length=1, max_length=128, pattern=rf"^{_NAME}\Z")]
OptionalId = Annotated[str, msgspec.Meta(max_length=128, pattern=rf"^(?:{_NAME})?\Z")]
TaskId = Annotated[str, msgspec.Meta(min_length=1, max_length=256, pattern=rf"^{_NAME}(?:/{_NAME})*\Z")]
BackendName = Annotated[str, msgspec.Meta(max_length=32, pattern=r"^[a-z0-9_]*\Z")]  # "" = any, where allowed
RequestPath = Annotated[str, msgspec.Meta(min_length=1, max_length=1024, pattern=r"^[^\x00-\x1f\x7f]+\Z")]
Version = Annotated[int, msgspec.Meta(ge=-1, le=2**63 - 1)]  # -1: no policy yet
Natural = Annotated[int, msgspec.Meta(ge=0, le=2**63 - 1)]
StepIndex = Annotated[int, msgspec.Meta(ge=0, le=2**31 - 1)]
Text = Annotated[str, msgspec.Meta(max_length=1024, pattern=r"^[^\x00-\x1f\x7f]*\Z")]  # one line
Sha256 = Annotated[str, msgspec.Meta(pattern=r"^[0-9a-f]{64}\Z")]  # hex digest, lowercase
Pixels = Annotated[int, msgspec.Meta(ge=1, le=2**31 - 1)]  # a PNG side (IHDR bounds it so)
MAX_SCREENSHOTS_PER_REQUEST = 256


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
    task_id: TaskId
    backend: BackendName
    name: Id
    seed: Natural = 0
    split: Literal["train", "eval"] = "train"
    config: str = ""  # backend-specific JSON (an OSWorld task file, difficulty, ...)


class Step(Msg):
    """One model call: exactly what the policy saw and sampled (the training unit)."""
    prompt_ids: np.ndarray  # int32 [P]: prompt token ids, image pads expanded
    response_ids: np.ndarray  # int32 [R]: sampled token ids
    logprobs: np.ndarray  # float32 [R]: the sampler's log-probs of response_ids
    image_refs: list[int]  # indices into Trajectory.screenshots, in prompt order
    policy_version: Version  # the version the request was submitted under
    response_text: str
    action: str = ""  # canonical action text after parsing; "" when invalid
    valid: bool = True
    # True unless all of the response (its prefill, the KV it reused, its tokens) came from
    # `policy_version`: a weight update cut across it, its log-probs match neither policy,
    # and it is never trained on.
    straddles_update: bool = False
    gen_s: tuple[float, float] = (0.0, 0.0)  # wall-clock start, end of the model call
    env_s: tuple[float, float] = (0.0, 0.0)  # wall-clock start, end of the env step


class Trajectory(Msg):
    """One episode with its steps, screenshots (PNG) and the evaluator's reward."""
    traj_id: Id
    task_id: TaskId
    steps: list[Step]
    screenshots: list[bytes]
    reward: float
    status: TrajectoryStatus
    worker_id: OptionalId = ""
    temperature: float = 1.0
    created_at: float = 0.0
    source: Literal["rollout", "pool", "demo"] = "rollout"
    assignment_id: OptionalId = ""  # the TaskAssignment this rollout fulfils ("" outside rollouts)
    env_slot: Text = ""  # "ENDPOINT#SLOT" of the env slot that played it
    reset_s: tuple[float, float] = (0.0, 0.0)  # wall-clock start, end of the env reset
    evaluate_s: tuple[float, float] = (0.0, 0.0)  # wall-clock start, end of the evaluator
    # weight loads of its worker's engine during the episode: (version, paused, resumed)
    weight_loads: list[tuple[int, float, float]] = []


# ---- rollout worker <-> data manager --------------------------------------------------

class TaskRequest(Msg):
    """`session` names one life of the worker process: a new session of a worker id
    returns every assignment of its earlier sessions to the pool at once."""
    worker_id: Id
    policy_version: Version
    session: OptionalId = ""


class TaskAssignment(Msg):
    """Run `num_rollouts` episodes of `task`, each at most `max_steps` steps; every
    trajectory names `assignment_id`."""
    task: TaskSpec
    num_rollouts: int
    max_steps: int
    assignment_id: OptionalId = ""


class WorkerHeartbeat(Msg):
    """A rollout worker is alive: its assignments stay out; silence returns them."""
    worker_id: Id
    session: Id
    policy_version: Version


class WorkerAck(Msg):
    known: bool  # False: the data manager holds no assignment of this session


class NoTask(Msg):
    reason: str
    retry_after_s: float


class SubmitTrajectory(Msg):
    trajectory: Trajectory


class TrajectoryAck(Msg):
    """Sent only after the trajectory is committed; `duplicate` on an idempotent retry."""
    traj_id: Id
    duplicate: bool


# ---- trainer <-> data manager ----------------------------------------------------------

class TrainerHeartbeat(Msg):
    """The trainer (its process 0) is alive at `step`; its last one says how it ended. A
    trainer on another host (a TPU slice) is watched through these (TrainerStatus)."""
    step: Natural
    policy_version: Version
    state: Literal["running", "finished", "failed"] = "running"


class TrainerStatusRequest(Msg):
    pass


class TrainerStatus(Msg):
    """The last TrainerHeartbeat the data manager got, and how long ago (None: none yet)."""
    seen_s_ago: float | None
    step: int = 0
    policy_version: int = -1
    state: Literal["none", "running", "finished", "failed"] = "none"


class BatchRequest(Msg):
    """The batch after `after_batch_id`: replayed if it exists (resume), else assembled."""
    trainer_version: Version
    after_batch_id: Natural


class ScreenshotRef(Msg):
    """A stored screenshot named by content, with its size as the image processor sees it
    (EXIF orientation applied): enough to plan shapes and buckets without its pixels."""
    sha256: Sha256
    height: Pixels
    width: Pixels


class CuratedBatch(Msg):
    """GRPO groups (trajectories grouped by task_id); `injected` came from the pool.

    Screenshots travel by reference: each trajectory's `screenshots` is empty and `screens[i]`
    lists trajectory i's screenshots in their order (what Step.image_refs index); their PNG
    bytes come from ScreenshotRequest. A batch of 64 trajectories x 30 steps of 1920x1080
    screenshots would carry gigabytes of PNG inline."""
    batch_id: int
    trainer_version: int
    trajectories: list[Trajectory]
    screens: list[list[ScreenshotRef]]
    injected: list[Id] = []


class ScreenshotRequest(Msg):
    """The PNG bytes of stored screenshots, by sha256; an unknown one is a `not_found` error."""
    sha256: Annotated[list[Sha256], msgspec.Meta(min_length=1, max_length=MAX_SCREENSHOTS_PER_REQUEST)]


class Screenshots(Msg):
    """The PNGs of the first len(png) hashes asked for, in order: as many as the data
    manager's reply budget holds (at least one). Ask again for the rest."""
    png: list[bytes]


class NoBatch(Msg):
    reason: str
    retry_after_s: float


# ---- data manager extras -----------------------------------------------------------------

class TaskStats(Msg):
    """One task's record for dashboards; rates over rollouts (environment errors excluded)."""
    task_id: TaskId
    split: str
    attempts: int
    successes: int
    env_errors: int
    success_rate: float
    recent_success_rate: float  # over the curation window: what sets the rollout count
    rollouts: int  # rollout count the scheduler assigns now
    max_steps: int  # step limit the scheduler assigns now
    mean_steps: float
    mean_success_steps: float
    min_version: int
    max_version: int
    unused: int
    pool: int


class StatsRequest(Msg):
    task_ids: list[TaskId] = []  # empty: every task


class DataStats(Msg):
    tasks: list[TaskStats]
    trajectories: int
    steps: int
    batches: int
    pool: int
    latest_version: int


class PoolImport(Msg):
    """Import successes from a *.traj directory or a JSONL file on the data manager's host:
    relative to its run directory, or absolute inside a configured import root."""
    path: RequestPath


class PoolImported(Msg):
    imported: int
    duplicates: int
    skipped: int


class ExportTrajectories(Msg):
    """Write trajectories (SFT, analysis) to a new path on the data manager's host: relative
    to its run directory, or absolute inside a configured export root. Never overwrites."""
    path: RequestPath
    format: Literal["traj", "jsonl"] = "jsonl"
    success_only: bool = False
    split: Literal["train", "eval", "all"] = "all"


class Exported(Msg):
    path: str
    count: int

# ---- end of data manager extras ----------------------------------------------------------


# ---- trainer -> rollout workers: weights ------------------------------------------------
# A version is a list of tensors (Hugging Face names, torch layout, the engine's dtype). Each
# trainer host serves the blocks of them it holds (its shards) as pieces grouped in buckets
# (WeightPull -> WeightBucket); process 0 announces the version on a PUB socket
# (WeightAnnounce: every tensor, and every bucket's host and pieces). A bucket reply carries
# its pieces as raw frames and an xxh3-64 checksum of their bytes; the worker reassembles
# each tensor from its pieces. A worker on the same machine as a host asks `shared` and may be
# answered WeightBucketShared: where the bucket lies in a shared-memory region of that host
# (dart_jax.wire.shm). See dart_jax.wire.weights.

WeightDtype = Literal["float32", "bfloat16", "float16"]
Endpoint = Annotated[str, msgspec.Meta(max_length=256, pattern=r"^(?:tcp|ipc)://[^\x00-\x20\x7f]+\Z")]
Dims = Annotated[list[Natural], msgspec.Meta(max_length=8)]
Checksum = Annotated[int, msgspec.Meta(ge=0)]  # an unsigned 64-bit hash


class TensorInfo(Msg):
    name: Id  # Hugging Face name (model.layers.0.self_attn.q_proj.weight)
    dtype: WeightDtype
    shape: Dims


class PieceInfo(msgspec.Struct, array_like=True, forbid_unknown_fields=True):
    """The block `start[d]:start[d] + shape[d]` of tensor `tensor`, C-order bytes."""
    tensor: Natural  # index into WeightAnnounce.tensors
    start: Dims
    shape: Dims


class WeightBucketInfo(Msg):
    index: Natural
    host: Natural  # index into WeightAnnounce.hosts
    nbytes: Natural
    pieces: list[PieceInfo]


class WeightAnnounce(Msg):
    """Version `version` of the policy can be pulled, bucket by bucket, from its hosts."""
    version: Natural
    hosts: list[Endpoint]  # the bucket server of each trainer host
    tensors: list[TensorInfo]
    buckets: list[WeightBucketInfo]
    total_bytes: Natural
    published_at: float


class WeightLatest(Msg):
    """Which version is newest (a worker that was down catches up): WeightAnnounce."""


class WeightPull(Msg):
    version: Natural
    bucket: Natural
    shared: bool = False  # the asker can map this host's shared-memory regions (it runs on its machine)


class WeightBucket(Msg):
    version: Natural
    bucket: Natural
    checksum: Checksum  # xxh3-64 of the pieces' bytes, in order
    pieces: list[np.ndarray]  # uint8, one per PieceInfo of the bucket


REGION_DIR = r"dart-jax-(\d{1,10})-[0-9a-f]{16}"  # /dev/shm/<this>/slot-<n>: dart_jax.wire.shm
RegionPath = Annotated[str, msgspec.Meta(max_length=256, pattern=rf"^/dev/shm/{REGION_DIR}/slot-\d{{1,6}}\Z")]
RegionToken = Annotated[str, msgspec.Meta(pattern=r"^[0-9a-f]{32}\Z")]


class WeightBucketShared(Msg):
    """A bucket's pieces, side by side at `offset` in the host's shared-memory region `region`
    (whose header holds `token`), instead of its bytes."""
    version: Natural
    bucket: Natural
    checksum: Checksum
    region: RegionPath
    token: RegionToken
    offset: Natural


# ---- rollout worker <-> env server --------------------------------------------------------
# A worker leases a slot (EnvAcquire -> EnvLease), runs episodes on it (EnvReset, EnvStep with
# the model's raw text, EnvEvaluate) and gives it back (EnvRelease). Every lease-bearing
# request renews the lease; EnvHeartbeat renews many at once. A lease not renewed within
# `lease_s` is reclaimed. EnvStep carries the step index so a retried step is answered
# from the server's cache instead of being applied twice.

EnvStepStatus = Literal["ok", "invalid", "env_error"]


class EnvAcquire(Msg):
    client_id: Id
    backend: BackendName = ""  # "" = any backend
    # the client's life ("" = none): its first acquire voids the leases of the client's earlier
    # lives (a restarted worker gets its predecessor's slots at once, not after `lease_s`)
    session: OptionalId = ""


class EnvLease(Msg):
    lease_id: Id
    slot: int
    backend: BackendName
    lease_s: float


class EnvHeartbeat(Msg):
    lease_ids: list[Id]


class EnvHeartbeatAck(Msg):
    alive: list[Id]  # the leases still held; the others were reclaimed or released


class EnvReset(Msg):
    lease_id: Id
    task: TaskSpec


class EnvStep(Msg):
    lease_id: Id
    step: StepIndex  # index of this step in the episode (0-based): makes retries idempotent
    action: str  # the model's text, "Thought: ...\nAction: ..." (UI-TARS-1.5)


class EnvObservation(Msg):
    screenshot: bytes  # PNG
    width: int
    height: int
    instruction: str
    dom_text: str = ""  # envs.dom format, when the backend has one


class EnvReply(Msg):
    """The answer to EnvReset (step 0) and EnvStep. `status`: the action ran (ok), could
    not be parsed (invalid: penalised, or the episode ends, by server config), or the
    environment failed (env_error: the episode is over and must not be trained on).
    `action` is the canonical text of the parsed action ("" when invalid)."""
    lease_id: Id
    episode_id: Id
    step: StepIndex
    status: EnvStepStatus
    done: bool
    observation: EnvObservation | None = None
    action: str = ""
    message: str = ""


class EnvEvaluate(Msg):
    lease_id: Id


class EnvReward(Msg):
    """The evaluator's reward in [0, 1] (less the invalid-action penalty) and the status."""
    lease_id: Id
    episode_id: Id
    reward: float
    status: TrajectoryStatus
    steps: int
    invalid_steps: int


class EnvRelease(Msg):
    lease_id: Id


class EnvReleased(Msg):
    lease_id: Id


class EnvListTasks(Msg):
    backend: BackendName


class EnvTaskList(Msg):
    backend: str
    names: list[str]


class EnvStatsRequest(Msg):
    reset: bool = False  # start a new measurement window after answering


class EnvSlotStats(Msg):
    slot: int
    backend: str
    state: Literal["free", "leased", "restarting"]
    wall_s: float  # length of the measurement window
    busy_s: float  # time inside reset/step/evaluate calls in the window
    utilization: float
    episodes: int
    steps: int
    env_errors: int
    restarts: int


class EnvStats(Msg):
    slots: list[EnvSlotStats]
    uptime_s: float

# ---- end of rollout worker <-> env server --------------------------------------------------


Message = Union[Error, Ping, Pong, TaskSpec, Step, Trajectory, TaskRequest, TaskAssignment,
                WorkerHeartbeat, WorkerAck, TensorInfo, WeightBucketInfo, WeightAnnounce,
                WeightLatest, WeightPull, WeightBucket, WeightBucketShared, NoTask, SubmitTrajectory, TrajectoryAck,
                BatchRequest, TrainerHeartbeat, TrainerStatusRequest, TrainerStatus, CuratedBatch, NoBatch, ScreenshotRef, ScreenshotRequest, Screenshots,
                TaskStats, StatsRequest, DataStats, PoolImport, PoolImported, ExportTrajectories,
                Exported,
                EnvAcquire, EnvLease, EnvHeartbeat, EnvHeartbeatAck, EnvReset, EnvStep, EnvReply,
                EnvEvaluate, EnvReward, EnvRelease, EnvReleased, EnvListTasks, EnvTaskList,
                EnvStatsRequest, EnvStats]
