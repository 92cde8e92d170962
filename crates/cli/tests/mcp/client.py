"""Drives strata's MCP server with the official MCP Python SDK (`mcp`, pinned in
scripts/setup-host.sh): lists the tools and calls each of them against a live daemon.

    client.py stdio STRATA_BIN SOCKET [--criu]
    client.py http URL TOKEN [--criu]

Prints `MCP-OK <json summary>` on success; any failed check raises (non-zero exit).
"""

import asyncio
import base64
import json
import os
import sys
import time

SLOW = []  # calls that took over 2 s, reported in the summary

import httpx2
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

EXPECTED_TOOLS = {
    "list_sandboxes", "create_sandbox", "exec", "read_file", "write_file", "list_files",
    "checkpoint", "restore", "list_checkpoints", "fork", "diff", "standby", "resume", "destroy",
}


def check(cond, what, detail=None):
    if not cond:
        raise AssertionError(f"{what}: {detail!r}")


async def call(c, name, args):
    """A tool call that must succeed; returns its structured content."""
    t0 = time.monotonic()
    r = await c.call_tool(name, args)
    if time.monotonic() - t0 > 2:
        SLOW.append((name, args, round(time.monotonic() - t0, 1)))
    text = " ".join(getattr(b, "text", "") for b in r.content)
    check(not r.is_error, f"{name}({args}) failed", text)
    check(isinstance(r.structured_content, dict), f"{name} structured content", r.structured_content)
    # The text content carries the same JSON, for clients that only show text.
    check(json.loads(text) == r.structured_content, f"{name} text mirrors structured content", text)
    return r.structured_content


async def call_err(c, name, args):
    """A tool call that must fail as a tool error; returns (code, text)."""
    r = await c.call_tool(name, args)
    text = " ".join(getattr(b, "text", "") for b in r.content)
    check(r.is_error, f"{name}({args}) should be a tool error", text)
    code = (r.structured_content or {}).get("error", {}).get("code")
    check(code and text.startswith(code + ":"), f"{name} error text starts with its code", (code, text))
    return code, text


