"""Tests of the strata Python SDK against a running daemon.

Run with the daemon's socket in ``STRATA_SOCKET`` and the ``busybox`` image
imported (``crates/cli/tests/python_sdk.rs`` does both)::

    STRATA_SOCKET=/tmp/sdk.sock PYTHONPATH=sdk/python/src \\
        python3 -m unittest discover -s sdk/python/tests -v

Without ``STRATA_SOCKET`` every test is skipped (the reason is printed).
"""

from __future__ import annotations

import io
import os
import sys
import tarfile
import tempfile
import threading
import time
import unittest
import uuid

from strata_sdk import (
    ApprovalRequired,
    BadRequest,
    Client,
    Conflict,
    NotFound,
    Policy,
    ProcessEvent,
    ResourceLimits,
    SandboxEvent,
    StrataConnectionError,
    StrataError,
    Unauthorized,
    Unsupported,
)

IMAGE = os.environ.get("STRATA_SDK_TEST_IMAGE", "busybox")
SOCKET = os.environ.get("STRATA_SOCKET")

client: Client
_sandboxes: list[str] = []
_templates: list[str] = []


def setUpModule() -> None:
    global client
    if not SOCKET:
        msg = "skipped: STRATA_SOCKET is not set (point it at a running strata daemon with the busybox image)"
        print(msg, file=sys.stderr)
        raise unittest.SkipTest(msg)
    client = Client(SOCKET, timeout=120)
    names = [i.name for i in client.list_images()]
    if IMAGE not in names:
        raise unittest.SkipTest(f"image {IMAGE!r} is not imported in the daemon at {SOCKET}")


def tearDownModule() -> None:
    if not SOCKET:
        return
    for t in _templates:
        try:
            client.delete_template(t)
        except StrataError:
            pass
    for sb in _sandboxes:
        try:
            client.destroy(sb, force=True)
        except StrataError:
            pass


def uniq(prefix: str) -> str:
    """A name unique to this run."""
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def new_sandbox(**kwargs: object) -> str:
    """Creates a busybox sandbox destroyed at the end of the module; returns its id."""
    sb = client.create_sandbox(IMAGE, **kwargs)  # type: ignore[arg-type]
    _sandboxes.append(sb.id)
    return sb.id


class ErrorsTest(unittest.TestCase):
    def test_unknown_sandbox_is_not_found(self) -> None:
        with self.assertRaises(NotFound) as cm:
            client.get_sandbox("no-such-sandbox-" + uuid.uuid4().hex[:6])
        self.assertEqual(cm.exception.status, 404)
        self.assertEqual(cm.exception.code, "sandbox_not_found")
        self.assertIn("no-such-sandbox", cm.exception.message)
        self.assertIsInstance(cm.exception, StrataError)

    def test_illegal_transition_is_conflict_with_current_state(self) -> None:
        sb = new_sandbox()
        with self.assertRaises(Conflict) as cm:
            client.unpause(sb)
        self.assertEqual(cm.exception.status, 409)
        self.assertEqual(cm.exception.code, "invalid_state")
        self.assertEqual(cm.exception.current_state, "running")
        # A running sandbox is not destroyed without force.
        with self.assertRaises(Conflict) as cm2:
            client.destroy(sb)
        self.assertEqual(cm2.exception.current_state, "running")

    def test_bad_request(self) -> None:
        sb = new_sandbox()
        with self.assertRaises(BadRequest) as cm:
            client.fork(sb, 0)
        self.assertEqual(cm.exception.status, 400)
        self.assertTrue(cm.exception.code)

    def test_connection_error_names_the_socket(self) -> None:
        path = os.path.join(tempfile.gettempdir(), f"strata-no-daemon-{uuid.uuid4().hex[:6]}.sock")
        with self.assertRaises(StrataConnectionError) as cm:
            Client(path).info()
        self.assertIn(path, str(cm.exception))

    def test_unknown_file_and_process(self) -> None:
        sb = new_sandbox()
        with self.assertRaises(NotFound) as cm:
            client.stat(sb, "/no/such/file")
        self.assertEqual(cm.exception.code, "file_not_found")
        with self.assertRaises(NotFound) as cm2:
            client.get_process(sb, 99999)
        self.assertEqual(cm2.exception.code, "process_not_found")


