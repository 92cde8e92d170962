"""Tests of the SDK that need no daemon: model decoding, error mapping, transport
details (against a tiny fake server on a Unix socket)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import tempfile
import threading
import unittest

from strata_sdk import (
    ApprovalRequired,
    BadRequest,
    Client,
    Conflict,
    ExecResult,
    Forbidden,
    InsufficientResources,
    NotFound,
    ProcessEvent,
    QuotaExceeded,
    Sandbox,
    ServerError,
    StrataConnectionError,
    StrataError,
    Unsupported,
)
from strata_sdk.errors import error_from_response
from strata_sdk.models import ResumeResult

SANDBOX = {
    "id": "abc123",
    "name": "n",
    "state": "standby",
    "state_reason": "idle",
    "source": "busybox",
    "image_id": "sha256:1",
    "hostname": "n",
    "lifecycle": "persistent",
    "runtime": "namespace",
    "created_at": "t",
    "updated_at": "t",
    "limits": {"pids": 10},
    "policy": {"on_idle": "standby", "idle_timeout": "15m", "hooks": {"after_resume": ["x"]}},
    "standby": {"mode": "processes", "created_at": "t", "dump_ms": 5, "image_bytes": 9, "api_processes": 1},
    "some_future_field": 1,
}


class ModelsTest(unittest.TestCase):
    def test_sandbox_nested_and_unknown_fields(self) -> None:
        sb = Sandbox.from_json(SANDBOX)
        self.assertEqual(sb.limits.pids, 10)
        assert sb.policy is not None and sb.policy.hooks is not None and sb.standby is not None
        self.assertEqual(sb.policy.hooks.after_resume, ["x"])
        self.assertEqual(sb.standby.mode, "processes")
        self.assertEqual(sb.raw["some_future_field"], 1)

    def test_resume_result_from_keyword(self) -> None:
        r = ResumeResult.from_json({"from": "standby", "duration_ms": 12, "processes_restored": True, "sandbox": SANDBOX})
        self.assertEqual(r.from_state, "standby")
        self.assertEqual(r.sandbox.id, "abc123")

    def test_exec_result_and_events_decode_base64(self) -> None:
        proc = {"id": 1, "sandbox_id": "s", "cmd": ["x"], "status": "exited", "started_at": "t", "exit_code": 0}
        r = ExecResult.from_json({"process": proc, "stdout_b64": "AP8=", "stderr_b64": "", "truncated": False})
        self.assertEqual(r.stdout, b"\x00\xff")
        self.assertTrue(r.ok)
        ev = ProcessEvent.from_json({"type": "output", "stream": "stderr", "offset": 3, "data_b64": "aGk="})
        self.assertEqual((ev.stream, ev.offset, ev.data), ("stderr", 3, b"hi"))
        self.assertEqual(ProcessEvent.from_json({"type": "dropped", "bytes": 7}).dropped_bytes, 7)


class ErrorMappingTest(unittest.TestCase):
    def test_status_to_class(self) -> None:
        cases: list[tuple[int, type[StrataError]]] = [
            (400, BadRequest),
            (404, NotFound),
            (409, Conflict),
            (501, Unsupported),
            (429, QuotaExceeded),
            (503, InsufficientResources),
            (507, InsufficientResources),
            (500, ServerError),
            (502, ServerError),
            (418, StrataError),
        ]
        for status, cls in cases:
            e = error_from_response(status, {"code": "c", "message": "m"}, "fallback")
            self.assertIs(type(e), cls)
            self.assertEqual((e.status, e.code, e.message), (status, "c", "m"))
        e = error_from_response(409, {"code": "invalid_state", "message": "no", "current_state": "paused"}, "")
        self.assertEqual(e.current_state, "paused")
        self.assertIn("paused", str(e))
        e = error_from_response(409, {"code": "in_use", "message": "no", "dependents": ["a"]}, "")
        self.assertEqual(e.dependents, ["a"])
        e = error_from_response(403, {"code": "forbidden", "message": "operator only"}, "")
        self.assertIs(type(e), Forbidden)
        e = error_from_response(403, {"code": "approval_required", "message": "held", "approval": {"id": "apr-1", "state": "pending"}}, "")
        self.assertIs(type(e), ApprovalRequired)
        self.assertIsInstance(e, Forbidden)
        assert e.approval is not None
        self.assertEqual(e.approval["id"], "apr-1")

    def test_url_validation(self) -> None:
        with self.assertRaises(ValueError):
            Client(url="127.0.0.1:8080")

    def test_socket_defaults(self) -> None:
        old = os.environ.pop("STRATA_SOCKET", None)
        try:
            self.assertEqual(Client().socket_path, "/run/strata/strata.sock")
            os.environ["STRATA_SOCKET"] = "/x/y.sock"
            self.assertEqual(Client().socket_path, "/x/y.sock")
            self.assertEqual(Client("/a.sock").socket_path, "/a.sock")
        finally:
            os.environ.pop("STRATA_SOCKET", None)
            if old is not None:
                os.environ["STRATA_SOCKET"] = old

    def test_missing_socket(self) -> None:
        with self.assertRaises(StrataConnectionError) as cm:
            Client("/nonexistent/strata.sock").list_sandboxes()
        self.assertIn("/nonexistent/strata.sock", str(cm.exception))


class FakeServerTest(unittest.TestCase):
    """One canned HTTP exchange over a Unix socket: checks what the client sends."""

    def serve(self, response: bytes) -> tuple[str, list[bytes]]:
        d = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, d, True)
        path = os.path.join(d, "s.sock")
        srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        srv.bind(path)
        srv.listen(1)
        got: list[bytes] = []

        def run() -> None:
            conn, _ = srv.accept()
            data = b""
            while b"\r\n\r\n" not in data:
                data += conn.recv(65536)
            head, _, body = data.partition(b"\r\n\r\n")
            length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")), 0)
            while len(body) < length:
                body += conn.recv(65536)
            got.append(head + b"\r\n\r\n" + body)
            conn.sendall(response)
            conn.close()
            srv.close()

        threading.Thread(target=run, daemon=True).start()
        return path, got

    def test_exec_request_and_stream(self) -> None:
        lines = [
            {"type": "started", "process": {"id": 1, "sandbox_id": "s", "cmd": ["x"], "status": "running", "started_at": "t"}},
            {"type": "output", "stream": "stdout", "offset": 0, "data_b64": "YQo="},
            {"type": "exited", "process": {"id": 1, "sandbox_id": "s", "cmd": ["x"], "status": "exited", "started_at": "t", "exit_code": 0}},
        ]
        payload = b"".join(json.dumps(x).encode() + b"\n" for x in lines)
        chunked = b"%x\r\n%s\r\n0\r\n\r\n" % (len(payload), payload)
        path, got = self.serve(b"HTTP/1.1 200 OK\r\ncontent-type: application/x-ndjson\r\ntransfer-encoding: chunked\r\n\r\n" + chunked)
        events = list(Client(path).exec_stream("my box", "echo a", stdin=b"in", env={"K": "V"}))
        self.assertEqual([e.type for e in events], ["started", "output", "exited"])
        self.assertEqual(events[1].data, b"a\n")
        req = got[0]
        self.assertTrue(req.startswith(b"POST /v1/sandboxes/my%20box/exec?stream=true HTTP/1.1"))
        body = json.loads(req.partition(b"\r\n\r\n")[2])
        self.assertEqual(body, {"cmd": ["sh", "-c", "echo a"], "stdin_b64": "aW4=", "env": {"K": "V"}})

    def test_non_json_error_body(self) -> None:
        path, _ = self.serve(b"HTTP/1.1 502 Bad Gateway\r\ncontent-length: 4\r\n\r\noops")
        with self.assertRaises(ServerError) as cm:
            Client(path).info()
        self.assertEqual((cm.exception.status, cm.exception.message), (502, "oops"))


if __name__ == "__main__":
    unittest.main()
