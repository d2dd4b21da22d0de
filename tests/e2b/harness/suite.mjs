// The E2B tier's driver, run where guests boot (tests/e2b/run.sh puts it in the test host):
// bakes the tier's template when a test needs it, starts one agentvm-serve, runs the test files
// with node's own runner (`node --test`, all files in one process) pointed at serve the
// way a user points the SDKs at it (E2B_API_URL = E2B_SANDBOX_URL = serve's address,
// E2B_API_KEY = its token), then stops serve and checks that nothing is left.
//
//   node tests/e2b/harness/suite.mjs [NODE_TEST_OPTIONS...] [FILE.test.mjs...]
//
// The report goes to stderr (node's spec reporter) and, in TAP, to build/e2b-tests.tap. The
// exit status is node's, or 1 when serve did not stop clean.
import { spawn, spawnSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { closeSync, mkdtempSync, openSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';

import { Serve } from './serve.mjs';

const tierDir = resolve(dirname(fileURLToPath(import.meta.url)), '..');
const repo = resolve(tierDir, '..', '..');
const build = join(repo, 'build');
const tapPath = join(build, 'e2b-tests.tap');
const templateName = 'e2b-tier';
const inTesthost = process.env.AGENTVM_IN_TESTHOST === '1';
const started = Date.now();

function say(text) {
  process.stderr.write(`e2b: [${Math.round((Date.now() - started) / 1000)}s] ${text}\n`);
}

const files = [];
const nodeOptions = [];
for (const arg of process.argv.slice(2)) {
  if (arg.endsWith('.test.mjs')) files.push(resolve(arg));
  else nodeOptions.push(arg);
}
if (!files.length) {
  for (const name of readdirSync(tierDir).sort()) if (name.endsWith('.test.mjs')) files.push(join(tierDir, name));
}

// The template's bake: a guest boots, so it happens here, once per change of the template
// (`agentvm template bake` leaves a current one alone).
let templateError = '';
if (files.some((f) => f.endsWith('/template.test.mjs'))) {
  const store = process.env.E2B_TIER_TEMPLATE_STORE;
  if (!store) {
    templateError = 'E2B_TIER_TEMPLATE_STORE is not set: tests/e2b/run.sh builds the template and sets it';
  } else {
    say(`baking template ${templateName} if it is not current (agentvm template bake)`);
    const bake = spawnSync(join(build, 'agentvm'), ['--log-level', 'warn', 'template', 'bake', templateName,
      '--store', store], { stdio: ['ignore', 'inherit', 'pipe'], timeout: 900_000, encoding: 'utf8' });
    if (bake.status !== 0) {
      templateError = `agentvm template bake ${templateName} failed (${bake.status ?? bake.signal}): `
        + bake.stderr.slice(-2000);
      process.stderr.write(bake.stderr);
    }
    say(templateError ? 'the bake failed' : 'template ready');
  }
}

// Warm VMs: enough that most creates take one, few enough that their refills do not crowd
// the one emulated CPU the tests run on.
const pools = { default: inTesthost ? 3 : 6 };
if (files.some((f) => f.endsWith('/template.test.mjs')) && !templateError) pools[templateName] = 1;

// All files in one process: each file's tests are one describe() with its own hooks, and
// loading the SDKs costs ~10 s a process under emulation.
const entryDir = mkdtempSync(join(tmpdir(), 'agentvm-e2b-tier-'));
const entry = join(entryDir, 'e2b-tier.test.mjs');
writeFileSync(entry, files.map((f) => `import ${JSON.stringify(pathToFileURL(f).href)};\n`).join(''));

say(`starting agentvm-serve (pools ${JSON.stringify(pools)})`);
let serve;
try {
  serve = await Serve.start({ binary: process.env.E2B_TIER_SERVE || join(build, 'agentvm-serve'), pools,
    templateStore: process.env.E2B_TIER_TEMPLATE_STORE });
} catch (e) {
  rmSync(entryDir, { recursive: true, force: true });
  say(`FAIL: ${e.message}`);
  process.exit(1);
}
say(`agentvm-serve answers on ${serve.url}; running ${files.length} test files`);

let runner = null;
let stopping = false;
async function finish(status) {
  if (stopping) return;
  stopping = true;
  runner?.kill('SIGKILL');
  say('stopping agentvm-serve');
  const problems = await serve.stop();
  rmSync(entryDir, { recursive: true, force: true });
  for (const p of problems) process.stderr.write(`e2b: FAIL: ${p}\n`);
  if (!problems.length) say('serve stopped clean: exit 0, no process of its left, its temporary directory removed');
  say(`the E2B tier took ${Math.round((Date.now() - started) / 1000)} s`);
  process.exit(status || (problems.length ? 1 : 0));
}
for (const [signal, number] of [['SIGINT', 2], ['SIGTERM', 15], ['SIGHUP', 1]]) {
  process.on(signal, () => finish(128 + number));
}

rmSync(tapPath, { force: true });
const env = {
  ...process.env,
  E2B_API_URL: serve.url,
  E2B_SANDBOX_URL: serve.url,
  E2B_API_KEY: serve.key,
  E2B_TIER_RUN: `run-${randomBytes(4).toString('hex')}`,
  E2B_TIER_TEMPLATE: templateName,
  E2B_TIER_TEMPLATE_ERROR: templateError,
  E2B_TIER_SERVE_PID: String(serve.proc.pid),
};
// Never E2B's own cloud, whatever the caller's environment says.
delete env.E2B_DOMAIN;
delete env.E2B_DEBUG;
// --test-force-exit: the run ends with its last test, not when the SDKs' sockets and timers
// (keep-alive connections, a refused upload's unsent body) let the process go. Exiting so
// drops what a reporter still had to write to a file destination (the TAP's closing counts),
// so the TAP goes to the runner's stdout, which is the TAP file (written synchronously), and
// the readable report to stderr.
const tapFd = openSync(tapPath, 'w');
runner = spawn(process.execPath, ['--test', '--test-force-exit', '--test-reporter=spec',
  '--test-reporter-destination=stderr', '--test-reporter=tap', '--test-reporter-destination=stdout',
  `--test-reporter=${join(tierDir, 'harness', 'timing.mjs')}`, '--test-reporter-destination=stderr',
  ...nodeOptions, entry],
{ stdio: ['ignore', tapFd, 'inherit'], env, cwd: repo });
closeSync(tapFd);
const status = await new Promise((resolve) => runner.on('exit', (code, signal) => resolve(code ?? 128 + 9)));
await finish(status);
