"""Typed results of the strata API (mirrors ``docs/openapi.json``).

Every model is a frozen-ish dataclass built from the daemon's JSON with
:meth:`Model.from_json`; fields the SDK does not know yet are kept in ``raw``
(the whole decoded object), so a newer daemon never breaks an older SDK.
"""

from __future__ import annotations

import base64
import dataclasses
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar, Union

SandboxState = Literal["creating", "running", "paused", "standby", "stopped", "archived", "destroyed", "error", "lost"]
"""Lifecycle state of a sandbox (see docs/lifecycle.md)."""

Lifecycle = Literal["ephemeral", "persistent"]
"""What happens to a sandbox when its run ends."""

OnIdle = Literal["standby", "stop", "destroy", "keep"]
"""What happens to a running sandbox once it has been idle for its idle timeout."""

T = TypeVar("T", bound="Model")


_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    hints = _HINTS.get(cls)
    if hints is None:
        hints = _HINTS[cls] = typing.get_type_hints(cls)
    return hints


def _convert(tp: Any, value: Any) -> Any:
    """Converts decoded JSON ``value`` to the annotated type ``tp`` (dataclasses, lists, dicts, optionals)."""
    if value is None:
        return None
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return _convert(args[0], value) if len(args) == 1 else value
    if origin is list:
        (item,) = typing.get_args(tp) or (Any,)
        return [_convert(item, v) for v in value]
    if origin is dict:
        _, item = typing.get_args(tp) or (Any, Any)
        return {k: _convert(item, v) for k, v in value.items()}
    if isinstance(tp, type) and issubclass(tp, Model) and isinstance(value, dict):
        return tp.from_json(value)
    return value


@dataclass
class Model:
    """Base of every result type."""

    @classmethod
    def from_json(cls: type[T], data: dict[str, Any]) -> T:
        """Builds the model from a decoded JSON object; unknown keys stay in ``raw``."""
        hints = _hints(cls)
        kwargs: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            if f.name == "raw":
                continue
            key = f.metadata.get("json", f.name)
            if key in data:
                kwargs[f.name] = _convert(hints[f.name], data[key])
        obj = cls(**kwargs)
        if hasattr(obj, "raw"):
            obj.raw = data
        return obj


def _raw() -> Any:
    return field(default_factory=dict, repr=False, compare=False)


# --- sandboxes -------------------------------------------------------------


@dataclass
class ResourceLimits(Model):
    """Resource limits of a sandbox. In a request, ``None`` takes the daemon's
    default (``strata daemon --default-memory`` etc.); a sandbox shows the limits
    it runs with (``None`` there: no limit, the operator's ``--default-* none``)."""

    cpus: float | None = None
    memory_bytes: int | None = None
    pids: int | None = None
    #: Size of the writable layer (its own filesystem; ENOSPC beyond it).
    disk_bytes: int | None = None
    #: Set by the daemon: ``enforced (...)``, ``none`` or ``unavailable (reason)``.
    disk_quota: str | None = None

    def to_json(self) -> dict[str, Any]:
        """The request body form (unset fields left out)."""
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}


@dataclass
class LifecycleHooks(Model):
    """Commands run inside the sandbox at lifecycle boundaries."""

    before_standby: list[str] = field(default_factory=list)
    after_resume: list[str] = field(default_factory=list)
    before_stop: list[str] = field(default_factory=list)
    timeout: str | None = None


