// A node --test reporter that says, as each test file's suite ends, how long it took and how
// many of its tests passed: where the tier's time goes under emulation.
export default async function* timing(source) {
  let passed = 0;
  let failed = 0;
  for await (const event of source) {
    if (event.type !== 'test:pass' && event.type !== 'test:fail') continue;
    if (event.data.nesting > 0) {
      if (event.data.details?.type !== 'suite') event.type === 'test:pass' ? passed++ : failed++;
      continue;
    }
    const seconds = (event.data.details.duration_ms / 1000).toFixed(1);
    yield `e2b: ${event.data.name}: ${passed} passed, ${failed} failed, ${seconds} s\n`;
    passed = 0;
    failed = 0;
  }
}
