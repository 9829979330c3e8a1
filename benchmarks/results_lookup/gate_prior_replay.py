"""The lookup gate's prior, chosen on the planner's replay: SmolLM2's greedy answers to the
`hispec bench --tasks` prompts (chat template, batch AR, up to --max-new-tokens stopping at
EOS), then `latency.replay` of prompt lookup (k = 16) on them with the gate at each prior
(kept, rejected), at the library's prior without the run buckets (`gate.GateState.runs`),
and with the gate off. Prints rounds, the level-1 passes by block, and the
loop's cost in AR steps at the default CPU pass cost (F + T + J [T > 1] over F + 1), gated
against ungated. No timing: the counts are the engine's (`tests/test_planner_lookup.py`).

    python benchmarks/results_lookup/gate_prior_replay.py --model "$(hispec pull smollm2-135m-instruct)" \
        > benchmarks/results_lookup/gate_prior_replay.txt
"""

from __future__ import annotations

import argparse
import json
import os

from hispec_jax import generate, load_model
from hispec_jax.bench.tasks import task_prompts
from hispec_jax.decoding import gate as gate_lib
from hispec_jax.decoding import lookup as lookup_lib
from hispec_jax.planner import latency

PRIORS = ((1.0, 1.0), (2.0, 1.0), (3.0, 1.0), (4.0, 1.0))


def answers(model_path: str, tasks: list[str], prompts: int, new: int, cache: str | None):
    """{task: (sequences, starts)}: each prompt followed by the model's greedy answer."""
    found = json.load(open(cache)) if cache and os.path.exists(cache) else {}
    model = None
    for task in tasks:
        if task not in found:
            model = model or load_model(model_path)
            ps = task_prompts(model, task, prompts, 512, chat=True)
            out = generate(model, ps, max_new_tokens=new)
            found[task] = {"sequences": [list(p) + list(t) for p, t in zip(ps, out.token_ids)],
                           "starts": [len(p) for p in ps]}
    if cache:
        with open(cache, "w") as f:
            json.dump(found, f)
    return found


def replayed(trace: latency.Trace, gate: bool, prior, runs: bool = True
             ) -> tuple[float, int, dict]:
    """(cost in AR steps per emitted token, rounds, {block: passes}) of lookup k = 16."""
    gate_lib.PRIOR_KEPT, gate_lib.PRIOR_REJECTED = prior
    latency._compiled_gate.cache_clear()  # the prior is read when the gate is traced
    original, init = lookup_lib.PromptLookup, gate_lib.GateState.init
    lookup_lib.PromptLookup = lambda **kw: original(**kw, gate=gate)  # replay's drafter
    if not runs:
        gate_lib.GateState.init = classmethod(lambda cls, b, n, runs=True: init(b, n))
    try:
        run = latency.replay(trace, (30,), (), lookup=16)
    finally:
        lookup_lib.PromptLookup, gate_lib.GateState.init = original, init
    cost = gate_lib.default_pass_cost("cpu")
    F, J = float(cost.fixed), float(cost.jump)
    blocks = dict(sorted((T, n) for (level, T), n in run.passes if level == 1))
    steps = sum(n * (F + T + J * (T > 1)) / (F + 1) for T, n in blocks.items())
    return steps / run.emitted, run.rounds, blocks


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--tasks", default="extract,summarize,code,chat")
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--answers", default=None, help="a JSON file keeping the answers between runs")
    a = p.parse_args()
    tasks = a.tasks.split(",")
    found = answers(a.model, tasks, a.prompts, a.max_new_tokens, a.answers)
    kept = (gate_lib.PRIOR_KEPT, gate_lib.PRIOR_REJECTED)
    print(f"# {a.prompts} prompts per task, up to {a.max_new_tokens} new tokens; lookup k = 16, "
          f"n-grams up to {lookup_lib.DEFAULT_MAX_NGRAM}; the library's prior {kept}")
    print("| task | ungated: AR steps / token, rounds | "
          + " | ".join(f"prior {int(k)},{int(r)}: gated / ungated, rounds" for k, r in PRIORS)
          + " | no run buckets, the library's prior |")
    print("|---|---|" + "---|" * (len(PRIORS) + 1))
    for task in tasks:
        t = found[task]
        trace = latency.Trace(max_ngram=lookup_lib.DEFAULT_MAX_NGRAM,
                              sequences=tuple(map(tuple, t["sequences"])),
                              starts=tuple(t["starts"]), predictions=())
        off, off_rounds, _ = replayed(trace, False, kept)
        cells = []
        for prior in PRIORS:
            cost, rounds, _ = replayed(trace, True, prior)
            cells.append(f"{off / cost:.3f}, {rounds}")
        cost, rounds, _ = replayed(trace, True, kept, runs=False)
        cells.append(f"{off / cost:.3f}, {rounds}")
        print(f"| {task} | {off:.3f}, {off_rounds} | " + " | ".join(cells) + " |", flush=True)
    gate_lib.PRIOR_KEPT, gate_lib.PRIOR_REJECTED = kept


if __name__ == "__main__":
    main()
