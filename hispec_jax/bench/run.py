"""`hispec bench`: the whole benchmark, from prompts to report.json, report.md and PNGs.

Phases (each a side-by-side `suite.compare`, greedy, EOS ignored, outputs checked == AR):

    agreement    per-exit top-1 agreement with the final layer on held-out text (Fig. 5)
    exit grid    HiSpec at every (Ld, Li) pair, 1 round, on the first dataset (Fig. 9);
                 its Ld = default row is Table 9; the best pair, then the best of a few
                 window settings for it, is "hispec tuned"
    methods      per dataset: AR, the LayerSkip sweep (draft exit x draft length), HiSpec
                 defaults / adaptive / tuned, SV and SpecBound defaults
    peers        per dataset: transformers greedy and transformers LayerSkip
                 (`assistant_early_exit`, the best LayerSkip setting found above) next to
                 our AR, best LayerSkip and best HiSpec (batch 1: transformers' assisted
                 generation supports batch 1 only)
    batch sizes  AR, LayerSkip, HiSpec, SV and SpecBound (defaults) at batch 1, 4, 16 on the
                 first dataset (HiSpec Table 5; SV's gains are at larger batch)

SV needs a profile: the model directory's `sv_profile.json` (the shipped model has one), else
--sv-profile, else a quick `hispec profile-sv` run on calibration prompts written to out_dir.

report.json is rewritten after every phase with "complete": false (report.md and the plots
come at the end, with "complete": true), so a run stopped at a time limit keeps what it
measured.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import datetime
import json
import time
from pathlib import Path
from typing import Any

import jax

from hispec_jax import datasets as prompts_lib
from hispec_jax import distributed
from hispec_jax.bench import plots, report, suite, sweeps
from hispec_jax.bench.suite import MethodSpec, Result, Runner
from hispec_jax.decoding import methods, recommended
from hispec_jax.models.model import Model, load_model


@dataclasses.dataclass
class BenchConfig:
    """Everything `hispec bench` takes (see `hispec bench --help`)."""

    model_dir: str | None = None            # None: the shipped default model
    datasets: tuple[str, ...] = ("sharegpt", "humaneval")
    num_prompts: int = 8
    max_prompt_tokens: int = 256
    max_new_tokens: int = 64
    batch_size: int = 1
    rounds: int = 3
    draft_exits: tuple[int, ...] | None = None   # LayerSkip sweep; None: candidate_exits
    draft_lens: tuple[int, ...] = (2, 4)
    grid_exits: tuple[int, ...] | None = None    # exit grid; None: candidate_exits; (): skip
    tuned: tuple[int, int, int, int] | None = None  # (Ld, Li, Nd, Ni); None: from the grid
    transformers: bool = True
    batch_sizes: tuple[int, ...] = (1, 4, 16)    # (): skip
    agreement: bool = True
    sv_specbound: bool = True   # SV and SpecBound rows
    sv_profile: str | None = None  # None: the model's, else profiled quickly
    out_dir: str = "hispec_bench_results"
    progress: bool = True
    # False: another process writes report.json, report.md and the plots (process 0 of a
    # run over several hosts, where every process runs the same benchmark)
    write_report: bool = True
    # `load_model` keyword arguments (dtype, quantize, matmul_precision: `hispec bench
    # --dtype ...`); the transformers baselines load the checkpoint in float32 regardless
    load_options: dict = dataclasses.field(default_factory=dict)

    def validate(self, model: Model) -> None:
        """ValueError naming the field, before anything is compiled."""
        for name in ("num_prompts", "max_prompt_tokens", "max_new_tokens", "batch_size", "rounds"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if not self.datasets:
            raise ValueError("datasets must name at least one of "
                             f"{prompts_lib.DATASETS}")
        for d in self.datasets:
            if d not in prompts_lib.DATASETS:
                raise ValueError(f"datasets: {d!r} is not one of {prompts_lib.DATASETS}")
        if any(b < 1 for b in self.batch_sizes) or any(n < 1 for n in self.draft_lens):
            raise ValueError("batch_sizes and draft_lens must be >= 1")
        # Building every method validates exits and windows against the model (SV's
        # profile is looked up, or made, after validation).
        for spec in self.method_specs(model, tuned=None, sv_profile=None):
            spec.decoder(model)
        if self.grid_exits:
            for spec in sweeps.exit_pair_specs(list(self.grid_exits)):
                spec.decoder(model)
        if self.tuned is not None:
            sweeps.hispec_spec(*self.tuned).decoder(model)
        for spec in suite.default_specs(self.sv_profile, self.sv_specbound):
            spec.decoder(model)  # SV's profile: when given (else looked up or made later)
        if self.transformers and importlib.util.find_spec("torch") is None:
            raise ValueError("the transformers baselines need PyTorch: pip install torch==2.13.0 "
                             "(or pass --no-transformers)")

    def method_specs(self, model: Model, tuned: MethodSpec | None, sv_profile: str | None
                     ) -> list[MethodSpec]:
        draft_exits = (list(self.draft_exits) if self.draft_exits is not None
                       else sweeps.candidate_exits(model))
        specs = [MethodSpec.of("ar", "ar")]
        specs += sweeps.layerskip_specs(draft_exits, self.draft_lens)
        specs += [MethodSpec.of("hispec defaults", "hispec"),
                  MethodSpec.of("hispec adaptive", "hispec", adaptive=True)]
        if recommended.load(model.path, "hispec", model.cfg.num_layers) is not None:
            # "defaults" ran the model's recommended plan: the paper's exits beside it
            d, v = methods.default_exits(model)
            specs.append(MethodSpec.of("hispec paper exits", "hispec", draft_exit=d,
                                       verify_exits=(v,)))
        if tuned is not None:
            specs.append(tuned)
        return specs + [spec for spec in suite.default_specs(sv_profile, self.sv_specbound)
                        if spec.method in ("sv", "specbound")]


class Bench:
    """Runs the phases, keeping the report dict (`self.report`) as it goes."""

    def __init__(self, config: BenchConfig):
        self.config = config
        from hispec_jax import DEFAULT_MODEL_DIR

        self.model_dir = str(config.model_dir or DEFAULT_MODEL_DIR)
        self.model = load_model(self.model_dir, **config.load_options)
        config.validate(self.model)
        self.out_dir = Path(config.out_dir)
        self.hf_model = None
        self.specs: dict[str, MethodSpec] = {}  # every method run so far, by name
        self.sv_profile = None
        if config.sv_specbound:
            self.sv_profile = config.sv_profile or suite.sv_profile_path(
                self.model, self.out_dir, lambda msg: print(f"[bench] {msg}", flush=True))
        cfg = self.model.cfg
        self.report: dict[str, Any] = {
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "device": suite.device_description(),
            "model": {"dir": self.model_dir, "layers": cfg.num_layers,
                      "hidden": cfg.hidden_size, "vocab": cfg.vocab_size,
                      "default_exits": list(methods.default_exits(self.model))},
            "config": {k: v for k, v in dataclasses.asdict(config).items()
                       if k not in ("progress", "write_report")},
            "agreement": {}, "grid": None, "methods": {}, "peers": {}, "batch": None,
            "plots": [], "sv_profile": self.sv_profile,
        }

    # ----- helpers ---------------------------------------------------------------------

    def _prompts(self, dataset: str, n: int | None = None) -> list[list[int]]:
        return prompts_lib.load_prompts(dataset, self.model.tokenizer,
                                        n or self.config.num_prompts,
                                        self.config.max_prompt_tokens)

    def _compare(self, title: str, runners: list[Runner], rounds: int) -> list[Result]:
        from tqdm import tqdm

        with tqdm(total=len(runners) * (rounds + 1), desc=title, dynamic_ncols=True,
                  disable=not self.config.progress) as bar:
            def tick(name):
                bar.set_postfix_str(name[:40])
                bar.update(1)
            return suite.compare(runners, rounds, tick)

    def _ours(self, prompts, specs: list[MethodSpec], batch_size: int | None = None
              ) -> list[Runner]:
        self.specs.update((spec.name, spec) for spec in specs)
        capacity = suite.common_cache_len(self.model, prompts, specs, self.config.max_new_tokens)
        return [suite.hispec_runner(self.model, prompts, spec,
                                    max_new_tokens=self.config.max_new_tokens,
                                    batch_size=batch_size or self.config.batch_size,
                                    max_cache_len=capacity) for spec in specs]

    @staticmethod
    def _rows(results: list[Result]) -> list[dict[str, Any]]:
        return [r.to_json(results[0]) for r in results]

    # ----- phases ----------------------------------------------------------------------

    def agreement(self) -> None:
        for dataset in self.config.datasets:
            if dataset == "sharegpt":
                _, evaluation = prompts_lib.split_sharegpt(prompts_lib.load_sharegpt().records)
                texts = [prompts_lib.conversation_text(r) for r in evaluation[:64]]
            else:
                texts = prompts_lib.dataset_texts(dataset)[:64]
            sequences = [self.model.tokenizer(t)["input_ids"] for t in texts if t]
            self.report["agreement"][dataset] = sweeps.exit_agreement(self.model, sequences)

    def grid(self) -> MethodSpec | None:
        """Exit grid + window sweep on the first dataset; returns the tuned HiSpec."""
        cfg, model = self.config, self.model
        exits = list(cfg.grid_exits) if cfg.grid_exits is not None else sweeps.candidate_exits(model)
        if len(exits) < 2:
            return None
        dataset = cfg.datasets[0]
        prompts = self._prompts(dataset)
        specs = [MethodSpec.of("ar", "ar")] + sweeps.exit_pair_specs(exits)
        rows = self._rows(self._compare(f"exit grid ({dataset})", self._ours(prompts, specs), 1))
        best = max(rows[1:], key=lambda r: r["speedup_vs_ar"])
        # chosen by the clock: on several hosts, process 0's choice for every process
        d, i = distributed.broadcast_work(
            [best["options"]["draft_exit"], best["options"]["verify_exits"][0]])
        window_rows = self._rows(self._compare(
            f"windows d={d} i={i}", self._ours(prompts, [specs[0]] + sweeps.window_specs(d, i)), 1))
        best_windows = distributed.broadcast_work(
            max(window_rows[1:], key=lambda r: r["speedup_vs_ar"])["options"])
        self.report["grid"] = {"dataset": dataset, "exits": exits, "rows": rows,
                               "heatmap": sweeps.heatmap(rows, exits).tolist(),
                               "window_rows": window_rows}
        nd, ni = best_windows["draft_len"], best_windows["verify_window"]
        return sweeps.hispec_spec(d, i, nd, ni, name=f"hispec tuned d={d} i={i} nd={nd} ni={ni}")

    def methods(self, tuned: MethodSpec | None) -> None:
        specs = self.config.method_specs(self.model, tuned, self.sv_profile)
        for dataset in self.config.datasets:
            prompts = self._prompts(dataset)
            results = self._compare(f"methods ({dataset})", self._ours(prompts, specs),
                                    self.config.rounds)
            self.report["methods"][dataset] = self._rows(results)

    def peers(self) -> None:
        from hispec_jax.bench import hf_baselines

        if self.hf_model is None:
            self.hf_model = hf_baselines.load_hf_model(self.model_dir)
        n_new = self.config.max_new_tokens
        for dataset in self.config.datasets:
            rows = self.report["methods"][dataset]
            best_ls = report.best_row(rows, "layerskip")
            best_hs = report.best_row(rows, "hispec")
            d, n = best_ls["options"]["draft_exit"], best_ls["options"]["draft_len"]
            specs = [self.specs[name] for name in ("ar", best_ls["name"], best_hs["name"])]
            prompts = self._prompts(dataset)
            runners = self._ours(prompts, specs, batch_size=1)
            runners.append(_hf_runner(self.hf_model, prompts, n_new, "transformers greedy"))
            runners.append(_hf_runner(self.hf_model, prompts, n_new,
                                      f"transformers layerskip d={d} n={n}",
                                      assistant_early_exit=d, num_assistant_tokens=n))
            results = self._compare(f"peers ({dataset})", runners, self.config.rounds)
            self.report["peers"][dataset] = self._rows(results)

    def batch_sizes(self) -> None:
        sizes = list(self.config.batch_sizes)
        dataset = self.config.datasets[0]
        prompts = self._prompts(dataset, max(max(sizes), self.config.num_prompts))
        specs = suite.default_specs(self.sv_profile, self.config.sv_specbound)
        table = {"dataset": dataset, "num_prompts": len(prompts), "batch_sizes": sizes,
                 "methods": [spec.name for spec in specs], "rows": {}}
        for b in sizes:
            results = self._compare(f"batch {b} ({dataset})", self._ours(prompts, specs, b),
                                    self.config.rounds)
            table["rows"][str(b)] = self._rows(results)
        self.report["batch"] = table

    # ----- all -------------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        cfg = self.config
        t0 = time.time()
        self.report["complete"] = False
        if cfg.agreement:
            self.agreement()
            self.checkpoint()
        tuned = sweeps.hispec_spec(*cfg.tuned, name="hispec tuned") if cfg.tuned else None
        if tuned is None and cfg.grid_exits != ():
            tuned = self.grid()
            self.checkpoint()
        self.methods(tuned)
        self.checkpoint()
        if cfg.transformers:
            self.peers()
            self.checkpoint()
        if cfg.batch_sizes:
            self.batch_sizes()
        self.report["seconds"] = round(time.time() - t0, 1)
        # Accelerators track the peak memory of this process's first device; CPU backends
        # report None.
        memory_stats = jax.local_devices()[0].memory_stats() or {}
        self.report["device_peak_bytes"] = memory_stats.get("peak_bytes_in_use")
        self.report["complete"] = True
        self.write()
        return self.report

    def checkpoint(self) -> None:
        """report.json as it stands after a phase ("complete": false; no markdown, no
        plots): a run stopped at a time limit, as on a lent accelerator, keeps the phases it
        finished."""
        if not self.config.write_report:
            return
        self.out_dir.mkdir(parents=True, exist_ok=True)
        (self.out_dir / "report.json").write_text(json.dumps(self.report, indent=1) + "\n")

    def write(self) -> None:
        if not self.config.write_report:
            return
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.report["plots"] = [str(p.name) for p in self._plots()]
        self.checkpoint()
        (self.out_dir / "report.md").write_text(report.markdown(self.report))

    def _plots(self) -> list[Path]:
        r, out, paths = self.report, self.out_dir, []
        name = Path(self.model_dir).name
        if r["agreement"]:
            paths.append(plots.agreement_plot(r["agreement"], out / "agreement.png",
                                              f"per-exit agreement with layer L ({name})"))
        if r["grid"]:
            g = r["grid"]
            import numpy as np

            paths.append(plots.speedup_heatmap(np.array(g["heatmap"], float), g["exits"],
                                               out / "exit_grid.png",
                                               f"HiSpec speedup over AR ({g['dataset']}, {name})"))
        for dataset, rows in r["methods"].items():
            paths.append(plots.methods_plot([x["name"] for x in rows],
                                            [x["tokens_per_second"] for x in rows],
                                            rows[0]["tokens_per_second"],
                                            out / f"methods_{dataset}.png",
                                            f"tokens/s, batch {self.config.batch_size} ({dataset})"))
        if r["batch"]:
            b = r["batch"]
            tps = {m: [b["rows"][str(s)][k]["tokens_per_second"] for s in b["batch_sizes"]]
                   for k, m in enumerate(b["methods"])}
            paths.append(plots.batch_plot(b["batch_sizes"], tps, out / "batch_sizes.png",
                                          f"throughput by batch size ({b['dataset']})"))
        return paths


def _hf_runner(hf_model, prompts, max_new_tokens: int, name: str, **kwargs) -> Runner:
    from hispec_jax.bench import hf_baselines

    def run(rounds: int):
        return hf_baselines.hf_generate(hf_model, prompts, max_new_tokens, rounds=rounds,
                                        name=name, **kwargs)

    def warmup() -> Result:
        hf = run(1)
        return Result(name=name, token_ids=hf.token_ids, new_tokens=hf.new_tokens,
                      options={"method": "transformers", **kwargs})

    return Runner(name, warmup, lambda: run(1).seconds[0])


def run_bench(config: BenchConfig) -> dict[str, Any]:
    """Runs `hispec bench` with `config`; writes report.json, report.md and PNGs to out_dir."""
    return Bench(config).run()