class DaemonAndImagesTest(unittest.TestCase):
    def test_info_and_images(self) -> None:
        info = client.info()
        self.assertIn("version", info)
        self.assertIn("tiers", client.doctor())
        self.assertTrue(client.audit_verify()["ok"])
        self.assertTrue(client.audit(limit=5))
        self.assertIn("strata_", client.metrics())
        images = client.list_images()
        img = next(i for i in images if i.name == IMAGE)
        self.assertTrue(img.id.startswith("sha256:"))
        self.assertGreater(img.size, 0)
        self.assertEqual(client.get_image(IMAGE).id, img.id)
        self.assertTrue(img.layers and img.layers[0].digest)

    def test_import_and_remove(self) -> None:
        tar = os.path.join(os.environ.get("STRATA_TEST_IMAGES", "/var/cache/strata/images"), "busybox-rootfs.tar")
        if not os.path.exists(tar):
            self.skipTest(f"{tar} not on this host")
        name = uniq("sdk-img")
        report = client.import_image(tar, name)
        self.assertEqual(report.image.name, name)
        self.assertEqual(report.layers_new + report.layers_reused, len(report.image.layers))
        client.remove_image(name)
        with self.assertRaises(NotFound) as cm:
            client.get_image(name)
        self.assertEqual(cm.exception.code, "image_not_found")

    def test_versions_outdated_and_rebase(self) -> None:
        root = os.path.join(os.environ.get("STRATA_TEST_IMAGES", "/var/cache/strata/images"), "busybox-rootfs")
        if not os.path.isdir(root):
            self.skipTest(f"{root} not on this host")
        import shutil

        name = uniq("sdk-ver")
        with tempfile.TemporaryDirectory() as tmp:
            for version in ("1", "2"):
                d = os.path.join(tmp, f"v{version}")
                shutil.copytree(root, d, symlinks=True)
                with open(os.path.join(d, "etc", "motd"), "w") as f:
                    f.write(f"v{version}\n")
            client.import_image(os.path.join(tmp, "v1"), name)
            sb = client.create_sandbox(name).id
            try:
                client.exec(sb, "echo mine > /etc/motd; echo kept > /root/work")
                client.stop(sb)
                client.import_image(os.path.join(tmp, "v2"), name, replace=True)
                versions = client.image_versions(name)
                self.assertEqual([v["version"] for v in versions], [2, 1])
                entry = next(e for e in client.outdated() if e["id"] == sb)
                self.assertEqual((entry["kind"], entry["version"], entry["newest_version"]), ("sandbox", 1, 2))
                with self.assertRaises(Conflict) as cm:
                    client.rebase(sb, name)
                self.assertEqual(cm.exception.code, "rebase_conflicts")
                self.assertEqual([c["path"] for c in cm.exception.conflicts], ["/etc/motd"])
                report = client.rebase(sb, name, prefer="base")
                self.assertEqual(report["state_before"], "stopped")
                client.start(sb)
                self.assertEqual(client.download(sb, "/etc/motd"), b"v2\n")
                self.assertEqual(client.download(sb, "/root/work"), b"kept\n")
            finally:
                client.destroy(sb, force=True)
                client.remove_image(name)


