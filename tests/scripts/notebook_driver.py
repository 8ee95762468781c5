"""Call notebook_launcher and debug_launcher as a user would from Python; print one JSON line per call."""

import json
import sys
import time

sys.path.insert(0, __import__("os").path.dirname(__file__))

from notebook_fns import fail_on_rank_one, train  # noqa: E402
from overdrive.launchers import LaunchError, debug_launcher, notebook_launcher  # noqa: E402

if __name__ == "__main__":
    port = sys.argv[1]
    results = notebook_launcher(train, args=(3,), num_processes=2, mixed_precision="bf16", use_port=port)
    print("NOTEBOOK " + json.dumps(results, sort_keys=True), flush=True)
    started = time.monotonic()
    try:
        debug_launcher(fail_on_rank_one)
        print("FAILURE not raised")
    except LaunchError as err:
        print("FAILURE " + json.dumps({"message": str(err), "exit_code": err.exit_code,
                                       "seconds": time.monotonic() - started}), flush=True)
