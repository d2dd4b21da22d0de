"""Bad arguments are refused with ValueError/TypeError before anything is sent."""
from __future__ import annotations

import pytest

from agentvm import AsyncSandbox, Sandbox
from conftest import history_of, run_async


@pytest.mark.parametrize("kwargs, exc", [
    ({"timeout": 0}, ValueError),
    ({"timeout": -5}, ValueError),
    ({"timeout": 10 ** 9}, ValueError),
    ({"timeout": "300"}, TypeError),
    ({"timeout": True}, TypeError),
    ({"timeout": float("nan")}, ValueError),
    ({"envs": {"1BAD": "x"}}, ValueError),
    ({"envs": {"A=B": "x"}}, ValueError),
    ({"envs": {"A": 1}}, TypeError),
    ({"envs": ["A"]}, TypeError),
    ({"metadata": {"k": 1}}, TypeError),
    ({"metadata": {str(i): "v" for i in range(65)}}, ValueError),
    ({"url": "ftp://host"}, ValueError),
    ({"url": "unix:"}, ValueError),
])
def test_create_arguments(target: dict, kwargs: dict, exc: type) -> None:
    args = dict(target)
    args.update(kwargs)
    with pytest.raises(exc):
        Sandbox(**args)


def test_mode_specific_arguments(target: dict) -> None:
    if target:
        with pytest.raises(ValueError, match="snapshot"):
            Sandbox(snapshot="/x", **target)
    else:
        with pytest.raises(ValueError, match="pool"):
            Sandbox(pool="default")
        with pytest.raises(ValueError, match="token"):
            Sandbox(token="t")


def test_template_arguments(target: dict) -> None:
    with pytest.raises(ValueError, match="template and snapshot"):
        Sandbox(template="t", snapshot="/x", **target)
    with pytest.raises(ValueError, match="template and pool"):
        Sandbox(template="t", pool="other", **target)
    with pytest.raises(TypeError):
        Sandbox(template=5, **target)
    with pytest.raises(ValueError):
        Sandbox(template="", **target)


BAD_COMMANDS = [
    (42, {}, TypeError),
    ([], {}, ValueError),
    (["ls", 3], {}, TypeError),
    ("", {}, ValueError),
    ("echo \0", {}, ValueError),
    (["echo", "\ud800"], {}, ValueError),
    ("true", {"timeout": 0}, ValueError),
    ("true", {"timeout": 31536001}, ValueError),
    ("true", {"timeout": "1"}, TypeError),
    ("true", {"envs": {"not a name": "x"}}, ValueError),
    ("true", {"cwd": 5}, TypeError),
    ("true", {"stdin": b"x"}, ValueError),          # shell calls read /dev/null
    (["cat"], {"stdin": 5}, TypeError),
    ("true", {"max_output": 0}, ValueError),
    ("true", {"max_output": (64 << 20) + 1}, ValueError),
    ("true", {"max_output": 1.5}, TypeError),
    ("true", {"on_stdout": "print"}, TypeError),
    ("true", {"check": "yes"}, TypeError),
    ("true", {"background": True, "check": True}, ValueError),
    ("true", {"request_timeout": -1}, ValueError),
    (["cat"], {"stdin": b"x" * (65 << 20)}, ValueError),  # over the 64 MiB line limit
]


def test_command_arguments(sandbox: Sandbox) -> None:
    for cmd, kwargs, exc in BAD_COMMANDS:
        case = f"run({repr(cmd)[:60]}, {sorted(kwargs)})"  # type: ignore[call-overload]
        try:
            sandbox.commands.run(cmd, **kwargs)  # type: ignore[arg-type]
        except exc:
            continue
        except Exception as e:
            raise AssertionError(f"{case} raised {e!r}, not {exc.__name__}") from e
        raise AssertionError(f"{case} was not refused")
    # Nothing was sent: the sandbox is fine and its first call is this one.
    assert sandbox.commands.run(["echo", "fine"]).stdout == "fine\n"
    if sandbox.mode == "service":
        history = history_of(sandbox)
        assert [c["request"].get("argv") for c in history["calls"]] == [["echo", "fine"]], history


def test_file_and_code_arguments(sandbox: Sandbox) -> None:
    for bad, exc in ((5, TypeError), ("", ValueError), ("a\0b", ValueError)):
        with pytest.raises(exc):
            sandbox.files.read(bad)  # type: ignore[arg-type]
        with pytest.raises(exc):
            sandbox.files.write(bad, b"x")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        sandbox.files.write("/tmp/x", 123)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        sandbox.files.write("/tmp/x", b"x", mode=0o17777)
    with pytest.raises(ValueError):
        sandbox.files.write("/tmp/x", b"x", mode="rwx")
    with pytest.raises(ValueError):
        sandbox.files.list("/tmp", max_entries=0)
    with pytest.raises(TypeError):
        sandbox.run_code(5)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        sandbox.run_code("1", language="javascript")
    with pytest.raises(ValueError):
        sandbox.run_code("1", timeout=-1)
    with pytest.raises(ValueError):
        sandbox.set_timeout(0)
    with pytest.raises(TypeError):
        sandbox.set_timeout("60")  # type: ignore[arg-type]
    assert not sandbox.files.exists("/tmp/x")


def test_async_create_arguments(target: dict) -> None:
    async def main() -> None:
        with pytest.raises(ValueError):
            await AsyncSandbox.create(timeout=0, **target)
        with pytest.raises(TypeError):
            await AsyncSandbox.create(envs="A=1", **target)  # type: ignore[arg-type]

    run_async(main())
