"""strata_sdk — Python SDK for the strata sandbox daemon.

Quickstart::

    from strata_sdk import Client

    c = Client()                      # $STRATA_SOCKET or /run/strata/strata.sock
    sb = c.create_sandbox("busybox", name="demo")
    print(c.exec(sb.id, ["echo", "hi"]).stdout)   # b'hi\\n'
    c.destroy(sb.id, force=True)

Everything is a method of :class:`Client`; results are dataclasses from
:mod:`strata_sdk.models`; failures raise :class:`StrataError` subclasses.
Fan-out (:meth:`Client.fanout`), pipelines (:meth:`Client.run_pipeline` and
friends) and the advisor (:meth:`Client.advise`) return the API's JSON as dicts.
"""

from .client import DEFAULT_SOCKET, Client
from .errors import (
    ApprovalRequired,
    BadRequest,
    Conflict,
    Forbidden,
    InsufficientResources,
    MetadataUnavailable,
    NotFound,
    QuotaExceeded,
    ServerError,
    StrataConnectionError,
    StrataError,
    Unauthorized,
    Unsupported,
)
from .models import (
    Checkpoint,
    ComputeCost,
    CostReport,
    CostSummary,
    Counterfactual,
    ExecResult,
    FileChange,
    FileStat,
    ForkResult,
    Image,
    ImportReport,
    LayerInfo,
    Lease,
    Lifecycle,
    LifecycleHooks,
    OnIdle,
    Policy,
    ProcessEvent,
    ProcessInfo,
    ResourceLimits,
    RestoreResult,
    ResumeResult,
    Sandbox,
    SandboxEvent,
    SandboxState,
    StandbyInfo,
    Template,
)

__version__ = "0.1.0"
"""Version of this SDK."""

__all__ = [
    "DEFAULT_SOCKET",
    "ApprovalRequired",
    "BadRequest",
    "Checkpoint",
    "Client",
    "ComputeCost",
    "Conflict",
    "Forbidden",
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
    "NotFound",
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
    "ServerError",
    "QuotaExceeded",
    "InsufficientResources",
    "MetadataUnavailable",
    "StandbyInfo",
    "StrataConnectionError",
    "StrataError",
    "Template",
    "Unauthorized",
    "Unsupported",
    "__version__",
]
