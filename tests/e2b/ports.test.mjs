// A server inside a sandbox, reached as E2B's SDK tells its users to reach one: the SDK
// starts it (files.write, commands.run in the background) and names it with getHost(port),
// `<port>-<sandbox id>.<domain>` from serve's --e2b-domain; serve routes a request with that
// Host, or with E2b-Sandbox-Id and E2b-Sandbox-Port, to the port inside the guest, without
// serve's token (E2B's sandbox ports are public). Nothing resolves the domain here, so a
// request goes to serve's address with the Host header set by hand, as a wildcard DNS name
// pointed at serve would make a browser send it. One sandbox for the file; its last test
// kills it.
import assert from 'node:assert/strict';
import { createHash, randomBytes } from 'node:crypto';
import { request as httpRequest } from 'node:http';
import test, { after, before, describe } from 'node:test';

import { Sandbox } from 'e2b';

import { e2bDomain } from './harness/serve.mjs';
import { eventually, inTesthost, requestTimeoutMs, runId, serveUrl, testTimeoutMs } from './support.mjs';

const port = 8000;

// http.server's files from ROOT, plus what the tests ask of the server itself: POST answers
// its body's sha256 and size (read as it arrives, never held whole), GET /headers the request's
// headers as the server got them.
const serverScript = `
import functools, hashlib, http.server, json, sys

class Handler(http.server.SimpleHTTPRequestHandler):
    def do_GET(self):
        if self.path == '/headers':
            return self.answer({k.lower(): v for k, v in self.headers.items()})
        return super().do_GET()

    def do_POST(self):
        digest, size = hashlib.sha256(), 0
        left = int(self.headers.get('Content-Length', '0'))
        while left:
            piece = self.rfile.read(min(left, 1 << 20))
            if not piece:
                break
            digest.update(piece)
            size += len(piece)
            left -= len(piece)
        self.answer({'sha256': digest.hexdigest(), 'size': size, 'path': self.path})

    def answer(self, obj):
        body = json.dumps(obj).encode()
        self.send_response(200)
        self.send_header('Content-Type', 'application/json')
        self.send_header('Content-Length', str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass

port, root = int(sys.argv[1]), sys.argv[2]
http.server.ThreadingHTTPServer(('0.0.0.0', port), functools.partial(Handler, directory=root)).serve_forever()
`;

const sha256 = (data) => createHash('sha256').update(data).digest('hex');

// One request to serve's address with `Host: host` (fetch will not set Host): the status,
// headers and whole body. No token: a sandbox's port asks for none.
function viaHost(host, { method = 'GET', path = '/', body } = {}) {
  const serve = new URL(serveUrl);
  return new Promise((resolve, reject) => {
    const headers = { Host: host };
    if (body !== undefined) {
      headers['Content-Type'] = 'application/octet-stream';
      headers['Content-Length'] = String(body.length);
    }
    const req = httpRequest({ host: serve.hostname, port: serve.port, method, path, headers, agent: false },
      (res) => {
        const chunks = [];
        res.on('data', (c) => chunks.push(c));
        res.on('end', () => resolve({ status: res.statusCode, headers: res.headers, body: Buffer.concat(chunks) }));
        res.on('error', reject);
      });
    req.setTimeout(requestTimeoutMs, () => req.destroy(new Error(`${method} ${host}${path}: no answer in ${requestTimeoutMs} ms`)));
    req.on('error', reject);
    req.end(body);
  });
}

// The same through E2B's routing headers on serve's URL.
async function viaHeaders(sandboxId, sandboxPort, path = '/', init = {}) {
  const res = await fetch(`${serveUrl}${path}`, { ...init, signal: AbortSignal.timeout(requestTimeoutMs),
    headers: { 'E2b-Sandbox-Id': sandboxId, 'E2b-Sandbox-Port': String(sandboxPort), ...init.headers } });
  return { status: res.status, headers: Object.fromEntries(res.headers), body: Buffer.from(await res.arrayBuffer()) };
}

// E2B's error shape, {code, message}, with that code.
function e2bError(r, code) {
  assert.equal(r.status, code, `status ${r.status}: ${r.body}`);
  const e = JSON.parse(r.body.toString());
  assert.equal(e.code, code, r.body.toString());
  assert.equal(typeof e.message, 'string');
  assert.ok(e.message.length > 0, 'the error says why');
  return e;
}