async def scenario(c, tag, criu):
    summary = {}
    listed = await c.list_tools()
    tools = {t.name: t for t in listed.tools}
    check(EXPECTED_TOOLS <= set(tools), "tool names", sorted(tools))
    for t in tools.values():
        check(t.description and len(t.description) > 40, f"{t.name} description", t.description)
        check(t.input_schema.get("type") == "object", f"{t.name} schema", t.input_schema)
    ex = tools["exec"].input_schema
    check({"sandbox", "command", "argv", "timeout", "cwd", "env"} <= set(ex["properties"]), "exec schema properties", ex)
    check("sandbox" in ex.get("required", []), "exec requires sandbox", ex)
    check(ex["properties"]["command"].get("description"), "exec.command documented", ex)
    check(tools["destroy"].annotations and tools["destroy"].annotations.destructive_hint, "destroy is destructive", tools["destroy"].annotations)
    check(tools["list_sandboxes"].annotations and tools["list_sandboxes"].annotations.read_only_hint, "list is read-only", None)
    summary["tools"] = len(tools)

    # create
    sb = await call(c, "create_sandbox", {"source": "busybox", "name": f"mcp-{tag}", "env": {"GREETING": "hello"}, "memory_mb": 256})
    sid = sb["id"]
    check(sb["state"] == "running" and sb["name"] == f"mcp-{tag}", "created sandbox", sb)

    # exec: output and exit codes
    r = await call(c, "exec", {"sandbox": sid, "command": "echo $GREETING; echo oops >&2; exit 3"})
    check((r["stdout"], r["stderr"], r["exit_code"]) == ("hello\n", "oops\n", 3), "exec output and exit code", r)
    r = await call(c, "exec", {"sandbox": f"mcp-{tag}", "argv": ["cat"], "stdin": "piped in"})
    check(r["stdout"] == "piped in" and r["exit_code"] == 0, "exec argv + stdin by name", r)
    r = await call(c, "exec", {"sandbox": sid, "command": "pwd; echo $X", "cwd": "/tmp", "env": {"X": "y"}})
    check(r["stdout"] == "/tmp\ny\n", "exec cwd + env", r)
    r = await call(c, "exec", {"sandbox": sid, "argv": ["no-such-program"]})
    check(r["exit_code"] == 127, "missing program exits 127", r)
    r = await call(c, "exec", {"sandbox": sid, "command": "seq 1 30000", "max_output_bytes": 1000})
    out = r["stdout"]
    check(r.get("stdout_truncated") is True and len(out) < 1100 and out.startswith("1\n2\n") and out.endswith("29999\n30000\n"), "output clipped", out)
    check("[... 167894 bytes omitted ...]" in out, "omitted byte count", out)
    r = await call(c, "exec", {"sandbox": sid, "command": "sleep 30", "timeout": "1s"})
    check(r.get("timed_out") is True and r["exit_code"] != 0, "timeout kills", r)
    code, _ = await call_err(c, "exec", {"sandbox": sid, "command": "true", "argv": ["true"]})
    check(code == "bad_request", "command and argv together", code)
    code, _ = await call_err(c, "exec", {"sandbox": sid, "command": "true", "timeout": "soon"})
    check(code == "bad_request", "bad timeout is the daemon's 400", code)

    # files
    w = await call(c, "write_file", {"sandbox": sid, "path": "/work/dir/hello.txt", "content": "hi there\n"})
    check(w["bytes"] == 9, "write_file bytes", w)
    await call(c, "write_file", {"sandbox": sid, "path": "/work/run.sh", "content": "#!/bin/sh\necho ran $1\n", "mode": "755"})
    r = await call(c, "exec", {"sandbox": sid, "argv": ["/work/run.sh", "ok"]})
    check(r["stdout"] == "ran ok\n", "script written with mode 755 runs", r)
    f = await call(c, "read_file", {"sandbox": sid, "path": "/work/dir/hello.txt"})
    check((f["content"], f["encoding"], f["truncated"]) == ("hi there\n", "utf8", False), "read_file", f)
    f = await call(c, "read_file", {"sandbox": sid, "path": "/work/dir/hello.txt", "offset": 3, "max_bytes": 4})
    check((f["content"], f["truncated"], f["size"]) == ("ther", True, 9), "read_file piece", f)
    blob = bytes(range(256))
    await call(c, "write_file", {"sandbox": sid, "path": "/work/blob.bin", "content": base64.b64encode(blob).decode(), "encoding": "base64"})
    f = await call(c, "read_file", {"sandbox": sid, "path": "/work/blob.bin"})
    check(f["encoding"] == "base64" and base64.b64decode(f["content"]) == blob, "binary round trip", f)
    ls = await call(c, "list_files", {"sandbox": sid, "path": "/work/dir"})
    check([(e["name"], e["kind"], e["size"]) for e in ls["entries"]] == [("hello.txt", "file", 9)], "list_files", ls)
    ls = await call(c, "list_files", {"sandbox": sid, "path": "/work"})
    modes = {e["name"]: (e["kind"], e["mode"]) for e in ls["entries"]}
    check(modes.get("dir", ("",))[0] == "dir" and modes.get("run.sh") == ("file", "755"), "list_files kinds and modes", modes)
    code, _ = await call_err(c, "read_file", {"sandbox": sid, "path": "/work/dir"})
    check(code == "bad_request", "read_file on a directory", code)
    code, _ = await call_err(c, "read_file", {"sandbox": sid, "path": "/work/missing.txt"})
    check(code == "file_not_found", "read_file of a missing file", code)
    code, _ = await call_err(c, "write_file", {"sandbox": sid, "path": "/work/x", "content": "!!", "encoding": "base64"})
    check(code == "bad_request", "bad base64", code)

    # checkpoint, diff, fork, restore
    ck = await call(c, "checkpoint", {"sandbox": sid, "name": f"ck-{tag}"})
    check(ck["name"] == f"ck-{tag}" and ck["changed_paths"] > 0, "checkpoint", ck)
    await call(c, "write_file", {"sandbox": sid, "path": "/work/after.txt", "content": "later"})
    await call(c, "exec", {"sandbox": sid, "command": "rm /work/blob.bin"})
    d = await call(c, "diff", {"sandbox": sid})
    changes = {ch["path"]: ch["change"] for ch in d["changes"]}
    check(changes.get("/work/after.txt") == "added" and changes.get("/work/blob.bin") == "deleted", "diff since checkpoint", changes)
    cl = await call(c, "list_checkpoints", {"sandbox": sid})
    check(ck["id"] in [x["id"] for x in cl["checkpoints"]], "list_checkpoints", cl)
    fk = await call(c, "fork", {"source": f"ck-{tag}", "count": 2, "name_prefix": f"child-{tag}"})
    kids = fk["sandboxes"]
    check(len(kids) == 2 and fk["checkpoint"] == ck["id"], "fork from checkpoint", fk)
    for k in kids:
        r = await call(c, "exec", {"sandbox": k, "command": "cat /work/dir/hello.txt; test -e /work/after.txt; echo $?"})
        check(r["stdout"] == "hi there\n1\n", "child has the checkpoint's files only", r)
    await call(c, "exec", {"sandbox": kids[0], "command": "echo mine > /work/dir/hello.txt"})
    r = await call(c, "exec", {"sandbox": kids[1], "argv": ["cat", "/work/dir/hello.txt"]})
    check(r["stdout"] == "hi there\n", "children are independent", r)
    live = await call(c, "fork", {"source": sid})
    check(len(live["sandboxes"]) == 1, "fork of a live sandbox", live)
    r = await call(c, "exec", {"sandbox": live["sandboxes"][0], "argv": ["cat", "/work/after.txt"]})
    check(r["stdout"] == "later", "live fork has the current files", r)
    # create_sandbox from a checkpoint and from a template (made by the test through the CLI)
    fromck = await call(c, "create_sandbox", {"source": f"ck-{tag}", "lifecycle": "ephemeral", "ttl": "10m"})
    r = await call(c, "exec", {"sandbox": fromck["id"], "argv": ["cat", "/work/dir/hello.txt"]})
    check(fromck["source"] == f"ck-{tag}" and fromck["lifecycle"] == "ephemeral" and r["stdout"] == "hi there\n", "sandbox from a checkpoint", (fromck, r))
    kids.append(fromck["id"])
    template = os.environ.get("MCP_TEST_TEMPLATE")
    if template:
        fromtpl = await call(c, "create_sandbox", {"source": template})
        r = await call(c, "exec", {"sandbox": fromtpl["id"], "argv": ["cat", "/opt/template-marker"]})
        check(r["stdout"] == "from the template\n", "sandbox from a template", r)
        kids.append(fromtpl["id"])
        summary["template"] = template
    rs = await call(c, "restore", {"sandbox": sid, "checkpoint": f"ck-{tag}"})
    check(rs["sandbox"]["state"] == "running", "restore", rs)
    r = await call(c, "exec", {"sandbox": sid, "command": "test -e /work/after.txt; echo $?; cat /work/dir/hello.txt"})
    check(r["stdout"] == "1\nhi there\n", "restore rolled the files back", r)

    ids = {s["id"] for s in (await call(c, "list_sandboxes", {}))["sandboxes"]}
    check({sid, *kids} <= ids, "list_sandboxes", ids)
    running = await call(c, "list_sandboxes", {"state": "running"})
    check(all(s["state"] == "running" for s in running["sandboxes"]), "state filter", running)
    code, _ = await call_err(c, "list_sandboxes", {"state": "sleepy"})
    check(code == "bad_request", "unknown state filter", code)

    # standby / resume (processes kept: needs CRIU)
    if criu:
        await call(c, "exec", {"sandbox": sid, "command": "echo kept > /tmp/mem.txt"})
        sb = await call(c, "standby", {"sandbox": sid})
        check(sb["state"] == "standby" and sb.get("mode") == "processes", "standby", sb)
        listed = {s["id"]: s["state"] for s in (await call(c, "list_sandboxes", {}))["sandboxes"]}
        check(listed[sid] == "standby", "listed in standby", listed)
        rz = await call(c, "resume", {"sandbox": sid})
        check(rz["state"] == "running" and rz["from"] == "standby" and rz["processes_restored"] is True, "resume", rz)
        r = await call(c, "exec", {"sandbox": sid, "argv": ["cat", "/tmp/mem.txt"]})
        check(r["stdout"] == "kept\n", "state survives standby", r)
        summary["standby"] = {"standby_ms": sb["duration_ms"], "resume_ms": rz["duration_ms"]}
    code, text = await call_err(c, "resume", {"sandbox": sid})
    check(code == "invalid_state" and "running" in text, "resume of a running sandbox", text)

    # bad input: unknown ids are tool errors with the not-found code, the session goes on
    for name, args in [
        ("exec", {"sandbox": "no-such-sandbox", "command": "true"}),
        ("read_file", {"sandbox": "no-such-sandbox", "path": "/etc/hostname"}),
        ("destroy", {"sandbox": "no-such-sandbox"}),
        ("standby", {"sandbox": "no-such-sandbox"}),
        ("diff", {"sandbox": "no-such-sandbox"}),
    ]:
        code, _ = await call_err(c, name, args)
        check(code == "sandbox_not_found", f"{name} on an unknown sandbox", code)
    code, _ = await call_err(c, "create_sandbox", {"source": "no-such-image"})
    check(code == "image_not_found", "unknown image", code)
    code, _ = await call_err(c, "fork", {"source": "no-such-checkpoint"})
    check(code.endswith("_not_found"), "fork of an unknown source", code)
    # Arguments that do not fit the schema: an error (protocol or tool), never a crash.
    try:
        r = await c.call_tool("exec", {"command": "true"})
        check(r.is_error, "missing required argument is an error", r)
    except Exception as e:  # the SDK raises protocol errors (invalid params)
        summary["invalid_params"] = type(e).__name__

    # destroy
    for k in [*kids, live["sandboxes"][0], sid]:
        r = await call(c, "destroy", {"sandbox": k})
        check(r["state"] == "destroyed", "destroy", r)
    left = {s["id"] for s in (await call(c, "list_sandboxes", {}))["sandboxes"]}
    check(not ({sid, *kids} & left), "destroyed sandboxes are gone", left)
    summary["sandbox"] = sid
    summary["slow"] = SLOW
    return summary


