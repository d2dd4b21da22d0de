# The driver of run_code's persistent interpreter (guest/agent/interpreter.hpp): the agent
# starts `python3 -u -c <this>` and sends one JSON line per cell on stdin:
#   {"code": ..., "cell": N, "out": FIFO, "err": FIFO, "status": FIFO, "result_limit": BYTES,
#    "forms_limit": BYTES, "display_limit": COUNT, "env": {NAME: VALUE, ...}}
# The cell runs with file descriptors 1 and 2 on the two FIFOs (so what child processes
# write is the cell's output too), then one JSON line on the status FIFO reports its value
# (its repr and its rich forms) and exception, with the cell's number. Each display() during
# the cell is a line of its own on the status FIFO before that, marked "event": "display".
# Between cells 1 and 2 are /dev/null, and stdin is /dev/null throughout: the
# command pipe is moved to a descriptor of its own that cells do not inherit.
import ast
import base64
import builtins
import json
import linecache
import os
import re
import signal
import sys
import threading
import traceback
import types

TEXT_LIMIT = 64 * 1024  # message and traceback, each

# IPython's display protocol: the forms a value offers through these methods, by MIME type
# (docs/protocol.md, run_code's "formats"). _repr_mimebundle_ comes first, as in IPython.
REPR_METHODS = (
    ("text/html", "_repr_html_"),
    ("text/markdown", "_repr_markdown_"),
    ("image/svg+xml", "_repr_svg_"),
    ("image/png", "_repr_png_"),
    ("image/jpeg", "_repr_jpeg_"),
    ("text/latex", "_repr_latex_"),
    ("application/json", "_repr_json_"),
    ("application/javascript", "_repr_javascript_"),
)
# A _repr_mimebundle_ can offer any number of forms under any names: so many are looked at.
MAX_FORMS = 32
MAX_MIME_BYTES = 255
# The agent takes no status line nested deeper than the protocol's 64 levels
# (protocol/json_depth.hpp), and a JSON form sits two levels down in it.
MAX_FORM_DEPTH = 32
JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')


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
    """Whether a cell runs: SIGINT interrupts only a running cell, never the driver. An interrupt
    that comes while the main thread writes a status line waits for the line to be whole."""

    running = False
    writing = False
    interrupted = False


def on_interrupt(signum, frame):
    if Cell.writing:
        Cell.interrupted = True
    elif Cell.running:
        raise KeyboardInterrupt


class Channel:
    """The status FIFO, written at a cell's end by the driver and during it by display(), from
    whichever thread calls it: a lock keeps each line whole."""

    lock = threading.Lock()
    status = None  # opened at the first cell
    cell = 0
    forms_limit = 0  # the running cell's bound on one form
    all_forms_limit = 0  # and on a value's forms together, as JSON text
    display_limit = 0
    displays = 0
    displays_dropped = 0

    @classmethod
    def write(cls, message):
        line = json.dumps(message, ensure_ascii=False) + "\n"
        main = threading.current_thread() is threading.main_thread()
        if main:
            Cell.writing = True
        try:
            with cls.lock:
                cls.status.write(line)
                cls.status.flush()
        finally:
            if main:
                Cell.writing = False
                if Cell.interrupted and Cell.running:
                    Cell.interrupted = False
                    raise KeyboardInterrupt


def json_depth(text):
    depth = deepest = 0
    for bracket in re.findall(r"[\[\]{}]", JSON_STRING.sub("", text)):
        depth += 1 if bracket in "[{" else -1
        deepest = max(deepest, depth)
    return deepest


def wire_form(mime, data):
    """A form's data as it goes on the wire (bytes in base64, a JSON type's objects and arrays as
    they are, else strings), or None when the data is none of these."""
    if isinstance(data, tuple) and len(data) == 2:  # (data, metadata), as IPython allows
        data = data[0]
    if isinstance(data, (bytes, bytearray)):
        return base64.b64encode(data).decode("ascii")
    if isinstance(data, str):
        return data
    if isinstance(data, (dict, list)) and (mime == "application/json" or mime.endswith("+json")):
        return data
    return None


class Forms:
    """A value's forms, each at most `limit` bytes, all together at most `all_limit` bytes of
    JSON text; a form past a bound is dropped and named in `dropped`."""

    def __init__(self, limit, all_limit):
        self.limit = limit
        self.all_limit = all_limit
        self.forms = {}
        self.dropped = []
        self.size = 0

    def has(self, mime):
        return mime in self.forms or mime in self.dropped

    def add(self, mime, data):
        if not isinstance(mime, str) or not mime or len(mime.encode("utf-8", "replace")) > MAX_MIME_BYTES:
            return
        if self.has(mime) or len(self.forms) + len(self.dropped) >= MAX_FORMS:
            return
        value = wire_form(mime, data)
        if value is None:
            return
        try:
            text = json.dumps(value, ensure_ascii=False, allow_nan=False)
        except (ValueError, TypeError, RecursionError):
            return
        encoded = len(text.encode("utf-8", "replace"))
        size = len(value.encode("utf-8", "replace")) if isinstance(value, str) else encoded
        if (size > self.limit or self.size + encoded > self.all_limit
                or (not isinstance(value, str) and json_depth(text) > MAX_FORM_DEPTH)):
            self.dropped.append(mime)
            return
        self.forms[mime] = value
        self.size += encoded


