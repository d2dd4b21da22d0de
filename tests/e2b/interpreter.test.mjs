// The code interpreter through @e2b/code-interpreter (POST /execute and /contexts on port
// 49999): state kept across runCode calls, logs, the last expression's text, errors, per-call
// envs and create's envVars, contexts (create/list/restart/remove, a cwd, a bash one).
// One sandbox for the file, of the SDK's default template.
import assert from 'node:assert/strict';
import test, { after, before, describe } from 'node:test';

import { Sandbox } from '@e2b/code-interpreter';

import { requestTimeoutMs, runId, testTimeoutMs } from './support.mjs';

describe('interpreter', () => {
  let sbx;
  before(async () => {
    sbx = await Sandbox.create({ requestTimeoutMs, timeoutMs: 1_800_000,
      metadata: { tier: 'e2b', run: runId, case: 'interpreter' }, envs: { SBX_LEVEL: 'from-create' } });
  });
  after(async () => {
    await sbx?.kill({ requestTimeoutMs }).catch(() => {});
  });

  // The interpreter's first run starts Python in the guest: slow under emulation.
  const run = (code, opts = {}) => sbx.runCode(code, { timeoutMs: requestTimeoutMs, requestTimeoutMs, ...opts });

  function clean(execution) {
    assert.equal(execution.error, undefined, `an error: ${JSON.stringify(execution.error)}`);
    return execution;
  }

  test('a variable lives on across runCode calls; execution.text is the last expression', { timeout: testTimeoutMs }, async () => {
    clean(await run('x = 41'));
    const e = clean(await run('x + 1'));
    assert.equal(e.text, '42');
    assert.equal(e.results.filter((r) => r.isMainResult).length, 1);
    // E2B's server gives a string's repr without its quotes (its Result drops them).
    assert.equal(clean(await run('x = "changed"\nx')).text, 'changed');
    const none = clean(await run('y = 1'));
    assert.equal(none.text, undefined, 'an assignment has no result');
  });

  test('stdout and stderr logs, and their callbacks', { timeout: testTimeoutMs }, async () => {
    const out = [];
    const err = [];
    const e = clean(await run('import sys\nprint("out one")\nprint("err one", file=sys.stderr)\nprint("out two")',
      { onStdout: (m) => out.push(m.line), onStderr: (m) => err.push(m.line) }));
    assert.equal(e.logs.stdout.join(''), 'out one\nout two\n');
    assert.equal(e.logs.stderr.join(''), 'err one\n');
    assert.equal(out.join(''), 'out one\nout two\n');
    assert.equal(err.join(''), 'err one\n');
    assert.equal(e.text, undefined);
  });

  test('an exception is execution.error, and the state survives it', { timeout: testTimeoutMs }, async () => {
    clean(await run('kept = "still here"'));
    const e = await run('print("before")\n1 / 0');
    assert.ok(e.error, 'an error');
    assert.equal(e.error.name, 'ZeroDivisionError');
    assert.equal(e.error.value, 'division by zero');
    assert.match(e.error.traceback, /ZeroDivisionError/);
    assert.equal(e.logs.stdout.join(''), 'before\n');
    assert.equal(e.text, undefined);
    const syntax = await run('def broken(:');
    assert.equal(syntax.error?.name, 'SyntaxError');
    assert.equal(clean(await run('kept')).text, 'still here');
  });

  test("envs per call, and create's envVars", { timeout: testTimeoutMs }, async () => {
    assert.equal(clean(await run('import os\nos.environ["SBX_LEVEL"]')).text, 'from-create');
    assert.equal(clean(await run('import os\nos.environ.get("CALL_VAR")', { envs: { CALL_VAR: 'per call' } })).text,
      'per call');
    assert.equal(clean(await run('echo "$SBX_LEVEL"', { language: 'bash' })).logs.stdout.join(''), 'from-create\n');
  });

  test('contexts: create with a cwd, list, restart, remove', { timeout: testTimeoutMs }, async () => {
    const ctx = await sbx.createCodeContext({ cwd: '/tmp', requestTimeoutMs });
    assert.ok(typeof ctx.id === 'string' && ctx.id, JSON.stringify(ctx));
    assert.equal(ctx.language, 'python');
    assert.equal(ctx.cwd, '/tmp');
    assert.equal(clean(await run('import os\nos.getcwd()', { context: ctx })).text, '/tmp');
    clean(await run('in_ctx = 5', { context: ctx }));
    assert.equal(clean(await run('in_ctx', { context: ctx })).text, '5');
    assert.equal((await run('in_ctx')).error?.name, 'NameError', "the default context does not see another's names");

    assert.ok((await sbx.listCodeContexts()).some((c) => c.id === ctx.id), 'listed');
    await sbx.restartCodeContext(ctx);
    assert.equal((await run('in_ctx', { context: ctx })).error?.name, 'NameError', 'a restart forgets');
    clean(await run('again = 1', { context: ctx }));
    await sbx.removeCodeContext(ctx.id);
    assert.ok(!(await sbx.listCodeContexts()).some((c) => c.id === ctx.id), 'gone from the list');
    await assert.rejects(() => run('again', { context: ctx }), 'a removed context runs nothing');
  });

  test('a bash context keeps its shell state; language: bash runs once', { timeout: testTimeoutMs }, async () => {
    const ctx = await sbx.createCodeContext({ language: 'bash', requestTimeoutMs });
    assert.equal(ctx.language, 'bash');
    clean(await run('export Z=6; cd /tmp', { context: ctx }));
    const e = clean(await run('echo $((Z * 7)) $(pwd)', { context: ctx }));
    assert.equal(e.logs.stdout.join(''), '42 /tmp\n');
    const failed = await run('echo to-stderr >&2; false', { context: ctx });
    assert.equal(failed.logs.stderr.join(''), 'to-stderr\n');
    await sbx.removeCodeContext(ctx);
    assert.equal(clean(await run('echo hi', { language: 'bash' })).logs.stdout.join(''), 'hi\n');
  });
});
