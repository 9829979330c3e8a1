"""Process 0 sends work to process 1 (`distributed.broadcast_work`), then process 1 dies
without a word; process 0's next broadcast must end the process with JAX's error naming a
dead task, within the heartbeat timeout, not hang. Run as two processes by
tests/test_multihost.py:

    python tests/multihost_follower_death.py HOST:PORT I        # I = 0, 1
"""

import os
import sys
import time

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                           + " --xla_force_host_platform_device_count=1").strip()
os.environ["JAX_PLATFORMS"] = "cpu"

import hispec_jax  # noqa: E402

address, process_id = sys.argv[1], int(sys.argv[2])
hispec_jax.distributed.initialize(address, num_processes=2, process_id=process_id,
                                  initialization_timeout=60, heartbeat_timeout_seconds=5)
work = hispec_jax.distributed.broadcast_work({"step": 1} if process_id == 0 else None)
print(f"process {process_id} received {work}", flush=True)
if process_id == 1:
    os._exit(0)  # dies: no shutdown, no goodbye to the coordinator
time.sleep(1)
hispec_jax.distributed.broadcast_work({"step": 2})
print("process 0 sent step 2 to a dead follower", flush=True)  # must not get here