async def main():
    mode, a, b = sys.argv[1:4]
    criu = "--criu" in sys.argv[4:]
    if mode == "stdio":
        server = StdioServerParameters(command=a, args=["--socket", b, "mcp"])
        async with Client(server) as c:
            summary = await scenario(c, f"stdio-{os.getpid()}", criu)
    elif mode == "http":
        async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {b}"}, timeout=httpx2.Timeout(120.0)) as http:
            async with Client(streamable_http_client(a, http_client=http)) as c:
                summary = await scenario(c, f"http-{os.getpid()}", criu)
    elif mode == "http-tenant":
        # The operator acting as a tenant: the header goes with every tool call.
        headers = {"Authorization": f"Bearer {b}", "X-Strata-Tenant": "acme"}
        async with httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(120.0)) as http:
            async with Client(streamable_http_client(a, http_client=http)) as c:
                created = await call(c, "create_sandbox", {"source": "busybox"})
                listed = await call(c, "list_sandboxes", {})
                check([s["id"] for s in listed["sandboxes"]] == [created["id"]], "acting as acme lists only acme's sandboxes", listed)
        summary = {"sandbox": created["id"]}
    elif mode == "http-unauthorized":
        async with httpx2.AsyncClient(headers={"Authorization": "Bearer wrong"}) as http:
            r = await http.post(a, json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"}, headers={"Accept": "application/json, text/event-stream"})
            check(r.status_code == 401 and r.json()["code"] == "unauthorized", "wrong token is refused", (r.status_code, r.text))
        summary = {"unauthorized": 401}
    else:
        raise SystemExit(f"unknown mode {mode}")
    print("MCP-OK " + json.dumps(summary), flush=True)


asyncio.run(main())
