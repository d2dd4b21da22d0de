"""Code contexts (docs/protocol.md, "run_code", "create_context" to "remove_context"; python/
README.md, "Code"), both transports, on asyncio, in one test since each boots a sandbox: two
Python contexts with separate state, a bash context keeping its cwd and variables apart from the
default bash one, rich forms and display() events, a restart under a running cell, and
removal."""
from __future__ import annotations

import asyncio
import base64
from typing import Any, Dict, List

import pytest

from agentvm import AgentError, AsyncSandbox, CodeContext, NotFound
from conftest import run_async

PNG = b"\x89PNG\r\n\x1a\n-not-really"
RICH = f"""
class Rich:
    def __repr__(self):
        return "Rich()"
    def _repr_html_(self):
        return "<b>hi</b>"
    def _repr_png_(self):
        return {PNG!r}
    def _repr_markdown_(self):
        raise RuntimeError("no markdown")
print("before", flush=True)
display(Rich())
display({{"text/markdown": "*m*"}}, raw=True)
Rich()
"""


def test_contexts_state_bash_formats_displays_and_restart(target: Dict[str, Any]) -> None:
    async def main() -> None:
        async with await AsyncSandbox.create(**target) as sb:
            a = await sb.create_code_context()
            b = await sb.create_code_context("python", cwd="/tmp")
            sh = await sb.create_code_context("bash", cwd="/tmp")
            assert isinstance(a, CodeContext) and (a.language, a.running) == ("python", False)
            assert (b.cwd, sh.language, sh.cwd) == ("/tmp", "bash", "/tmp") and len({a.id, b.id, sh.id}) == 3

            # Separate state, cells of different contexts at once.
            await asyncio.gather(sb.run_code("x = 'a'", context=a), sb.run_code("x = 'b'", context=b.id))
            ra, rb, cwd = await asyncio.gather(sb.run_code("x", context=a), sb.run_code("x", context=b),
                                               sb.run_code("import os\nos.getcwd()", context=b))
            assert (ra.result, rb.result, cwd.result) == ("'a'", "'b'", "'/tmp'")
            assert ra.exit_code is None and ra.formats == {} and ra.displays == []

            # bash: cwd and variables kept per context, a status as the exit code.
            e = await sb.run_code("cd /etc && Y=42", context=sh)
            assert (e.exit_code, e.exception, e.result) == (0, None, None)
            e = await sb.run_code("echo $PWD $Y; false", context=sh)
            assert (e.stdout, e.exit_code, e.exception and e.exception.type) == ("/etc 42\n", 1, "ExitCode")
            e = await sb.run_code("echo ${Y:-unset}", language="bash")  # default-bash: another shell
            assert (e.stdout, e.exit_code) == ("unset\n", 0)

            # Rich forms of the result, display() events (to the callback and in the result).
            shown: List[Dict[str, Any]] = []
            e = await sb.run_code(RICH, context=a, on_display=shown.append)
            assert (e.result, e.stdout, e.exception) == ("Rich()", "before\n", None), e
            assert e.formats == {"text/html": "<b>hi</b>", "image/png": base64.b64encode(PNG).decode()}
            assert e.formats_truncated == [] and e.displays_dropped == 0
            assert e.displays == shown and len(shown) == 2, shown
            assert shown[0] == {"text/plain": "Rich()", "text/html": "<b>hi</b>",
                                "image/png": base64.b64encode(PNG).decode()}
            assert shown[1] == {"text/markdown": "*m*"}

            listed = await sb.list_code_contexts()
            assert [c.id for c in listed] == ["default", a.id, b.id, sh.id, "default-bash"]
            assert all(c.running for c in listed[1:]) and listed[3].cwd == "/tmp"

            # A restart kills a running cell (state_lost) and the context's state, no other's.
            started = asyncio.get_running_loop().create_future()
            cell = asyncio.ensure_future(sb.run_code(
                "import time\nprint('started', flush=True)\ntime.sleep(60)", context=a,
                on_stdout=lambda _: started.done() or started.set_result(None)))
            await asyncio.wait_for(started, 60)
            await sb.restart_code_context(a)
            e = await asyncio.wait_for(cell, 30)
            assert e.state_lost and e.exception is not None and e.exception.type == "InterpreterDied"
            assert "restarted" in e.exception.message
            assert (await sb.run_code("'x' in globals()", context=a)).result == "False"
            assert (await sb.run_code("x", context=b)).result == "'b'"
            await sb.restart_code_context(sh.id)
            assert (await sb.run_code("pwd", context=sh)).stdout == "/tmp\n"

            # Removed: gone from the list, cells naming it not found; default stays.
            await sb.remove_code_context(b)
            with pytest.raises(NotFound):
                await sb.run_code("1", context=b)
            assert b.id not in [c.id for c in await sb.list_code_contexts()]
            with pytest.raises(AgentError) as err:
                await sb.remove_code_context("default")
            assert err.value.code == "bad_field"
            with pytest.raises(AgentError) as err:
                await sb.run_code("1", language="python", context=sh.id)
            assert err.value.code == "bad_field"
            with pytest.raises(ValueError):
                await sb.run_code("1", language="bash", context=a)
            with pytest.raises(ValueError):
                await sb.create_code_context("r")
            with pytest.raises(TypeError):
                await sb.restart_code_context(3)  # type: ignore[arg-type]

    run_async(main())
