"""Code contexts, on asyncio (docs/protocol.md, "run_code" and "create_context" to
"remove_context"): persistent interpreters, Python or bash, that ``run_code`` cells run in.
The agent has a Python ``default`` from the start and a ``default-bash`` from the first bash
cell on; ``create_code_context`` makes more (``ctx-N``, at most 16), each started at its first
cell. Contexts belong to the sandbox, not to this object: any client sees them."""
from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Union

from . import _validate as valid
from .models import CodeContext

if TYPE_CHECKING:  # pragma: no cover
    from ._lifecycle import AsyncSandbox

LANGUAGES = ("python", "bash")
MAX_CONTEXT_ID_BYTES = 64
# A context as the API takes it: the object create_code_context returned, or its id.
ContextRef = Union[CodeContext, str]


def language(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(f"language must be a str, not {type(value).__name__}")
    if value not in LANGUAGES:
        raise ValueError(f"language {value!r} is not supported ({' or '.join(LANGUAGES)})")
    return value


def context_id(value: Any, name: str = "context") -> str:
    """The id of a :class:`CodeContext` or of an id given as a str."""
    if isinstance(value, CodeContext):
        value = value.id
    elif not isinstance(value, str):
        raise TypeError(f"{name} must be a CodeContext or its id (str), not {type(value).__name__}")
    valid.text(name, value)
    if len(value.encode("utf-8")) > MAX_CONTEXT_ID_BYTES:
        raise ValueError(f"{name} is at most {MAX_CONTEXT_ID_BYTES} bytes")
    return str(value)


async def _call(sandbox: AsyncSandbox, op: str, body: Dict[str, Any]) -> Dict[str, Any]:
    sandbox._check_alive()
    return await sandbox._transport.call(op, body, soft_timeout=0.0)


async def create(sandbox: AsyncSandbox, lang: str, cwd: Optional[str]) -> CodeContext:
    body: Dict[str, Any] = {"language": language(lang)}
    if cwd is not None:
        body["cwd"] = valid.text("cwd", os.fspath(cwd) if isinstance(cwd, os.PathLike) else cwd)
    return CodeContext.from_response(await _call(sandbox, "create_context", body))


async def list_all(sandbox: AsyncSandbox) -> List[CodeContext]:
    msg = await _call(sandbox, "list_contexts", {})
    return [CodeContext.from_response(c) for c in msg.get("contexts") or []]


async def restart(sandbox: AsyncSandbox, context: ContextRef) -> None:
    await _call(sandbox, "restart_context", {"context": context_id(context)})


async def remove(sandbox: AsyncSandbox, context: ContextRef) -> None:
    await _call(sandbox, "remove_context", {"context": context_id(context)})
