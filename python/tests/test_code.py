"""run_code: the sandbox's persistent Python interpreter."""
from __future__ import annotations

import pytest

from agentvm import AsyncSandbox, Execution, Sandbox
from conftest import run_async


def test_state_result_and_output(sandbox: Sandbox) -> None:
    e = sandbox.run_code("import math\nx = math.factorial(5)\nprint('x is', x)\nx * 2")
    assert isinstance(e, Execution)
    assert (e.result, e.stdout, e.stderr, e.exception, e.timed_out, e.state_lost) == \
        ("240", "x is 120\n", "", None, False, False)
    e = sandbox.run_code("y = x + 1\ny")
    assert e.result == "121"
    e = sandbox.run_code("import sys\nprint('warn', file=sys.stderr)\nNone")
    assert e.result is None and e.stderr == "warn\n"


def test_exception(sandbox: Sandbox) -> None:
    e = sandbox.run_code("def f():\n    return 1 / 0\nf()")
    assert e.exception is not None
    assert e.exception.type == "ZeroDivisionError"
    assert e.exception.message == "division by zero"
    assert "ZeroDivisionError" in e.exception.traceback and "<cell" in e.exception.traceback
    assert e.result is None and not e.state_lost
    # The interpreter keeps running after an exception.
    assert sandbox.run_code("40 + 2").result == "42"


def test_timeout_interrupts(sandbox: Sandbox) -> None:
    sandbox.run_code("kept = 'yes'")
    e = sandbox.run_code("import time\nprint('before', flush=True)\ntime.sleep(60)", timeout=1)
    assert e.timed_out
    assert e.exception is not None and e.exception.type == "KeyboardInterrupt"
    assert "before" in e.stdout
    assert not e.state_lost and sandbox.run_code("kept").result == "'yes'"


def test_interpreter_death_loses_state(sandbox: Sandbox) -> None:
    sandbox.run_code("z = 1")
    e = sandbox.run_code("import os\nos._exit(3)")
    assert e.state_lost and e.exception is not None and e.exception.type == "InterpreterDied"
    e = sandbox.run_code("'z' in globals()")
    assert e.result == "False"


def test_streaming_and_async(target: dict) -> None:
    async def main() -> None:
        async with await AsyncSandbox.create(**target) as sb:
            chunks: list = []
            e = await sb.run_code("import time\nfor i in range(3):\n    print(i, flush=True)\n    time.sleep(0.2)",
                                  on_stdout=chunks.append)
            assert "".join(chunks) == "0\n1\n2\n" == e.stdout
            with pytest.raises(ValueError):
                await sb.run_code("1", language="rust")

    run_async(main())
