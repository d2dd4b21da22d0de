// The facade's hostile side, without the SDK: what a broken or malicious client sends to
// envd's Connect-RPC, /files, the interpreter and the control plane. Each request must get a
// clean Connect or HTTP error of its own, and the sandbox must go on answering the next one.
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { request as httpRequest } from 'node:http';
import { connect as netConnect } from 'node:net';
import test, { after, before, describe } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';

import { apiKey, runId, serveUrl, testTimeoutMs } from './support.mjs';

const envdPort = '49983';
const interpreterPort = '49999';

// --- the control plane, as plain JSON over HTTP -------------------------------------------

async function control(method, path, body) {
  const res = await fetch(`${serveUrl}${path}`, {
    method,
    headers: { 'X-API-KEY': apiKey, ...(body === undefined ? {} : { 'Content-Type': 'application/json' }) },
    body: body === undefined ? undefined : (typeof body === 'string' ? body : JSON.stringify(body)),
  });
  const text = await res.text();
  return { status: res.status, text, json: text ? JSON.parse(text) : undefined };
}

async function createSandbox(name) {
  const r = await control('POST', '/v2/sandboxes',
    { templateID: 'base', timeout: 1800, metadata: { tier: 'e2b', run: runId, case: `hostile-${name}` } });
  assert.equal(r.status, 201, r.text);
  assert.ok(r.json.sandboxID && r.json.envdAccessToken, r.text);
  return { id: r.json.sandboxID, token: r.json.envdAccessToken };
}