@dataclass
class Policy(Model):
    """A lifecycle policy, or a patch of one (fields left ``None`` are not sent / kept).

    Durations are strings such as ``"30s"``, ``"10m"``, ``"2h"``; ``"none"``
    removes ``max_lifetime``/``archive_after``/``delete_after`` in an update.
    ``flush`` lists directories emptied before each checkpoint (an update replaces the list).
    """

    on_idle: OnIdle | None = None
    idle_timeout: str | None = None
    max_lifetime: str | None = None
    #: What a run reaching ``max_lifetime`` gets: ``"stop"``, ``"standby"`` or ``"destroy"``.
    on_max_lifetime: OnIdle | None = None
    archive_after: str | None = None
    delete_after: str | None = None
    flush: list[str] | None = None
    hooks: LifecycleHooks | None = None
    #: Whether calls that need it running (exec, files, previews) resume a parked
    #: sandbox (default ``True``); with ``False`` they raise :class:`Conflict`.
    resume_on_access: bool | None = None
    raw: dict[str, Any] = _raw()

    def to_json(self) -> dict[str, Any]:
        """The request body form (``PolicyPatch``); unset fields left out."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if f.name == "raw" or v is None:
                continue
            out[f.name] = dataclasses.asdict(v) if isinstance(v, LifecycleHooks) else v
        return out


@dataclass
class StandbyInfo(Model):
    """How a sandbox in standby keeps its state."""

    mode: Literal["processes", "fs_only"]
    created_at: str
    dump_ms: int
    image_bytes: int
    api_processes: int
    note: str | None = None


@dataclass
class Sandbox(Model):
    """A sandbox as the daemon reports it (``GET /v1/sandboxes/{id}``)."""

    id: str
    name: str
    state: SandboxState
    state_reason: str
    source: str
    image_id: str
    hostname: str
    lifecycle: Lifecycle
    runtime: str
    created_at: str
    updated_at: str
    limits: ResourceLimits = field(default_factory=ResourceLimits)
    state_detail: str | None = None
    base_checkpoint: str | None = None
    head_checkpoint: str | None = None
    fork_generation: int = 0
    env: dict[str, str] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)
    policy: Policy | None = None
    standby: StandbyInfo | None = None
    ttl: str | None = None
    expires_at: str | None = None
    inactive_since: str | None = None
    init_pid: int | None = None
    oom_kills: int = 0
    #: Whether setuid binaries (``sudo``) take effect inside (no ``no_new_privs``).
    allow_setuid: bool = False
    #: Where ``/tmp`` lives: ``"disk"`` (part of the filesystem) or ``"tmpfs"`` (scratch).
    tmp: str = "disk"
    raw: dict[str, Any] = _raw()


@dataclass
class SandboxEvent(Model):
    """A lifecycle transition (``from_state`` -> ``to``) with its reason code."""

    seq: int
    sandbox_id: str
    time: str
    to: SandboxState
    reason: str
    duration_ms: int = 0
    from_state: SandboxState | None = field(default=None, metadata={"json": "from"})
    detail: str | None = None
    raw: dict[str, Any] = _raw()


@dataclass
class ResumeResult(Model):
    """Outcome of ``resume``: where from, how long it took, whether processes came back."""

    from_state: SandboxState = field(metadata={"json": "from"})
    duration_ms: int
    processes_restored: bool
    sandbox: Sandbox
    raw: dict[str, Any] = _raw()


@dataclass
class Lease(Model):
    """A keep-alive lease: the sandbox is not idle while it is held."""

    id: str
    sandbox_id: str
    created_at: str
    expires_at: str


# --- processes -------------------------------------------------------------


@dataclass
class ProcessInfo(Model):
    """A process started through the API (exec or background)."""

    id: int
    sandbox_id: str
    cmd: list[str]
    status: Literal["running", "exited"]
    started_at: str
    pid: int | None = None
    exit_code: int | None = None
    signal: int | None = None
    finished_at: str | None = None
    timed_out: bool = False
    oom_killed: bool = False
    spawn_error: str | None = None
    tty: dict[str, int] | None = None
    """``{"cols": .., "rows": ..}`` of its terminal, when it runs on one."""
    raw: dict[str, Any] = _raw()


@dataclass
class ExecResult:
    """Result of a command run to completion."""

    stdout: bytes
    """Standard output (bytes)."""
    stderr: bytes
    """Standard error (bytes)."""
    process: ProcessInfo
    """The final process record."""
    truncated: bool = False
    """Output exceeded the daemon's buffer and was cut."""
    resumed_from: str | None = None
    """State the sandbox was resumed from to run this (``strata-resumed-from``), if any."""
    resume_ms: int | None = None
    """How long that resume took, in milliseconds."""

    @property
    def exit_code(self) -> int | None:
        """Exit code (``None`` when killed by a signal or it failed to start)."""
        return self.process.exit_code

    @property
    def ok(self) -> bool:
        """Whether the command exited 0."""
        return self.process.exit_code == 0

    @property
    def stdout_text(self) -> str:
        """Standard output decoded as UTF-8 (invalid bytes replaced)."""
        return self.stdout.decode("utf-8", "replace")

    @property
    def stderr_text(self) -> str:
        """Standard error decoded as UTF-8 (invalid bytes replaced)."""
        return self.stderr.decode("utf-8", "replace")

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ExecResult:
        """Builds the result from an ``ExecResult`` JSON object (base64 output decoded)."""
        return cls(
            stdout=base64.b64decode(data.get("stdout_b64") or ""),
            stderr=base64.b64decode(data.get("stderr_b64") or ""),
            process=ProcessInfo.from_json(data["process"]),
            truncated=bool(data.get("truncated", False)),
        )


@dataclass
class ProcessEvent:
    """One event of a process's output stream (exec streaming, logs).

    ``type`` is ``"started"`` / ``"exited"`` (with ``process``), ``"output"``
    (with ``stream``, ``offset`` and ``data``) or ``"dropped"`` (``dropped_bytes``
    of output no longer held by the daemon's buffer).
    """

    type: Literal["started", "output", "dropped", "exited"]
    process: ProcessInfo | None = None
    stream: Literal["stdout", "stderr"] | None = None
    offset: int | None = None
    data: bytes = b""
    dropped_bytes: int = 0
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ProcessEvent:
        """Builds the event from one NDJSON line (decoded)."""
        return cls(
            type=data["type"],
            process=ProcessInfo.from_json(data["process"]) if data.get("process") else None,
            stream=data.get("stream"),
            offset=data.get("offset"),
            data=base64.b64decode(data["data_b64"]) if data.get("data_b64") else b"",
            dropped_bytes=int(data.get("bytes") or 0),
            raw=data,
        )


