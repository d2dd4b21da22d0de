"""Argument checks of the public API: everything is refused (TypeError, ValueError) before a
byte is sent. Each returns the value in the form the protocol takes."""
from __future__ import annotations

import math
import os
import re
from typing import Any, Dict, List, Mapping, Optional, Sequence

from ._common import MAX_OUTPUT_LIMIT

# A sandbox's lifetime: serve's range for "timeout" (docs/api.md), also used in embedded mode.
MAX_SANDBOX_TIMEOUT = 86400.0
MAX_FORK_COUNT = 64  # docs/api.md, fork
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_OCTAL_MODE = re.compile(r"^[0-7]{1,4}$")


def number(name: str, value: Any, *, low: float, high: float, low_inclusive: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number of seconds, not {type(value).__name__}")
    v = float(value)
    ok = math.isfinite(v) and (v >= low if low_inclusive else v > low) and v <= high
    if not ok:
        raise ValueError(f"{name} must be {'at least' if low_inclusive else 'above'} {low:g} and at most {high:g}, "
                         f"not {value!r}")
    return v


def text(name: str, value: Any, *, empty_ok: bool = False) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str, not {type(value).__name__}")
    if not value and not empty_ok:
        raise ValueError(f"{name} must not be empty")
    if "\0" in value:
        raise ValueError(f"{name} must not contain NUL characters")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"{name} is not valid Unicode (it has a lone surrogate)") from None
    return value


def envs(name: str, value: Any) -> Dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise TypeError(f"{name} must be a mapping of str to str, not {type(value).__name__}")
    out: Dict[str, str] = {}
    for k, v in value.items():
        if not isinstance(k, str) or not _ENV_NAME.match(k):
            raise ValueError(f"{name}: {k!r} is not a variable name (letters, digits and _, not starting with a digit)")
        out[k] = text(f"{name}[{k!r}]", v, empty_ok=True)
    return out


def egress(value: Any) -> Optional[Dict[str, List[str]]]:
    """{"allow": [...], "deny": [...]} of rule strings; the rules themselves are checked by
    agentvm, whose error names the bad one."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise TypeError(f"egress must be a mapping with 'allow' and 'deny', not {type(value).__name__}")
    out: Dict[str, List[str]] = {}
    for key, rules in value.items():
        if key not in ("allow", "deny"):
            raise ValueError(f"egress: unknown key {key!r} (allow, deny)")
        if isinstance(rules, (str, bytes)) or not isinstance(rules, Sequence):
            raise TypeError(f"egress[{key!r}] must be a list of rule strings")
        out[key] = [text(f"egress[{key!r}] item", r) for r in rules]
    return out


def metadata(value: Any) -> Dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise TypeError(f"metadata must be a mapping of str to str, not {type(value).__name__}")
    if len(value) > 64:
        raise ValueError("metadata holds at most 64 entries")
    out: Dict[str, str] = {}
    for k, v in value.items():
        text("metadata key", k)
        text(f"metadata[{k!r}]", v, empty_ok=True)
        if len(k.encode()) > 256 or len(v.encode()) > 4096:
            raise ValueError(f"metadata[{k!r}]: names are at most 256 bytes, values 4096")
        out[k] = v
    return out


def snapshot_dir(value: Any) -> str:
    """An existing directory, as an absolute path."""
    path = text("snapshot_dir", os.fspath(value))
    if not os.path.isdir(path):
        raise ValueError(f"snapshot_dir {path!r} is not an existing directory")
    return os.path.abspath(path)


def max_output(value: Any) -> Optional[int]:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"max_output must be an int (bytes), not {type(value).__name__}")
    if not 0 < value <= MAX_OUTPUT_LIMIT:
        raise ValueError(f"max_output must be from 1 to {MAX_OUTPUT_LIMIT} bytes (64 MiB), not {value}")
    return value


def port(name: str, value: Any, *, low: int = 1) -> int:
    """A TCP port number, ``low`` (1, or 0 for "any free port") to 65535."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int (a TCP port), not {type(value).__name__}")
    if not low <= value <= 65535:
        raise ValueError(f"{name} must be from {low} to 65535, not {value}")
    return value


def callback(name: str, value: Any) -> None:
    if value is not None and not callable(value):
        raise TypeError(f"{name} must be callable, not {type(value).__name__}")


def mode(value: Any) -> Optional[str]:
    if value is None:
        return None
    if isinstance(value, bool):
        raise TypeError("mode must be an int (0o755) or a str of octal digits ('0755')")
    if isinstance(value, int):
        if not 0 <= value <= 0o7777:
            raise ValueError(f"mode must be from 0 to 0o7777, not {value:#o}")
        return f"{value:04o}"
    if isinstance(value, str) and _OCTAL_MODE.match(value):
        return value
    raise ValueError(f"mode must be an int (0o755) or 1-4 octal digits ('0755'), not {value!r}")


def path(value: Any) -> str:
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    return text("path", value)


def bytes_of(name: str, value: Any) -> bytes:
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    raise TypeError(f"{name} must be bytes or str, not {type(value).__name__}")
