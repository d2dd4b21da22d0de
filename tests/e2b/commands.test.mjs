// sandbox.commands through the official SDK (envd's process.Process): foreground and
// background runs, output callbacks, cwd, envs (and create's envVars under them), users,
// a command deadline, stdin, list, connect and kill. One sandbox for the file; each test
// works in its own names.
import assert from 'node:assert/strict';
import test, { after, before, describe } from 'node:test';

import { CommandExitError, NotFoundError, Sandbox, TimeoutError } from 'e2b';

import {
  commandTimeoutMs, eventually, rejectsWith, requestTimeoutMs, runId, sh, testTimeoutMs,
} from './support.mjs';

describe('commands', () => {
  let sbx;
  before(async () => {
    sbx = await Sandbox.create({ requestTimeoutMs, timeoutMs: 1_800_000,
      metadata: { tier: 'e2b', run: runId, case: 'commands' },
      envs: { SBX_LEVEL: 'from-create', SHADOWED: 'create' } });
  });
  after(async () => {
    await sbx?.kill({ requestTimeoutMs }).catch(() => {});
  });

  const opts = (more = {}) => ({ timeoutMs: commandTimeoutMs, requestTimeoutMs, ...more });

  // True while `pid` is among the sandbox's processes.
  async function listed(pid) {
    return (await sbx.commands.list({ requestTimeoutMs })).some((p) => p.pid === pid);
  }

  test('run in the foreground: stdout, stderr, exit code', { timeout: testTimeoutMs }, async () => {
    const r = await sbx.commands.run('echo out; echo err >&2; printf "no newline"', opts());
    assert.equal(r.exitCode, 0);
    assert.equal(r.stdout, 'out\nno newline');
    assert.equal(r.stderr, 'err\n');
  });

  test('a non-zero exit is CommandExitError carrying the result', { timeout: testTimeoutMs }, async () => {
    const e = await rejectsWith(() => sbx.commands.run('echo partial; echo why >&2; exit 3', opts()),
      CommandExitError, 'exit 3');
    assert.equal(e.exitCode, 3);
    assert.equal(e.stdout, 'partial\n');
    assert.equal(e.stderr, 'why\n');
  });

  test("create's envVars reach every command, a command's envs win over them", { timeout: testTimeoutMs }, async () => {
    assert.equal(await sh(sbx, 'echo "$SBX_LEVEL $SHADOWED"'), 'from-create create\n');
    const r = await sbx.commands.run('echo "$SBX_LEVEL $SHADOWED $A|$B"',
      opts({ envs: { SHADOWED: 'request', A: '1', B: 'two words' } }));
    assert.equal(r.stdout, 'from-create request 1|two words\n');
    assert.equal(await sh(sbx, 'echo "${A:-unset}"'), 'unset\n', "one command's envs do not stay");
  });

  test('cwd', { timeout: testTimeoutMs }, async () => {
    assert.equal(await sh(sbx, 'pwd', { cwd: '/tmp' }), '/tmp\n');
    await sh(sbx, 'mkdir -p /tmp/cwd-test/inner');
    assert.equal(await sh(sbx, 'pwd && ls', { cwd: '/tmp/cwd-test' }), '/tmp/cwd-test\ninner\n');
    await assert.rejects(() => sbx.commands.run('echo ran', opts({ cwd: '/tmp/no-such-dir' })),
      (e) => !String(e.stdout ?? '').includes('ran'), 'a missing cwd fails the command before it runs');
  });

  test('user: root and user', { timeout: testTimeoutMs }, async () => {
    assert.equal(await sh(sbx, 'id -un', { user: 'root' }), 'root\n');
    assert.equal(await sh(sbx, 'id -un', { user: 'user' }), 'user\n');
    assert.equal(await sh(sbx, 'touch /tmp/made-by-user && stat -c %U /tmp/made-by-user', { user: 'user' }), 'user\n');
  });

  test('onStdout and onStderr see the output as it comes', { timeout: testTimeoutMs }, async () => {
    const out = [];
    const err = [];
    const r = await sbx.commands.run('for i in 1 2 3; do echo line$i; echo e$i >&2; sleep 0.2; done',
      opts({ onStdout: (d) => out.push(d), onStderr: (d) => err.push(d) }));
    assert.equal(out.join(''), 'line1\nline2\nline3\n');
    assert.equal(err.join(''), 'e1\ne2\ne3\n');
    assert.ok(out.length >= 2, `output came in ${out.length} piece(s), not at the end only`);
    assert.equal(r.stdout, 'line1\nline2\nline3\n');
  });

  test('background: wait for one, kill another', { timeout: testTimeoutMs }, async () => {
    const quick = await sbx.commands.run('sleep 0.5; echo done', opts({ background: true }));
    assert.ok(Number.isInteger(quick.pid) && quick.pid > 0, `pid ${quick.pid}`);
    const r = await quick.wait();
    assert.equal(r.exitCode, 0);
    assert.equal(r.stdout, 'done\n');

    const slow = await sbx.commands.run('sleep 600', opts({ background: true, timeoutMs: 0 }));
    assert.ok(await listed(slow.pid), 'the background command is listed');
    assert.equal(await slow.kill(), true);
    const e = await rejectsWith(() => slow.wait(), CommandExitError, 'wait on a killed command');
    assert.notEqual(e.exitCode, 0);
    await eventually(async () => !(await listed(slow.pid)), { what: 'the killed command left the list' });
    assert.equal(await sbx.commands.kill(slow.pid, { requestTimeoutMs }), false, 'killing it again finds nothing');
  });

  test('timeoutMs ends a command at its deadline', { timeout: testTimeoutMs }, async () => {
    const started = Date.now();
    await rejectsWith(() => sbx.commands.run('sleep 30.125; echo late > /tmp/late.txt', opts({ timeoutMs: 3_000 })),
      TimeoutError, 'a 3 s deadline on a 30 s command');
    assert.ok(Date.now() - started < 25_000, `it took ${Date.now() - started} ms to time out`);
    // Killed, not merely left behind: no such sleep, and it never wrote its file.
    const gone = async () => (await sbx.commands.run("pgrep -f 'sleep 30[.]125' || echo none", opts())).stdout === 'none\n';
    await eventually(gone,
      { what: 'the timed-out command was killed' });
    assert.equal(await sbx.files.exists('/tmp/late.txt'), false);
  });

  test('stdin: sendStdin, then closeStdin ends the input', { timeout: testTimeoutMs }, async () => {
    const h = await sbx.commands.run('cat; echo "<eof>"', opts({ background: true, stdin: true }));
    await sbx.commands.sendStdin(h.pid, 'hello ', { requestTimeoutMs });
    await h.sendStdin(new TextEncoder().encode('world\n'), { requestTimeoutMs });
    await sbx.commands.closeStdin(h.pid, { requestTimeoutMs });
    const r = await h.wait();
    assert.equal(r.stdout, 'hello world\n<eof>\n');
  });

  test("without stdin: true a command's stdin is empty", { timeout: testTimeoutMs }, async () => {
    assert.equal(await sh(sbx, 'cat; echo "<eof>"'), '<eof>\n');
  });

  test('commands.list shows what runs, with its command line and envs', { timeout: testTimeoutMs }, async () => {
    const h = await sbx.commands.run('sleep 601', opts({ background: true, timeoutMs: 0, envs: { LISTED: 'yes' },
      cwd: '/tmp' }));
    try {
      const procs = await sbx.commands.list({ requestTimeoutMs });
      const p = procs.find((x) => x.pid === h.pid);
      assert.ok(p, `pid ${h.pid} in ${JSON.stringify(procs)}`);
      assert.equal(p.cmd, '/bin/bash');
      assert.deepEqual(p.args, ['-l', '-c', 'sleep 601']);
      assert.equal(p.envs.LISTED, 'yes');
      assert.equal(p.cwd, '/tmp');
    } finally {
      await h.kill();
    }
  });

  test('commands.connect picks up a running command after a disconnect', { timeout: testTimeoutMs }, async () => {
    const h = await sbx.commands.run('for i in $(seq 1 25); do echo tick$i; sleep 0.2; done; exit 4',
      opts({ background: true }));
    await h.disconnect();
    const seen = [];
    const again = await sbx.commands.connect(h.pid, { onStdout: (d) => seen.push(d), timeoutMs: commandTimeoutMs,
      requestTimeoutMs });
    assert.equal(again.pid, h.pid);
    const e = await rejectsWith(() => again.wait(), CommandExitError, 'the connected command exits 4');
    assert.equal(e.exitCode, 4);
    assert.match(seen.join(''), /tick25\n$/, 'the output after the connect arrives, to the end');
    await rejectsWith(() => sbx.commands.connect(999_999, { requestTimeoutMs }), NotFoundError, 'connect to no such pid');
  });
});