def call_repr(value, name, *args):
    try:
        method = getattr(value, name, None)
        return method(*args) if callable(method) else None
    except Exception:  # a failing _repr_*_ loses its form, never the cell
        return None


def offered_forms(value, with_plain):
    forms = Forms(Channel.forms_limit, Channel.all_forms_limit)
    # A class has its instances' _repr_*_ methods, unbound: it offers none itself.
    if not isinstance(value, type):
        bundle = call_repr(value, "_repr_mimebundle_", None, None)
        if isinstance(bundle, tuple) and len(bundle) == 2:  # (data, metadata)
            bundle = bundle[0]
        if isinstance(bundle, dict):
            for mime, data in list(bundle.items())[:MAX_FORMS]:
                forms.add(mime, data)
        for mime, method in REPR_METHODS:
            if not forms.has(mime):
                forms.add(mime, call_repr(value, method))
    if with_plain and not forms.has("text/plain"):
        try:
            forms.add("text/plain", repr(value))
        except Exception:  # as a failing _repr_*_
            pass
    return forms


def display(*objs, raw=False, **ignored):
    """IPython's display() for cells: each object's forms (text/plain its repr) go to the host as
    a display event. With raw=True each object is a bundle already: {MIME type: data}."""
    for obj in objs:
        with Channel.lock:
            if Channel.status is None or not Cell.running:
                return
            if Channel.displays >= Channel.display_limit:
                Channel.displays_dropped += 1
                continue
            Channel.displays += 1
            cell = Channel.cell
        if raw and isinstance(obj, dict):
            forms = Forms(Channel.forms_limit, Channel.all_forms_limit)
            for mime, data in list(obj.items())[:MAX_FORMS]:
                forms.add(mime, data)
        else:
            forms = offered_forms(obj, True)
        # What the cell printed before the display is sent first, as far as the agent can tell.
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        Channel.write({"cell": cell, "event": "display", "formats": forms.forms, "formats_truncated": forms.dropped})


def run_cell(namespace, code, filename, result_limit):
    linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
    try:
        tree = ast.parse(code, filename, "exec")
    except SyntaxError as error:
        return None, False, Forms(0, 0), describe(error, None)
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Expression(tree.body.pop().value)
    result = None
    truncated = False
    forms = Forms(0, 0)
    try:
        Cell.running = True
        exec(compile(tree, filename, "exec"), namespace)
        if last is not None:
            value = eval(compile(last, filename, "eval"), namespace)
            if value is not None:
                result, truncated = clip(repr(value), result_limit)
                forms = offered_forms(value, False)
        Cell.running = False
        return result, truncated, forms, None
    except BaseException as error:  # the cell's, whatever it is: the interpreter goes on
        Cell.running = False
        # The first frame is this function's exec or eval; the cell's own come after it.
        tb = error.__traceback__
        return None, False, Forms(0, 0), describe(error, tb.tb_next if tb is not None else None)


def set_env(env):
    """Sets the cell's env in os.environ (so the cell's child processes get it too) and returns
    what it replaced: each name's value before, None for a name that was not set."""
    before = {}
    for name, value in env.items():
        before[name] = os.environ.get(name)
        os.environ[name] = value
    return before


def restore_env(before):
    """Puts back what set_env replaced, whatever the cell did to those names meanwhile."""
    for name, value in before.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


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
    commands = os.fdopen(os.dup(0), "rb")
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    sys.argv = [""]
    signal.signal(signal.SIGINT, on_interrupt)
    # The cells' module is __main__ (so classes defined in a cell pickle), not this driver.
    main_module = types.ModuleType("__main__")
    sys.modules["__main__"] = main_module
    namespace = main_module.__dict__
    if not hasattr(builtins, "display"):
        builtins.display = display
    for line in commands:
        request = json.loads(line)
        with Channel.lock:
            if Channel.status is None:
                Channel.status = open(request["status"], "w", encoding="utf-8", errors="replace")
            Channel.cell = request["cell"]
            Channel.forms_limit = request["result_limit"]
            Channel.all_forms_limit = request["forms_limit"]
            Channel.display_limit = request["display_limit"]
            Channel.displays = Channel.displays_dropped = 0
        Cell.interrupted = False
        redirect(request["out"], request["err"])
        filename = "<cell %d>" % request["cell"]
        before = set_env(request.get("env", {}))
        try:
            result, truncated, forms, exception = run_cell(namespace, request["code"], filename,
                                                           request["result_limit"])
        finally:
            restore_env(before)
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        os.dup2(null, 1)
        os.dup2(null, 2)
        Channel.write({"cell": request["cell"], "result": result, "result_truncated": truncated,
                       "formats": forms.forms, "formats_truncated": forms.dropped,
                       "displays_dropped": Channel.displays_dropped, "exception": exception})


main()