class SandboxTest(unittest.TestCase):
    def test_create_inspect_list_update(self) -> None:
        name = uniq("sdk-sb")
        sb = client.create_sandbox(
            IMAGE,
            name=name,
            lifecycle="persistent",
            env={"SDK_VAR": "from-create"},
            labels={"suite": "python-sdk"},
            limits=ResourceLimits(pids=256),
            policy=Policy(on_idle="stop", idle_timeout="30m"),
        )
        _sandboxes.append(sb.id)
        self.assertEqual(sb.name, name)
        self.assertEqual(sb.state, "running")
        self.assertEqual(sb.lifecycle, "persistent")
        self.assertEqual(sb.labels.get("suite"), "python-sdk")
        self.assertEqual(sb.limits.pids, 256)
        assert sb.policy is not None
        self.assertEqual(sb.policy.on_idle, "stop")
        self.assertEqual(sb.policy.idle_timeout, "30m")
        self.assertIn(sb.id, [s.id for s in client.list_sandboxes()])
        self.assertEqual(client.get_sandbox(name).id, sb.id)  # by name
        self.assertEqual(client.get_sandbox(sb.id[:8]).id, sb.id)  # by prefix
        self.assertEqual(client.exec(sb.id, "echo $SDK_VAR").stdout, b"from-create\n")

        updated = client.update_policy(sb.id, Policy(on_idle="standby", max_lifetime="2h", on_max_lifetime="standby"))
        assert updated.policy is not None
        self.assertEqual(updated.policy.on_idle, "standby")
        self.assertEqual(updated.policy.idle_timeout, "30m")  # kept
        self.assertEqual(updated.policy.max_lifetime, "2h")
        self.assertEqual(updated.policy.on_max_lifetime, "standby")
        self.assertFalse(updated.allow_setuid)

    def test_tmp_and_isolation(self) -> None:
        kept = client.create_sandbox(IMAGE, name=uniq("sdk-tmp"), isolation="namespace")
        scratch = client.create_sandbox(IMAGE, name=uniq("sdk-scratch"), tmp="tmpfs")
        try:
            self.assertEqual((kept.tmp, kept.runtime), ("disk", "namespace"))
            self.assertEqual(scratch.tmp, "tmpfs")
            for sb in (kept, scratch):
                client.exec(sb.id, "echo x > /tmp/x")
            self.assertIn("/tmp/x", [c.path for c in client.diff(kept.id)])
            self.assertNotIn("/tmp/x", [c.path for c in client.diff(scratch.id)])
            with self.assertRaises(BadRequest):
                client.create_sandbox(IMAGE, tmp="ram")
            # A parked sandbox that does not resume on access: calls are a 409 until asked.
            self.assertFalse(client.update_policy(kept.id, Policy(resume_on_access=False)).policy.resume_on_access)
            client.pause(kept.id)
            with self.assertRaises(Conflict):
                client.exec(kept.id, "true")
            client.unpause(kept.id)
            self.assertEqual(client.exec(kept.id, "cat /tmp/x").stdout, b"x\n")
        finally:
            client.destroy(kept.id, force=True)
            client.destroy(scratch.id, force=True)

    def test_allow_setuid(self) -> None:
        sb = client.create_sandbox(IMAGE, name=uniq("sdk-suid"), allow_setuid=True)
        try:
            self.assertTrue(sb.allow_setuid)
            status = client.exec(sb.id, "grep NoNewPrivs /proc/self/status").stdout
            self.assertEqual(status.split(), [b"NoNewPrivs:", b"0"])
        finally:
            client.destroy(sb.id, force=True)

    def test_rule_of_two_approval(self) -> None:
        name = uniq("sdk-r2")
        kwargs = dict(
            name=name,
            capabilities=["untrusted_input", "sensitive_access"],
            network={"mode": "egress", "allow": ["10.0.0.0/8:443"]},
        )
        with self.assertRaises(ApprovalRequired) as held:
            client.create_sandbox(IMAGE, **kwargs)  # type: ignore[arg-type]
        approval = held.exception.approval
        assert approval is not None
        self.assertEqual(held.exception.status, 403)
        self.assertEqual(client.get_approval(approval["id"])["state"], "pending")
        self.assertIn(approval["id"], [a["id"] for a in client.list_approvals("pending")])
        self.assertEqual(client.approve(approval["id"], reason="sdk test")["state"], "approved")
        sb = client.create_sandbox(IMAGE, **kwargs)  # type: ignore[arg-type]
        _sandboxes.append(sb.id)
        self.assertEqual(client.get_approval(approval["id"])["state"], "used")
        with self.assertRaises(Conflict):
            client.deny(approval["id"])

    def test_stop_start_pause_destroy(self) -> None:
        sb = new_sandbox()
        ev = client.stop(sb)
        self.assertEqual(ev.to, "stopped")
        self.assertEqual(ev.from_state, "running")
        self.assertEqual(client.get_sandbox(sb).state, "stopped")
        started = client.start(sb)
        self.assertEqual(started.state, "running")
        self.assertEqual(client.pause(sb).to, "paused")
        self.assertEqual(client.get_sandbox(sb).state, "paused")
        self.assertEqual(client.unpause(sb).to, "running")
        client.stop(sb)
        # exec on a stopped sandbox resumes it first and says so.
        r = client.exec(sb, ["true"])
        self.assertTrue(r.ok)
        self.assertEqual(r.resumed_from, "stopped")
        self.assertIsNotNone(r.resume_ms)
        ev = client.destroy(sb, force=True)
        self.assertEqual(ev.to, "destroyed")
        with self.assertRaises(NotFound):
            client.get_sandbox(sb)


