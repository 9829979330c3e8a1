"""Side-by-side timing of decoding methods: warm-up, losslessness check, interleaved rounds.

Every method in a comparison decodes the same prompts greedily with the same token budget
(EOS ignored, so every method emits exactly the same number of tokens). One comparison:

    warm-up   for each method: compile its loop, decode once, check tokens == AR's
    round r   for each method, in turn: decode the prompts, record wall seconds
              (r = 1..rounds; interleaving spreads machine noise over every method alike)

tokens/s is the median over rounds; speedups are ratios to AR's median from the same
rounds. Peers from other libraries (transformers) join a comparison as `Runner`s too.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from pathlib import Path
from typing import Any, Callable

import jax

from hispec_jax.decoding import generate as generate_lib
from hispec_jax.decoding import methods
from hispec_jax.decoding.sampling import SamplingParams
from hispec_jax.models.model import Model

# Statistics of paper Table 9 and the engine's cost counters, copied from `generate` stats.
STAT_KEYS = ("exits", "acceptance_rate_per_level", "final_acceptance_rate", "true_reject_rate",
             "false_accept_rate", "tokens_per_full_pass", "layer_passes_per_token",
             "layer_passes", "actions_per_level", "rounds", "new_tokens", "tokens_per_round",
             "verified_length_histogram", "draft_exit_histogram", "lookup",
             "head_evals_per_exit", "work_per_token", "head_work_per_token", "ar_work_per_token",
             "work_speedup", "draft_model")


@dataclasses.dataclass(frozen=True)
class MethodSpec:
    """A named hispec-jax decoding method: `generate(model, ..., method=method, **options)`
    (`lookup_cost`: the pass costs its gates weigh, a `gate.PassCost`; None: `generate`'s
    default, this host's kept measurement or the backend's; `draft`: a draft `Model` the
    method runs with, `Model.with_draft`, so the other rows of a comparison keep the model
    without one)."""

    name: str
    method: str
    options: tuple[tuple[str, Any], ...] = ()
    lookup_cost: Any = dataclasses.field(default=None, compare=False)
    draft: Any = dataclasses.field(default=None, compare=False)
    cross_request: bool = False  # each run drafts from its earlier prompts too (a new store)

    @classmethod
    def of(cls, name: str, method: str, lookup_cost=None, draft=None, cross_request=False,
           **options) -> "MethodSpec":
        return cls(name, method, tuple(sorted(options.items())), lookup_cost, draft,
                   cross_request)

    def bound(self, model: Model) -> Model:
        """The model this method decodes: `model` with the spec's draft model, if any."""
        return model if self.draft is None else model.with_draft(self.draft)

    def decoder(self, model: Model) -> methods.Decoder:
        return methods.make_method(self.bound(model), self.method, **dict(self.options))


@dataclasses.dataclass
class Result:
    """One method's measurements in a comparison."""

    name: str
    token_ids: list[list[int]]
    seconds: list[float] = dataclasses.field(default_factory=list)  # per timed round
    new_tokens: int = 0                                              # per round
    compile_seconds: float | None = None
    memory_bytes: int | None = None       # XLA memory analysis of the compiled loop
    stats: dict[str, Any] = dataclasses.field(default_factory=dict)
    identical_to_ar: bool | None = None
    # per prompt, the first output position where the tokens differ from AR's (None: same)
    departures_from_ar: list[int | None] = dataclasses.field(default_factory=list)
    options: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def tokens_per_second(self) -> float:
        return statistics.median(self.new_tokens / s for s in self.seconds)

    def to_json(self, ar: "Result | None" = None) -> dict[str, Any]:
        row = {k: v for k, v in dataclasses.asdict(self).items() if k != "token_ids"}
        row["tokens_per_second"] = self.tokens_per_second
        passes = self.stats.get("layer_passes")
        if passes:  # wall time per layer pass: what one unit of the engine's work costs
            row["ms_per_layer_pass"] = 1e3 * statistics.median(self.seconds) / passes
        if ar is not None:
            row["speedup_vs_ar"] = self.tokens_per_second / ar.tokens_per_second
        return row


@dataclasses.dataclass
class Runner:
    """Something to time: `warmup()` -> Result (tokens, compile time, stats), and
    `timed_round()` -> wall seconds of decoding every prompt once."""

    name: str
    warmup: Callable[[], Result]
    timed_round: Callable[[], float]


