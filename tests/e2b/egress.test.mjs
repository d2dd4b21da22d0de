// A sandbox reaching the outside as E2B's SDK sets it up: Sandbox.create's allowInternetAccess
// and network {allowOut, denyOut}, and updateNetwork on a running sandbox, mapped onto serve's
// egress rules (docs/e2b.md, "Network"). The outside is a web server of this test's on
// 127.0.0.2, a loopback address that only a rule naming it reaches (the guest's own 127.0.0.1
// stays off the proxy); the tools in the sandbox are curl and Python's urllib, through the
// HTTP_PROXY every command gets.
import assert from 'node:assert/strict';
import { createServer } from 'node:http';
import test, { after, before, describe } from 'node:test';

import { ALL_TRAFFIC } from 'e2b';

import { requestTimeoutMs, sandboxFor, sh, testTimeoutMs } from './support.mjs';

describe('egress', () => {
  let server;
  let url;
  before(async () => {
    server = createServer((req, res) => {
      res.writeHead(200, { 'Content-Type': 'text/plain' });
      res.end(`hello from outside: ${req.method} ${req.url}`);
    });
    await new Promise((resolve) => server.listen(0, '127.0.0.2', resolve));
    url = `http://127.0.0.2:${server.address().port}/hello`;
  });
  after(() => server?.close());

  // curl's stdout and exit code, without the SDK throwing on a non-zero exit.
  const curl = async (sbx, args = '') => {
    const r = await sbx.commands.run(`curl -sS -m 60 ${args} ${url}; echo " exit=$?"`, { requestTimeoutMs });
    return r.stdout;
  };

  test('network {allowOut, denyOut: [ALL_TRAFFIC]}: the allowed address is reached, and getInfo says so',
    { timeout: testTimeoutMs }, async (t) => {
      const sbx = await sandboxFor(t, { network: { allowOut: ['127.0.0.2'], denyOut: [ALL_TRAFFIC] } });
      assert.equal(await curl(sbx), 'hello from outside: GET /hello exit=0\n');
      assert.equal(await curl(sbx, '-p'), 'hello from outside: GET /hello exit=0\n', 'through CONNECT');
      const py = await sh(sbx, `python3 -c 'import urllib.request; print(urllib.request.urlopen("${url}").read().decode())'`);
      assert.equal(py, 'hello from outside: GET /hello\n');
      const info = await sbx.getInfo({ requestTimeoutMs });
      assert.equal(info.allowInternetAccess, false);
      assert.deepEqual(info.network.allowOut, ['127.0.0.2']);
      assert.deepEqual(info.network.denyOut, [ALL_TRAFFIC]);
    });

  test('allowInternetAccess: true reaches public addresses only: a loopback one is refused with the reason',
    { timeout: testTimeoutMs }, async (t) => {
      const sbx = await sandboxFor(t, { allowInternetAccess: true });
      const out = await curl(sbx);
      assert.match(out, /^agentvm egress: 127\.0\.0\.2:\d+ .*loopback/, out);
      assert.equal((await sbx.getInfo({ requestTimeoutMs })).allowInternetAccess, true);
    });

  test('a denyOut range beats the internet: refused', { timeout: testTimeoutMs }, async (t) => {
    const sbx = await sandboxFor(t, { network: { allowOut: ['127.0.0.2'], denyOut: ['127.0.0.0/8'] } });
    assert.match(await curl(sbx), /^agentvm egress: .*deny/);
  });

  test('allowInternetAccess: false: no proxy, no way out; updateNetwork then opens the way',
    { timeout: testTimeoutMs }, async (t) => {
      const sbx = await sandboxFor(t, { allowInternetAccess: false });
      assert.equal(await sh(sbx, 'printenv HTTP_PROXY || echo unset'), 'unset\n');
      assert.doesNotMatch(await curl(sbx), /exit=0/);
      await sbx.updateNetwork({ allowOut: ['127.0.0.2'], denyOut: [ALL_TRAFFIC] }, { requestTimeoutMs });
      assert.equal(await sh(sbx, 'printenv HTTP_PROXY'), 'http://127.0.0.1:3128\n');
      assert.equal(await curl(sbx), 'hello from outside: GET /hello exit=0\n');
      await sbx.updateNetwork({ allowInternetAccess: false }, { requestTimeoutMs });
      assert.match(await curl(sbx), /no egress policy|exit=[1-9]/);
    });

  test('what agentvm does not do is refused by name: egressProxy', { timeout: testTimeoutMs }, async () => {
    const { Sandbox } = await import('e2b');
    await assert.rejects(
      Sandbox.create({ requestTimeoutMs, network: { egressProxy: { address: 'proxy.example:3128' } } }),
      (e) => /network\.egressProxy/.test(e.message));
  });
});