class ExecTest(unittest.TestCase):
    sb: str

    @classmethod
    def setUpClass(cls) -> None:
        cls.sb = new_sandbox()

    def test_run_to_completion(self) -> None:
        r = client.exec(self.sb, ["sh", "-c", "echo out; echo err >&2; exit 3"])
        self.assertEqual(r.stdout, b"out\n")
        self.assertEqual(r.stderr, b"err\n")
        self.assertEqual(r.exit_code, 3)
        self.assertFalse(r.ok)
        self.assertEqual(r.process.status, "exited")
        self.assertEqual(r.stdout_text, "out\n")

    def test_stdin_env_cwd_user(self) -> None:
        data = bytes(range(256)) * 4
        r = client.exec(self.sb, ["cat"], stdin=data)
        self.assertEqual(r.stdout, data)
        r = client.exec(self.sb, "echo $A-$B; pwd; id -u", env={"A": "1", "B": "two"}, cwd="/tmp", user="1000")
        self.assertEqual(r.stdout_text.split(), ["1-two", "/tmp", "1000"])

    def test_timeout(self) -> None:
        t0 = time.monotonic()
        r = client.exec(self.sb, ["sleep", "30"], timeout="1s")
        self.assertLess(time.monotonic() - t0, 20)
        self.assertTrue(r.process.timed_out)
        self.assertFalse(r.ok)

    def test_streaming_arrives_while_running(self) -> None:
        seen: list[tuple[float, ProcessEvent]] = []
        for ev in client.exec_stream(self.sb, ["sh", "-c", "echo first; sleep 1.5; echo second >&2; exit 4"]):
            seen.append((time.monotonic(), ev))
        types = [e.type for _, e in seen]
        self.assertEqual(types[0], "started")
        self.assertEqual(types[-1], "exited")
        outputs = [(t, e) for t, e in seen if e.type == "output"]
        self.assertEqual([(e.stream, e.data) for _, e in outputs], [("stdout", b"first\n"), ("stderr", b"second\n")])
        # The first chunk came before the process finished (it was streamed, not buffered).
        self.assertGreater(seen[-1][0] - outputs[0][0], 0.8)
        last = seen[-1][1].process
        assert last is not None
        self.assertEqual(last.exit_code, 4)

    def test_background_processes(self) -> None:
        p = client.start_process(self.sb, ["sh", "-c", "echo ready; sleep 300"])
        self.assertEqual(p.status, "running")
        self.assertIn(p.id, [x.id for x in client.list_processes(self.sb)])
        deadline = time.monotonic() + 10
        while b"ready" not in client.process_output(self.sb, p.id) and time.monotonic() < deadline:
            time.sleep(0.1)
        self.assertEqual(client.process_output(self.sb, p.id), b"ready\n")
        client.signal_process(self.sb, p.id, "KILL")
        done = client.wait_process(self.sb, p.id, timeout="10s")
        self.assertEqual(done.status, "exited")
        self.assertEqual(done.signal, 9)
        self.assertEqual(client.get_process(self.sb, p.id).status, "exited")

    def test_stdin_of_background_process_and_follow_logs(self) -> None:
        p = client.start_process(self.sb, ["cat"], keep_stdin_open=True)
        client.write_stdin(self.sb, p.id, b"line one\n")
        client.write_stdin(self.sb, p.id, "line two\n", close=True)
        events = list(client.process_logs(self.sb, p.id, follow=True))
        self.assertEqual(b"".join(e.data for e in events if e.type == "output"), b"line one\nline two\n")
        self.assertEqual(events[-1].type, "exited")
        self.assertEqual(client.wait_process(self.sb, p.id).exit_code, 0)
        # Reattach from an offset.
        tail = b"".join(e.data for e in client.process_logs(self.sb, p.id, offset=5) if e.type == "output")
        self.assertEqual(tail, b"one\nline two\n")

    def test_terminal(self) -> None:
        p = client.start_process(self.sb, ["sh"], tty=(100, 30))
        self.assertEqual(p.tty, {"cols": 100, "rows": 30})
        self.assertEqual(client.resize_tty(self.sb, p.id, 132, 50).tty, {"cols": 132, "rows": 50})
        client.write_stdin(self.sb, p.id, b"stty size; exit 3\n")
        self.assertEqual(client.wait_process(self.sb, p.id, timeout="20s").exit_code, 3)
        self.assertIn(b"50 132", client.process_output(self.sb, p.id).replace(b"\r", b""))
        with self.assertRaises(Conflict):
            client.resize_tty(self.sb, p.id, 80, 24)


