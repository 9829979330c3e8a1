"""The timing loop the A/B scripts here share: each variant's first pass over the prompts
(its compile), then `rounds` interleaved rounds of every variant, tokens per second of
`generate`'s decode time (prefill included)."""
import time


def interleaved_tok_s(variants, use, run, prompts, rounds: int = 3) -> dict:
    """{variant: [tok/s per round]}; `use(v)` switches to variant v, `run(v, prompt)` is
    one `generate` call."""
    for v in variants:
        use(v)
        t0 = time.perf_counter()
        for p in prompts:
            run(v, p)
        print(f"{v}: first pass (compile) {time.perf_counter() - t0:.1f} s", flush=True)
    dec = {v: [] for v in variants}
    for _ in range(rounds):
        for v in variants:
            use(v)
            seconds = tokens = 0
            for p in prompts:
                r = run(v, p)
                seconds += r.stats["decode_seconds"]
                tokens += r.stats["new_tokens"]
            dec[v].append(tokens / seconds)
    return dec
