"""What the vm-tier check scripts share: a failed expectation, and running named cases so that
each prints "ok <case>: <what was seen> [<seconds> s]" or "FAIL <case>: <why> [<seconds> s]",
which the doctest wrappers look for one by one."""
import time
import traceback


class Failed(Exception):
    pass


def expect(cond, why):
    if not cond:
        raise Failed(why)


def rises(read, within, what):
    """Reads a count with read() until it exceeds the first one read, for up to `within`
    seconds; returns the new count. A job that runs every 100 ms can still miss half a second
    when the emulated test host shares its core with other tests, so the bound is generous;
    a job that stopped never passes."""
    first = read()
    deadline = time.monotonic() + within
    while True:
        time.sleep(0.2)
        now = read()
        if now > first:
            return now
        expect(time.monotonic() < deadline, f"{what}: still {now} after {within} s (first {first})")


def settled(read, fine, within):
    """Reads with read() until fine(value) holds, for up to `within` seconds; returns the last
    value read, for the caller to judge. For what is on its way out (processes exiting,
    connections closing) under an emulated host that may take its time; what never goes
    stays and still fails the caller's check."""
    deadline = time.monotonic() + within
    while True:
        now = read()
        if fine(now) or time.monotonic() > deadline:
            return now
        time.sleep(0.5)


def run_case(name, fn, *args, expected=()):
    """Runs fn(*args); True when it returned (its result is what was seen). Exceptions of the
    `expected` types are plain failures; anything else also prints its traceback."""
    started = time.monotonic()

    def took():  # each case's time, to see where a tier's goes
        return f"[{time.monotonic() - started:.1f} s]"

    try:
        seen = fn(*args)
        print(f"ok {name}: {seen} {took()}", flush=True)
        return True
    except (Failed, *expected) as e:
        print(f"FAIL {name}: {e} {took()}", flush=True)
    except Exception:
        print(f"FAIL {name}: {traceback.format_exc()} {took()}", flush=True)
    return False
