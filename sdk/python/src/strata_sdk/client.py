"""The strata client: every daemon API area as typed methods.

Only the standard library is used: ``http.client`` over the daemon's Unix
socket (default) or over TCP with a bearer token.
"""

from __future__ import annotations

import base64
import http.client
import json
import os
import socket
import urllib.parse
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, BinaryIO

from .errors import NotFound, StrataConnectionError, StrataError, error_from_response
from .models import (
    Checkpoint,
    CostReport,
    CostSummary,
    ExecResult,
    FileChange,
    FileStat,
    ForkResult,
    Image,
    ImportReport,
    Lease,
    Lifecycle,
    Policy,
    ProcessEvent,
    ProcessInfo,
    ResourceLimits,
    RestoreResult,
    ResumeResult,
    Sandbox,
    SandboxEvent,
    Template,
)

DEFAULT_SOCKET = "/run/strata/strata.sock"
"""Socket used when neither ``socket``/``url`` nor ``STRATA_SOCKET`` is given."""

_NO_TIMEOUT = object()


class _UnixHTTPConnection(http.client.HTTPConnection):
    """An HTTPConnection over a Unix domain socket."""

    def __init__(self, path: str, timeout: float | None) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self._path)
        except OSError:
            sock.close()
            raise
        self.sock = sock


def _b64(data: bytes | str) -> str:
    if isinstance(data, str):
        data = data.encode()
    return base64.b64encode(data).decode("ascii")


def _seg(value: str | int) -> str:
    return urllib.parse.quote(str(value), safe="")


def _drop_none(d: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if v is not None}


class _Response:
    """An open HTTP response and its connection (closed together)."""

    def __init__(self, conn: http.client.HTTPConnection, resp: http.client.HTTPResponse, where: str) -> None:
        self.conn = conn
        self.resp = resp
        self.where = where

    def read(self) -> bytes:
        try:
            return self.resp.read()
        except (OSError, http.client.HTTPException) as e:
            raise StrataConnectionError(f"connection to strata daemon at {self.where} lost: {e}") from e
        finally:
            self.close()

    def lines(self) -> Iterator[dict[str, Any]]:
        """Decoded NDJSON objects as they arrive; closes the connection at the end (or when abandoned)."""
        try:
            while True:
                try:
                    line = self.resp.readline()
                except (OSError, http.client.HTTPException) as e:
                    raise StrataConnectionError(f"stream from strata daemon at {self.where} broke: {e}") from e
                if not line:
                    return
                line = line.strip()
                if line:
                    yield json.loads(line)
        finally:
            self.close()

    def close(self) -> None:
        self.resp.close()
        self.conn.close()