# --- files -----------------------------------------------------------------


@dataclass
class FileStat(Model):
    """Metadata of a path inside a sandbox."""

    name: str
    path: str
    kind: Literal["file", "dir", "symlink", "other"]
    size: int
    mode: int
    uid: int
    gid: int
    mtime: int
    link_target: str | None = None


@dataclass
class FileChange(Model):
    """One path of a diff since a checkpoint."""

    path: str
    change: Literal["added", "modified", "deleted"]
    kind: str
    size: int


# --- images, checkpoints, forks, templates ---------------------------------


@dataclass
class LayerInfo(Model):
    """A content-addressed layer."""

    digest: str
    size: int


@dataclass
class Image(Model):
    """A base image."""

    id: str
    name: str
    source: str
    source_kind: str
    created_at: str
    size: int
    layers: list[LayerInfo] = field(default_factory=list)
    config: dict[str, Any] = field(default_factory=dict)
    raw: dict[str, Any] = _raw()


@dataclass
class ImportReport(Model):
    """Outcome of an image import."""

    image: Image
    layers_new: int
    layers_reused: int
    bytes_stored: int
    duration_ms: int
    warnings: list[str] = field(default_factory=list)


@dataclass
class Checkpoint(Model):
    """An immutable, named point in a sandbox's history."""

    id: str
    name: str
    sandbox_id: str
    image: str
    image_id: str
    created_at: str
    layers: list[str]
    layer_size: int
    changed_paths: int
    duration_ms: int
    frozen_ms: int
    layer: str | None = None
    parent: str | None = None
    pinned: bool = False
    expires_at: str | None = None
    labels: dict[str, str] = field(default_factory=dict)
    raw: dict[str, Any] = _raw()


@dataclass
class RestoreResult(Model):
    """Outcome of a restore: the sandbox, and the checkpoint of the discarded state if kept."""

    sandbox: Sandbox
    kept: Checkpoint | None = None


@dataclass
class ForkResult(Model):
    """Outcome of a fork: the checkpoint forked from and the children's ids."""

    checkpoint: str
    duration_ms: int
    sandboxes: list[str]


@dataclass
class Template(Model):
    """A checkpoint promoted to a trusted starting point."""

    name: str
    checkpoint: str
    image: str
    layers: int
    created_at: str
    accepted_findings: dict[str, Any] | None = None
    built_from: str | None = None
    check_every: str | None = None
    on_findings: str = "record"
    last_check: dict[str, Any] | None = None
    raw: dict[str, Any] = _raw()


# --- cost ------------------------------------------------------------------


@dataclass
class ComputeCost(Model):
    """Compute part of a cost."""

    cpu: float
    memory: float
    total: float


@dataclass
class Counterfactual(Model):
    """What the same work would have cost under another lifecycle."""

    compute: ComputeCost
    storage: float
    total: float
    extra_seconds: float
    method: str


@dataclass
class CostReport(Model):
    """Cost of one sandbox: compute, storage by kind, total, and the counterfactuals."""

    sandbox_id: str
    name: str
    state: SandboxState
    total: float
    compute: ComputeCost
    storage: dict[str, float]
    storage_total: float
    lifetime_seconds: float
    ephemeral_only: Counterfactual
    always_on: Counterfactual
    prices: dict[str, Any] = field(default_factory=dict)
    usage: dict[str, Any] = field(default_factory=dict)
    raw: dict[str, Any] = _raw()


@dataclass
class CostSummary(Model):
    """Cost of every sandbox (destroyed ones included)."""

    total: float
    ephemeral_only_total: float
    always_on_total: float
    sandboxes: list[CostReport] = field(default_factory=list)
    prices: dict[str, Any] = field(default_factory=dict)
    raw: dict[str, Any] = _raw()


__all__ = [
    "Checkpoint",
    "ComputeCost",
    "CostReport",
    "CostSummary",
    "Counterfactual",
    "ExecResult",
    "FileChange",
    "FileStat",
    "ForkResult",
    "Image",
    "ImportReport",
    "LayerInfo",
    "Lease",
    "Lifecycle",
    "LifecycleHooks",
    "Model",
    "OnIdle",
    "Policy",
    "ProcessEvent",
    "ProcessInfo",
    "ResourceLimits",
    "RestoreResult",
    "ResumeResult",
    "Sandbox",
    "SandboxEvent",
    "SandboxState",
    "StandbyInfo",
    "Template",
]