def default_specs(sv_profile: str | None = None, sv_specbound: bool = True) -> list[MethodSpec]:
    """Every method at its defaults, AR first: AR, LayerSkip, HiSpec and, with
    `sv_specbound`, SV (when a profile is known) and SpecBound."""
    specs = [MethodSpec.of("ar", "ar"), MethodSpec.of("layerskip defaults", "layerskip"),
             MethodSpec.of("hispec defaults", "hispec")]
    if sv_specbound and sv_profile is not None:
        specs.append(MethodSpec.of("sv defaults", "sv", sv_profile=sv_profile))
    if sv_specbound:
        specs.append(MethodSpec.of("specbound defaults", "specbound"))
    return specs


def hispec_runner(model: Model, prompts: list[list[int]], spec: MethodSpec, *,
                  max_new_tokens: int, batch_size: int, max_cache_len: int,
                  loop_time_only: bool = False, stop_at_eos: bool = False,
                  chat: bool = False) -> Runner:
    """A hispec-jax method as a Runner. The loop is compiled for this method's own window
    bounds (a `Decoder` is passed, so no larger compiled loop is reused). A timed round is
    the wall time of one decoding call, end to end; with `loop_time_only`, only its
    compiled loop's runs (`stats["decode_seconds"]`: no request building, no host copies).
    EOS is ignored (every prompt gets `max_new_tokens`) unless `stop_at_eos`: then each
    prompt stops at `generate_lib.stop_token_ids(model, chat)` (`chat`: the prompts were
    rendered with the chat template, so its end-of-turn tokens stop them too)."""
    model = spec.bound(model)
    decoder = spec.decoder(model)
    prompt_ids = generate_lib.prompt_token_ids(model, prompts)

    def run():  # `generate` with a Decoder, for prompts rendered already
        store = generate_lib.check_cross_request(spec.cross_request, decoder)  # new, empty
        return generate_lib.decode(model, prompt_ids, decoder, SamplingParams(),
                                   method_name="custom", max_new_tokens=max_new_tokens,
                                   batch_size=batch_size, ignore_eos=not stop_at_eos,
                                   max_cache_len=max_cache_len, chat=chat, reuse_compiled=False,
                                   lookup_cost=spec.lookup_cost, store=store)

    def warmup() -> Result:
        r = run()  # compiles the programs (their seconds and memory in its stats)
        return Result(name=spec.name, token_ids=r.token_ids, new_tokens=r.stats["new_tokens"],
                      compile_seconds=r.stats["program_seconds"],
                      memory_bytes=r.stats["program_memory_bytes"],
                      stats={k: r.stats.get(k) for k in STAT_KEYS},
                      options={"method": spec.method, **dict(spec.options)})

    def timed_round() -> float:  # end to end, request building and host transfers included
        t0 = time.perf_counter()
        r = run()
        return r.stats["decode_seconds"] if loop_time_only else time.perf_counter() - t0

    return Runner(spec.name, warmup, timed_round)