class FilesTest(unittest.TestCase):
    sb: str

    @classmethod
    def setUpClass(cls) -> None:
        cls.sb = new_sandbox()

    def test_binary_round_trip(self) -> None:
        data = bytes(range(256)) * 64 + os.urandom(1 << 20)
        client.upload(self.sb, "/tmp/blob.bin", data, mode=0o600)
        self.assertEqual(client.download(self.sb, "/tmp/blob.bin"), data)
        st = client.stat(self.sb, "/tmp/blob.bin")
        self.assertEqual(st.kind, "file")
        self.assertEqual(st.size, len(data))
        self.assertEqual(st.mode & 0o777, 0o600)
        # The sandbox sees the same bytes.
        r = client.exec(self.sb, ["wc", "-c", "/tmp/blob.bin"])
        self.assertEqual(int(r.stdout.split()[0]), len(data))

    def test_local_files(self) -> None:
        data = os.urandom(300_000)
        with tempfile.TemporaryDirectory() as d:
            src, dst = os.path.join(d, "in"), os.path.join(d, "out")
            with open(src, "wb") as f:
                f.write(data)
            client.upload_file(self.sb, src, "/tmp/local.bin", mode=0o755)
            client.download_file(self.sb, "/tmp/local.bin", dst)
            with open(dst, "rb") as f:
                self.assertEqual(f.read(), data)
        self.assertEqual(client.stat(self.sb, "/tmp/local.bin").mode & 0o777, 0o755)

    def test_directories_move_remove(self) -> None:
        client.mkdir(self.sb, "/work/a/b", parents=True)
        client.upload(self.sb, "/work/a/b/f.txt", b"hello")
        names = {e.name: e.kind for e in client.list_files(self.sb, "/work/a")}
        self.assertEqual(names, {"b": "dir"})
        client.move(self.sb, "/work/a/b/f.txt", "/work/a/g.txt")
        self.assertEqual(client.download(self.sb, "/work/a/g.txt"), b"hello")
        with self.assertRaises(NotFound):
            client.stat(self.sb, "/work/a/b/f.txt")
        client.remove(self.sb, "/work/a", recursive=True)
        with self.assertRaises(NotFound):
            client.stat(self.sb, "/work/a")

    def test_tar_trees(self) -> None:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tf:
            d = tarfile.TarInfo("sub")
            d.type = tarfile.DIRTYPE
            d.mode = 0o755
            tf.addfile(d)
            for name, content in [("x.txt", b"x-content"), ("sub/y.bin", bytes(range(256)))]:
                info = tarfile.TarInfo(name)
                info.size = len(content)
                tf.addfile(info, io.BytesIO(content))
        client.mkdir(self.sb, "/srv/tree", parents=True)
        client.upload_tar(self.sb, "/srv/tree", buf.getvalue())
        self.assertEqual(client.download(self.sb, "/srv/tree/sub/y.bin"), bytes(range(256)))
        out = client.download_tar(self.sb, "/srv/tree")
        with tarfile.open(fileobj=io.BytesIO(out)) as tf:
            files = {m.name: tf.extractfile(m).read() for m in tf.getmembers() if m.isfile()}  # type: ignore[union-attr]
        # Entries are named under the directory's own name (unlike upload_tar, which unpacks into it).
        self.assertEqual(files.get("tree/x.txt"), b"x-content")
        self.assertEqual(files.get("tree/sub/y.bin"), bytes(range(256)))

    def test_hostile_tar_is_refused(self) -> None:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tf:
            info = tarfile.TarInfo("../../escape.txt")
            info.size = 1
            tf.addfile(info, io.BytesIO(b"x"))
        with self.assertRaises(BadRequest) as cm:
            client.upload_tar(self.sb, "/tmp", buf.getvalue())
        self.assertIn(cm.exception.code, ("invalid_archive", "path_escape"))


