// E2B compatibility, JavaScript: the official `e2b` npm SDK, unmodified and with
// its default options (no opt-outs), against a strata daemon. Run by
// crates/cli/tests/e2b.rs once per pinned SDK version (package.json here: the
// current one as `e2b`, an old one as `e2b-old`), with E2B_API_URL and
// E2B_SANDBOX_URL pointing at the daemon and a tenant key in E2B's key form as
// E2B_API_KEY.
//
//   E2B_JS_SDK=e2b|e2b-old E2B_JS_VERSION=2.51.0 node --test-reporter=tap suite.mjs
import assert from 'node:assert/strict'
import { mkdirSync, mkdtempSync, readFileSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { request as httpRequest } from 'node:http'
import { createRequire } from 'node:module'
import { after, before, describe, it } from 'node:test'

const SDK = process.env.E2B_JS_SDK || 'e2b'
const e2b = await import(SDK)
const { Sandbox, CommandExitError, NotFoundError, AuthenticationError, TimeoutError, SandboxError, Template, waitForPort, BuildError } = e2b

const sleep = (ms) => new Promise((r) => setTimeout(r, ms))

/** Polls `probe` until it returns true, for up to `ms`. */
async function eventually(probe, ms = 15000, what = 'condition') {
  const deadline = Date.now() + ms
  while (Date.now() < deadline) {
    if (await probe()) return
    await sleep(100)
  }
  assert.fail(`timed out waiting for ${what}`)
}

describe('sdk', () => {
  it('is the pinned version, called with its default options', () => {
    const require = createRequire(import.meta.url)
    const pkg = JSON.parse(readFileSync(require.resolve(`${SDK}/package.json`), 'utf8'))
    assert.equal(pkg.version, process.env.E2B_JS_VERSION)
    assert.match(process.env.E2B_API_KEY, /^e2b_[0-9a-f]+$/, "a key in E2B's form: no validation opt-out")
    assert.equal(process.env.E2B_VALIDATE_API_KEY, undefined)
  })
})

describe('lifecycle', () => {
  it('creates, inspects, lists, connects and kills', async () => {
    const sb = await Sandbox.create({ metadata: { suite: 'js', sdk: SDK }, envs: { A: '1' } })
    try {
      const info = await sb.getInfo()
      assert.equal(info.sandboxId, sb.sandboxId)
      assert.equal(info.templateId, 'base')
      assert.equal(info.state, 'running')
      assert.deepEqual(info.metadata, { suite: 'js', sdk: SDK })
      assert.ok(info.endAt > info.startedAt)
      assert.equal(await sb.isRunning(), true)
      assert.equal((await sb.commands.run('echo $A')).stdout, '1\n')
      const listed = await Sandbox.list({ query: { metadata: { suite: 'js', sdk: SDK } } }).nextItems()
      assert.deepEqual(
        listed.map((s) => s.sandboxId),
        [sb.sandboxId],
      )
      const again = await Sandbox.connect(sb.sandboxId)
      assert.equal((await again.commands.run('echo again')).stdout, 'again\n')
    } finally {
      assert.equal(await Sandbox.kill(sb.sandboxId), true)
    }
    assert.equal(await Sandbox.kill(sb.sandboxId), false, 'killing twice finds nothing')
    assert.equal(await sb.isRunning(), false)
    await assert.rejects(Sandbox.connect(sb.sandboxId), NotFoundError)
  })

  it('lists newest first, in pages, with start-time filters', async () => {
    const made = []
    try {
      for (let i = 0; i < 3; i++) {
        made.push(await Sandbox.create({ metadata: { order: SDK } }))
        await sleep(50)
      }
      const ids = made.map((s) => s.sandboxId)
      const query = { metadata: { order: SDK } }
      assert.deepEqual(
        (await Sandbox.list({ query }).nextItems()).map((s) => s.sandboxId),
        [...ids].reverse(),
      )
      const pager = Sandbox.list({ query, limit: 2 })
      const first = await pager.nextItems()
      assert.equal(first.length, 2)
      assert.equal(pager.hasNext, true)
      const second = await pager.nextItems()
      assert.deepEqual([...first, ...second].map((s) => s.sandboxId), [...ids].reverse())
      const startedAfter = (await made[1].getInfo()).startedAt
      const newer = await Sandbox.list({ query: { ...query, startedAfter } }).nextItems()
      assert.deepEqual(
        newer.map((s) => s.sandboxId),
        [ids[2], ids[1]],
      )
      const running = await Sandbox.list({ query: { ...query, state: ['running'] } }).nextItems()
      assert.equal(running.length, 3)
    } finally {
      for (const s of made) await s.kill()
    }
  })

  it('ends a sandbox at its timeout, set on create and moved by setTimeout', async () => {
    const sb = await Sandbox.create({ timeoutMs: 60_000 })
    const end0 = (await sb.getInfo()).endAt
    await sb.setTimeout(5_000)
    const end1 = (await sb.getInfo()).endAt
    assert.ok(end1 < end0, `${end1} before ${end0}`)
    const t0 = Date.now()
    await sb.setTimeout(2_000)
    await eventually(async () => !(await sb.isRunning()), 15000, 'the sandbox to end at its timeout')
    assert.ok(Date.now() - t0 >= 1900, 'not before its timeout')
  })

  it('connect(timeoutMs) only extends; killing a sandbox ends its command streams as not found', async () => {
    const sb = await Sandbox.create({ timeoutMs: 300_000 })
    const end = (await sb.getInfo()).endAt
    await Sandbox.connect(sb.sandboxId, { timeoutMs: 10_000 })
    assert.deepEqual((await sb.getInfo()).endAt, end, 'never shortened')
    await Sandbox.connect(sb.sandboxId, { timeoutMs: 900_000 })
    assert.ok((await sb.getInfo()).endAt > end, 'extended')
    let out = ''
    const h = await sb.commands.run('echo started; sleep 60', { background: true, onStdout: (d) => (out += d) })
    await eventually(async () => out === 'started\n', 10000, 'the command to start')
    await Sandbox.kill(sb.sandboxId)
    await assert.rejects(h.wait(), (e) => e instanceof NotFoundError && /was killed/.test(e.message))
  })

  it('says what is wrong: unknown template, unknown sandbox, wrong key', async () => {
    await assert.rejects(Sandbox.create('no-such-template-js'), SandboxError)
    await assert.rejects(Sandbox.connect('0123456789abcdef'), NotFoundError)
    await assert.rejects(Sandbox.getInfo('0123456789abcdef'), NotFoundError)
    await assert.rejects(Sandbox.create({ apiKey: 'e2b_00000000000000000000' }), AuthenticationError)
  })
})

describe('in one sandbox', () => {
  let sb
  before(async () => {
    sb = await Sandbox.create()
  })
  after(async () => {
    await sb?.kill()
  })

  it('runs commands: output, exit codes, envs, cwd, user', async () => {
    const out = []
    const r = await sb.commands.run('echo out; echo err >&2', { onStdout: (d) => out.push(d) })
    assert.equal(r.exitCode, 0)
    assert.equal(r.stdout, 'out\n')
    assert.equal(r.stderr, 'err\n')
    assert.equal(out.join(''), 'out\n')
    await assert.rejects(sb.commands.run('exit 3'), (e) => e instanceof CommandExitError && e.exitCode === 3)
    const env = await sb.commands.run('echo $X $(pwd) $(id -un)', { envs: { X: 'x' }, cwd: '/tmp' })
    assert.equal(env.stdout, 'x /tmp user\n')
    assert.equal((await sb.commands.run('id -un', { user: 'root' })).stdout, 'root\n')
    assert.equal((await sb.commands.run('pwd')).stdout, '/home/user\n')
    // The base template has what E2B's has and programs call: `python`, node, npm.
    const tools = await sb.commands.run("python -c 'print(3)'; node -e 'console.log(6*7)'; npm --version")
    assert.match(tools.stdout, /^3\n42\n10\.\d+\.\d+\n$/)
  })

  it('runs background commands with stdin, lists and kills them', async () => {
    const h = await sb.commands.run('cat', { background: true, stdin: true })
    await sb.commands.sendStdin(h.pid, 'fed\n')
    await sb.commands.closeStdin(h.pid)
    const r = await h.wait()
    assert.equal(r.stdout, 'fed\n')
    const sleeper = await sb.commands.run('sleep 600', { background: true })
    const listed = await sb.commands.list()
    assert.ok(
      listed.some((p) => p.pid === sleeper.pid),
      JSON.stringify(listed),
    )
    assert.equal(await sb.commands.kill(sleeper.pid), true)
    await assert.rejects(sleeper.wait(), CommandExitError)
    assert.equal(await sb.commands.kill(sleeper.pid), false, 'an ended process is not found')
  })

  it('times a command out', async () => {
    await assert.rejects(sb.commands.run('sleep 30', { timeoutMs: 1000 }), TimeoutError)
  })

  it('reattaches to a running command', async () => {
    const h = await sb.commands.run('for i in 1 2 3; do echo $i; sleep 0.3; done', { background: true })
    const again = await sb.commands.connect(h.pid)
    const r = await again.wait()
    assert.match(r.stdout, /3\n$/)
  })

  it('gives a terminal that takes input and resizes right after create', async () => {
    const data = []
    const dec = new TextDecoder()
    const t = await sb.pty.create({ cols: 80, rows: 24, onData: (d) => data.push(dec.decode(d)) })
    await sb.pty.resize(t.pid, { cols: 100, rows: 30 })
    await sb.pty.sendInput(t.pid, new TextEncoder().encode('stty size; exit 7\n'))
    const r = await t.wait().catch((e) => e)
    assert.equal(r.exitCode, 7)
    assert.match(data.join(''), /30 100/)
  })

  it('reads and writes files as the user', async () => {
    await sb.files.write('/home/user/a.txt', 'hello')
    assert.equal(await sb.files.read('/home/user/a.txt'), 'hello')
    const bytes = new Uint8Array([0, 1, 2, 255])
    await sb.files.write('bin.dat', bytes)
    assert.deepEqual(await sb.files.read('/home/user/bin.dat', { format: 'bytes' }), bytes)
    await sb.files.write([
      { path: '/home/user/many/one.txt', data: '1' },
      { path: '/home/user/many/two.txt', data: '2' },
    ])
    assert.equal((await sb.commands.run('cat many/one.txt many/two.txt; stat -c %U many/two.txt')).stdout, '12user\n')
    await sb.files.write('/tmp/in-tmp.txt', 'tmp')
    assert.equal(await sb.files.read('/tmp/in-tmp.txt'), 'tmp')
  })

  it('lists, stats, renames, removes and makes directories', async () => {
    assert.equal(await sb.files.makeDir('/home/user/d'), true)
    assert.equal(await sb.files.makeDir('/home/user/d'), false, 'already there')
    await sb.files.write('/home/user/d/f.txt', 'f')
    const names = (await sb.files.list('/home/user/d')).map((e) => e.name)
    assert.deepEqual(names, ['f.txt'])
    const info = await sb.files.getInfo('/home/user/d/f.txt')
    assert.equal(info.type, 'file')
    assert.equal(info.size, 1)
    assert.equal(await sb.files.exists('/home/user/d/f.txt'), true)
    await sb.files.rename('/home/user/d/f.txt', '/home/user/d/g.txt')
    assert.equal(await sb.files.exists('/home/user/d/f.txt'), false)
    await sb.files.remove('/home/user/d')
    assert.equal(await sb.files.exists('/home/user/d'), false)
    await sb.files.remove('/home/user/d') // a missing path is already removed (no error, as envd)
    await assert.rejects(sb.files.read('/home/user/none.txt'), NotFoundError)
  })

  it('watches a directory: every event, with entries', async () => {
    await sb.files.makeDir('/home/user/w')
    const events = []
    const w = await sb.files.watchDir('/home/user/w', (e) => events.push(e), { includeEntry: true })
    await sb.files.write('/home/user/w/new.txt', 'x')
    // Created and removed at once: none of them is missed.
    await sb.commands.run('for i in $(seq 1 50); do echo $i > /home/user/w/f$i; rm /home/user/w/f$i; done')
    const removed = () => events.filter((e) => e.type === 'remove' && /^f\d+$/.test(e.name)).length
    await eventually(async () => removed() === 50, 10000, 'fifty removals')
    const created = events.find((e) => e.name === 'new.txt' && e.type === 'create')
    assert.equal(created.entry.path, '/home/user/w/new.txt')
    assert.equal(created.entry.type, 'file')
    assert.equal(events.filter((e) => e.type === 'create' && /^f\d+$/.test(e.name)).length, 50)
    await w.stop()
  })

  it('keeps file metadata, speaks gzip, describes symlinks by their target, lists depth first', async () => {
    const w = await sb.files.write('/home/user/meta/a.txt', 'a', { metadata: { Owner: 'team-a' } })
    assert.deepEqual(w.metadata, { owner: 'team-a' })
    assert.deepEqual((await sb.files.getInfo('/home/user/meta/a.txt')).metadata, { owner: 'team-a' })
    assert.deepEqual((await sb.files.list('/home/user/meta')).map((e) => e.metadata), [{ owner: 'team-a' }])
    const blob = 'strata '.repeat(40000)
    await sb.files.write('/home/user/gz.txt', blob, { gzip: true })
    assert.equal((await sb.commands.run('wc -c < /home/user/gz.txt')).stdout.trim(), String(blob.length))
    assert.equal(await sb.files.read('/home/user/gz.txt', { gzip: true }), blob)
    await sb.commands.run('mkdir -p /home/user/s && echo hi > /home/user/s/t.txt && ln -s t.txt /home/user/s/link')
    const link = await sb.files.getInfo('/home/user/s/link')
    assert.equal(link.symlinkTarget, '/home/user/s/t.txt')
    await sb.commands.run('mkdir -p /home/user/o/b /home/user/o/a/x && touch /home/user/o/c.txt /home/user/o/a/z.txt /home/user/o/a/x/deep.txt')
    const paths = (await sb.files.list('/home/user/o', { depth: 3 })).map((e) => e.path.slice('/home/user/o/'.length))
    assert.deepEqual(paths, ['a', 'a/x', 'a/x/deep.txt', 'a/z.txt', 'b', 'c.txt'])
  })

  it('signs file URLs with the sandbox\'s own access token', async () => {
    await sb.files.write('/home/user/signed.txt', 'signed bytes')
    // As a browser opens it: no key, the sandbox named by E2B's host form.
    const open = (url, method = 'GET', body) =>
      new Promise((resolve, reject) => {
        const req = httpRequest(url, { method, headers: { Host: `49983-${sb.sandboxId}.strata.test` } }, (res) => {
          const chunks = []
          res.on('data', (c) => chunks.push(c))
          res.on('end', () => resolve({ status: res.statusCode, body: Buffer.concat(chunks).toString() }))
        })
        req.on('error', reject)
        req.end(body)
      })
    const url = await sb.downloadUrl('/home/user/signed.txt')
    assert.match(url, /signature=v1_/)
    assert.deepEqual(await open(url), { status: 200, body: 'signed bytes' })
    const bad = await open(url.replace('signature=v1_', 'signature=v1_x'))
    assert.equal(bad.status, 401)
    assert.equal(JSON.parse(bad.body).message, 'invalid signature')
    const up = await sb.uploadUrl('/home/user/up.txt', { useSignatureExpiration: 60 })
    assert.equal((await open(up, 'POST', 'uploaded')).status, 200)
    assert.equal(await sb.files.read('/home/user/up.txt'), 'uploaded')
  })

  it('holds commands to their deadline (Connect-Timeout-Ms)', async () => {
    const h = await sb.commands.run('sleep 30', { background: true, timeoutMs: 1500 })
    await assert.rejects(h.wait(), (e) => e instanceof TimeoutError)
    await eventually(async () => !(await sb.commands.list()).some((p) => p.pid === h.pid), 5000, 'the command killed at its deadline')
    assert.equal((await sb.commands.run('sleep 1.2; echo done', { timeoutMs: 0 })).stdout, 'done\n')
  })

  it('reports metrics', async () => {
    const m = await sb.getMetrics()
    assert.ok(m.length >= 1)
    assert.ok(m[m.length - 1].memUsed > 0)
    assert.ok(m[0].cpuCount >= 1)
  })
})

describe('pause, snapshots', () => {
  it('pauses with a running process and connect() resumes it; a probe does not', async () => {
    const sb = await Sandbox.create({ lifecycle: { onTimeout: 'pause' } })
    try {
      await sb.files.write('/home/user/keep.txt', 'kept')
      const h = await sb.commands.run('sleep 600', { background: true })
      await sb.pause()
      assert.equal(await sb.isRunning(), false)
      assert.equal((await Sandbox.getInfo(sb.sandboxId)).state, 'paused', 'the probe did not wake it')
      const back = await Sandbox.connect(sb.sandboxId)
      assert.equal(await back.isRunning(), true)
      assert.equal(await back.files.read('/home/user/keep.txt'), 'kept')
      assert.ok((await back.commands.list()).some((p) => p.pid === h.pid))
    } finally {
      await sb.kill()
    }
  })

  it("connect({ onResume: 'reboot' }) brings a paused sandbox back from its filesystem alone", async () => {
    // The option is new in 2.46; the old SDK restores the processes (the test above).
    const reboot = SDK === 'e2b'
    const sb = await Sandbox.create({ lifecycle: { onTimeout: 'pause' } })
    try {
      await sb.files.write('/home/user/keep.txt', 'kept')
      const h = await sb.commands.run('sleep 600', { background: true })
      const bootId = async (s) => (await s.commands.run('cat /proc/sys/kernel/random/boot_id')).stdout.trim()
      const booted = await bootId(sb)
      await sb.pause()
      const back = await Sandbox.connect(sb.sandboxId, reboot ? { onResume: 'reboot' } : {})
      assert.equal(await back.files.read('/home/user/keep.txt'), 'kept')
      const running = (await back.commands.list()).some((p) => p.pid === h.pid)
      assert.equal(running, !reboot, reboot ? 'processes started afresh' : 'processes restored')
      // A reboot is a new boot (a new boot id); a restore is the same one.
      assert.equal((await bootId(back)) === booted, !reboot)
    } finally {
      await sb.kill()
    }
  })

  it('keeps a sandbox with autoResume off paused until connect()', async () => {
    const sb = await Sandbox.create({ lifecycle: { onTimeout: 'pause', autoResume: false } })
    try {
      assert.deepEqual((await sb.getInfo()).lifecycle, { onTimeout: 'pause', autoResume: false })
      await sb.pause()
      await assert.rejects(sb.commands.run('true'))
      assert.equal((await Sandbox.getInfo(sb.sandboxId)).state, 'paused')
      const back = await Sandbox.connect(sb.sandboxId)
      assert.equal((await back.commands.run('echo up')).stdout, 'up\n')
    } finally {
      await sb.kill()
    }
  })

  it('snapshots a sandbox, starts from the snapshot and deletes it while its sandbox runs', async () => {
    const sb = await Sandbox.create()
    try {
      await sb.files.write('/home/user/s.txt', 'snap')
      const snap = await sb.createSnapshot()
      const child = await Sandbox.create(snap.snapshotId)
      try {
        assert.equal(await child.files.read('/home/user/s.txt'), 'snap')
      } finally {
        await child.kill()
      }
      const listed = []
      for (const p = Sandbox.listSnapshots(); p.hasNext; ) listed.push(...(await p.nextItems()))
      assert.ok(listed.some((s) => s.snapshotId === snap.snapshotId))
      assert.equal(await Sandbox.deleteSnapshot(snap.snapshotId), true)
      assert.equal(await Sandbox.deleteSnapshot(snap.snapshotId), false)
      await assert.rejects(Sandbox.create(snap.snapshotId))
      assert.equal(await sb.files.read('/home/user/s.txt'), 'snap', 'its sandbox runs on')
    } finally {
      await sb.kill()
    }
  })
})

describe('template sdk', () => {
  it('builds a warm template from the SDK\'s steps, cached the second time', async () => {
    const ctx = mkdtempSync(join(tmpdir(), 'e2b-tpl-'))
    mkdirSync(join(ctx, 'site'))
    writeFileSync(join(ctx, 'site', 'index.html'), `hello from ${SDK}\n`)
    const name = `js-tpl-${SDK}`
    const template = Template({ fileContextPath: ctx })
      .fromBaseImage()
      .setEnvs({ SDK_NAME: SDK })
      .runCmd('echo built > /tmp/built.txt', { user: 'user' })
      .copy('site', '/home/user/site')
      .setWorkdir('/home/user/site')
      .setUser('user')
      .setStartCmd('python -m http.server 8000', waitForPort(8000))
    const logs = []
    const info = await Template.build(template, name, { onBuildLogs: (e) => logs.push(e.message) })
    assert.equal(info.name, name)
    assert.ok(logs.some((m) => m.includes(`template ${name} ready`)), logs.join('\n'))
    assert.equal(await Template.exists(name), true)
    const sb = await Sandbox.create(name)
    try {
      const r = await sb.commands.run('curl -sf localhost:8000/index.html; cat /tmp/built.txt; echo $SDK_NAME')
      assert.equal(r.stdout, `hello from ${SDK}\nbuilt\n${SDK}\n`)
    } finally {
      await sb.kill()
    }
    const again = []
    await Template.build(template, name, { onBuildLogs: (e) => again.push(e.message) })
    assert.ok(again.filter((m) => m.includes('(cached)')).length >= 4, again.join('\n'))
    const bad = Template().fromBaseImage().runCmd('echo failing here; exit 4')
    await assert.rejects(Template.build(bad, `js-bad-${SDK}`), (e) => e instanceof BuildError && /exit status 4/.test(e.message))
  })
})