describe('hostile', () => {
  let sbx;
  let other;
  before(async () => {
    [sbx, other] = await Promise.all([createSandbox('main'), createSandbox('other')]);
  });
  after(async () => {
    for (const s of [sbx, other]) if (s) await control('DELETE', `/sandboxes/${s.id}`).catch(() => {});
  });

  // --- envd's wire ----------------------------------------------------------------------------

  function envdHeaders(s, contentType, more = {}) {
    return { 'E2b-Sandbox-Id': s.id, 'E2b-Sandbox-Port': envdPort, 'X-Access-Token': s.token,
      'Connect-Protocol-Version': '1', ...(contentType ? { 'Content-Type': contentType } : {}), ...more };
  }

  // One Connect envelope: flags, a 4-byte big-endian length (`length` overrides the true one),
  // the payload.
  function envelope(payload, { flags = 0, length } = {}) {
    const text = typeof payload === 'string' ? payload : JSON.stringify(payload);
    const data = Buffer.isBuffer(payload) ? payload : Buffer.from(text);
    const head = Buffer.alloc(5);
    head[0] = flags;
    head.writeUInt32BE(length ?? data.length, 1);
    return Buffer.concat([head, data]);
  }

  function frames(buf) {
    const out = [];
    let at = 0;
    while (at + 5 <= buf.length) {
      const len = buf.readUInt32BE(at + 1);
      assert.ok(at + 5 + len <= buf.length, `a frame of ${len} bytes runs past the body's end`);
      out.push({ flags: buf[at], json: JSON.parse(buf.subarray(at + 5, at + 5 + len).toString() || '{}') });
      at += 5 + len;
    }
    assert.equal(at, buf.length, 'the body is whole frames');
    return out;
  }

  async function rpc(s, path, body, { contentType = 'application/json', headers = {}, method = 'POST' } = {}) {
    const res = await fetch(`${serveUrl}${path}`, { method, headers: envdHeaders(s, contentType, headers),
      body: method === 'GET' ? undefined : body });
    return { status: res.status, type: res.headers.get('content-type') ?? '', body: Buffer.from(await res.arrayBuffer()) };
  }

  // A unary call's clean Connect error: that status, JSON {code, message} with one of `codes`.
  function unaryError(r, status, codes) {
    assert.equal(r.status, status, `status ${r.status}: ${r.body}`);
    assert.match(r.type, /^application\/json/, `content type ${r.type}`);
    const e = JSON.parse(r.body.toString());
    assert.ok(codes.includes(e.code), `code ${e.code}, want one of ${codes}: ${r.body}`);
    assert.equal(typeof e.message, 'string');
    return e;
  }

  // A streaming call's clean Connect error: HTTP 200 with frames ending in an end-of-stream
  // frame (flag 2) whose error has one of `codes`, or a non-200 status with a JSON error body.
  function streamError(r, codes) {
    if (r.status !== 200) {
      assert.ok(r.status >= 400 && r.status < 500, `status ${r.status}: ${r.body}`);
      const e = JSON.parse(r.body.toString());
      assert.ok(codes.includes(e.code), `code ${e.code}, want one of ${codes}: ${r.body}`);
      return e;
    }
    assert.match(r.type, /^application\/connect\+json/, `content type ${r.type}`);
    const fs = frames(r.body);
    const end = fs.at(-1);
    assert.equal(end?.flags, 2, `the last frame ends the stream: ${JSON.stringify(fs)}`);
    assert.ok(end.json.error && codes.includes(end.json.error.code), `end frame ${JSON.stringify(end.json)}, want ${codes}`);
    assert.ok(fs.slice(0, -1).every((f) => !f.json.event?.start), 'no process started');
    return end.json.error;
  }

  // A plain HTTP error: one of `statuses`, with a body that says something.
  function httpError(r, statuses) {
    assert.ok(statuses.includes(r.status), `status ${r.status}, want one of ${statuses}: ${r.body ?? r.text}`);
    assert.ok(String(r.body ?? r.text).length > 0, 'an error body');
  }

  // The sandbox still answers: a Stat of / and a command's whole stream.
  async function stillAnswers(s = sbx) {
    const stat = await rpc(s, '/filesystem.Filesystem/Stat', JSON.stringify({ path: '/' }));
    assert.equal(stat.status, 200, `Stat after: ${stat.body}`);
    assert.equal(JSON.parse(stat.body.toString()).entry.type, 'FILE_TYPE_DIRECTORY');
    const start = await rpc(s, '/process.Process/Start',
      envelope({ process: { cmd: '/bin/bash', args: ['-c', 'echo still-here'], envs: {} }, stdin: false }),
      { contentType: 'application/connect+json' });
    assert.equal(start.status, 200, `Start after: ${start.body}`);
    const fs = frames(start.body);
    const out = fs.map((f) => f.json.event?.data?.stdout).filter(Boolean)
      .map((b) => Buffer.from(b, 'base64').toString()).join('');
    assert.equal(out, 'still-here\n', JSON.stringify(fs));
    assert.deepEqual(fs.at(-1), { flags: 2, json: {} }, 'a clean end of stream');
  }

  const stream = { contentType: 'application/connect+json' };
  const startBody = { process: { cmd: '/bin/true', args: [], envs: {} }, stdin: false };

  test('unary calls with bad JSON, wrong types or bad base64 are invalid_argument', { timeout: testTimeoutMs }, async () => {
    unaryError(await rpc(sbx, '/filesystem.Filesystem/Stat', '{"path":'), 400, ['invalid_argument']);
    unaryError(await rpc(sbx, '/filesystem.Filesystem/Stat', '{"path": 5}'), 400, ['invalid_argument']);
    unaryError(await rpc(sbx, '/filesystem.Filesystem/Stat', '[]'), 400, ['invalid_argument']);
    unaryError(await rpc(sbx, '/filesystem.Filesystem/Stat', '\u0000\u00ff\u00fe'), 400, ['invalid_argument']);
    unaryError(await rpc(sbx, '/filesystem.Filesystem/ListDir', '{"path": "/", "depth": "many"}'), 400, ['invalid_argument']);
    unaryError(await rpc(sbx, '/process.Process/SendInput',
      JSON.stringify({ process: { pid: 1 }, input: { stdin: '***not base64***' } })), 400, ['invalid_argument']);
    unaryError(await rpc(sbx, '/process.Process/SendSignal',
      JSON.stringify({ process: { pid: 4294967297 }, signal: 'SIGNAL_SIGKILL' })), 400, ['invalid_argument']);
    await stillAnswers();
  });

  test('unknown services and methods are unimplemented', { timeout: testTimeoutMs }, async () => {
    unaryError(await rpc(sbx, '/nope.Nope/Call', '{}'), 404, ['unimplemented']);
    unaryError(await rpc(sbx, '/process.Process/Explode', '{}'), 404, ['unimplemented']);
    unaryError(await rpc(sbx, '/filesystem.Filesystem/', '{}'), 404, ['unimplemented']);
    await stillAnswers();
  });

  test('wrong content types and methods are refused', { timeout: testTimeoutMs }, async () => {
    const stat = JSON.stringify({ path: '/' });
    httpError(await rpc(sbx, '/filesystem.Filesystem/Stat', stat, { contentType: 'text/plain' }), [415]);
    httpError(await rpc(sbx, '/filesystem.Filesystem/Stat', stat, { contentType: 'application/proto' }), [415]);
    httpError(await rpc(sbx, '/filesystem.Filesystem/Stat', stat, { contentType: '' }), [415]);
    // A streaming method called as unary, and a unary one as streaming.
    httpError(await rpc(sbx, '/process.Process/Start', JSON.stringify(startBody)), [415]);
    httpError(await rpc(sbx, '/filesystem.Filesystem/Stat', envelope(stat), stream), [415]);
    httpError(await rpc(sbx, '/filesystem.Filesystem/Stat', undefined, { method: 'GET' }), [400, 404, 405, 415]);
    await stillAnswers();
  });

  test('broken envelopes: truncated, lying lengths, compressed, bad JSON inside', { timeout: testTimeoutMs }, async () => {
    const good = envelope(startBody);
    streamError(await rpc(sbx, '/process.Process/Start', good.subarray(0, 3), stream), ['invalid_argument']);
    streamError(await rpc(sbx, '/process.Process/Start', Buffer.alloc(0), stream), ['invalid_argument']);
    streamError(await rpc(sbx, '/process.Process/Start', good.subarray(0, good.length - 4), stream), ['invalid_argument']);
    streamError(await rpc(sbx, '/process.Process/Start', envelope(startBody, { length: 1000 }), stream), ['invalid_argument']);
    streamError(await rpc(sbx, '/process.Process/Start', envelope(startBody, { length: 4 }), stream), ['invalid_argument']);
    streamError(await rpc(sbx, '/process.Process/Start', Buffer.concat([good, good]), stream), ['invalid_argument']);
    streamError(await rpc(sbx, '/process.Process/Start', envelope(startBody, { length: 0xffffffff }), stream),
      ['invalid_argument', 'resource_exhausted']);
    streamError(await rpc(sbx, '/process.Process/Start', envelope(startBody, { flags: 1 }), stream),
      ['invalid_argument', 'internal', 'unimplemented']);
    streamError(await rpc(sbx, '/process.Process/Start', envelope(startBody, { flags: 2 }), stream), ['invalid_argument']);
    streamError(await rpc(sbx, '/process.Process/Start', envelope('{"process":'), stream), ['invalid_argument']);
    streamError(await rpc(sbx, '/process.Process/Start', envelope({ process: { cmd: 7 } }), stream), ['invalid_argument']);
    streamError(await rpc(sbx, '/filesystem.Filesystem/WatchDir', envelope('not json'), stream), ['invalid_argument']);
    await stillAnswers();
  });

  test('an oversized envelope is refused before it is all read', { timeout: testTimeoutMs }, async () => {
    // 24 MiB of JSON whitespace around an empty message: valid framing, far past any sane request.
    const big = Buffer.alloc(24 << 20, 0x20);
    big[0] = 0x7b;
    big[big.length - 1] = 0x7d;
    let r;
    try {
      r = await rpc(sbx, '/process.Process/Start', envelope(big), stream);
    } catch (e) {
      // A server may answer early and close while the body is still being sent.
      r = { status: 0, error: e };
    }
    // Refused in Connect's shape: before the stream (429, as Connect pairs resource_exhausted),
    // or as the stream's end.
    if (r.status !== 0) streamError(r, ['resource_exhausted', 'invalid_argument']);
    await stillAnswers();
  });

  test('an idle stream gets keepalives at Keepalive-Ping-Interval; Connect-Timeout-Ms ends a process', { timeout: testTimeoutMs }, async () => {
    const idle = await rpc(sbx, '/process.Process/Start',
      envelope({ process: { cmd: '/bin/bash', args: ['-c', 'sleep 3.5; echo done'], envs: {} }, stdin: false }),
      { contentType: 'application/connect+json', headers: { 'Keepalive-Ping-Interval': '1' } });
    assert.equal(idle.status, 200, String(idle.body));
    const fs = frames(idle.body);
    assert.ok(fs[0].json.event?.start, `the first frame is start: ${JSON.stringify(fs[0])}`);
    const keepalives = fs.filter((f) => f.json.event?.keepalive).length;
    assert.ok(keepalives >= 2, `${keepalives} keepalives in 3.5 s at a 1 s interval: ${JSON.stringify(fs)}`);
    const end = fs.find((f) => f.json.event?.end)?.json.event.end;
    assert.ok(end && end.exited && (end.exitCode ?? 0) === 0, `a clean exit: ${JSON.stringify(fs)}`);
    const out = fs.map((f) => f.json.event?.data?.stdout).filter(Boolean)
      .map((b) => Buffer.from(b, 'base64').toString()).join('');
    assert.equal(out, 'done\n');
    assert.deepEqual(fs.at(-1), { flags: 2, json: {} }, 'a clean end of stream');

    const t0 = Date.now();
    const bounded = await rpc(sbx, '/process.Process/Start',
      envelope({ process: { cmd: '/bin/bash', args: ['-c', 'sleep 60'], envs: {} }, stdin: false }),
      { contentType: 'application/connect+json', headers: { 'Connect-Timeout-Ms': '2000' } });
    const took = Date.now() - t0;
    assert.equal(bounded.status, 200, String(bounded.body));
    const ends = frames(bounded.body);
    const pid = ends[0].json.event?.start?.pid;
    assert.ok(Number.isInteger(pid), JSON.stringify(ends[0]));
    assert.equal(ends.at(-1).flags, 2, 'an end-of-stream frame');
    assert.ok(took < 30_000, `a 2 s Connect-Timeout-Ms took ${took} ms to end the stream`);
    const listed = JSON.parse((await rpc(sbx, '/process.Process/List', '{}')).body.toString()).processes ?? [];
    assert.ok(!listed.some((p) => p.pid === pid), `the process ${pid} outlived its Connect-Timeout-Ms`);
  });

  test('wrong, missing and foreign access tokens are unauthenticated', { timeout: testTimeoutMs }, async () => {
    const stat = JSON.stringify({ path: '/' });
    unaryError(await rpc({ ...sbx, token: 'x'.repeat(64) }, '/filesystem.Filesystem/Stat', stat), 401, ['unauthenticated']);
    unaryError(await rpc({ ...sbx, token: '' }, '/filesystem.Filesystem/Stat', stat), 401, ['unauthenticated']);
    unaryError(await rpc({ ...sbx, token: other.token }, '/filesystem.Filesystem/Stat', stat), 401, ['unauthenticated']);
    const started = await rpc({ ...sbx, token: other.token }, '/process.Process/Start', envelope(startBody), stream);
    if (started.status === 200) streamError(started, ['unauthenticated']);
    else assert.equal(started.status, 401, String(started.body));
    // /files takes the token too, and the interpreter its own.
    const files = await fetch(`${serveUrl}/files?path=/etc/hostname`, { headers: envdHeaders({ ...sbx, token: other.token }) });
    assert.equal(files.status, 401, await files.text());
    const exec = await fetch(`${serveUrl}/execute`, { method: 'POST', body: JSON.stringify({ code: '1' }),
      headers: { 'E2b-Sandbox-Id': sbx.id, 'E2b-Sandbox-Port': interpreterPort, 'Content-Type': 'application/json',
        'X-Access-Token': other.token, 'E2B-Traffic-Access-Token': 'wrong' } });
    assert.equal(exec.status, 401, await exec.text());
    await stillAnswers();
    await stillAnswers(other);
  });

  test('a killed sandbox or a port not served is 502, as a proxy answers', { timeout: testTimeoutMs }, async () => {
    const stat = JSON.stringify({ path: '/' });
    const health = async (s) => (await fetch(`${serveUrl}/health`, { headers: envdHeaders(s) })).status;
    assert.equal(await health(sbx), 204);
    // What isRunning() reads as "not running": the sandbox's own token, the sandbox gone.
    const gone = await createSandbox('gone');
    assert.equal((await control('DELETE', `/sandboxes/${gone.id}`)).status, 204);
    httpError(await rpc(gone, '/filesystem.Filesystem/Stat', stat), [502]);
    assert.equal(await health(gone), 502);
    httpError(await rpc(sbx, '/filesystem.Filesystem/Stat', stat, { headers: { 'E2b-Sandbox-Port': '8080' } }), [502]);
    // An id that names nothing, with another sandbox's token: refused either way.
    httpError(await rpc({ id: 'no-such-sandbox', token: sbx.token }, '/filesystem.Filesystem/Stat', stat), [401, 502]);
    httpError(await rpc({ id: '../../etc', token: sbx.token }, '/filesystem.Filesystem/Stat', stat), [401, 502]);
    await stillAnswers();
  });

  test('/files: broken multipart, missing paths, a directory', { timeout: testTimeoutMs }, async () => {
    const files = (query, init = {}) => fetch(`${serveUrl}/files${query}`,
      { ...init, headers: { ...envdHeaders(sbx), ...init.headers } })
      .then(async (res) => ({ status: res.status, text: await res.text() }));
    httpError(await files('?path=/tmp/nope/missing.txt'), [404]);
    httpError(await files('?path=/tmp'), [400, 404]);
    httpError(await files(''), [400]);
    httpError(await files('?path=/tmp/x.txt', { method: 'POST', body: 'no multipart here',
      headers: { 'Content-Type': 'multipart/form-data' } }), [400]);
    const cut = '--b\r\nContent-Disposition: form-data; name="file"; filename="/tmp/cut.txt"\r\n\r\nhalf a fi';
    httpError(await files('?path=/tmp/cut.txt', { method: 'POST', body: cut,
      headers: { 'Content-Type': 'multipart/form-data; boundary=b' } }), [400]);
    httpError(await files('?path=/tmp/cut.txt'), [404]);
    httpError(await files('?path=/tmp/x.txt', { method: 'DELETE' }), [400, 404, 405]);
    await stillAnswers();
  });

  test('the interpreter and the control plane refuse bad bodies', { timeout: testTimeoutMs }, async () => {
    const interp = { 'E2b-Sandbox-Id': sbx.id, 'E2b-Sandbox-Port': interpreterPort, 'X-Access-Token': sbx.token,
      'Content-Type': 'application/json' };
    for (const body of ['{"code":', '{"code": 5}', '[]', '']) {
      const res = await fetch(`${serveUrl}/execute`, { method: 'POST', headers: interp, body });
      httpError({ status: res.status, text: await res.text() }, [400, 422]);
    }
    const ctx = await fetch(`${serveUrl}/contexts/no-such-context`, { method: 'DELETE', headers: interp });
    httpError({ status: ctx.status, text: await ctx.text() }, [404]);

    for (const [body, status] of [['{"templateID":', 400], ['{"templateID": 5}', 400], ['[]', 400],
      ['{"templateID": "base", "timeout": -1}', 400], ['{"templateID": "base", "metadata": {"k": 1}}', 400]]) {
      const r = await control('POST', '/v2/sandboxes', body);
      assert.equal(r.status, status, `${body}: ${r.text}`);
      assert.equal(r.json.code, status, `the body's code is the status: ${r.text}`);
      assert.equal(typeof r.json.message, 'string');
    }
    const missing = await control('GET', '/sandboxes/no-such-sandbox');
    assert.equal(missing.status, 404, missing.text);
    assert.equal(missing.json.code, 404);
    await stillAnswers();
  });

  test('a request whose Content-Length lies is refused alone', { timeout: testTimeoutMs }, async () => {
    const { hostname, port } = new URL(serveUrl);
    const reply = await new Promise((resolve, reject) => {
      const sock = netConnect(Number(port), hostname);
      let got = '';
      sock.on('data', (d) => { got += d; });
      sock.on('error', reject);
      sock.on('close', () => resolve(got));
      sock.write(`POST /filesystem.Filesystem/Stat HTTP/1.1\r\nHost: ${hostname}:${port}\r\n`
        + `E2b-Sandbox-Id: ${sbx.id}\r\nE2b-Sandbox-Port: ${envdPort}\r\nX-Access-Token: ${sbx.token}\r\n`
        + 'Connect-Protocol-Version: 1\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{"path":"/"}');
      sock.end();
      setTimeout(() => sock.destroy(), 30_000);
    });
    // Either an error answer or a closed connection; never a 200 for half a body.
    assert.ok(!/^HTTP\/1\.1 200/.test(reply), reply.slice(0, 300));
    await stillAnswers();
  });

  // serve's resident memory in MiB (the driver passes its pid).
  function serveRssMiB() {
    const status = readFileSync(`/proc/${process.env.E2B_TIER_SERVE_PID}/status`, 'utf8');
    return Number(/^VmRSS:\s+(\d+) kB/m.exec(status)[1]) / 1024;
  }

  // A stalled reader holds its own sandbox's output (serve's backpressure: the command blocks on
  // its pipe rather than serve buffering without bound), never another sandbox's, the control
  // plane or serve's memory; once it goes away, its sandbox answers again.
  test('a client that stops reading a stream holds up no other sandbox', { timeout: testTimeoutMs }, async (t) => {
    const { hostname, port } = new URL(serveUrl);
    let t0 = Date.now();
    await stillAnswers();
    const quiet = Date.now() - t0;
    const flood = { cmd: '/bin/bash', args: ['-c', 'yes flood-flood-flood-flood'], envs: {} };
    const body = envelope({ process: flood, stdin: false });
    const bound = Math.max(30_000, 10 * quiet);
    let pid;
    const req = httpRequest({ host: hostname, port, method: 'POST', path: '/process.Process/Start',
      headers: { ...envdHeaders(sbx, 'application/connect+json'), 'Content-Length': body.length } });
    try {
      const stalled = await new Promise((resolve, reject) => {
        req.on('error', reject);
        req.on('response', (res) => {
          res.once('data', (chunk) => {
            // The first frame is start, with the pid; then this client reads no more.
            const len = chunk.readUInt32BE(1);
            pid = JSON.parse(chunk.subarray(5, 5 + len).toString()).event.start.pid;
            res.pause();
            resolve(res);
          });
        });
        req.end(body);
      });
      assert.equal(stalled.statusCode, 200);
      assert.ok(Number.isInteger(pid), `pid ${pid}`);
      // Long enough for every buffer between the guest and this socket to fill up; from then on
      // the output must wait (the command blocks on its pipe), not pile up in serve.
      await sleep(5000);
      const rssBefore = serveRssMiB();
      await sleep(5000);
      const grown = serveRssMiB() - rssBefore;
      const timed = async (what) => {
        const t1 = Date.now();
        await what();
        return Date.now() - t1;
      };
      const list = () => control('GET', `/v2/sandboxes?metadata=${encodeURIComponent(`run=${runId}`)}`)
        .then((r) => assert.equal(r.status, 200, r.text));
      const listMs = await timed(list);
      const otherMs = await timed(() => stillAnswers(other));
      t.diagnostic(`calls ${quiet} ms before the stall; during it: the control plane ${listMs} ms, another sandbox `
        + `${otherMs} ms; serve grew ${grown.toFixed(1)} MiB in 5 s`);
      assert.ok(grown < 32, `serve grew ${grown.toFixed(1)} MiB in 5 s of a stalled stream: the output piles up`);
      assert.ok(listMs < bound && otherMs < bound, `the control plane took ${listMs} ms, another sandbox ${otherMs} ms`);
    } finally {
      req.destroy();
      const kill = JSON.stringify({ process: { pid }, signal: 'SIGNAL_SIGKILL' });
      if (pid) await rpc(sbx, '/process.Process/SendSignal', kill);
    }
    const deadline = Date.now() + 60_000;
    for (;;) {
      const procs = JSON.parse((await rpc(sbx, '/process.Process/List', '{}')).body.toString()).processes ?? [];
      if (!procs.some((p) => p.pid === pid)) break;
      assert.ok(Date.now() < deadline, `the flood ${pid} is still listed`);
      await sleep(250);
    }
    const t2 = Date.now();
    await stillAnswers();
    const afterMs = Date.now() - t2;
    assert.ok(afterMs < bound, `the stalled stream's sandbox took ${afterMs} ms to answer once its reader went away`);
  });
});
