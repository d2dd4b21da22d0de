// What the E2B facade costs over serve's native API, measured in one serve and one run, with
// the official SDK (`e2b`, from tests/e2b/node_modules) and plain HTTP to the native API
// interleaved round by round, so that drift in the machine's load hits both alike:
//
// 1. create -> first result: Sandbox.create() then commands.run('true'), against
//    POST /v1/sandboxes then POST .../exec of the same command line (the SDK runs
//    `/bin/bash -l -c true`), both from a warm pool refilled between rounds; then the kill.
//    Target: the SDK's median <= 1.2x the native one.
// 2. A commands.run('true') round trip in a running sandbox, against the native exec of
//    `/bin/bash -l -c true`. Target (hardware KVM): the facade's own cost <= 0.2 ms.
// 3. runCode('x = 1') (@e2b/code-interpreter) against the native run_code of the same cell.
//
// Run through bench/e2b, which puts it where a Linux guest boots.
import { parseArgs } from 'node:util';
import { setTimeout as sleep } from 'node:timers/promises';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const repo = join(dirname(fileURLToPath(import.meta.url)), '..');
const sdkDir = join(repo, 'tests/e2b/node_modules');
const { Sandbox } = await import(join(sdkDir, 'e2b/dist/index.mjs'));
const { Sandbox: CodeSandbox } = await import(join(sdkDir, '@e2b/code-interpreter/dist/index.mjs'));
const { Serve } = await import(join(repo, 'tests/e2b/harness/serve.mjs'));

const { values: args } = parseArgs({
  options: { rounds: { type: 'string', default: '20' }, calls: { type: 'string', default: '200' } },
});
const rounds = Number(args.rounds);
const calls = Number(args.calls);
if (!Number.isInteger(rounds) || rounds < 1 || !Number.isInteger(calls) || calls < 1) {
  console.error('bench/e2b: --rounds and --calls must be positive integers');
  process.exit(2);
}
const inTesthost = Boolean(process.env.AGENTVM_IN_TESTHOST);
const where = inTesthost
  ? 'nested KVM inside the emulated test host: absolute times are meaningless, only relations'
  : 'hardware KVM';

const median = (xs) => {
  const s = [...xs].sort((a, b) => a - b);
  const m = Math.floor(s.length / 2);
  return s.length % 2 ? s[m] : (s[m - 1] + s[m]) / 2;
};
const line = (name, ms) =>
  console.log(`  ${name.padEnd(46)} median ${median(ms).toFixed(3).padStart(9)} ms  min ${Math.min(...ms).toFixed(3).padStart(9)}  max ${Math.max(...ms).toFixed(3).padStart(9)}`);
const verdict = (met) => (met ? 'MET' : 'NOT MET') + (inTesthost ? ' here (under emulation)' : '');

const serve = await Serve.start({ binary: join(repo, 'build/agentvm-serve'), pools: { default: 2 } });
const opts = { apiUrl: serve.url, sandboxUrl: serve.url, apiKey: serve.key, requestTimeoutMs: 600_000 };
const native = async (method, path, body) => {
  const res = await fetch(`${serve.url}${path}`, {
    method,
    headers: { Authorization: `Bearer ${serve.key}`, 'Content-Type': 'application/json' },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await res.text();
  if (!res.ok) throw new Error(`${method} ${path}: ${res.status} ${text}`);
  return text ? JSON.parse(text) : null;
};
const bashTrue = { argv: ['/bin/bash', '-l', '-c', 'true'] };
const checkTrue = (exitCode, what) => {
  if (exitCode !== 0) throw new Error(`${what}: \`true\` exited ${exitCode}`);
};
// Both paths create from the warm pool: wait for it to be full again between creates.
async function poolFull() {
  for (;;) {
    const text = await (await fetch(`${serve.url}/metrics`, { headers: { Authorization: `Bearer ${serve.key}` } })).text();
    const ready = /agentvm_pool_ready\{pool="default"\} (\d+)/.exec(text);
    if (ready && Number(ready[1]) >= 2) return;
    await sleep(50);
  }
}

try {
  console.log(`bench/e2b: ${rounds} creates and ${calls} calls each way, on ${where}`);
  const created = { sdk: [], native: [] };
  for (let i = 0; i < rounds; i++) {
    await poolFull();
    let start = performance.now();
    const sbx = await Sandbox.create(opts);
    const result = await sbx.commands.run('true');
    created.sdk.push(performance.now() - start);
    checkTrue(result.exitCode, 'SDK');
    await sbx.kill();
    await poolFull();
    start = performance.now();
    const made = await native('POST', '/v1/sandboxes', {});
    const answer = await native('POST', `/v1/sandboxes/${made.id}/exec`, bashTrue);
    created.native.push(performance.now() - start);
    checkTrue(answer.exit_code, 'native');
    await native('DELETE', `/v1/sandboxes/${made.id}`);
  }
  console.log('1. create -> first result (warm pool):');
  line('Sandbox.create + commands.run("true")', created.sdk);
  line('POST /v1/sandboxes + exec bash -l -c true', created.native);
  const createRatio = median(created.sdk) / median(created.native);
  console.log(`    ratio ${createRatio.toFixed(2)}x; target <= 1.2x: ${verdict(createRatio <= 1.2)}`);

  const sbx = await CodeSandbox.create(opts);
  const made = await native('POST', '/v1/sandboxes', {});
  const round = { sdk: [], native: [], cell: [], nativeCell: [] };
  await sbx.commands.run('true');
  await native('POST', `/v1/sandboxes/${made.id}/exec`, bashTrue);
  await sbx.runCode('x = 0');
  await native('POST', `/v1/sandboxes/${made.id}/run_code`, { code: 'x = 0' });
  for (let i = 0; i < calls; i++) {
    let start = performance.now();
    checkTrue((await sbx.commands.run('true')).exitCode, 'SDK');
    round.sdk.push(performance.now() - start);
    start = performance.now();
    checkTrue((await native('POST', `/v1/sandboxes/${made.id}/exec`, bashTrue)).exit_code, 'native');
    round.native.push(performance.now() - start);
    start = performance.now();
    const execution = await sbx.runCode('x = 1');
    round.cell.push(performance.now() - start);
    if (execution.error) throw new Error(`runCode raised ${execution.error.name}`);
    start = performance.now();
    const cell = await native('POST', `/v1/sandboxes/${made.id}/run_code`, { code: 'x = 1' });
    round.nativeCell.push(performance.now() - start);
    if (cell.exception) throw new Error(`run_code raised ${cell.exception.type}`);
  }
  console.log('2. a command round trip in a running sandbox:');
  line('commands.run("true")', round.sdk);
  line('native exec bash -l -c true', round.native);
  const extra = median(round.sdk) - median(round.native);
  console.log(`    the facade's own cost ${extra >= 0 ? '+' : ''}${extra.toFixed(3)} ms; target <= 0.2 ms: ${verdict(extra <= 0.2)}`);
  console.log('3. a cell of the persistent interpreter:');
  line('runCode("x = 1")', round.cell);
  line('native run_code "x = 1"', round.nativeCell);
  console.log(`    ratio ${(median(round.cell) / median(round.nativeCell)).toFixed(2)}x`);
  await sbx.kill();
  await native('DELETE', `/v1/sandboxes/${made.id}`);
} finally {
  const problems = await serve.stop();
  if (problems.length) {
    console.error(`bench/e2b: serve did not stop clean: ${problems.join('; ')}`);
    process.exitCode = 1;
  }
}
