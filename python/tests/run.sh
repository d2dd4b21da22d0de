#!/bin/sh
# The Python client's tests, both transports, where a real guest boots (the emulated test
# host when there is no hardware KVM). Extra arguments go to pytest (e.g. -k files -x).
cd "$(dirname "$0")/../.." || exit 2
exec tests/testhost/run --mem 4096 --timeout 1800 -- /usr/bin/python3 -m pytest python/tests -q "$@"