class Client:
    """A connection to a strata daemon.

    Args:
        socket: Path of the daemon's Unix socket. Defaults to ``$STRATA_SOCKET``,
            else ``/run/strata/strata.sock``. Ignored when ``url`` is given.
        url: ``http://host:port`` of a daemon started with ``--listen`` (TCP).
        token: Bearer token for TCP: a tenant token from ``strata token create``
            (sees only its tenant) or the operator's ``<state-dir>/api-token``;
            defaults to ``$STRATA_TOKEN``.
        timeout: Socket timeout in seconds for ordinary requests. Calls that wait
            for work to finish (exec, streams, wait, follow) are not limited by it
            unless you pass their own ``request_timeout``.

    Each call opens its own connection, so a client may be shared between threads.
    """

    def __init__(
        self,
        socket: str | os.PathLike[str] | None = None,
        *,
        url: str | None = None,
        token: str | None = None,
        timeout: float | None = 300.0,
    ) -> None:
        self.timeout = timeout
        self.token = token if token is not None else os.environ.get("STRATA_TOKEN")
        self.url = url
        self.socket_path: str | None = None
        if url is not None:
            parts = urllib.parse.urlsplit(url)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise ValueError(f"url must be http(s)://host:port, got {url!r}")
            self._scheme = parts.scheme
            self._host = parts.hostname
            self._port = parts.port
            self._prefix = parts.path.rstrip("/")
        else:
            self.socket_path = os.fspath(socket) if socket is not None else os.environ.get("STRATA_SOCKET") or DEFAULT_SOCKET
            self._prefix = ""

    def __repr__(self) -> str:
        return f"Client({self._where()!r})"

    # --- transport ---------------------------------------------------------

    def _where(self) -> str:
        return self.url if self.url is not None else f"unix:{self.socket_path}"

    def _connection(self, timeout: float | None) -> http.client.HTTPConnection:
        if self.url is None:
            assert self.socket_path is not None
            return _UnixHTTPConnection(self.socket_path, timeout)
        if self._scheme == "https":
            return http.client.HTTPSConnection(self._host, self._port, timeout=timeout)
        return http.client.HTTPConnection(self._host, self._port, timeout=timeout)

    def _open(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, Any] | None = None,
        json_body: Any = None,
        body: bytes | BinaryIO | None = None,
        content_type: str | None = None,
        timeout: Any = None,
    ) -> _Response:
        """Sends a request and returns the open response; raises the mapped StrataError on >= 400."""
        if query:
            q = {k: ("true" if v is True else "false" if v is False else v) for k, v in query.items() if v is not None}
            if q:
                path = f"{path}?{urllib.parse.urlencode(q)}"
        headers = {"accept": "application/json, application/x-ndjson, */*"}
        if self.token and self.url is not None:
            headers["authorization"] = f"Bearer {self.token}"
        data: bytes | BinaryIO | None = body
        if json_body is not None:
            data = json.dumps(json_body).encode()
            headers["content-type"] = "application/json"
        elif content_type:
            headers["content-type"] = content_type
        t = None if timeout is _NO_TIMEOUT else (self.timeout if timeout is None else timeout)
        conn = self._connection(t)
        try:
            conn.request(method, self._prefix + path, body=data, headers=headers)
            resp = conn.getresponse()
        except (FileNotFoundError, ConnectionRefusedError, PermissionError) as e:
            conn.close()
            hint = "is `strata daemon` running with --listen?" if self.url is not None else "is `strata daemon` running? set STRATA_SOCKET or pass socket="
            raise StrataConnectionError(f"cannot connect to strata daemon at {self._where()}: {e} ({hint})") from e
        except (OSError, http.client.HTTPException) as e:
            conn.close()
            raise StrataConnectionError(f"request {method} {path} to strata daemon at {self._where()} failed: {e}") from e
        r = _Response(conn, resp, self._where())
        if resp.status >= 400:
            raw = r.read()
            try:
                err = json.loads(raw) if raw else None
            except ValueError:
                err = None
            fallback = raw.decode("utf-8", "replace").strip() or f"HTTP {resp.status} {resp.reason}"
            raise error_from_response(resp.status, err if isinstance(err, dict) else None, fallback)
        return r

    def _json(self, method: str, path: str, **kw: Any) -> Any:
        raw = self._open(method, path, **kw).read()
        return json.loads(raw) if raw else None

    def _obj(self, method: str, path: str, **kw: Any) -> dict[str, Any]:
        value = self._json(method, path, **kw)
        if not isinstance(value, dict):
            raise StrataError(f"{method} {path}: expected a JSON object, got {type(value).__name__}")
        return value

    def _sb(self, sandbox: str) -> str:
        return f"/v1/sandboxes/{_seg(sandbox)}"

    # --- daemon ------------------------------------------------------------

    def info(self) -> dict[str, Any]:
        """Daemon version, state directory and counts (``GET /v1/info``)."""
        return self._obj("GET", "/v1/info")

    def doctor(self) -> dict[str, Any]:
        """What this host supports: isolation tiers and features such as CRIU (``GET /v1/doctor``)."""
        return self._obj("GET", "/v1/doctor")

    # --- images ------------------------------------------------------------

    def list_images(self) -> list[Image]:
        """All images."""
        return [Image.from_json(x) for x in self._json("GET", "/v1/images")]

    def get_image(self, name: str) -> Image:
        """One image by name or id."""
        return Image.from_json(self._json("GET", f"/v1/images/{_seg(name)}"))

    def import_image(self, source: str | os.PathLike[str], name: str, *, replace: bool = False, trusted: bool = False) -> ImportReport:
        """Imports an image from a path on the daemon's host (OCI layout, ``docker save`` archive, rootfs tar or directory)."""
        body = {"source": os.fspath(source), "name": name, "replace": replace, "trusted": trusted}
        return ImportReport.from_json(self._json("POST", "/v1/images/import", json_body=body, timeout=_NO_TIMEOUT))

    def pull_image(self, reference: str, *, name: str | None = None, insecure: bool = False) -> ImportReport:
        """Pulls an image from a registry (anonymous; ``insecure`` for plain HTTP)."""
        body = _drop_none({"reference": reference, "name": name, "insecure": insecure})
        return ImportReport.from_json(self._json("POST", "/v1/images/pull", json_body=body, timeout=_NO_TIMEOUT))

    def remove_image(self, name: str) -> None:
        """Removes an image (:class:`Conflict` ``in_use`` while sandboxes use it)."""
        self._open("DELETE", f"/v1/images/{_seg(name)}").read()

    # --- sandboxes ---------------------------------------------------------

    def create_sandbox(
        self,
        source: str,
        *,
        name: str | None = None,
        lifecycle: Lifecycle | None = None,
        ttl: str | None = None,
        env: Mapping[str, str] | None = None,
        labels: Mapping[str, str] | None = None,
        hostname: str | None = None,
        limits: ResourceLimits | None = None,
        policy: Policy | None = None,
        network: Mapping[str, Any] | None = None,
        capabilities: list[str] | None = None,
        allow_setuid: bool = False,
        isolation: str | None = None,
        tmp: str | None = None,
        processes: bool | None = None,
    ) -> Sandbox:
        """Creates and starts a sandbox from an image, checkpoint or template; returns it (running).

        Args:
            source: Image name/id, checkpoint id/name or template name.
            name: Unique name (optional).
            lifecycle: ``"ephemeral"`` or ``"persistent"``.
            ttl: Time to live, e.g. ``"10m"``.
            env: Environment variables for every process.
            labels: Free-form labels.
            hostname: Hostname inside (default: the short id).
            limits: CPU / memory / pids limits.
            policy: Lifecycle policy (``on_idle``, ``idle_timeout``, ``max_lifetime``, ...).
            network: ``{"mode": "egress", "allow": ["pypi.org", "10.0.0.0/8:443"]}``
                (default: ``none``, loopback only); see docs/network.md.
            capabilities: Rule-of-Two capabilities to declare (``"untrusted_input"``,
                ``"sensitive_access"``, ``"external_comms"``). A sandbox that would hold
                all three raises :class:`ApprovalRequired` until an operator approves it.
            allow_setuid: Let setuid binaries (``sudo``) take effect inside; they reach
                the sandbox's root with its reduced capabilities, no more.
            isolation: ``"namespace"``, ``"gvisor"`` or ``"microvm"`` (default: the
                daemon's, or the tier of the checkpoint or template); a tier the host
                cannot run raises with status 501 naming what is missing.
            tmp: Where ``/tmp`` lives: ``"disk"`` (part of the filesystem, kept in
                checkpoints, forks and templates; the default) or ``"tmpfs"`` (scratch,
                never kept). From a checkpoint or template: its sandbox's.
            processes: From a warm checkpoint or template: start with its processes
                running (the default) or ``False`` for its files only.
        """
        body = _drop_none(
            {
                "source": source,
                "name": name,
                "lifecycle": lifecycle,
                "ttl": ttl,
                "env": dict(env) if env else None,
                "labels": dict(labels) if labels else None,
                "hostname": hostname,
                "limits": limits.to_json() if limits else None,
                "policy": policy.to_json() if policy else None,
                "network": dict(network) if network else None,
                "capabilities": list(capabilities) if capabilities else None,
                "allow_setuid": True if allow_setuid else None,
                "isolation": isolation,
                "tmp": tmp,
                "processes": processes,
            }
        )
        created = self._json("POST", "/v1/sandboxes", json_body=body)
        return self.get_sandbox(created["id"])

    def list_sandboxes(self) -> list[Sandbox]:
        """All sandboxes that are not destroyed."""
        return [Sandbox.from_json(x) for x in self._json("GET", "/v1/sandboxes")]

    def get_sandbox(self, sandbox: str) -> Sandbox:
        """One sandbox by id, unique id prefix or name (:class:`NotFound` ``sandbox_not_found``)."""
        return Sandbox.from_json(self._json("GET", self._sb(sandbox)))

    def update_policy(self, sandbox: str, policy: Policy) -> Sandbox:
        """Changes the lifecycle policy; fields left ``None`` are kept. Returns the sandbox."""
        return Sandbox.from_json(self._json("PATCH", self._sb(sandbox), json_body={"policy": policy.to_json()}))

    def declare_capabilities(self, sandbox: str, capabilities: list[str]) -> Sandbox:
        """Declares further Rule-of-Two capabilities (they only grow); :class:`ApprovalRequired`
        when the sandbox would then hold all three."""
        current = [c for c in (self._obj("GET", self._sb(sandbox)).get("policy") or {}).get("capabilities") or []]
        merged = sorted(set(current) | set(capabilities))
        return Sandbox.from_json(self._json("PATCH", self._sb(sandbox), json_body={"capabilities": merged}))

    # --- Rule-of-Two approvals ----------------------------------------------

    def list_approvals(self, state: str | None = None) -> list[dict[str, Any]]:
        """Approvals (a tenant sees its own), optionally only ``pending``, ``approved``, ``denied`` or ``used``."""
        return list(self._json("GET", "/v1/approvals", query=_drop_none({"state": state})))

    def get_approval(self, approval: str) -> dict[str, Any]:
        """One approval (:class:`NotFound` ``approval_not_found``)."""
        return self._obj("GET", f"/v1/approvals/{_seg(approval)}")

    def approve(self, approval: str, reason: str | None = None) -> dict[str, Any]:
        """Approves a pending approval (operator only); the held request may then be repeated once."""
        return self._obj("POST", f"/v1/approvals/{_seg(approval)}/approve", json_body=_drop_none({"reason": reason}))

    def deny(self, approval: str, reason: str | None = None) -> dict[str, Any]:
        """Denies a pending approval (operator only)."""
        return self._obj("POST", f"/v1/approvals/{_seg(approval)}/deny", json_body=_drop_none({"reason": reason}))

    def get_network(self, sandbox: str) -> dict[str, Any]:
        """The sandbox's network: ``mode``, ``allow``, ``address``, ``gateway``, counters
        (``allowed``/``denied``/``received`` as ``{packets, bytes}``), ``dns_answered``,
        ``dns_refused``, ``recent_denied``."""
        return self._json("GET", self._sb(sandbox) + "/network")

    def set_network(
        self, sandbox: str, mode: str = "egress", allow: Sequence[str] = (), deny: Sequence[str] = ()
    ) -> dict[str, Any]:
        """Replaces the network mode, allow rules and deny rules (exceptions to an
        ``0.0.0.0/0`` allow rule), live when it runs (:class:`BadRequest` naming a
        malformed rule). Returns what :meth:`get_network` returns."""
        body: dict[str, Any] = {"mode": mode, "allow": list(allow)}
        if deny:
            body["deny"] = list(deny)
        return self._json("PUT", self._sb(sandbox) + "/network", json_body=body)

    def stop(self, sandbox: str) -> SandboxEvent:
        """Stops the sandbox (processes end, filesystem kept)."""
        return SandboxEvent.from_json(self._json("POST", self._sb(sandbox) + "/stop"))

    def start(self, sandbox: str) -> Sandbox:
        """Starts a stopped sandbox again (an archived one is restored first)."""
        return Sandbox.from_json(self._json("POST", self._sb(sandbox) + "/start", timeout=_NO_TIMEOUT))

    def destroy(self, sandbox: str, *, force: bool = False) -> SandboxEvent:
        """Destroys the sandbox (a running one needs ``force=True``)."""
        return SandboxEvent.from_json(self._json("DELETE", self._sb(sandbox), query={"force": force or None}))

    def pause(self, sandbox: str) -> SandboxEvent:
        """Freezes the sandbox's processes (memory kept, no CPU)."""
        return SandboxEvent.from_json(self._json("POST", self._sb(sandbox) + "/pause"))

    def unpause(self, sandbox: str) -> SandboxEvent:
        """Thaws a paused sandbox."""
        return SandboxEvent.from_json(self._json("POST", self._sb(sandbox) + "/unpause"))

    def standby(self, sandbox: str, *, fs_only: bool = False) -> SandboxEvent:
        """Dumps processes and memory to disk and releases CPU and RAM.

        Raises :class:`Unsupported` when the host cannot checkpoint processes (no
        CRIU), unless ``fs_only=True`` (keeps only the filesystem, recorded on the sandbox).
        """
        return SandboxEvent.from_json(self._json("POST", self._sb(sandbox) + "/standby", json_body={"fs_only": fs_only}, timeout=_NO_TIMEOUT))

    def resume(self, sandbox: str) -> ResumeResult:
        """Brings a sandbox back from standby / paused / stopped / archived; reports the duration."""
        return ResumeResult.from_json(self._json("POST", self._sb(sandbox) + "/resume", timeout=_NO_TIMEOUT))

    def archive(self, sandbox: str) -> SandboxEvent:
        """Packs a stopped or standby sandbox into the archive store and frees its local copy."""
        return SandboxEvent.from_json(self._json("POST", self._sb(sandbox) + "/archive", timeout=_NO_TIMEOUT))

    # --- leases ------------------------------------------------------------

    def take_lease(self, sandbox: str, duration: str) -> Lease:
        """Takes a keep-alive lease (e.g. ``"30m"``): the sandbox is not idle while it is held."""
        return Lease.from_json(self._json("POST", self._sb(sandbox) + "/leases", json_body={"for": duration}))

    def list_leases(self, sandbox: str) -> list[Lease]:
        """Leases held on the sandbox."""
        return [Lease.from_json(x) for x in self._json("GET", self._sb(sandbox) + "/leases")]

    def renew_lease(self, sandbox: str, lease: str, duration: str) -> Lease:
        """Extends a lease to expire ``duration`` from now."""
        return Lease.from_json(self._json("POST", self._sb(sandbox) + f"/leases/{_seg(lease)}/renew", json_body={"for": duration}))

    def release_lease(self, sandbox: str, lease: str) -> None:
        """Releases a lease."""
        self._open("DELETE", self._sb(sandbox) + f"/leases/{_seg(lease)}").read()

    # --- exec and processes ------------------------------------------------

    @staticmethod
    def _exec_body(
        cmd: Sequence[str] | str,
        stdin: bytes | str | None,
        env: Mapping[str, str] | None,
        cwd: str | None,
        user: str | None,
        timeout: str | None,
        keep_stdin_open: bool = False,
        tty: tuple[int, int] | None = None,
    ) -> dict[str, Any]:
        if isinstance(cmd, str):
            cmd = ["sh", "-c", cmd]
        body: dict[str, Any] = {"cmd": list(cmd)}
        if stdin is not None:
            body["stdin_b64"] = _b64(stdin)
        if env:
            body["env"] = dict(env)
        if cwd is not None:
            body["cwd"] = cwd
        if user is not None:
            body["user"] = user
        if timeout is not None:
            body["timeout"] = timeout
        if keep_stdin_open:
            body["keep_stdin_open"] = True
        if tty is not None:
            body["tty"] = {"cols": tty[0], "rows": tty[1]}
        return body

    def exec(
        self,
        sandbox: str,
        cmd: Sequence[str] | str,
        *,
        stdin: bytes | str | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        user: str | None = None,
        timeout: str | None = None,
        request_timeout: float | None = None,
    ) -> ExecResult:
        """Runs a command to completion and returns its output and exit code.

        Args:
            sandbox: Sandbox id or name (a standby/paused/stopped one is resumed first;
                ``ExecResult.resumed_from`` says so).
            cmd: Program and arguments, or a string run with ``sh -c``.
            stdin: Bytes (or text) written to stdin, which is then closed.
            env: Extra environment variables.
            cwd: Working directory inside the sandbox.
            user: User name or ``uid[:gid]``.
            timeout: Kill the process after this long (daemon side), e.g. ``"30s"``.
            request_timeout: Client-side socket timeout in seconds (default: none).

        A non-zero exit is not an exception: check ``result.exit_code`` / ``result.ok``.
        """
        body = self._exec_body(cmd, stdin, env, cwd, user, timeout)
        r = self._open("POST", self._sb(sandbox) + "/exec", json_body=body, timeout=request_timeout if request_timeout is not None else _NO_TIMEOUT)
        resumed_from = r.resp.getheader("strata-resumed-from")
        resume_ms = r.resp.getheader("strata-resume-ms")
        result = ExecResult.from_json(json.loads(r.read()))
        result.resumed_from = resumed_from
        result.resume_ms = int(resume_ms) if resume_ms and resume_ms.isdigit() else None
        return result

    def exec_stream(
        self,
        sandbox: str,
        cmd: Sequence[str] | str,
        *,
        stdin: bytes | str | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        user: str | None = None,
        timeout: str | None = None,
        request_timeout: float | None = None,
    ) -> Iterator[ProcessEvent]:
        """Runs a command and yields its events as they happen.

        Yields a ``started`` event, then ``output`` events (``event.stream``,
        ``event.data``) while it runs, then ``exited`` (``event.process.exit_code``).
        Arguments as for :meth:`exec`. Closing the iterator early closes the connection.
        """
        body = self._exec_body(cmd, stdin, env, cwd, user, timeout)
        r = self._open("POST", self._sb(sandbox) + "/exec", query={"stream": True}, json_body=body, timeout=request_timeout if request_timeout is not None else _NO_TIMEOUT)
        return (ProcessEvent.from_json(x) for x in r.lines())

    def start_process(
        self,
        sandbox: str,
        cmd: Sequence[str] | str,
        *,
        stdin: bytes | str | None = None,
        keep_stdin_open: bool = False,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        user: str | None = None,
        timeout: str | None = None,
        tty: tuple[int, int] | None = None,
    ) -> ProcessInfo:
        """Starts a background process and returns at once (use :meth:`process_logs`, :meth:`wait_process`).

        ``keep_stdin_open=True`` lets you write to it later with :meth:`write_stdin`.
        ``tty=(cols, rows)`` runs it on a terminal of that size inside the sandbox
        (its output is one stream; type into it with :meth:`write_stdin`, resize
        it with :meth:`resize_tty`).
        """
        body = self._exec_body(cmd, stdin, env, cwd, user, timeout, keep_stdin_open, tty)
        return ProcessInfo.from_json(self._json("POST", self._sb(sandbox) + "/processes", json_body=body))

    def list_processes(self, sandbox: str) -> list[ProcessInfo]:
        """Processes started through the API (running and finished)."""
        return [ProcessInfo.from_json(x) for x in self._json("GET", self._sb(sandbox) + "/processes")]

    def get_process(self, sandbox: str, process: int) -> ProcessInfo:
        """One process by its API id (``ProcessInfo.id``)."""
        return ProcessInfo.from_json(self._json("GET", self._sb(sandbox) + f"/processes/{_seg(process)}"))

    def process_logs(self, sandbox: str, process: int, *, offset: int = 0, follow: bool = False) -> Iterator[ProcessEvent]:
        """A process's buffered output from ``offset``; with ``follow=True`` keeps streaming until it exits.

        Yields ``output`` events (and ``dropped`` when the buffer no longer holds
        ``offset``; with ``follow``, a final ``exited``).
        """
        r = self._open(
            "GET",
            self._sb(sandbox) + f"/processes/{_seg(process)}/logs",
            query={"offset": offset, "follow": follow or None},
            timeout=_NO_TIMEOUT if follow else None,
        )
        return (ProcessEvent.from_json(x) for x in r.lines())

    def process_output(self, sandbox: str, process: int) -> bytes:
        """Convenience: the buffered output of a process so far (stdout and stderr interleaved)."""
        return b"".join(e.data for e in self.process_logs(sandbox, process) if e.type == "output")

    def write_stdin(self, sandbox: str, process: int, data: bytes | str = b"", *, close: bool = False) -> None:
        """Writes to a process's stdin (started with ``keep_stdin_open``); ``close=True`` closes it after."""
        body: dict[str, Any] = {"data_b64": _b64(data), "close": close}
        self._open("POST", self._sb(sandbox) + f"/processes/{_seg(process)}/stdin", json_body=body).read()

    def resize_tty(self, sandbox: str, process: int, cols: int, rows: int) -> ProcessInfo:
        """Resizes the terminal of a process started with ``tty``."""
        body = {"cols": cols, "rows": rows}
        return ProcessInfo.from_json(self._json("POST", self._sb(sandbox) + f"/processes/{_seg(process)}/resize", json_body=body))

    def signal_process(self, sandbox: str, process: int, signal: str | int = "TERM") -> ProcessInfo:
        """Sends a signal (``"TERM"``, ``"KILL"``, ``"SIGINT"``, or a number)."""
        return ProcessInfo.from_json(self._json("POST", self._sb(sandbox) + f"/processes/{_seg(process)}/signal", json_body={"signal": str(signal)}))

    def wait_process(self, sandbox: str, process: int, *, timeout: str | None = None) -> ProcessInfo:
        """Waits for a process to exit (or ``timeout``, e.g. ``"10s"``, to pass) and returns its record."""
        return ProcessInfo.from_json(self._json("POST", self._sb(sandbox) + f"/processes/{_seg(process)}/wait", query={"timeout": timeout}, timeout=_NO_TIMEOUT))

    # --- files -------------------------------------------------------------

    def upload(self, sandbox: str, path: str, data: bytes | str | BinaryIO, *, mode: int | None = None) -> None:
        """Writes a file inside the sandbox (parents must exist); ``mode`` e.g. ``0o755``."""
        if isinstance(data, str):
            data = data.encode()
        self._open("PUT", self._sb(sandbox) + "/files", query={"path": path, "mode": mode}, body=data, content_type="application/octet-stream", timeout=_NO_TIMEOUT).read()

    def upload_file(self, sandbox: str, local: str | os.PathLike[str], path: str, *, mode: int | None = None) -> None:
        """Uploads a local file to ``path`` inside the sandbox (streamed)."""
        with open(local, "rb") as f:
            self.upload(sandbox, path, f, mode=mode)

    def download(self, sandbox: str, path: str) -> bytes:
        """Reads a file from the sandbox."""
        return self._open("GET", self._sb(sandbox) + "/files", query={"path": path}, timeout=_NO_TIMEOUT).read()

    def download_file(self, sandbox: str, path: str, local: str | os.PathLike[str]) -> None:
        """Copies a file from the sandbox to a local path (streamed)."""
        r = self._open("GET", self._sb(sandbox) + "/files", query={"path": path}, timeout=_NO_TIMEOUT)
        try:
            with open(local, "wb") as f:
                while chunk := r.resp.read(1 << 16):
                    f.write(chunk)
        finally:
            r.close()

    def upload_tar(self, sandbox: str, path: str, tar: bytes | BinaryIO) -> None:
        """Unpacks a tar archive into the existing directory ``path`` inside the sandbox.

        Hostile entries (``..``, absolute links out) are refused with :class:`BadRequest`.
        Parent directories of entries must be in the archive (or exist already).
        """
        self._open("PUT", self._sb(sandbox) + "/files", query={"path": path, "tar": True}, body=tar, content_type="application/x-tar", timeout=_NO_TIMEOUT).read()

    def download_tar(self, sandbox: str, path: str) -> bytes:
        """A tar archive of the tree at ``path`` inside the sandbox.

        Entries are named under the directory's base name (``/srv/tree`` gives
        ``tree/...``), so unpack it with :meth:`upload_tar` into the parent directory.
        """
        return self._open("GET", self._sb(sandbox) + "/files", query={"path": path, "tar": True}, timeout=_NO_TIMEOUT).read()

    def stat(self, sandbox: str, path: str) -> FileStat:
        """Metadata of a path (:class:`NotFound` ``file_not_found`` if missing)."""
        return FileStat.from_json(self._json("GET", self._sb(sandbox) + "/files/stat", query={"path": path}))

    def list_files(self, sandbox: str, path: str) -> list[FileStat]:
        """Entries of a directory."""
        return [FileStat.from_json(x) for x in self._json("GET", self._sb(sandbox) + "/files/list", query={"path": path})]

    def mkdir(self, sandbox: str, path: str, *, parents: bool = False) -> None:
        """Creates a directory (``parents=True``: like ``mkdir -p``)."""
        self._open("POST", self._sb(sandbox) + "/files/mkdir", json_body={"path": path, "parents": parents}).read()

    def remove(self, sandbox: str, path: str, *, recursive: bool = False) -> None:
        """Removes a file, or a directory tree with ``recursive=True``."""
        self._open("POST", self._sb(sandbox) + "/files/remove", json_body={"path": path, "recursive": recursive}).read()

    def move(self, sandbox: str, src: str, dst: str) -> None:
        """Renames/moves a path inside the sandbox."""
        self._open("POST", self._sb(sandbox) + "/files/move", json_body={"from": src, "to": dst}).read()

    # --- checkpoints, restore, diff ------------------------------------------

    def checkpoint(
        self,
        sandbox: str,
        *,
        name: str | None = None,
        labels: Mapping[str, str] | None = None,
        pinned: bool = False,
        ttl: str | None = None,
    ) -> Checkpoint:
        """Checkpoints the sandbox's filesystem (only what changed since the last checkpoint is stored)."""
        body = _drop_none({"name": name, "labels": dict(labels) if labels else None, "pinned": pinned or None, "ttl": ttl})
        return Checkpoint.from_json(self._json("POST", self._sb(sandbox) + "/checkpoints", json_body=body, timeout=_NO_TIMEOUT))

    def list_checkpoints(self, sandbox: str | None = None) -> list[Checkpoint]:
        """All checkpoints, or those of one sandbox."""
        path = self._sb(sandbox) + "/checkpoints" if sandbox is not None else "/v1/checkpoints"
        return [Checkpoint.from_json(x) for x in self._json("GET", path)]

    def get_checkpoint(self, checkpoint: str) -> Checkpoint:
        """One checkpoint by id or name."""
        return Checkpoint.from_json(self._json("GET", f"/v1/checkpoints/{_seg(checkpoint)}"))

    def delete_checkpoint(self, checkpoint: str) -> None:
        """Deletes a checkpoint (:class:`Conflict` ``in_use`` with ``dependents`` while still needed)."""
        self._open("DELETE", f"/v1/checkpoints/{_seg(checkpoint)}").read()

    def restore(self, sandbox: str, checkpoint: str, *, keep_current: bool = False) -> RestoreResult:
        """Rolls the sandbox back to a checkpoint; ``keep_current=True`` checkpoints the discarded state first."""
        body = {"checkpoint": checkpoint, "keep_current": keep_current}
        return RestoreResult.from_json(self._json("POST", self._sb(sandbox) + "/restore", json_body=body, timeout=_NO_TIMEOUT))

    def diff(self, sandbox: str, *, against: str | None = None) -> list[FileChange]:
        """Paths changed since the last checkpoint (or since checkpoint ``against``)."""
        return [FileChange.from_json(x) for x in self._json("GET", self._sb(sandbox) + "/diff", query={"against": against})]

    def export(self, sandbox: str, *, against: str | None = None) -> bytes:
        """The same change set as an OCI layer tar."""
        return self._open("GET", self._sb(sandbox) + "/export", query={"against": against}, timeout=_NO_TIMEOUT).read()

    # --- fork and templates ------------------------------------------------

    def fork(
        self,
        source: str,
        count: int,
        *,
        lifecycle: Lifecycle | None = None,
        ttl: str | None = None,
        name_prefix: str | None = None,
        limits: ResourceLimits | None = None,
    ) -> ForkResult:
        """Forks ``count`` sandboxes from a checkpoint, or from a live sandbox (checkpointed first).

        Each child has its own copy-on-write layer and a fresh identity;
        ``ForkResult.sandboxes`` lists their ids (see also :meth:`fork_sandboxes`).
        """
        body = _drop_none(
            {"source": source, "count": count, "lifecycle": lifecycle, "ttl": ttl, "name_prefix": name_prefix, "limits": limits.to_json() if limits else None}
        )
        return ForkResult.from_json(self._json("POST", "/v1/fork", json_body=body, timeout=_NO_TIMEOUT))

    def fork_sandboxes(self, source: str, count: int, **kwargs: Any) -> list[Sandbox]:
        """Like :meth:`fork`, returning the children as :class:`Sandbox` records."""
        return [self.get_sandbox(i) for i in self.fork(source, count, **kwargs).sandboxes]

    def create_template(self, name: str, source: str, *, accept_findings: bool = False, replace: bool = False) -> Template:
        """Promotes a checkpoint (or a sandbox, checkpointed first) to a template.

        Refused with :class:`Conflict` ``scan_findings`` (see ``.findings``) unless the
        state-hygiene scan is clean or ``accept_findings=True`` (recorded on the template).
        """
        body = {"name": name, "from": source, "accept_findings": accept_findings, "replace": replace}
        return Template.from_json(self._json("POST", "/v1/templates", json_body=body, timeout=_NO_TIMEOUT))

    def list_templates(self) -> list[Template]:
        """All templates."""
        return [Template.from_json(x) for x in self._json("GET", "/v1/templates")]

    def get_template(self, name: str) -> Template:
        """One template by name (searched in the listing)."""
        for t in self.list_templates():
            if t.name == name:
                return t
        raise NotFound(f"no template named {name!r}", status=404, code="not_found")

    def delete_template(self, name: str) -> None:
        """Removes a template (its checkpoint stays)."""
        self._open("DELETE", f"/v1/templates/{_seg(name)}").read()

    def build_template(self, name: str, file: str, *, context: str | None = None, accept_findings: bool = False, no_cache: bool = False) -> Iterator[dict[str, Any]]:
        """Builds a template from a Dockerfile subset at ``file`` (a path on the daemon's host).

        Yields the daemon's ``BuildEvent`` objects (``step``, output, result) as dicts.
        """
        body = _drop_none({"name": name, "file": file, "context": context, "accept_findings": accept_findings, "no_cache": no_cache})
        return self._open("POST", "/v1/templates/build", json_body=body, timeout=_NO_TIMEOUT).lines()

    def scan(self, target: str) -> dict[str, Any]:
        """State-hygiene scan of a sandbox or checkpoint (``ScanReport``)."""
        return self._obj("GET", f"/v1/scan/{_seg(target)}", timeout=_NO_TIMEOUT)

    def check(self, sandbox: str) -> dict[str, Any]:
        """Checks a sandbox now as its ``check_every`` would: the scan and its
        accumulation, then its ``on_findings`` (``CheckReport``; a parked sandbox is not resumed)."""
        return self._obj("POST", f"/v1/sandboxes/{_seg(sandbox)}/check", timeout=_NO_TIMEOUT)

    def accumulation(self, sandbox: str) -> dict[str, Any]:
        """What a sandbox has accumulated (``Accumulation``: writable layer, checkpoints, base age)."""
        return self._obj("GET", f"/v1/sandboxes/{_seg(sandbox)}/accumulation", timeout=_NO_TIMEOUT)

    def quarantine(self, target: str, reason: str) -> dict[str, Any]:
        """Quarantines a sandbox or checkpoint: no fork, template, start from it or egress (``QuarantineEntry``)."""
        return self._obj("POST", f"/v1/quarantine/{_seg(target)}", json_body={"reason": reason})

    def lift_quarantine(self, target: str, reason: str) -> dict[str, Any]:
        """Lifts a quarantine (operator only; the reason is recorded)."""
        return self._obj("DELETE", f"/v1/quarantine/{_seg(target)}", json_body={"reason": reason})

    def quarantined(self) -> list[dict[str, Any]]:
        """The quarantined sandboxes and checkpoints."""
        return list(self._json("GET", "/v1/quarantine"))

    def set_template_policy(self, name: str, *, check_every: str | None = None, on_findings: str | None = None) -> Template:
        """Sets a template's checks at set times (``check_every``, ``on_findings``: ``record`` or ``quarantine``)."""
        body = _drop_none({"check_every": check_every, "on_findings": on_findings})
        return Template.from_json(self._obj("PATCH", f"/v1/templates/{_seg(name)}", json_body=body))

    def check_template(self, name: str) -> dict[str, Any]:
        """Checks a template now (``TemplateCheckReport``; kept as its ``last_check``)."""
        return self._obj("POST", f"/v1/templates/{_seg(name)}/check", timeout=_NO_TIMEOUT)

    def image_versions(self, name: str) -> list[dict[str, Any]]:
        """Every imported version of an image name, newest first (``Image`` with ``version``, ``previous``)."""
        return list(self._json("GET", f"/v1/images/{_seg(name)}/versions"))

    def outdated(self) -> list[dict[str, Any]]:
        """Sandboxes, checkpoints and templates on an older version of their image (``OutdatedEntry``)."""
        return list(self._json("GET", "/v1/outdated"))

    def rebase(self, sandbox: str, onto: str, *, prefer: str | None = None) -> dict[str, Any]:
        """Moves a stopped or standby sandbox's writable layer onto image ``onto`` (``RebaseReport``).

        Processes do not survive: the sandbox is stopped afterwards. Paths changed both in the
        sandbox and between the two bases refuse the rebase with :class:`Conflict`
        ``rebase_conflicts`` (see ``.conflicts``) unless ``prefer`` is ``"sandbox"`` or ``"base"``.
        """
        body = _drop_none({"onto": onto, "prefer": prefer})
        return self._obj("POST", f"/v1/sandboxes/{_seg(sandbox)}/rebase", json_body=body, timeout=_NO_TIMEOUT)

    def rebuild_template(self, name: str, *, base: str | None = None, no_cache: bool = False, accept_findings: bool = False) -> Iterator[dict[str, Any]]:
        """Reruns a built template's recipe, optionally on another base image; yields the build's NDJSON events."""
        body = _drop_none({"base": base, "no_cache": no_cache, "accept_findings": accept_findings})
        resp = self._open("POST", f"/v1/templates/{_seg(name)}/rebuild", json_body=body, timeout=_NO_TIMEOUT)
        return resp.lines()

    def lineage(self, target: str) -> dict[str, Any]:
        """Tree of images, checkpoints, sandboxes and templates around ``target``."""
        return self._obj("GET", f"/v1/lineage/{_seg(target)}")

    def gc(self) -> dict[str, Any]:
        """Expires checkpoints and removes unreferenced layers (``GcReport``)."""
        return self._obj("POST", "/v1/gc", timeout=_NO_TIMEOUT)

    # --- events, cost, audit -----------------------------------------------

    def events(self, *, sandbox: str | None = None, after: int = 0) -> list[SandboxEvent]:
        """Lifecycle transitions so far (all, or one sandbox's), after sequence number ``after``."""
        return [SandboxEvent.from_json(x) for x in self._json("GET", "/v1/events", query={"sandbox": sandbox, "after": after or None})]

    def follow_events(self, *, sandbox: str | None = None, after: int = 0, request_timeout: float | None = None) -> Iterator[SandboxEvent]:
        """Yields transitions after ``after`` as they happen (past ones first); runs until closed.

        ``request_timeout`` (seconds) ends the iteration with :class:`StrataConnectionError`
        if no event arrives in that long.
        """
        r = self._open(
            "GET",
            "/v1/events",
            query={"sandbox": sandbox, "after": after or None, "follow": True},
            timeout=request_timeout if request_timeout is not None else _NO_TIMEOUT,
        )
        return (SandboxEvent.from_json(x) for x in r.lines())

    # ---- fan-out, pipelines, advisor ----

    def fanout(
        self,
        source: str,
        *,
        run: str | None = None,
        args: list[str] | None = None,
        count: int | None = None,
        attempts: list[dict[str, Any]] | None = None,
        select: str = "first_success",
        score_cmd: str | None = None,
        timeout: str | None = None,
        losers: str = "destroy",
        promote_as: str | None = None,
    ) -> dict[str, Any]:
        """Forks one child per attempt from ``source`` (checkpoint or sandbox), runs the
        attempts concurrently and selects a winner.

        ``run`` is a shell command with ``{i}`` (attempt index) and ``{arg}`` (one of
        ``args``) filled in; or give explicit ``attempts`` (``{"cmd": [...], "env": {...}}``).
        ``select``: ``first_success``, ``all_success`` or ``best_score`` (with ``score_cmd``).
        ``losers``: ``destroy`` or ``keep``; ``promote_as`` checkpoints the winner under a name.
        Returns the ``FanoutResult`` JSON: ``attempts`` and ``winner`` (``None`` with a
        ``reason`` when no attempt won).
        """
        body = _drop_none(
            {
                "source": source,
                "run": run,
                "args": args,
                "count": count,
                "attempts": attempts,
                "select": select,
                "score_cmd": score_cmd,
                "timeout": timeout,
                "losers": losers,
                "promote_as": promote_as,
            }
        )
        result: dict[str, Any] = self._json("POST", "/v1/fanout", json_body=body, timeout=_NO_TIMEOUT)
        return result

    def run_pipeline(self, toml: str) -> dict[str, Any]:
        """Starts a pipeline run from its TOML spec (see docs/pipelines.md); returns the
        ``PipelineRun`` JSON at once (``id``, ``state``, ``stages``)."""
        run: dict[str, Any] = self._json("POST", "/v1/pipelines", json_body={"toml": toml})
        return run

    def run_pipeline_follow(self, toml: str) -> Iterator[dict[str, Any]]:
        """Starts a pipeline run and yields its progress events until it ends."""
        r = self._open("POST", "/v1/pipelines", query={"follow": True}, json_body={"toml": toml}, timeout=_NO_TIMEOUT)
        return (x for x in r.lines())

    def pipeline(self, run_id: str) -> dict[str, Any]:
        """A pipeline run: state, and per stage its lifecycle, times, sandboxes, checkpoint, cost."""
        run: dict[str, Any] = self._json("GET", f"/v1/pipelines/{_seg(run_id)}")
        return run

    def list_pipelines(self) -> list[dict[str, Any]]:
        """Every pipeline run, newest first."""
        runs: list[dict[str, Any]] = self._json("GET", "/v1/pipelines")
        return runs

    def resume_pipeline(self, run_id: str) -> dict[str, Any]:
        """Resumes a failed, paused or interrupted run from its first unfinished stage."""
        run: dict[str, Any] = self._json("POST", f"/v1/pipelines/{_seg(run_id)}/resume")
        return run

    def pause_pipeline(self, run_id: str) -> dict[str, Any]:
        """Asks a running run to pause at its next stage boundary."""
        run: dict[str, Any] = self._json("POST", f"/v1/pipelines/{_seg(run_id)}/pause")
        return run

    def pipeline_cost(self, run_id: str) -> dict[str, Any]:
        """Cost of a pipeline run per stage."""
        cost: dict[str, Any] = self._json("GET", f"/v1/pipelines/{_seg(run_id)}/cost")
        return cost

    def advise(self, **stage: Any) -> dict[str, Any]:
        """The lifecycle advisor (docs/advisor.md): pass the ``AdviseRequest`` fields
        (``keep=["processes"], setup="5m", turns=5, idle="30m", untrusted_input=False,
        fan_out=..., cpus=..., memory="1g", disk="1g"``); returns the ``Advice`` JSON
        (``recommendation``, ``reasons``, ``warnings``, priced ``alternatives``)."""
        advice: dict[str, Any] = self._json("POST", "/v1/advise", json_body=_drop_none(stage))
        return advice

    def cost(self) -> CostSummary:
        """Cost of every sandbox (destroyed ones included) with ephemeral-only/always-on counterfactuals."""
        return CostSummary.from_json(self._json("GET", "/v1/cost"))

    def sandbox_cost(self, sandbox: str) -> CostReport:
        """Cost of one sandbox: compute, storage by kind, total and counterfactuals."""
        return CostReport.from_json(self._json("GET", f"/v1/cost/{_seg(sandbox)}"))

    def audit(self, *, limit: int | None = None) -> list[dict[str, Any]]:
        """The hash-chained audit log (oldest first)."""
        entries: list[dict[str, Any]] = self._json("GET", "/v1/audit", query={"limit": limit})
        return entries

    def audit_verify(self) -> dict[str, Any]:
        """Recomputes the audit log's hash chain (``AuditVerification``: ``ok``, ``entries``, ``first_bad``)."""
        return self._obj("GET", "/v1/audit/verify", timeout=_NO_TIMEOUT)

    def metrics(self) -> str:
        """Prometheus metrics (OpenMetrics text)."""
        return self._open("GET", "/metrics").read().decode()
