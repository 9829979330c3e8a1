"""Decoding over a mesh of four fake CPU devices, as one process or as one of two processes
with two devices each (JAX's multi-controller runtime over gloo): run as its own process by
tests/test_multihost.py (XLA_FLAGS must be set before JAX starts). Process 0 (or the single
process) prints one JSON object: {mesh: {method: token ids per prompt, the fraction of the
model's weights this process holds and the fraction it read}, "devices": ...}; process 1
prints only whether it received process 0's work (`distributed.broadcast_work`).

    python tests/multihost_cases.py MODEL_DIR                          # one process, 4 devices
    python tests/multihost_cases.py MODEL_DIR HOST:PORT 2 I            # process I of 2, 2 each
"""

import json
import os
import sys

model_dir, *dist = sys.argv[1:]
devices_here = 4 // (int(dist[1]) if dist else 1)
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                           + f" --xla_force_host_platform_device_count={devices_here}").strip()
os.environ["JAX_PLATFORMS"] = "cpu"

import hispec_jax  # noqa: E402

if dist:
    hispec_jax.distributed.initialize(dist[0], num_processes=int(dist[1]),
                                      process_id=int(dist[2]), initialization_timeout=60,
                                      heartbeat_timeout_seconds=20)

import jax  # noqa: E402

from hispec_jax.models import lazy_weights, sharding  # noqa: E402

# Two prompts, so each data shard (one per process) decodes one; the second repeats itself
# so that prompt lookup finds drafts. test_multihost.py gives `hispec generate` the same.
PROMPTS = ["the cat was", "hello world hello world"]
METHODS = {
    "ar": dict(method="ar"),
    "lookup": dict(method="lookup", lookup=3),
    "hispec": dict(method="hispec", draft_exit=1, verify_exits=(2,), draft_len=2,
                   verify_window=2),
}


# (mesh, methods): the model axis inside each process (the usual layout: tensor parallelism
# over a host's fast links, data parallelism across hosts), then across processes, where
# each process holds about half of the weights (all but the replicated ones: norms, the
# KV projections when 4 does not divide the KV heads).
CASES = [("data=2,model=2", ["ar", "lookup", "hispec"]), ("model=4", ["ar"])]


def process_fraction(x) -> float:
    """The fraction of array `x` held by this process's devices (distinct shards)."""
    held = {tuple((s.start, s.stop) for s in shard.index): shard.data.size
            for shard in x.addressable_shards}
    return sum(held.values()) / x.size


def main() -> int:
    out = {"devices": len(jax.devices()), "local_devices": len(jax.local_devices())}
    for mesh_text, methods in CASES:
        lazy_weights.bytes_read = 0
        model = hispec_jax.load_model(model_dir, mesh=sharding.make_mesh(mesh_text))
        weights = jax.tree.leaves(model.params)
        held = sum(process_fraction(x) * x.size for x in weights)
        case = {"weights_held": held / sum(x.size for x in weights),
                "weights_read": lazy_weights.bytes_read / sum(x.nbytes for x in weights)}
        for name in methods:
            result = hispec_jax.generate(model, PROMPTS, max_new_tokens=8, ignore_eos=True,
                                         **METHODS[name])
            case[name] = result.token_ids
        out[mesh_text] = case
    # host-side work from process 0 (the followers pass None): what a multi-host server
    # sends every step; longer than the first collective carries, and past a power of two
    # beyond it, to exercise the second and its padding
    work = {"step": 7, "prompts": PROMPTS,
            "note": "x" * (hispec_jax.distributed.INLINE_BYTES + 300)}
    received = hispec_jax.distributed.broadcast_work(
        work if hispec_jax.distributed.is_leader() else None)
    if hispec_jax.distributed.is_leader():
        print(json.dumps(out), flush=True)
    else:  # a follower reports only what it received
        print(json.dumps({"follower_received_work": received == work}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
