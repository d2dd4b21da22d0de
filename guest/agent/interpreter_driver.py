# The driver of run_code's persistent interpreter (guest/agent/interpreter.hpp): the agent
# starts `python3 -u -c <this>` and sends one JSON line per cell on stdin:
#   {"code": ..., "cell": N, "out": FIFO, "err": FIFO, "status": FIFO, "result_limit": BYTES}
# The cell runs with file descriptors 1 and 2 on the two FIFOs (so what child processes
# write is the cell's output too), then one JSON line on the status FIFO reports its value
# and exception, with the cell's number. Between cells 1 and 2 are /dev/null, and stdin is /dev/null throughout: the
# command pipe is moved to a descriptor of its own that cells do not inherit.
import ast
import json
import linecache
import os
import signal
import sys
import traceback
import types

TEXT_LIMIT = 64 * 1024  # message and traceback, each


def clip(text, limit):
    data = text.encode("utf-8", "replace")
    if len(data) <= limit:
        return text, False
    return data[:limit].decode("utf-8", "ignore"), True


def clip_marked(text):
    kept, cut = clip(text, TEXT_LIMIT)
    if cut:
        kept += "[… %d bytes cut]" % (len(text.encode("utf-8", "replace")) - len(kept.encode("utf-8")))
    return kept


def type_name(cls):
    if cls.__module__ == "builtins":
        return cls.__qualname__
    return "%s.%s" % (cls.__module__, cls.__qualname__)


def describe(error, cell_frames):
    """The exception as run_code reports it; `cell_frames` is its traceback from the cell's own
    first frame on (None for a cell that did not compile)."""
    report = traceback.TracebackException(type(error), error, cell_frames)
    # A KeyboardInterrupt raised by on_interrupt would show the driver's frame last.
    report.stack = traceback.StackSummary.from_list(
        [frame for frame in report.stack if not (frame.filename == "<string>" and frame.name == "on_interrupt")])
    return {
        "type": type_name(type(error)),
        "message": clip_marked(str(error)),
        "traceback": clip_marked("".join(report.format())),
    }


class Cell:
    """Whether a cell runs: SIGINT interrupts only a running cell, never the driver."""

    running = False


def on_interrupt(signum, frame):
    if Cell.running:
        raise KeyboardInterrupt


def run_cell(namespace, code, filename, result_limit):
    linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
    try:
        tree = ast.parse(code, filename, "exec")
    except SyntaxError as error:
        return None, False, describe(error, None)
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Expression(tree.body.pop().value)
    result = None
    truncated = False
    try:
        Cell.running = True
        exec(compile(tree, filename, "exec"), namespace)
        if last is not None:
            value = eval(compile(last, filename, "eval"), namespace)
            if value is not None:
                result, truncated = clip(repr(value), result_limit)
        Cell.running = False
        return result, truncated, None
    except BaseException as error:  # the cell's, whatever it is: the interpreter goes on
        Cell.running = False
        # The first frame is this function's exec or eval; the cell's own come after it.
        tb = error.__traceback__
        return None, False, describe(error, tb.tb_next if tb is not None else None)


def redirect(out_path, err_path):
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    out = os.open(out_path, os.O_WRONLY)
    err = os.open(err_path, os.O_WRONLY)
    os.dup2(out, 1)
    os.dup2(err, 2)
    os.close(out)
    os.close(err)


def main():
    status = None  # the status FIFO, opened at the first cell
    commands = os.fdopen(os.dup(0), "rb")
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    sys.argv = [""]
    signal.signal(signal.SIGINT, on_interrupt)
    # The cells' module is __main__ (so classes defined in a cell pickle), not this driver.
    main_module = types.ModuleType("__main__")
    sys.modules["__main__"] = main_module
    namespace = main_module.__dict__
    for line in commands:
        request = json.loads(line)
        if status is None:
            status = open(request["status"], "w", encoding="utf-8", errors="replace")
        redirect(request["out"], request["err"])
        filename = "<cell %d>" % request["cell"]
        result, truncated, exception = run_cell(namespace, request["code"], filename, request["result_limit"])
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        os.dup2(null, 1)
        os.dup2(null, 2)
        status.write(json.dumps({"cell": request["cell"], "result": result, "result_truncated": truncated,
                                 "exception": exception}, ensure_ascii=False) + "\n")
        status.flush()


main()