class CheckpointForkTemplateTest(unittest.TestCase):
    def test_checkpoint_diff_restore(self) -> None:
        sb = new_sandbox()
        client.upload(sb, "/root/state.txt", b"v1")
        name = uniq("sdk-cp")
        cp = client.checkpoint(sb, name=name, labels={"step": "1"})
        self.assertEqual(cp.name, name)
        self.assertEqual(cp.sandbox_id, sb)
        self.assertEqual(cp.labels.get("step"), "1")
        self.assertGreaterEqual(cp.changed_paths, 1)
        self.assertEqual(client.get_checkpoint(name).id, cp.id)
        self.assertIn(cp.id, [c.id for c in client.list_checkpoints(sb)])
        self.assertIn(cp.id, [c.id for c in client.list_checkpoints()])
        self.assertEqual(client.get_sandbox(sb).head_checkpoint, cp.id)

        client.upload(sb, "/root/state.txt", b"v2")
        client.upload(sb, "/root/new.txt", b"new")
        client.exec(sb, "echo extra >> /etc/passwd")
        changes = {c.path: c.change for c in client.diff(sb)}
        self.assertEqual(changes.get("/etc/passwd"), "modified")  # in the image
        self.assertEqual(changes.get("/root/new.txt"), "added")
        # Existed at the checkpoint (in the writable layer), changed since.
        self.assertEqual(changes.get("/root/state.txt"), "modified")
        self.assertTrue(client.export(sb).startswith(b"root") or len(client.export(sb)) >= 1024)

        res = client.restore(sb, name, keep_current=True)
        self.assertEqual(res.sandbox.id, sb)
        self.assertIsNotNone(res.kept)
        self.assertEqual(client.download(sb, "/root/state.txt"), b"v1")
        with self.assertRaises(NotFound):
            client.stat(sb, "/root/new.txt")
        # The kept checkpoint holds the discarded state.
        assert res.kept is not None
        other = new_sandbox_from(res.kept.id)
        self.assertEqual(client.download(other, "/root/state.txt"), b"v2")

        # A checkpoint something still needs is not deleted.
        with self.assertRaises(Conflict) as cm:
            client.delete_checkpoint(cp.id)
        self.assertEqual(cm.exception.code, "in_use")
        self.assertTrue(cm.exception.dependents)
        # An unneeded one is.
        spare = client.checkpoint(other, name=uniq("sdk-spare"))
        client.restore(other, res.kept.id)
        try:
            client.delete_checkpoint(spare.id)
        except Conflict:
            pass  # the daemon may count the sandbox's history as a dependent
        else:
            with self.assertRaises(NotFound) as cm2:
                client.get_checkpoint(spare.id)
            self.assertEqual(cm2.exception.code, "checkpoint_not_found")

    def test_fork_two_see_the_file(self) -> None:
        sb = new_sandbox(name=uniq("sdk-parent"))
        client.upload(sb, "/root/shared.txt", b"from the parent")
        res = client.fork(sb, 2, name_prefix=uniq("sdk-child"))
        _sandboxes.extend(res.sandboxes)
        self.assertEqual(len(res.sandboxes), 2)
        self.assertTrue(res.checkpoint)
        children = [client.get_sandbox(i) for i in res.sandboxes]
        self.assertEqual(len({c.hostname for c in children}), 2)
        for c in children:
            self.assertEqual(c.state, "running")
            self.assertEqual(c.fork_generation, 1)
            self.assertEqual(client.download(c.id, "/root/shared.txt"), b"from the parent")
        # Children do not share a writable layer.
        client.upload(children[0].id, "/root/only0.txt", b"0")
        with self.assertRaises(NotFound):
            client.stat(children[1].id, "/root/only0.txt")
        # fork_sandboxes returns records.
        more = client.fork_sandboxes(res.checkpoint, 1)
        _sandboxes.extend(s.id for s in more)
        self.assertEqual(len(more), 1)
        self.assertEqual(client.download(more[0].id, "/root/shared.txt"), b"from the parent")

    def test_template(self) -> None:
        sb = new_sandbox()
        client.mkdir(sb, "/opt/app", parents=True)
        client.upload(sb, "/opt/app/setup.txt", b"installed")
        report = client.scan(sb)
        self.assertIn("clean", report)
        self.assertIsInstance(report["findings"], list)
        # A check (scan + accumulation) and a quarantine round trip.
        checked = client.check(sb)
        self.assertEqual(checked["trigger"], "requested")
        self.assertGreaterEqual(client.accumulation(sb)["writable_bytes"], len(b"installed"))
        entry = client.quarantine(sb, "sdk test")
        self.assertEqual((entry["kind"], entry["quarantine"]["reason"]), ("sandbox", "sdk test"))
        self.assertIn(sb, [e["id"] for e in client.quarantined()])
        with self.assertRaises(Conflict) as cm:
            client.create_template(uniq("sdk-q"), sb)
        self.assertEqual(cm.exception.code, "quarantined")
        client.lift_quarantine(sb, "sdk test done")
        self.assertNotIn(sb, [e["id"] for e in client.quarantined()])
        name = uniq("sdk-tpl")
        try:
            tpl = client.create_template(name, sb)
        except Conflict as e:
            self.assertEqual(e.code, "scan_findings")
            self.assertTrue(e.findings)
            tpl = client.create_template(name, sb, accept_findings=True)
        _templates.append(name)
        self.assertEqual(tpl.name, name)
        self.assertTrue(tpl.checkpoint)
        self.assertIn(name, [t.name for t in client.list_templates()])
        self.assertEqual(client.get_template(name).checkpoint, tpl.checkpoint)
        with self.assertRaises(Conflict) as cm:
            client.create_template(name, sb)
        self.assertEqual(cm.exception.code, "name_conflict")
        child = new_sandbox_from(name)
        self.assertEqual(client.download(child, "/opt/app/setup.txt"), b"installed")
        kinds = {n["kind"] for n in client.lineage(child)["nodes"]}
        self.assertIn("checkpoint", kinds)
        self.assertIn("bytes_freed", client.gc())
        # Checks of a template: at set times, and now.
        t = client.set_template_policy(name, check_every="24h", on_findings="record")
        self.assertEqual((t.check_every, t.on_findings), ("24h", "record"))
        with self.assertRaises(BadRequest):
            client.set_template_policy(name, check_every="10s")
        checked = client.check_template(name)
        self.assertEqual((checked["template"], checked["trigger"]), (name, "requested"))
        self.assertEqual(client.get_template(name).last_check["time"], checked["time"])
        client.delete_template(name)
        _templates.remove(name)
        self.assertNotIn(name, [t.name for t in client.list_templates()])
        with self.assertRaises(NotFound):
            client.get_template(name)