describe('ports', () => {
  let sbx;
  let host;
  before(async () => {
    sbx = await Sandbox.create({ requestTimeoutMs, timeoutMs: 1_800_000,
      metadata: { tier: 'e2b', run: runId, case: 'ports' } });
    host = sbx.getHost(port);
    await sbx.files.write('/tmp/ports/server.py', serverScript, { requestTimeoutMs });
    await sbx.files.write('/tmp/www/index.html', '<h1>from the sandbox</h1>\n', { requestTimeoutMs });
    // timeoutMs 0: a background command's deadline is its lifetime, and the server must outlive
    // the SDK's default of 60 s.
    await sbx.commands.run(`python3 /tmp/ports/server.py ${port} /tmp/www`,
      { background: true, timeoutMs: 0, requestTimeoutMs });
    // Until it listens, serve answers 502 at once; python's start is slow under emulation.
    await eventually(async () => (await viaHeaders(sbx.sandboxId, port, '/headers')).status === 200,
      { withinMs: inTesthost ? 240_000 : 30_000, everyMs: 500, what: `the server listening on port ${port}` });
  });
  after(async () => {
    await sbx?.kill({ requestTimeoutMs }).catch(() => {});
  });

  test("getHost(port) is <port>-<id>.<serve's --e2b-domain>, after create and after connect", { timeout: testTimeoutMs }, async () => {
    assert.equal(host, `${port}-${sbx.sandboxId}.${e2bDomain}`);
    const again = await Sandbox.connect(sbx.sandboxId, { requestTimeoutMs });
    assert.equal(again.getHost(3000), `3000-${sbx.sandboxId}.${e2bDomain}`);
  });

  test('the Host getHost names reaches the server, without a token', { timeout: testTimeoutMs }, async () => {
    const r = await viaHost(host, { path: '/index.html' });
    assert.equal(r.status, 200, r.body.toString());
    assert.equal(r.body.toString(), '<h1>from the sandbox</h1>\n');
    // As a browser sent to http://<host>:<serve's port>/ writes it: the port and the case do not matter.
    const sent = `${host.toUpperCase()}:${new URL(serveUrl).port}`;
    const cased = await viaHost(sent, { path: '/headers' });
    assert.equal(cased.status, 200, cased.body.toString());
    assert.equal(JSON.parse(cased.body.toString()).host, sent,
      'the server sees the Host the client sent');
  });

  test('E2b-Sandbox-Id and E2b-Sandbox-Port reach it too, and are not passed on', { timeout: testTimeoutMs }, async () => {
    const r = await viaHeaders(sbx.sandboxId, port, '/index.html');
    assert.equal(r.status, 200, r.body.toString());
    assert.equal(r.body.toString(), '<h1>from the sandbox</h1>\n');
    const seen = await viaHeaders(sbx.sandboxId, port, '/headers',
      { headers: { 'E2B-Traffic-Access-Token': 'not-for-the-guest', 'X-Passed': 'on' } });
    assert.equal(seen.status, 200, seen.body.toString());
    const headers = JSON.parse(seen.body.toString());
    assert.equal(headers['x-passed'], 'on');
    for (const name of ['e2b-sandbox-id', 'e2b-sandbox-port', 'e2b-traffic-access-token'])
      assert.equal(headers[name], undefined, `${name} reached the guest: ${seen.body}`);
  });

  test('a 16 MiB POST arrives whole: the server hashes it', { timeout: testTimeoutMs }, async () => {
    const body = randomBytes(16 << 20);
    const r = await viaHost(host, { method: 'POST', path: '/upload?n=1', body });
    assert.equal(r.status, 200, r.body.toString());
    assert.deepEqual(JSON.parse(r.body.toString()), { sha256: sha256(body), size: body.length, path: '/upload?n=1' });
  });

  test('an 8 MiB file written with files.write comes back whole through http.server', { timeout: testTimeoutMs }, async () => {
    const data = randomBytes(8 << 20);
    await sbx.files.write('/tmp/www/blob.bin', data.buffer.slice(data.byteOffset, data.byteOffset + data.length),
      { requestTimeoutMs });
    const r = await viaHeaders(sbx.sandboxId, port, '/blob.bin');
    assert.equal(r.status, 200, r.body.subarray(0, 200).toString());
    assert.equal(r.headers['content-length'], String(data.length), "the server's Content-Length is kept");
    assert.equal(r.body.length, data.length);
    assert.equal(sha256(r.body), sha256(data));
  });

  test('a port nothing listens on, or a sandbox that does not exist, is 502 at once', { timeout: testTimeoutMs }, async () => {
    const quick = inTesthost ? 20_000 : 3_000;
    for (const probe of [
      () => viaHeaders(sbx.sandboxId, port + 1, '/'),
      () => viaHost(sbx.getHost(port + 1)),
      () => viaHost(`${port}-no-such-sandbox.${e2bDomain}`),
    ]) {
      const started = Date.now();
      e2bError(await probe(), 502);
      assert.ok(Date.now() - started < quick, `a 502 took ${Date.now() - started} ms`);
    }
  });

  test("after kill(), the sandbox's host name answers 502", { timeout: testTimeoutMs }, async () => {
    assert.equal((await viaHost(host, { path: '/index.html' })).status, 200, 'it answers before the kill');
    assert.equal(await sbx.kill({ requestTimeoutMs }), true);
    e2bError(await viaHost(host, { path: '/index.html' }), 502);
    e2bError(await viaHeaders(sbx.sandboxId, port, '/index.html'), 502);
  });
});