def common_cache_len(model: Model, prompts, specs: list[MethodSpec], max_new_tokens: int) -> int:
    """One KV-cache capacity for every method of a comparison (memory compared like for
    like): the longest prompt + budget + the largest lookahead, rounded up to 64."""
    lookahead = max(spec.decoder(model).lookahead() for spec in specs)
    need = max(map(len, prompts)) + max_new_tokens + lookahead
    return min(-(-need // 64) * 64, model.cfg.max_position_embeddings)


def loop_time_runners(model: Model, prompts, specs: list[MethodSpec], max_new_tokens: int,
                      stop_at_eos: bool = False, chat: bool = False
                      ) -> tuple[list[Runner], int]:
    """(a batch-1 loop-time runner per spec, the one cache capacity they share:
    `common_cache_len`): what the task benches compare side by side (`hispec_runner`'s
    `stop_at_eos` and `chat`)."""
    capacity = common_cache_len(model, prompts, specs, max_new_tokens)
    return [hispec_runner(model, prompts, s, max_new_tokens=max_new_tokens, batch_size=1,
                          max_cache_len=capacity, loop_time_only=True, stop_at_eos=stop_at_eos,
                          chat=chat) for s in specs], capacity


PREFILL_ROW = "prefill (AR, 1 new token)"


def prefill_runner(model: Model, prompts, capacity: int) -> Runner:
    """The prompts' prefill alone, as a loop-time runner (`PREFILL_ROW`): AR with a budget of
    one token (the first token comes from the prefill), at the comparison's cache capacity.
    Timed in the same interleaved rounds as the methods, it splits their times into prefill
    and decoding loop (`loop_ratio`)."""
    return hispec_runner(model, prompts, MethodSpec.of(PREFILL_ROW, "ar"), max_new_tokens=1,
                         batch_size=1, max_cache_len=capacity, loop_time_only=True)


def loop_ratio(reference: Result, result: Result, prefill: Result) -> float:
    """`result`'s speed-up over `reference` in the decoding loop alone: the median over the
    rounds of each one's seconds minus the prefill's seconds of the same round. Every method
    runs the same prefill, which dilutes end-to-end ratios (more so the longer the prompts);
    the planner's predictions and the work speedups are loop figures."""
    def loop(r: Result) -> float:
        return statistics.median(t - p for t, p in zip(r.seconds, prefill.seconds))

    return loop(reference) / loop(result)


def paired_ratio(reference: Result, result: Result) -> float:
    """Median over the timed rounds of reference seconds / result seconds: `result`'s
    speed-up over `reference` paired per round (a load change hits both alike)."""
    return statistics.median(a / b for a, b in zip(reference.seconds, result.seconds))


def release_compiled() -> None:
    """Drops every compiled decoding program and JAX's caches (a tune's stage programs,
    loops timed earlier): what a long bench process must do between comparisons, because
    each rounds loop holds 1,000-3,000 of the process's memory mappings
    (`engine.MAP_BUDGET`)."""
    from hispec_jax.decoding import engine as engine_lib

    engine_lib.clear_compiled()
    jax.clear_caches()


def compare(runners: list[Runner], rounds: int, progress: Callable[[str], None] | None = None
            ) -> list[Result]:
    """Warms every runner up, then times `rounds` interleaved rounds. The first runner is
    the reference (AR): every other runner's tokens are checked against it."""
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    tick = progress or (lambda name: None)
    results = []
    for runner in runners:
        tick(f"warm-up {runner.name}")
        result = runner.warmup()
        reference = (results[0] if results else result).token_ids
        result.identical_to_ar = result.token_ids == reference
        result.departures_from_ar = [first_departure(ours, ar)
                                     for ours, ar in zip(result.token_ids, reference)]
        results.append(result)
    for _ in range(rounds):
        for runner, result in zip(runners, results):
            tick(runner.name)
            result.seconds.append(runner.timed_round())
    return results


def sv_profile_path(model: Model, out_dir: Path, progress: Callable[[str], None] | None = None
                    ) -> str:
    """A path to an SV profile for the model's default SV exits: the model directory's
    `sv_profile.json` when it was profiled for them, else a quick `profile_sv` run written
    to `out_dir` (calibration prompts: the ShareGPT training split, never held-out ones)."""
    from hispec_jax.decoding import sv as sv_lib
    from hispec_jax.planner import calibrate, sv_profile

    d, c = methods.default_exits(model)
    try:
        table = sv_lib.find_table(model.path)
        if (table.draft_exit, table.companion_exit) == (d, c):
            return str(Path(model.path) / sv_lib.PROFILE_FILE)
    except FileNotFoundError:
        pass
    (progress or (lambda msg: None))(f"profiling SV for exits {d}, {c} (quick)")
    table = sv_profile.profile_sv(model, d, c, settings=calibrate.Settings.quick())
    out_dir.mkdir(parents=True, exist_ok=True)
    return str(table.save(out_dir / sv_lib.PROFILE_FILE))


def first_departure(tokens: list[int], reference: list[int]) -> int | None:
    """The first position where `tokens` differs from `reference` (a length difference
    counts at the shorter length), None when they are equal. Greedy speculative decoding is
    exact in exact arithmetic; with bfloat16 weights or TF32/bfloat16 matmul passes a
    near-tie can flip, and everything after that position legitimately differs."""
    for i, (a, b) in enumerate(zip(tokens, reference)):
        if a != b:
            return i
    return None if len(tokens) == len(reference) else min(len(tokens), len(reference))


def device_description() -> str:
    """e.g. 'cpu: 2 cores, jax 0.10.2' or 'gpu: NVIDIA H100 80GB HBM3, jax ...'."""
    import os
    import platform

    d = jax.devices()[0]
    what = (f"{len(os.sched_getaffinity(0))} cores, {platform.processor() or platform.machine()}"
            if d.platform == "cpu" else d.device_kind)
    return f"{d.platform}: {what}, jax {jax.__version__}"