def new_sandbox_from(source: str) -> str:
    """Creates a sandbox from a checkpoint or template (destroyed at the end)."""
    sb = client.create_sandbox(source)
    _sandboxes.append(sb.id)
    return sb.id


class FanoutPipelineAdviseTest(unittest.TestCase):
    def test_fanout_keeps_the_passing_attempt(self) -> None:
        sb = new_sandbox()
        client.upload(sb, "/root/base.txt", b"base")
        r = client.fanout(sb, run="test {i} = 2 && echo won > /root/won", count=3, select="first_success")
        self.assertEqual(r["winner"], 2, r)
        winner = r["winner_sandbox"]
        _sandboxes.append(winner)
        self.assertEqual(client.download(winner, "/root/won"), b"won\n")
        self.assertEqual(client.download(winner, "/root/base.txt"), b"base")
        losers = [a["sandbox_id"] for a in r["attempts"] if a["index"] != 2]
        listed = {s.id for s in client.list_sandboxes()}
        self.assertFalse(set(losers) & listed, "losers are destroyed")
        none = client.fanout(sb, run="false", count=2, select="all_success")
        self.assertIsNone(none.get("winner"), none)
        self.assertTrue(none.get("reason"), none)

    def test_pipeline_runs_stages_and_reports_them(self) -> None:
        spec = f"""
[[stage]]
name = "setup"
source = "image:{IMAGE}"
lifecycle = "persistent"
commands = ["echo prepared > /root/prepared"]

[[stage]]
name = "eval"
source = "stage:setup"
lifecycle = "ephemeral"
commands = ["grep -q prepared /root/prepared"]
"""
        events = list(client.run_pipeline_follow(spec))
        self.assertTrue(events, "progress events arrive")
        run_id = next(e["run_id"] for e in events if "run_id" in e) if any("run_id" in e for e in events) else None
        runs = client.list_pipelines()
        self.assertTrue(runs)
        run = client.pipeline(run_id or runs[0]["id"])
        self.assertEqual(run["state"], "succeeded", run)
        self.assertEqual([s["name"] for s in run["stages"]], ["setup", "eval"])
        for st in run["stages"]:
            _sandboxes.extend(st.get("sandboxes") or [])
        self.assertIn("total", client.pipeline_cost(run["id"]))
        with self.assertRaises(BadRequest):
            client.run_pipeline('[[stage]]\nname = "x"\nsource = "stage:nope"\nlifecycle = "ephemeral"\ncommands = ["true"]\n')
        with self.assertRaises(NotFound):
            client.pipeline("no-such-run")

    def test_advise(self) -> None:
        a = client.advise(keep=["processes"], setup="2m", turns=5, idle="30m")
        self.assertEqual(a["recommendation"], "standby_between_turns", a)
        self.assertTrue(any(c["strategy"] == "always_on" for c in a["alternatives"]))
        with self.assertRaises(BadRequest):
            client.advise(turns=0)


