"""The blocking API is the asyncio one, blocking: every public method of Sandbox, of its
commands and files, and of CommandHandle declares exactly the parameters of its async twin
(names, kinds, defaults, annotations; overloads too) and returns the blocking form of what the
twin returns. Needs no VM."""
from __future__ import annotations

import inspect
import re
import typing
from typing import Any, Callable, List, Tuple

import pytest

import agentvm
from agentvm import sandbox as module

pytestmark = pytest.mark.no_guest  # boots nothing: tests/run_all.sh runs it on the host

TWINS = [
    (module.Sandbox, module.AsyncSandbox),
    (module.Commands, module.AsyncCommands),
    (module.Files, module.AsyncFiles),
    (module.CommandHandle, module.AsyncCommandHandle),
    (module.ProcessCommands, module.AsyncProcessCommands),
    (module.Process, module.AsyncProcess),
    (module.Pty, module.AsyncPty),
    (module.WatchHandle, module.AsyncWatchHandle),
    (module.Ports, module.AsyncPorts),
    (module.PortForward, module.AsyncPortForward),
]


def public(cls: type) -> List[str]:
    return sorted(name for name in vars(cls) if not name.startswith("_"))


def spelled(annotation: Any) -> str:
    """An annotation without the modules of the package's own names (they moved between
    modules; they are the same names)."""
    return re.sub(r"\bagentvm\.(\w+\.)*", "", inspect.formatannotation(annotation))


def blocking_form(annotation: Any) -> str:
    """An async method's return annotation as its blocking twin spells it."""
    text = re.sub(r"\bAsync(Sandbox|CommandHandle|Commands|Files|Process|Pty|WatchHandle|Ports|PortForward)\b", r"\1", spelled(annotation))
    return re.sub(r"^AsyncGenerator\[(.*), NoneType\]$", r"Generator[\1, NoneType, NoneType]", text)


def signature(fn: Callable[..., Any]) -> inspect.Signature:
    return inspect.signature(fn, eval_str=True)


def differences(sync_fn: Callable[..., Any], async_fn: Callable[..., Any], *, returns: bool = True) -> List[str]:
    s, a = signature(sync_fn), signature(async_fn)
    out = []
    if list(s.parameters.values()) != list(a.parameters.values()):
        out.append(f"parameters ({', '.join(map(str, s.parameters.values()))}) "
                   f"!= ({', '.join(map(str, a.parameters.values()))})")
    if returns and spelled(s.return_annotation) != blocking_form(a.return_annotation):
        out.append(f"returns {spelled(s.return_annotation)}, not {blocking_form(a.return_annotation)}")
    return out


def pairs() -> List[Tuple[str, Callable[..., Any], Callable[..., Any]]]:
    found = []
    for sync_cls, async_cls in TWINS:
        for name in public(async_cls):
            member = vars(async_cls)[name]
            if callable(member) or isinstance(member, classmethod):
                found.append((f"{sync_cls.__name__}.{name}", getattr(sync_cls, name, None), getattr(async_cls, name)))
    return found


def test_every_public_member_has_a_twin() -> None:
    for sync_cls, async_cls in TWINS:
        missing = set(public(async_cls)) - set(public(sync_cls))
        assert not missing, f"{sync_cls.__name__} lacks {sorted(missing)} of {async_cls.__name__}"
        extra = set(public(sync_cls)) - set(public(async_cls))
        # The blocking Sandbox's properties read what AsyncSandbox has as plain attributes.
        init = inspect.getsource(async_cls.__init__)
        extra = {name for name in extra if not re.search(rf"\bself\.{name} = ", init)}
        assert not extra, f"{sync_cls.__name__} has {sorted(extra)}, which {async_cls.__name__} has not"


@pytest.mark.parametrize("name, sync_fn, async_fn", pairs(), ids=[p[0] for p in pairs()])
def test_method_mirrors_its_async_twin(name: str, sync_fn: Any, async_fn: Any) -> None:
    assert sync_fn is not None, f"{name} is missing"
    assert not inspect.iscoroutinefunction(sync_fn) and not inspect.isasyncgenfunction(sync_fn), f"{name} is async"
    problems = differences(sync_fn, async_fn)
    sync_overloads, async_overloads = typing.get_overloads(sync_fn), typing.get_overloads(async_fn)
    if len(sync_overloads) != len(async_overloads):
        problems.append(f"{len(sync_overloads)} overloads, not {len(async_overloads)}")
    for i, (s, a) in enumerate(zip(sync_overloads, async_overloads)):
        problems += [f"overload {i}: {p}" for p in differences(s, a)]
    assert not problems, f"{name}: " + "; ".join(problems)


def test_properties_mirror_their_async_twins() -> None:
    for sync_cls, async_cls in TWINS:
        for name in public(async_cls):
            member = vars(async_cls)[name]
            if isinstance(member, property):
                twin = vars(sync_cls).get(name)
                assert isinstance(twin, property), f"{sync_cls.__name__}.{name} is not a property"
                assert not differences(twin.fget, member.fget), f"{sync_cls.__name__}.{name}"


def test_the_constructor_takes_creates_arguments() -> None:
    # Sandbox(...) creates, as AsyncSandbox.create does (Sandbox.create is checked above).
    init = list(signature(module.Sandbox.__init__).parameters.values())[1:]  # without self
    assert init == list(signature(module.AsyncSandbox.create).parameters.values())


def test_public_names_stay_where_they_were() -> None:
    for name in agentvm.__all__:
        assert getattr(agentvm, name) is not None
    for name in module.__all__ + ["AsyncCommands", "AsyncFiles", "Commands", "Files", "MAX_SANDBOX_TIMEOUT",
                                  "DEFAULT_START_TIMEOUT", "MAX_FORK_COUNT", "Output", "Data"]:
        assert hasattr(module, name), f"agentvm.sandbox.{name}"
    assert agentvm.Sandbox is module.Sandbox and agentvm.AsyncSandbox is module.AsyncSandbox
