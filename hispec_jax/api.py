"""`hispec_jax.generate`: decoding (`decoding/generate.py`) plus method="auto", the plan
`hispec tune` saved (`planner/`).

The package's layers import one way (`tests/test_imports.py` holds them to it):

    models, datasets  ->  decoding, train_heads  ->  planner  ->  api  ->  serving
        ->  bench  ->  cli

Decoding knows nothing of the planner, so a method that needs a tuned plan is resolved
here, one layer above both: the plan for (model, device, batch size) becomes a `Decoder`
and decoding runs it like any other.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import sys

from hispec_jax.decoding import generate as generate_lib
from hispec_jax.decoding import method_spec
from hispec_jax.decoding import methods as methods_lib
from hispec_jax.decoding.generate import GenerationResult
from hispec_jax.models.model import Model
from hispec_jax.planner import tune as tune_lib


def generate(model: Model, prompts, *, method=None, max_new_tokens: int = 64,
             batch_size: int | None = None, ignore_eos: bool = False, temperature: float = 0.0,
             top_k: int = 0, top_p: float = 1.0, seed: int = 0, max_cache_len: int | None = None,
             chat: bool = False, mesh=None, draft: Model | None = None, cross_request=False,
             lookup_cost=None, **method_options) -> GenerationResult:
    """Generates continuations of `prompts`: `decoding.generate.generate`'s arguments and
    result (`method`: a method spec, `hispec_jax.AR()`, `HiSpec(...)`, ..., or a method
    name with its options; None: the model's default plan, as on the command line), and
    also method="auto": the plan `hispec tune` saved for this model, device and batch size
    (a quick tune first when there is none, said on stderr); with `draft=`, the pair's
    plan, chosen among the draft model's plans and the target's own (`tune.auto_decoder`).
    Auto takes no method options (the plan sets them); its stats name the plan ("plan").

    method="sv" works on any model: without `sv_profile=` it uses the model directory's
    profile when it is for the requested exits, else one cached for this model, device and
    exits, else it makes a quick one now (`planner.sv_profile.profile_for`: progress on
    stderr, then cached). `stats["sv_profile"]` says which ("model directory: PATH",
    "cached quick profile: PATH", "quick profile made now: PATH", or "given: ...")."""
    model = generate_lib.with_draft(model, draft)
    if isinstance(method, methods_lib.Decoder):
        spec = None
    else:
        spec, reason = method_spec.resolve(method, method_options, model_path=model.path,
                                           num_layers=model.cfg.num_layers,
                                           has_draft=model.draft is not None)
        method_options = {}
    if spec != "auto":
        profile_source: list[str] = []
        if isinstance(spec, method_spec.SV) and spec.sv_profile is None:
            spec = dataclasses.replace(spec, sv_profile=functools.partial(
                _sv_profile, model, profile_source))
        result = generate_lib.generate(
            model, prompts, method=method if spec is None else spec,
            max_new_tokens=max_new_tokens, batch_size=batch_size, ignore_eos=ignore_eos,
            temperature=temperature, top_k=top_k, top_p=top_p, seed=seed,
            max_cache_len=max_cache_len, chat=chat, mesh=mesh, cross_request=cross_request,
            lookup_cost=lookup_cost, **method_options)
        if spec is not None:
            result.stats["plan_reason"] = reason
        if isinstance(spec, method_spec.SV):
            given = spec.sv_profile
            result.stats["sv_profile"] = (profile_source[0] if profile_source else "given: " + (
                str(given) if isinstance(given, (str, os.PathLike)) else type(given).__name__))
        return result
    # The same checks, in the same order, as decoding's, before anything is tuned.
    sampling, max_new_tokens = generate_lib.check_request(max_new_tokens, temperature, top_k,
                                                          top_p, seed)
    prompt_ids = generate_lib.prompt_token_ids(model, prompts, chat)
    batch_size = generate_lib.check_batch_size(batch_size, len(prompt_ids))
    decoder, plan = tune_lib.auto_decoder(model, batch_size, greedy=sampling.greedy)
    store = generate_lib.check_cross_request(cross_request, decoder)
    return generate_lib.decode(
        tune_lib.plan_model(model, plan), prompt_ids, decoder, sampling, method_name="auto",
        max_new_tokens=max_new_tokens, batch_size=batch_size, ignore_eos=ignore_eos,
        max_cache_len=max_cache_len, chat=chat, mesh=mesh, reuse_compiled=True, store=store,
        lookup_cost=lookup_cost,
        extra_stats={"plan": plan.name(), "method_spec": plan.spec().to_json(),
                     "plan_reason": reason})


def _sv_profile(model: Model, source: list[str], draft_exit: int, companion_exit: int):
    """The SV profile `generate(method="sv")` decodes with when given none (called by
    `methods.make_method` once the other settings are checked); notes where it came from."""
    from hispec_jax.planner import sv_profile

    table, where = sv_profile.profile_with_source(
        model, draft_exit, companion_exit,
        progress=lambda msg: print(f"[sv] {msg}", file=sys.stderr))
    source.append(where)
    return table
