"""Compatibility suite: the official e2b SDK (pinned, see E2B_VERSION) against
a strata daemon. Run by crates/cli/tests/e2b.rs with E2B_API_URL,
E2B_SANDBOX_URL and E2B_API_KEY pointing at a private daemon; every test
asserts real results, unsupported calls assert the exception and message."""

import json
import os
import socket
import time
import unittest
import urllib.request
import urllib.error

import e2b
from e2b import (
    AuthenticationException,
    BuildException,
    Template,
    wait_for_port,
    CommandExitException,
    NotFoundException,
    Sandbox,
    SandboxException,
    SandboxQuery,
    SandboxUnreachableException,
    SandboxState,
    TimeoutException,
)
from e2b.sandbox.filesystem.filesystem import FileType
from e2b.sandbox.filesystem.watch_handle import FilesystemEventType

E2B_VERSION = "2.63.0"
API = os.environ["E2B_API_URL"]
KEY = os.environ["E2B_API_KEY"]


def raw(method, path, body=None, headers=None):
    """A plain HTTP/1.1 request to the daemon: (status, parsed JSON or bytes)."""
    req = urllib.request.Request(API + path, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            data = r.read()
            status = r.status
    except urllib.error.HTTPError as e:
        data = e.read()
        status = e.code
    try:
        return status, json.loads(data)
    except ValueError:
        return status, data


class Base(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.sb = Sandbox.create(metadata={"suite": "e2b", "cls": cls.__name__}, envs={"SANDBOX_VAR": "from-create"})

    @classmethod
    def tearDownClass(cls):
        try:
            cls.sb.kill()
        except Exception:
            pass


class TestVersion(unittest.TestCase):
    def test_pinned_sdk(self):
        from importlib.metadata import version
        self.assertEqual(version("e2b"), E2B_VERSION)


class TestLifecycle(unittest.TestCase):
    def test_create_info_list_connect_kill(self):
        sb = Sandbox.create("base", timeout=120, metadata={"owner": "lifecycle"})
        try:
            info = sb.get_info()
            self.assertEqual(info.sandbox_id, sb.sandbox_id)
            self.assertEqual(info.template_id, "base")
            self.assertEqual(info.metadata, {"owner": "lifecycle"})
            self.assertEqual(info.state.value, "running")
            left = (info.end_at - info.started_at).total_seconds()
            self.assertTrue(110 <= left <= 130, left)
            self.assertTrue(sb.is_running())
            # v2 list with metadata and state filters.
            found = Sandbox.list(query=SandboxQuery(metadata={"owner": "lifecycle"}, state=[SandboxState.RUNNING])).next_items()
            self.assertEqual([s.sandbox_id for s in found], [sb.sandbox_id])
            none = Sandbox.list(query=SandboxQuery(metadata={"owner": "lifecycle"}, state=[SandboxState.PAUSED])).next_items()
            self.assertEqual(none, [])
            # connect by id, run through the new handle.
            again = Sandbox.connect(sb.sandbox_id)
            self.assertEqual(again.commands.run("echo connected").stdout, "connected\n")
        finally:
            self.assertTrue(sb.kill())
        self.assertFalse(Sandbox.kill(sb.sandbox_id))
        with self.assertRaises(NotFoundException):
            Sandbox.connect(sb.sandbox_id)

    def test_list_pagination(self):
        boxes = [Sandbox.create(metadata={"page": "p"}) for _ in range(3)]
        try:
            pager = Sandbox.list(query=SandboxQuery(metadata={"page": "p"}), limit=2)
            first = pager.next_items()
            self.assertEqual(len(first), 2)
            self.assertTrue(pager.has_next)
            second = pager.next_items()
            self.assertEqual(len(second), 1)
            self.assertFalse(pager.has_next)
            self.assertEqual(sorted(s.sandbox_id for s in first + second), sorted(b.sandbox_id for b in boxes))
        finally:
            for b in boxes:
                b.kill()

    def test_list_order_and_start_time(self):
        boxes = []
        try:
            for _ in range(3):
                boxes.append(Sandbox.create(metadata={"order": "o"}))
                time.sleep(0.05)
            made = [b.sandbox_id for b in boxes]
            q = SandboxQuery(metadata={"order": "o"})
            newest_first = [s.sandbox_id for s in Sandbox.list(query=q).next_items()]
            self.assertEqual(newest_first, made[::-1], "E2B's default order is newest first")
            oldest_first = [s.sandbox_id for s in Sandbox.list(query=q, order="asc").next_items()]
            self.assertEqual(oldest_first, made)
            # Pagination keeps the order across pages.
            pager = Sandbox.list(query=q, order="desc", limit=2)
            paged = [s.sandbox_id for s in pager.next_items()] + [s.sandbox_id for s in pager.next_items()]
            self.assertEqual(paged, made[::-1])
            second = boxes[1].get_info().started_at
            after = [s.sandbox_id for s in Sandbox.list(query=SandboxQuery(metadata={"order": "o"}, started_after=second)).next_items()]
            self.assertEqual(after, made[:0:-1], "startedAfter is inclusive")
        finally:
            for b in boxes:
                b.kill()

    def test_set_timeout(self):
        sb = Sandbox.create(timeout=60)
        try:
            sb.set_timeout(900)
            info = sb.get_info()
            left = (info.end_at.timestamp() - time.time())
            self.assertTrue(880 <= left <= 910, left)
        finally:
            sb.kill()

    def test_connect_only_extends_and_a_timeout_ends_on_time(self):
        sb = Sandbox.create(timeout=300)
        try:
            end = sb.get_info().end_at
            Sandbox.connect(sb.sandbox_id, timeout=10)
            self.assertEqual(sb.get_info().end_at, end, "connect(timeout) never shortens a running sandbox")
            Sandbox.connect(sb.sandbox_id, timeout=900)
            left = sb.get_info().end_at.timestamp() - time.time()
            self.assertTrue(880 <= left <= 910, left)
            # set_timeout both ways; the end is kept to the millisecond, and the
            # sandbox is gone at it (the policy loop wakes at the deadline).
            t0 = time.time()
            sb.set_timeout(2)
            end = sb.get_info().end_at.timestamp()
            self.assertLess(abs(end - (t0 + 2)), 0.5, end - t0)
            while sb.is_running() and time.time() < t0 + 30:
                time.sleep(0.05)
            ended = time.time() - t0
            self.assertFalse(sb.is_running())
            self.assertGreaterEqual(ended, 1.9, "not before its timeout")
            print(f"set_timeout(2): gone {ended:.2f} s after the call", flush=True)
        finally:
            sb.kill()

    def test_killing_a_sandbox_ends_its_command_streams_as_not_found(self):
        sb = Sandbox.create()
        h = sb.commands.run("echo started; sleep 60", background=True)
        self.assertEqual(next(iter(h))[0], "started\n")
        Sandbox.kill(sb.sandbox_id)
        with self.assertRaises(NotFoundException) as cm:
            h.wait()
        self.assertIn("was killed", str(cm.exception))

    def test_unknown_template_is_not_found(self):
        with self.assertRaises(SandboxException) as cm:
            Sandbox.create("no-such-template")
        self.assertIn("no-such-template", str(cm.exception))


class TestAuth(unittest.TestCase):
    def test_wrong_and_missing_key(self):
        with self.assertRaises(AuthenticationException):
            Sandbox.create(api_key="e2b_wrong_key_0000000000000000")
        status, body = raw("GET", "/v2/sandboxes")
        self.assertEqual(status, 401)
        self.assertEqual(body["code"], 401)
        self.assertIn("API key", body["message"])
        status, body = raw("GET", "/v2/sandboxes", headers={"X-API-Key": "wrong"})
        self.assertEqual(status, 401)
        self.assertEqual(body["code"], 401)

    def test_other_tenants_key_sees_nothing(self):
        other = os.environ.get("E2B_OTHER_KEY")
        self.assertTrue(other, "E2B_OTHER_KEY (a key of another tenant) is not set")
        sb = Sandbox.create()
        try:
            with self.assertRaises(NotFoundException):
                Sandbox.connect(sb.sandbox_id, api_key=other)
            with self.assertRaises(NotFoundException):
                Sandbox.get_info(sb.sandbox_id, api_key=other)
            self.assertFalse(Sandbox.kill(sb.sandbox_id, api_key=other))
            self.assertNotIn(sb.sandbox_id, [s.sandbox_id for s in Sandbox.list(api_key=other).next_items()])
            # envd with the other key: the sandbox does not exist for it.
            h = {"E2b-Sandbox-Id": sb.sandbox_id, "E2b-Sandbox-Port": "49983", "X-Access-Token": other, "Content-Type": "application/json"}
            status, body = raw("POST", "/filesystem.Filesystem/Stat", body=b'{"path": "/etc"}', headers=h)
            self.assertEqual(status, 404)
            self.assertEqual(body["code"], "not_found")
            status, body = raw("GET", "/files?path=/etc/hostname", headers=h)
            self.assertEqual(status, 404)
            self.assertTrue(sb.is_running())
        finally:
            sb.kill()

    def test_unknown_sandbox_is_404(self):
        with self.assertRaises(NotFoundException):
            Sandbox.connect("0123456789abcdef")
        status, body = raw("GET", "/sandboxes/0123456789abcdef", headers={"X-API-Key": KEY})
        self.assertEqual(status, 404)
        self.assertEqual(body["code"], 404)


class TestCommands(Base):
    def test_foreground(self):
        r = self.sb.commands.run("echo hi; echo err >&2; whoami; pwd; echo $SANDBOX_VAR")
        self.assertEqual(r.exit_code, 0)
        self.assertEqual(r.stdout, "hi\nuser\n/home/user\nfrom-create\n")
        self.assertEqual(r.stderr, "err\n")

    def test_envs_cwd_user(self):
        r = self.sb.commands.run("echo $FOO; pwd", envs={"FOO": "bar"}, cwd="/tmp")
        self.assertEqual(r.stdout, "bar\n/tmp\n")
        r = self.sb.commands.run("whoami", user="root")
        self.assertEqual(r.stdout, "root\n")

    def test_exit_code(self):
        with self.assertRaises(CommandExitException) as cm:
            self.sb.commands.run("echo out; exit 3")
        self.assertEqual(cm.exception.exit_code, 3)
        self.assertEqual(cm.exception.stdout, "out\n")

    def test_callbacks(self):
        seen = []
        self.sb.commands.run("echo a; echo b", on_stdout=lambda s: seen.append(s))
        self.assertEqual("".join(seen), "a\nb\n")

    def test_background_and_wait(self):
        h = self.sb.commands.run("sleep 0.5; echo done", background=True)
        self.assertGreater(h.pid, 0)
        r = h.wait()
        self.assertEqual(r.stdout, "done\n")

    def test_stdin(self):
        h = self.sb.commands.run("cat", background=True, stdin=True)
        self.sb.commands.send_stdin(h.pid, "hello ")
        self.sb.commands.send_stdin(h.pid, b"world\n")
        self.sb.commands.close_stdin(h.pid)
        self.assertEqual(h.wait().stdout, "hello world\n")

    def test_stream_input(self):
        h = self.sb.commands.run("cat", background=True, stdin=True)
        self.sb.commands.stream_input(h.pid, iter(["a", b"b", "c\n"]))
        self.sb.commands.close_stdin(h.pid)
        self.assertEqual(h.wait().stdout, "abc\n")

    def test_timeout(self):
        t = time.time()
        with self.assertRaises(TimeoutException):
            self.sb.commands.run("sleep 30; echo still-here > /tmp/not-killed", timeout=1)
        self.assertLess(time.time() - t, 10)
        # The deadline (Connect-Timeout-Ms) is envd's too: the command is killed then.
        h = self.sb.commands.run("echo started; sleep 30; echo still-here > /tmp/not-killed-bg", background=True, timeout=2)
        with self.assertRaises(TimeoutException):
            h.wait()
        for _ in range(40):  # the SDK's own deadline may fire a moment before the kill
            if h.pid not in [p.pid for p in self.sb.commands.list()]:
                break
            time.sleep(0.1)
        self.assertNotIn(h.pid, [p.pid for p in self.sb.commands.list()])
        self.assertFalse(self.sb.files.exists("/tmp/not-killed-bg"))
        # timeout=0: no deadline.
        self.assertEqual(self.sb.commands.run("sleep 1.5; echo done", timeout=0).stdout, "done\n")
        # A malformed deadline is refused as connect-go refuses it.
        h = {"E2b-Sandbox-Id": self.sb.sandbox_id, "E2b-Sandbox-Port": "49983", "X-Access-Token": KEY,
             "Content-Type": "application/json", "Connect-Timeout-Ms": "12345678901"}
        status, body = raw("POST", "/filesystem.Filesystem/Stat", b'{"path": "/tmp"}', h)
        self.assertEqual((status, body["code"]), (400, "invalid_argument"))
        self.assertIn("has >10 digits", body["message"])

    def test_kill_and_list(self):
        h = self.sb.commands.run("sleep 300", background=True)
        procs = {p.pid: p for p in self.sb.commands.list()}
        self.assertIn(h.pid, procs)
        self.assertEqual(procs[h.pid].cmd, "/bin/bash")
        self.assertEqual(procs[h.pid].args, ["-l", "-c", "sleep 300"])
        self.assertTrue(self.sb.commands.kill(h.pid))
        with self.assertRaises(CommandExitException):
            h.wait()
        self.assertNotIn(h.pid, [p.pid for p in self.sb.commands.list()])
        self.assertFalse(self.sb.commands.kill(h.pid))

    def test_reconnect_to_running_command(self):
        h = self.sb.commands.run("for i in 1 2 3; do echo line$i; sleep 0.4; done", background=True)
        h.disconnect()
        again = self.sb.commands.connect(h.pid)
        r = again.wait()
        self.assertEqual(r.stdout, "line1\nline2\nline3\n")

    def test_pty(self):
        from e2b.sandbox.commands.command_handle import PtySize
        h = self.sb.pty.create(PtySize(rows=30, cols=100))
        self.sb.pty.send_stdin(h.pid, b"tty; stty size; echo pty-$((6*7))\n")
        time.sleep(1.5)  # let the shell answer before the resize
        self.sb.pty.resize(h.pid, PtySize(rows=40, cols=120))
        self.sb.pty.send_stdin(h.pid, b"stty size; exit 5\n")
        out = []
        with self.assertRaises(CommandExitException) as cm:
            h.wait(on_pty=lambda d: out.append(bytes(d)))
        self.assertEqual(cm.exception.exit_code, 5)
        text = b"".join(out).decode(errors="replace")
        self.assertIn("/dev/pts/", text)
        self.assertIn("30 100", text)
        self.assertIn("pty-42", text)
        self.assertIn("40 120", text)
        # A resize right after the start reaches the terminal (the process may not run yet).
        h2 = self.sb.pty.create(PtySize(rows=10, cols=50))
        self.sb.pty.resize(h2.pid, PtySize(rows=33, cols=111))
        self.sb.pty.send_stdin(h2.pid, b"stty size; echo term=$TERM; exit\n")
        out2 = []
        h2.wait(on_pty=lambda d: out2.append(bytes(d)))
        text2 = b"".join(out2).decode(errors="replace")
        self.assertIn("33 111", text2)
        self.assertIn("term=xterm-256color", text2)

    def test_base_image(self):
        r = self.sb.commands.run("python3 -c 'print(1+1)'; git --version >/dev/null && echo git; curl --version >/dev/null && echo curl; id -u; echo $HOME")
        self.assertEqual(r.stdout, "2\ngit\ncurl\n1000\n/home/user\n")
        # What E2B's base image has and programs call: `python`, node and npm.
        r = self.sb.commands.run("python -c 'import sys; print(sys.version_info[0])'; node -e 'console.log(6*7)'; npm --version; pip --version >/dev/null && echo pip")
        self.assertEqual(r.stdout.split("\n")[:2], ["3", "42"])
        self.assertRegex(r.stdout, r"\n10\.\d+\.\d+\npip\n$")
        # npm works offline as a user would use it: a local package installed from a directory.
        r = self.sb.commands.run("mkdir -p ~/pkg ~/app && cd ~/pkg && npm init -y >/dev/null && "
                                 "echo 'module.exports = () => \"from-pkg\"' > index.js && cd ~/app && npm init -y >/dev/null && "
                                 "npm install --offline --no-audit --no-fund ../pkg >/dev/null 2>&1 && node -e 'console.log(require(\"pkg\")())'")
        self.assertEqual(r.stdout, "from-pkg\n")
        # A boot id of the sandbox's own (E2B: each VM boot has one), not the host's.
        boot = self.sb.commands.run("cat /proc/sys/kernel/random/boot_id").stdout.strip()
        self.assertRegex(boot, r"^[0-9a-f-]{36}$")
        self.assertNotEqual(boot, open("/proc/sys/kernel/random/boot_id").read().strip())
        # Passwordless sudo works as in E2B's base image (E2B sandboxes allow
        # setuid): it reaches the sandbox's root, whose capabilities stay the
        # reduced set (CapBnd 0x5fb) under the same seccomp filter.
        self.assertEqual(self.sb.commands.run("sudo -n whoami").stdout, "root\n")
        r = self.sb.commands.run("sudo -n grep -E '^(CapBnd|CapEff|NoNewPrivs|Seccomp):' /proc/self/status")
        self.assertEqual(r.stdout.split(), ["CapEff:", "00000000000005fb", "CapBnd:", "00000000000005fb", "NoNewPrivs:", "0", "Seccomp:", "2"])
        with self.assertRaises(CommandExitException) as cm:
            self.sb.commands.run("sudo -n mount -t tmpfs none /mnt")
        self.assertIn("permission denied", cm.exception.stderr.lower())
        self.assertEqual(self.sb.commands.run("whoami", user="root").stdout, "root\n")
        r = self.sb.commands.run("grep -c NOPASSWD /etc/sudoers.d/user; getent passwd user", user="root")
        self.assertEqual(r.stdout, "1\nuser:x:1000:1000::/home/user:/bin/bash\n")

    def test_files_belong_to_the_user(self):
        self.sb.files.write("/tmp/own/x.txt", "x")
        self.sb.files.make_dir("/home/user/mine")
        r = self.sb.commands.run("stat -c %U /tmp/own /tmp/own/x.txt /home/user/mine; echo y >> /tmp/own/x.txt; rm /tmp/own/x.txt && echo removed")
        self.assertEqual(r.stdout, "user\nuser\nuser\nremoved\n")
        with self.assertRaises(SandboxException):
            self.sb.files.make_dir("/etc/not-yours")


class TestFiles(Base):
    def test_write_read_text_and_binary(self):
        info = self.sb.files.write("hello.txt", "hello")
        self.assertEqual(info.path, "/home/user/hello.txt")
        self.assertEqual(self.sb.files.read("hello.txt"), "hello")
        blob = bytes(range(256)) * 64
        self.sb.files.write("/tmp/blob.bin", blob)
        self.assertEqual(bytes(self.sb.files.read("/tmp/blob.bin", format="bytes")), blob)
        self.sb.files.write("/tmp/blob2.bin", blob, use_octet_stream=True)
        self.assertEqual(bytes(self.sb.files.read("/tmp/blob2.bin", format="bytes")), blob)
        self.assertEqual(self.sb.commands.run("md5sum < /tmp/blob.bin").stdout, self.sb.commands.run("md5sum < /tmp/blob2.bin").stdout)

    def test_write_files_multipart(self):
        out = self.sb.files.write_files([{"path": "/tmp/m/a.txt", "data": "A"}, {"path": "/tmp/m/b.txt", "data": b"B"}])
        self.assertEqual(sorted(w.path for w in out), ["/tmp/m/a.txt", "/tmp/m/b.txt"])
        self.assertEqual(self.sb.commands.run("cat /tmp/m/a.txt /tmp/m/b.txt").stdout, "AB")

    def test_list_exists_info_rename_remove_mkdir(self):
        self.assertTrue(self.sb.files.make_dir("/tmp/d/sub"))
        self.assertFalse(self.sb.files.make_dir("/tmp/d/sub"))
        self.sb.files.write("/tmp/d/f.txt", "12345")
        names = sorted(e.name for e in self.sb.files.list("/tmp/d"))
        self.assertEqual(names, ["f.txt", "sub"])
        deep = sorted(e.path for e in self.sb.files.list("/tmp/d", depth=2))
        self.assertEqual(deep, ["/tmp/d/f.txt", "/tmp/d/sub"])
        self.assertTrue(self.sb.files.exists("/tmp/d/f.txt"))
        self.assertFalse(self.sb.files.exists("/tmp/d/nope"))
        info = self.sb.files.get_info("/tmp/d/f.txt")
        self.assertEqual(info.type, FileType.FILE)
        self.assertEqual(info.size, 5)
        self.assertEqual(self.sb.files.get_info("/tmp/d").type, FileType.DIR)
        moved = self.sb.files.rename("/tmp/d/f.txt", "/tmp/d/g.txt")
        self.assertEqual(moved.path, "/tmp/d/g.txt")
        self.assertFalse(self.sb.files.exists("/tmp/d/f.txt"))
        self.sb.files.remove("/tmp/d")
        self.sb.files.remove("/tmp/d")  # a missing path is already removed: no error, as envd
        self.assertFalse(self.sb.files.exists("/tmp/d"))
        with self.assertRaises(NotFoundException):
            self.sb.files.read("/tmp/d/g.txt")

    def test_watch_dir(self):
        self.sb.files.make_dir("/tmp/w")
        w = self.sb.files.watch_dir("/tmp/w")
        self.sb.files.write("/tmp/w/new.txt", "x")
        kinds = [(e.name, e.type) for e in w.get_new_events()]
        # strata writes as root and gives a new file to the user: a CHMOD follows.
        self.assertEqual(kinds[:2], [("new.txt", FilesystemEventType.CREATE), ("new.txt", FilesystemEventType.WRITE)])
        self.assertEqual(w.get_new_events(), [])
        self.sb.commands.run("echo more >> /tmp/w/new.txt")
        self.assertEqual([(e.name, e.type) for e in w.get_new_events()], [("new.txt", FilesystemEventType.WRITE)])
        self.sb.commands.run("rm /tmp/w/new.txt")
        self.assertEqual([(e.name, e.type) for e in w.get_new_events()], [("new.txt", FilesystemEventType.REMOVE)])
        w.stop()
        with self.assertRaises(SandboxException):
            w.get_new_events()

    def test_watch_dir_sees_every_event_between_polls_with_entries(self):
        self.sb.files.make_dir("/tmp/w2/sub")
        w = self.sb.files.watch_dir("/tmp/w2", recursive=True, include_entry=True)
        # Created and removed between two polls (polling could never see these),
        # in a subdirectory, and a directory made after the watch began.
        self.sb.commands.run("for i in $(seq 1 200); do echo $i > /tmp/w2/f$i; rm /tmp/w2/f$i; done; "
                             "echo s > /tmp/w2/sub/s.txt; mkdir /tmp/w2/late; sleep 0.2; echo l > /tmp/w2/late/l.txt; "
                             "mv /tmp/w2/sub/s.txt /tmp/w2/sub/t.txt; chmod 600 /tmp/w2/sub/t.txt")
        events = w.get_new_events()
        seen = [(e.name, e.type) for e in events]
        for i in range(1, 201):
            self.assertIn((f"f{i}", FilesystemEventType.CREATE), seen)
            self.assertIn((f"f{i}", FilesystemEventType.REMOVE), seen)
        self.assertLess(seen.index(("f1", FilesystemEventType.CREATE)), seen.index(("f1", FilesystemEventType.REMOVE)))
        rest = [x for x in seen if not x[0].startswith("f")]
        for want in [("sub/s.txt", FilesystemEventType.CREATE), ("late", FilesystemEventType.CREATE),
                     ("late/l.txt", FilesystemEventType.CREATE), ("late/l.txt", FilesystemEventType.WRITE),
                     ("sub/s.txt", FilesystemEventType.RENAME), ("sub/t.txt", FilesystemEventType.CREATE),
                     ("sub/t.txt", FilesystemEventType.CHMOD)]:
            self.assertIn(want, rest)
        chmod = [e for e in events if e.name == "sub/t.txt" and e.type == FilesystemEventType.CHMOD][0]
        self.assertEqual((chmod.entry.path, chmod.entry.mode, chmod.entry.type), ("/tmp/w2/sub/t.txt", 0o600, FileType.FILE))
        removed = [e for e in events if e.type == FilesystemEventType.REMOVE]
        self.assertTrue(all(e.entry is None for e in removed), "a removal carries no entry, as envd's")
        w.stop()

    def test_metadata_is_kept_as_user_xattrs(self):
        meta = {"owner": "team-a", "build": "42"}
        info = self.sb.files.write("/tmp/meta/a.txt", "a", metadata={"Owner": "team-a", "build": "42"})
        self.assertEqual(info.metadata, meta)
        self.assertEqual(self.sb.files.get_info("/tmp/meta/a.txt").metadata, meta)
        self.assertEqual({e.name: e.metadata for e in self.sb.files.list("/tmp/meta")}, {"a.txt": meta})
        # Inside the sandbox they are user.e2b.* extended attributes; ones set there show too.
        r = self.sb.commands.run("python3 -c \"import os; p='/tmp/meta/a.txt'; print(os.getxattr(p, 'user.e2b.owner').decode()); os.setxattr(p, 'user.e2b.extra', b'in-sandbox')\"")
        self.assertEqual(r.stdout, "team-a\n")
        self.assertEqual(self.sb.files.get_info("/tmp/meta/a.txt").metadata["extra"], "in-sandbox")
        # A write without metadata replaces the file and its metadata, as envd's.
        self.sb.files.write("/tmp/meta/a.txt", "b")
        self.assertIsNone(self.sb.files.get_info("/tmp/meta/a.txt").metadata)
        out = self.sb.files.write_files([{"path": "/tmp/meta/x", "data": "x"}, {"path": "/tmp/meta/y", "data": "y"}], metadata={"k": "v"})
        self.assertEqual([w.metadata for w in out], [{"k": "v"}, {"k": "v"}])
        # Metadata envd refuses is refused before anything is written.
        h = {"E2b-Sandbox-Id": self.sb.sandbox_id, "E2b-Sandbox-Port": "49983", "X-Access-Token": KEY,
             "Content-Type": "application/octet-stream", "X-Metadata-big": "v" * 5000}
        status, body = raw("POST", "/files?path=/tmp/meta/bad", b"x", h)
        self.assertEqual((status, body["message"]), (400, "invalid metadata: total metadata size 5012 exceeds 4096 bytes"))
        self.assertFalse(self.sb.files.exists("/tmp/meta/bad"))

    def test_gzip_uploads_and_downloads(self):
        blob = (b"strata " * 50000) + bytes(range(256))
        self.sb.files.write("/tmp/gz.bin", blob, gzip=True)
        self.assertEqual(self.sb.commands.run("wc -c < /tmp/gz.bin").stdout.strip(), str(len(blob)))
        self.assertEqual(bytes(self.sb.files.read("/tmp/gz.bin", format="bytes", gzip=True)), blob)
        h = {"E2b-Sandbox-Id": self.sb.sandbox_id, "E2b-Sandbox-Port": "49983", "X-Access-Token": KEY}
        req = urllib.request.Request(API + "/files?path=/tmp/gz.bin", headers=dict(h, **{"Accept-Encoding": "gzip"}))
        with urllib.request.urlopen(req, timeout=30) as r:
            self.assertEqual((r.headers["Content-Encoding"], r.headers["Vary"]), ("gzip", "Accept-Encoding"))
            import gzip as gz
            self.assertEqual(gz.decompress(r.read()), blob)
        # Not gzip, or an encoding envd does not take: 400, nothing written.
        for enc, body, msg in [("gzip", b"not gzip at all", "error decompressing request body"),
                               ("br", b"x", "unsupported Content-Encoding: br, supported: [gzip]")]:
            status, out = raw("POST", "/files?path=/tmp/gz-bad", body, dict(h, **{"Content-Type": "application/octet-stream", "Content-Encoding": enc}))
            self.assertEqual(status, 400, out)
            self.assertIn(msg, out["message"])
        self.assertFalse(self.sb.files.exists("/tmp/gz-bad"))

    def test_symlinks_are_described_by_their_target(self):
        self.sb.commands.run("mkdir -p /tmp/s/dir/deep && echo hi > /tmp/s/t.txt && chmod 640 /tmp/s/t.txt && "
                             "ln -s t.txt /tmp/s/link && ln -s /tmp/s/dir /tmp/s/dlink && ln -s /nowhere /tmp/s/dangling")
        info = self.sb.files.get_info("/tmp/s/link")
        self.assertEqual((info.type, info.symlink_target, info.mode, info.size), (FileType.SYMLINK, "/tmp/s/t.txt", 0o640, len("t.txt")))
        self.assertTrue(info.permissions.startswith("L"), info.permissions)
        self.assertEqual(self.sb.files.get_info("/tmp/s/dlink").symlink_target, "/tmp/s/dir")
        dangling = self.sb.files.get_info("/tmp/s/dangling")
        self.assertEqual((dangling.type, dangling.symlink_target, dangling.mode), (FileType.SYMLINK, "/tmp/s/dangling", 0))
        # A link to a directory is listed, not entered (envd's walk does not follow links).
        paths = [e.path for e in self.sb.files.list("/tmp/s", depth=3)]
        self.assertIn("/tmp/s/dlink", paths)
        self.assertNotIn("/tmp/s/dlink/deep", paths)

    def test_list_depth_is_depth_first_in_name_order(self):
        self.sb.commands.run("mkdir -p /tmp/o/b /tmp/o/a/x/y && touch /tmp/o/c.txt /tmp/o/a/z.txt /tmp/o/a/x/y/deep.txt /tmp/o/B")
        paths = [e.path[len("/tmp/o/"):] for e in self.sb.files.list("/tmp/o", depth=3)]
        self.assertEqual(paths, ["B", "a", "a/x", "a/x/y", "a/z.txt", "b", "c.txt"])
        self.assertEqual([e.name for e in self.sb.files.list("/tmp/o")], ["B", "a", "b", "c.txt"])


class TestAccessTokensAndSignedUrls(Base):
    def envd(self, method, url, body=None, headers=None):
        """A request as a browser or a plain client sends it: no key; the
        sandbox named by E2B's host form (`49983-<id>.<domain>`)."""
        h = {"Host": f"49983-{self.sb.sandbox_id}.strata.test", **(headers or {})}
        req = urllib.request.Request(url, data=body, method=method, headers=h)
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    def test_the_access_token_is_the_sandboxes_own(self):
        token = self.sb._envd_access_token
        self.assertTrue(token and token != KEY, "a per-sandbox token, not the API key")
        # It opens this sandbox's envd (every call of this suite's SDK uses it) ...
        self.assertEqual(self.sb.commands.run("echo via-token").stdout, "via-token\n")
        # ... and nothing else: not the control plane, not another sandbox.
        status, _ = raw("GET", "/v2/sandboxes", headers={"X-API-Key": token})
        self.assertEqual(status, 401)
        other = Sandbox.create()
        try:
            h = {"E2b-Sandbox-Id": other.sandbox_id, "E2b-Sandbox-Port": "49983", "X-Access-Token": token,
                 "Content-Type": "application/json"}
            status, _ = raw("POST", "/filesystem.Filesystem/Stat", b'{"path": "/tmp"}', h)
            self.assertEqual(status, 401)
        finally:
            other.kill()
        # The same token again on connect.
        self.assertEqual(Sandbox.connect(self.sb.sandbox_id)._envd_access_token, token)

    def test_signed_download_and_upload_urls(self):
        self.sb.files.write("/home/user/signed.txt", "signed bytes")
        url = self.sb.download_url("/home/user/signed.txt")
        self.assertIn("signature=v1_", url)
        self.assertEqual(self.envd("GET", url), (200, b"signed bytes"))
        status, body = self.envd("GET", url.replace("signature=v1_", "signature=v1_x"))
        self.assertEqual((status, json.loads(body)["message"]), (401, "invalid signature"))
        status, body = self.envd("GET", url.split("&signature=")[0])
        self.assertEqual((status, json.loads(body)["message"]), (401, "missing signature query parameter"))
        # A signature names its path and operation.
        other = url.replace("signed.txt", "other.txt")
        self.assertEqual(self.envd("GET", other)[0], 401)
        status, _ = self.envd("POST", url, b"x", {"Content-Type": "application/octet-stream"})
        self.assertEqual(status, 401, "a read signature does not write")
        # Expiry.
        short = self.sb.download_url("/home/user/signed.txt", use_signature_expiration=1)
        self.assertIn("signature_expiration=", short)
        self.assertEqual(self.envd("GET", short)[0], 200)
        time.sleep(2.2)
        status, body = self.envd("GET", short)
        self.assertEqual((status, json.loads(body)["message"]), (401, "signature is already expired"))
        # Upload.
        up = self.sb.upload_url("/home/user/uploaded.txt", use_signature_expiration=60)
        status, body = self.envd("POST", up, b"from a signed url", {"Content-Type": "application/octet-stream"})
        self.assertEqual(status, 200, body)
        self.assertEqual(self.sb.files.read("/home/user/uploaded.txt"), "from a signed url")
        self.assertEqual(self.sb.commands.run("stat -c %U /home/user/uploaded.txt").stdout, "user\n")


class TestTemplateSdk(unittest.TestCase):
    def test_builds_a_warm_template_with_cached_steps(self):
        import tempfile
        ctx = tempfile.mkdtemp()
        os.makedirs(f"{ctx}/app/sub")
        with open(f"{ctx}/app/main.py", "w") as f:
            f.write("print('from app')\n")
        with open(f"{ctx}/app/sub/data.txt", "w") as f:
            f.write("data\n")
        with open(f"{ctx}/single.txt", "w") as f:
            f.write("single\n")
        t = (Template(file_context_path=ctx)
             .from_base_image()
             .set_envs({"GREETING": "hello"})
             .run_cmd("echo built-as-$(id -un) > /tmp/built.txt", user="user")
             .copy("app", "/home/user/app")
             .copy("single.txt", "/opt/single.txt", user="user", mode=0o640)
             .set_workdir("/home/user/app")
             .set_user("user")
             .set_start_cmd("python -m http.server 8000", wait_for_port(8000)))
        logs = []
        info = Template.build(t, "sdk-tpl", on_build_logs=lambda e: logs.append(e.message))
        self.assertEqual(info.name, "sdk-tpl")
        text = "\n".join(logs)
        self.assertIn("RUN [user] echo built-as", text, "the build's own log lines reach on_build_logs")
        self.assertIn("template sdk-tpl ready", text)
        self.assertTrue(Template.exists("sdk-tpl"))
        self.assertFalse(Template.exists("no-such-template"))
        sb = Sandbox.create("sdk-tpl")
        try:
            # A warm template: the start command already serves, from the workdir.
            r = sb.commands.run("curl -sf localhost:8000/main.py; cat /tmp/built.txt /opt/single.txt /home/user/app/sub/data.txt; "
                                "echo $GREETING; stat -c '%U %a' /home/user/app/main.py /opt/single.txt")
            # Files copied before set_user belong to root (E2B's build context user then), unless given to a user.
            self.assertEqual(r.stdout, "print('from app')\nbuilt-as-user\nsingle\ndata\nhello\nroot 644\nuser 640\n")
        finally:
            sb.kill()
        # Unchanged: every step from the cache.
        again = []
        Template.build(t, "sdk-tpl", on_build_logs=lambda e: again.append(e.message))
        self.assertGreaterEqual(sum("(cached)" in m for m in again), 5, again)
        # Tags: a build of name:tag, tags assigned to a build and removed.
        Template.build(t, "sdk-tpl:v1")
        self.assertEqual(sorted(x.tag for x in Template.get_tags("sdk-tpl")), ["default", "v1"])
        tagged = Template.assign_tags("sdk-tpl:v1", ["prod", "stable"])
        self.assertEqual(sorted(tagged.tags), ["prod", "stable"])
        builds = {x.tag: x.build_id for x in Template.get_tags("sdk-tpl")}
        self.assertEqual(sorted(builds), ["default", "prod", "stable", "v1"])
        self.assertEqual(builds["prod"], builds["v1"], "one build, two tags")
        prod = Sandbox.create("sdk-tpl:prod")
        try:
            self.assertEqual(prod.commands.run("curl -sf localhost:8000/main.py").stdout, "print('from app')\n")
        finally:
            prod.kill()
        Template.remove_tags("sdk-tpl", ["prod", "stable"])
        self.assertEqual(sorted(x.tag for x in Template.get_tags("sdk-tpl")), ["default", "v1"])
        with self.assertRaises(Exception) as cm:
            Template.remove_tags("sdk-tpl", ["never-there"])
        self.assertIn("no tag", str(cm.exception))
        # A failing step: the SDK's BuildException, with the step's output.
        bad = Template().from_base_image().run_cmd("echo about to fail; exit 3")
        with self.assertRaises(BuildException) as cm:
            Template.build(bad, "sdk-bad")
        self.assertIn("exit status 3", str(cm.exception))
        self.assertIn("about to fail", str(cm.exception))
        self.assertFalse(Template.exists("sdk-bad"))


class TestPauseForkSnapshot(unittest.TestCase):
    def test_pause_resume_keeps_process_and_files(self):
        sb = Sandbox.create()
        try:
            sb.files.write("/home/user/keep.txt", "kept")
            h = sb.commands.run("i=0; while true; do i=$((i+1)); echo $i > /tmp/counter; sleep 0.1; done", background=True)
            time.sleep(0.5)
            sb.pause()
            self.assertEqual(Sandbox.get_info(sb.sandbox_id).state.value, "paused")
            # A health probe says "not running" and does not wake it.
            self.assertFalse(sb.is_running())
            self.assertEqual(Sandbox.get_info(sb.sandbox_id).state.value, "paused")
            resumed = Sandbox.connect(sb.sandbox_id)
            self.assertTrue(resumed.is_running())
            self.assertEqual(resumed.get_info().state.value, "running")
            self.assertEqual(resumed.files.read("/home/user/keep.txt"), "kept")
            self.assertIn(h.pid, [p.pid for p in resumed.commands.list()])
            a = int(resumed.files.read("/tmp/counter").strip())
            time.sleep(0.5)
            b = int(resumed.files.read("/tmp/counter").strip())
            self.assertGreater(b, a)
        finally:
            sb.kill()

    def test_auto_resume_off_stays_paused_until_connect(self):
        sb = Sandbox.create(lifecycle={"on_timeout": "pause", "auto_resume": False})
        try:
            self.assertEqual(sb.get_info().lifecycle, {"on_timeout": "pause", "auto_resume": False})
            sb.files.write("/home/user/keep.txt", "kept")
            sb.pause()
            self.assertFalse(sb.is_running())
            with self.assertRaises(SandboxUnreachableException) as cm:
                sb.files.read("/home/user/keep.txt")
            self.assertIn("paused", str(cm.exception))
            with self.assertRaises(SandboxUnreachableException):
                sb.commands.run("true")
            self.assertEqual(Sandbox.get_info(sb.sandbox_id).state.value, "paused", "calls did not wake it")
            resumed = Sandbox.connect(sb.sandbox_id)
            self.assertEqual(resumed.files.read("/home/user/keep.txt"), "kept")
        finally:
            sb.kill()
        # Unset, strata's choice applies: a call resumes a paused sandbox.
        sb = Sandbox.create()
        try:
            self.assertTrue(sb.get_info().lifecycle["auto_resume"])
            sb.pause()
            self.assertEqual(sb.commands.run("echo back").stdout, "back\n")
        finally:
            sb.kill()
        self.assertFalse(sb.is_running(), "a killed sandbox is not running")

    def wait_paused(self, sid, secs=30):
        deadline = time.time() + secs
        while time.time() < deadline:
            if Sandbox.get_info(sid).state.value == "paused":
                return
            time.sleep(0.25)
        self.fail(f"sandbox {sid} did not pause within {secs} s")

    def test_auto_pause_at_timeout_keeps_processes(self):
        # on_timeout "pause" keeps memory (strata: standby at max_lifetime).
        sb = Sandbox.create(timeout=3, lifecycle={"on_timeout": "pause", "auto_resume": True})
        try:
            h = sb.commands.run("i=0; while true; do i=$((i+1)); echo $i > /tmp/counter; sleep 0.1; done", background=True)
            self.wait_paused(sb.sandbox_id)
            resumed = Sandbox.connect(sb.sandbox_id, timeout=60)
            self.assertEqual(resumed.get_info().state.value, "running")
            self.assertIn(h.pid, [p.pid for p in resumed.commands.list()])
            a = int(resumed.files.read("/tmp/counter").strip())
            time.sleep(0.5)
            self.assertGreater(int(resumed.files.read("/tmp/counter").strip()), a)
        finally:
            sb.kill()

    def test_auto_pause_filesystem_mode_keeps_files_only(self):
        # mode "filesystem" (autoPauseMemory=false): a cold boot on resume (strata: stop).
        sb = Sandbox.create(timeout=3, lifecycle={"on_timeout": {"action": "pause", "mode": "filesystem"}})
        try:
            sb.files.write("/home/user/kept.txt", "kept")
            sb.commands.run("sleep 600", background=True)
            self.wait_paused(sb.sandbox_id)
            resumed = Sandbox.connect(sb.sandbox_id, timeout=60)
            self.assertEqual(resumed.files.read("/home/user/kept.txt"), "kept")
            self.assertEqual([p for p in resumed.commands.list() if "sleep 600" in " ".join([p.cmd] + p.args)], [])
        finally:
            sb.kill()

    COUNTER = "i=0; while true; do i=$((i+1)); echo $i > /tmp/counter; sleep 0.05; done"

    def assert_counter_runs(self, sb, pid):
        """The background counter (copied with its memory) runs on in `sb`."""
        self.assertIn(pid, [p.pid for p in sb.commands.list()])
        a = int(sb.files.read("/tmp/counter").strip())
        time.sleep(0.3)
        self.assertGreater(int(sb.files.read("/tmp/counter").strip()), a)

    def test_fork(self):
        sb = Sandbox.create()
        try:
            sb.files.write("/home/user/f.txt", "parent")
            h = sb.commands.run(self.COUNTER, background=True)
            time.sleep(0.3)
            forks = sb.fork(count=2)
            self.assertEqual(len(forks), 2)
            for f in forks:
                self.assertIsInstance(f, Sandbox)
                self.assertNotEqual(f.sandbox_id, sb.sandbox_id)
                self.assertEqual(f.files.read("/home/user/f.txt"), "parent")
                # E2B forks the running sandbox: its processes and memory too.
                self.assert_counter_runs(f, h.pid)
                f.files.write("/home/user/f.txt", f.sandbox_id)
            self.assertEqual(sb.files.read("/home/user/f.txt"), "parent")
            for f in forks:
                f.kill()
        finally:
            sb.kill()

    def test_snapshots(self):
        sb = Sandbox.create()
        try:
            sb.files.write("/home/user/s.txt", "snap")
            h = sb.commands.run(self.COUNTER, background=True)
            time.sleep(0.3)
            snap = sb.create_snapshot()
            self.assertTrue(snap.snapshot_id)
            ids = [s.snapshot_id for s in Sandbox.list_snapshots().next_items()]
            self.assertIn(snap.snapshot_id, ids)
            child = Sandbox.create(snap.snapshot_id)
            try:
                self.assertEqual(child.files.read("/home/user/s.txt"), "snap")
                # A sandbox made from a snapshot starts with its processes running.
                self.assert_counter_runs(child, h.pid)
            finally:
                child.kill()
            # As in E2B, a snapshot can be deleted while its sandbox runs: gone from
            # listings and as a source at once (strata frees its layers later).
            self.assertTrue(Sandbox.delete_snapshot(snap.snapshot_id))
            self.assertNotIn(snap.snapshot_id, [s.snapshot_id for s in Sandbox.list_snapshots().next_items()])
            with self.assertRaises(SandboxException) as cm:
                Sandbox.create(snap.snapshot_id)
            self.assertIn("404", str(cm.exception))
            self.assertFalse(Sandbox.delete_snapshot(snap.snapshot_id))
            self.assertEqual(sb.files.read("/home/user/s.txt"), "snap", "its sandbox runs on")
        finally:
            sb.kill()
        self.assertFalse(Sandbox.delete_snapshot(snap.snapshot_id))

    def test_metrics(self):
        sb = Sandbox.create()
        try:
            sb.commands.run("python3 -c 'sum(range(3000000))'")
            m = sb.get_metrics()
            self.assertGreaterEqual(len(m), 1)
            self.assertGreaterEqual(m[0].cpu_count, 1)
            self.assertGreaterEqual(m[0].cpu_used_pct, 0)
            self.assertGreater(m[-1].mem_used, 0)
            # The range is honoured: samples only from within it, none from before the sandbox.
            import datetime
            now = datetime.datetime.now(datetime.timezone.utc)
            within = sb.get_metrics(start=now - datetime.timedelta(minutes=5), end=now + datetime.timedelta(minutes=1))
            self.assertGreaterEqual(len(within), 1)
            for s in within:
                self.assertTrue(now - datetime.timedelta(minutes=5) <= s.timestamp <= now + datetime.timedelta(minutes=1), s.timestamp)
            self.assertEqual(sb.get_metrics(start=now - datetime.timedelta(days=2), end=now - datetime.timedelta(days=1)), [])
        finally:
            sb.kill()


class TestLogsUnsupportedMalformed(Base):
    def test_network_rules(self):
        def native():
            status, body = raw("GET", f"/v1/sandboxes/{self.sb.sandbox_id}/network", headers={"Authorization": "Bearer " + KEY})
            self.assertEqual(status, 200, body)
            return body["mode"], body.get("allow", [])
        self.sb.update_network({"deny_out": ["0.0.0.0/0"], "allow_out": ["pypi.org", "10.1.2.0/24:443"]})
        self.assertEqual(native(), ("egress", ["pypi.org", "10.1.2.0/24:443"]))
        self.sb.update_network({"deny_out": ["0.0.0.0/0"]})
        self.assertEqual(native(), ("none", []))
        # Open internet with deny exceptions: every public address (strata's
        # 0.0.0.0/0 rule, which never opens the host, private ranges or metadata) but those.
        self.sb.update_network({"deny_out": ["1.1.1.1"]})
        status, body = raw("GET", f"/v1/sandboxes/{self.sb.sandbox_id}/network", headers={"Authorization": "Bearer " + KEY})
        self.assertEqual((body["mode"], body["allow"], body["deny"]), ("egress", ["0.0.0.0/0"], ["1.1.1.1"]))
        # A name cannot be denied (a 400 naming it).
        with self.assertRaises(SandboxException) as cm:
            self.sb.update_network({"deny_out": ["evil.example"]})
        self.assertIn("evil.example", str(cm.exception))
        # allow_internet_access=True (the JS SDK sends it on every create) is open internet.
        open_sb = Sandbox.create(allow_internet_access=True)
        try:
            status, body = raw("GET", f"/v1/sandboxes/{open_sb.sandbox_id}/network", headers={"Authorization": "Bearer " + KEY})
            self.assertEqual((body["mode"], body["allow"]), ("egress", ["0.0.0.0/0"]))
        finally:
            open_sb.kill()
        # On create: deny all but one host.
        sb = Sandbox.create(network={"deny_out": ["0.0.0.0/0"], "allow_out": ["pypi.org"]})
        try:
            status, body = raw("GET", f"/v1/sandboxes/{sb.sandbox_id}/network", headers={"Authorization": "Bearer " + KEY})
            self.assertEqual((body["mode"], body["allow"]), ("egress", ["pypi.org"]))
        finally:
            sb.kill()

    def test_other_ports_go_through_the_preview_proxy(self):
        # A server on port 8000 inside, reached by E2b-Sandbox-Port with the caller's key.
        self.sb.files.write("/home/user/www/hello.txt", "hello from the sandbox\n")
        server = self.sb.commands.run("python3 -m http.server 8000 --bind 127.0.0.1", background=True, cwd="/home/user/www")
        try:
            h = {"E2b-Sandbox-Id": self.sb.sandbox_id, "E2b-Sandbox-Port": "8000", "X-API-Key": KEY}
            deadline = time.time() + 20
            while True:
                status, body = raw("GET", "/hello.txt", headers=h)
                if status == 200 or time.time() > deadline:
                    break
                time.sleep(0.2)
            self.assertEqual((status, body), (200, b"hello from the sandbox\n"))
            status, body = raw("GET", "/missing.txt", headers=h)
            self.assertEqual(status, 404)  # the server's own answer
            # No key: 401 in E2B's shape; a port nobody listens on: the proxy's 502.
            status, body = raw("GET", "/", headers={"E2b-Sandbox-Id": self.sb.sandbox_id, "E2b-Sandbox-Port": "8000"})
            self.assertEqual(status, 401)
            self.assertEqual(body["code"], 401)
            status, body = raw("GET", "/", headers=dict(h, **{"E2b-Sandbox-Port": "8081"}))
            self.assertEqual(status, 502)
            status, body = raw("GET", "/", headers=dict(h, **{"E2b-Sandbox-Id": "no-such-sandbox"}))
            self.assertEqual(status, 404)
        finally:
            server.kill()

    def test_malformed_connect_frames(self):
        h = {"E2b-Sandbox-Id": self.sb.sandbox_id, "E2b-Sandbox-Port": "49983", "X-Access-Token": KEY, "Content-Type": "application/connect+json"}
        for garbage in [b"\x00\x00", b"\x00\xff\xff\xff\xff", b"\x01\x00\x00\x00\x01x", b"\x00\x00\x00\x00\x03abc", os.urandom(200)]:
            status, body = raw("POST", "/process.Process/Start", body=garbage, headers=h)
            self.assertEqual(status, 200)
            self.assertIsInstance(body, bytes)
            self.assertEqual(body[0], 2, body)  # end-of-stream envelope
            end = json.loads(body[5:])
            self.assertIn(end["error"]["code"], ("invalid_argument",))
        uh = dict(h, **{"Content-Type": "application/json"})
        status, body = raw("POST", "/filesystem.Filesystem/Stat", body=b"{not json", headers=uh)
        self.assertEqual(status, 400)
        self.assertEqual(body["code"], "invalid_argument")
        status, body = raw("POST", "/process.Process/Nope", body=b"{}", headers=uh)
        self.assertEqual(status, 501)
        self.assertEqual(body["code"], "unimplemented")
        # Still alive.
        self.assertEqual(self.sb.commands.run("echo alive").stdout, "alive\n")

    def test_logs_are_lifecycle_events(self):
        # The SDK 2.63.0 has no logs call: its generated client is used directly.
        from e2b.api.client_sync import get_api_client
        from e2b.api.client.api.sandboxes import get_v_2_sandboxes_sandbox_id_logs, get_sandboxes_sandbox_id_logs
        from e2b.connection_config import ConnectionConfig
        client = get_api_client(ConnectionConfig())
        res = get_v_2_sandboxes_sandbox_id_logs.sync_detailed(self.sb.sandbox_id, client=client)
        self.assertEqual(res.status_code, 200, res.content)
        msgs = [l.message for l in res.parsed.logs]
        self.assertTrue(any("-> running" in m for m in msgs), msgs)
        self.assertTrue(all(l.level.value == "info" for l in res.parsed.logs))
        res = get_sandboxes_sandbox_id_logs.sync_detailed(self.sb.sandbox_id, client=client)
        self.assertEqual(res.status_code, 200, res.content)
        self.assertEqual([l.line for l in res.parsed.logs], msgs)
        status, body = raw("GET", "/v2/sandboxes/0123456789abcdef/logs", headers={"X-API-Key": KEY})
        self.assertEqual(status, 404)


if __name__ == "__main__":
    unittest.main(verbosity=2)