class StandbyTest(unittest.TestCase):
    def test_standby_resume_keeps_processes(self) -> None:
        sb = new_sandbox()
        client.upload(sb, "/root/kept.txt", b"still here")
        p = client.start_process(sb, ["sleep", "600"])
        try:
            ev = client.standby(sb)
        except Unsupported as e:
            self.skipTest(f"standby unsupported on this host: {e}")
        self.assertEqual(ev.to, "standby")
        info = client.get_sandbox(sb)
        self.assertEqual(info.state, "standby")
        assert info.standby is not None
        self.assertEqual(info.standby.mode, "processes")
        self.assertGreaterEqual(info.standby.api_processes, 1)

        res = client.resume(sb)
        self.assertEqual(res.from_state, "standby")
        self.assertGreaterEqual(res.duration_ms, 0)
        self.assertTrue(res.processes_restored)
        self.assertEqual(res.sandbox.state, "running")
        self.assertEqual(client.get_process(sb, p.id).status, "running")
        ps = client.exec(sb, "ps -o comm 2>/dev/null || ps").stdout_text
        self.assertIn("sleep", ps)
        self.assertEqual(client.download(sb, "/root/kept.txt"), b"still here")

    def test_fs_only_standby_and_auto_resume(self) -> None:
        sb = new_sandbox()
        client.upload(sb, "/root/kept.txt", b"fs only")
        self.assertEqual(client.standby(sb, fs_only=True).to, "standby")
        info = client.get_sandbox(sb)
        assert info.standby is not None
        self.assertEqual(info.standby.mode, "fs_only")
        r = client.exec(sb, ["cat", "/root/kept.txt"])  # resumes first
        self.assertEqual(r.stdout, b"fs only")
        self.assertEqual(r.resumed_from, "standby")
        self.assertEqual(client.get_sandbox(sb).state, "running")


class LeasesEventsCostTest(unittest.TestCase):
    def test_leases(self) -> None:
        sb = new_sandbox()
        lease = client.take_lease(sb, "10m")
        self.assertEqual(lease.sandbox_id, sb)
        self.assertIn(lease.id, [x.id for x in client.list_leases(sb)])
        renewed = client.renew_lease(sb, lease.id, "20m")
        self.assertGreater(renewed.expires_at, lease.expires_at)
        client.release_lease(sb, lease.id)
        self.assertEqual(client.list_leases(sb), [])
        with self.assertRaises(NotFound) as cm:
            client.release_lease(sb, lease.id)
        self.assertEqual(cm.exception.code, "lease_not_found")

    def test_events_list_and_follow(self) -> None:
        sb = new_sandbox()
        evs = client.events(sandbox=sb)
        self.assertEqual([e.to for e in evs][-1], "running")
        self.assertIn("creating", [e.to for e in evs])
        after = evs[-1].seq
        got: list[SandboxEvent] = []
        errors: list[BaseException] = []

        def follow() -> None:
            try:
                for e in client.follow_events(sandbox=sb, after=after, request_timeout=30):
                    got.append(e)
                    if e.to == "running" and e.from_state == "paused":
                        return
            except BaseException as e:  # reported below
                errors.append(e)

        t = threading.Thread(target=follow, daemon=True)
        t.start()
        time.sleep(0.3)
        client.pause(sb)
        client.unpause(sb)
        t.join(30)
        self.assertFalse(errors, errors)
        self.assertEqual([e.to for e in got], ["paused", "running"])
        self.assertTrue(all(e.seq > after for e in got))

    def test_cost(self) -> None:
        sb = new_sandbox()
        client.exec(sb, ["true"])
        report = client.sandbox_cost(sb)
        self.assertEqual(report.sandbox_id, sb)
        self.assertGreaterEqual(report.total, 0.0)
        self.assertGreaterEqual(report.always_on.total, 0.0)
        self.assertIsInstance(report.storage, dict)
        summary = client.cost()
        self.assertIn(sb, [r.sandbox_id for r in summary.sandboxes])
        self.assertGreaterEqual(summary.total, 0.0)
        with self.assertRaises(NotFound) as cm:
            client.sandbox_cost("no-such-sandbox")
        self.assertEqual(cm.exception.code, "sandbox_not_found")


class TcpTest(unittest.TestCase):
    """Over TCP with the bearer token; needs ``STRATA_URL`` and ``STRATA_TOKEN`` (a daemon with ``--listen``)."""

    def test_tcp_with_token(self) -> None:
        url, token = os.environ.get("STRATA_URL"), os.environ.get("STRATA_TOKEN")
        if not url or not token:
            self.skipTest("STRATA_URL/STRATA_TOKEN not set (daemon without --listen)")
        tcp = Client(url=url, token=token.strip())
        self.assertIn(IMAGE, [i.name for i in tcp.list_images()])
        sb = tcp.create_sandbox(IMAGE)
        _sandboxes.append(sb.id)
        self.assertEqual(tcp.exec(sb.id, ["echo", "tcp"]).stdout, b"tcp\n")
        self.assertEqual([e.type for e in tcp.exec_stream(sb.id, ["true"])][-1], "exited")
        with self.assertRaises(Unauthorized) as cm:
            Client(url=url, token="wrong").list_images()
        self.assertEqual(cm.exception.status, 401)
        self.assertEqual(cm.exception.code, "unauthorized")


if __name__ == "__main__":
    unittest.main()
