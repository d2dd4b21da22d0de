"""What the vm-tier check scripts share: a failed expectation, and running named cases so that
each prints "ok <case>: <what was seen>" or "FAIL <case>: <why>", which the doctest wrappers
look for one by one."""
import traceback


class Failed(Exception):
    pass


def expect(cond, why):
    if not cond:
        raise Failed(why)


def run_case(name, fn, *args, expected=()):
    """Runs fn(*args); True when it returned (its result is what was seen). Exceptions of the
    `expected` types are plain failures; anything else also prints its traceback."""
    try:
        print(f"ok {name}: {fn(*args)}", flush=True)
        return True
    except (Failed, *expected) as e:
        print(f"FAIL {name}: {e}", flush=True)
    except Exception:
        print(f"FAIL {name}: {traceback.format_exc()}", flush=True)
    return False
