"""Lookup under HiSpec, side by side: every level above the lookup drafter at the shortest
power-of-two block that holds its input (`Hierarchy.level_blocks`, since 2026-11-26) against
the intermediate level at its one static block, k + Nd (before). Greedy, EOS ignored, batch
1, loop time, interleaved rounds on the task prompts of `hispec bench --tasks`; every output
checked against AR's.

    python benchmarks/results_lookup/level_blocks_ab.py --tasks summarize,extract,code,chat \
        > benchmarks/results_lookup/level_blocks_ab.txt

The model's recommended HiSpec (and LayerSkip, which this does not change, as a control),
each with the lookup at k = 16 and k = 8 below it.
"""

from __future__ import annotations

import argparse
import dataclasses

from hispec_jax import DEFAULT_MODEL_DIR
from hispec_jax.decoding import engine, methods
from hispec_jax.models.model import load_model

from schedule_ab import compare_tasks, print_header, task_arguments  # this folder (the script's own)


@dataclasses.dataclass(frozen=True)
class StaticAboveLevel1(engine.Hierarchy):
    """The hierarchy as it ran before: only level 1 and the top level switch block lengths;
    an intermediate level always runs its static block."""

    def level_blocks(self, k: int) -> tuple[int, ...]:
        if 1 < k < self.num_levels - 1:
            return ()
        return super().level_blocks(k)


@dataclasses.dataclass(frozen=True)
class Spec:
    name: str
    method: str
    options: tuple = ()
    static: bool = False

    def decoder(self, model):
        d = methods.make_method(model, self.method, **dict(self.options))
        if self.static:
            h = d.hierarchy
            d = dataclasses.replace(d, hierarchy=StaticAboveLevel1(
                **{f.name: getattr(h, f.name) for f in dataclasses.fields(h)}))
        return d


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    task_arguments(p, model=DEFAULT_MODEL_DIR, prompts=4)
    a = p.parse_args()
    print_header(a)
    model = load_model(a.model)
    specs = [Spec("ar", "ar"), Spec("hispec (recommended)", "hispec")]
    for k in (16, 8):
        for static in (True, False):
            how = "intermediate static (before)" if static else "every level switched (now)"
            specs.append(Spec(f"hispec + lookup k={k}, {how}", "hispec", (("lookup", k),), static))
    specs += [Spec("layerskip (recommended)", "layerskip"),
              Spec("layerskip + lookup k=16 (unchanged)", "layerskip", (("lookup", 16),))]
    print("# recommended HiSpec:", methods.make_method(model, "hispec").hierarchy.exits,
          methods.make_method(model, "hispec").windows)
    compare_tasks(model, specs, a)


if __name__ == "__main__":
    main()
