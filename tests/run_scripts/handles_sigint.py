"""Catches Ctrl-C itself and ends as usual (exit 0): a script that saves and stops. It counts
the SIGINTs that reach it for ``FEEDRATE_TEST_LISTEN_S`` seconds after the first."""

import os
import signal
import sys
import time

caught: list[int] = []
signal.signal(signal.SIGINT, lambda signum, frame: caught.append(signum))
print("ready", flush=True)
deadline = time.monotonic() + 60
while not caught and time.monotonic() < deadline:
    time.sleep(0.05)
listen = time.monotonic() + float(os.environ.get("FEEDRATE_TEST_LISTEN_S", "0"))
while caught and time.monotonic() < listen:
    time.sleep(0.05)
print(f"caught {len(caught)}" if caught else "never caught", flush=True)
sys.exit(0 if caught else 1)
