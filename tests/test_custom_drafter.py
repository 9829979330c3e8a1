"""A drafter defined here, in the test file alone, runs through `generate`,
`generate_stream` and `hispec serve`'s app (the drafter interface, docs/engine.md "Adding a
drafter"): the library holds no branch for it, and its output is AR's.

`BigramDrafter` proposes a fixed continuation: after token t, `table[t]`, then the table's
entry for that, k tokens a round. The table is built from AR's own output on one prompt, so
level 1 keeps most of its proposals there and few elsewhere: both paths are exercised.
"""

from __future__ import annotations

import dataclasses
import json
import urllib.request
from typing import Any, ClassVar

import flax.struct
import jax
import jax.numpy as jnp
import pytest

import hispec_jax
from hispec_jax.decoding import lookup as lookup_lib
from hispec_jax.decoding.engine import Hierarchy
from hispec_jax.decoding.engine.state import gather_positions
from hispec_jax.decoding.methods import Decoder
from hispec_jax.models.transformer import embed

from conftest import serving, shipped_model_scanned

PROMPTS = ["Once upon a time", "Why is the sky blue?", "Hello"]
NEW = 10


@flax.struct.dataclass
class BigramState:
    proposed_B: jax.Array  # [B] tokens proposed for level 1's pending block


@flax.struct.dataclass
class BigramCounters:
    proposed: jax.Array  # [] tokens proposed
    accepted: jax.Array  # [] of those, tokens level 1 kept


@dataclasses.dataclass(frozen=True)
class BigramDrafter:
    """Level 0 at exit 0 (no layers): proposes table[x_c], table[table[x_c]], ... (k)."""

    table: tuple[int, ...]
    k: int = 3

    runs_layers: ClassVar[bool] = False
    block_passes: ClassVar[bool] = True
    draws: ClassVar[bool] = False

    def check(self, h) -> None:
        if h.exits[0] != 0 or len(h.exits) < 2 or h.max_windows[0] != self.k:
            raise ValueError("a bigram level sits at exit 0 under a verifier, window k")

    def label(self, h) -> str:
        return "bigram"

    def describe(self) -> str:
        return f"bigram k={self.k}"

    def plan_options(self) -> dict:
        return {}

    @property
    def gated(self) -> bool:
        return False

    def carries_prefill(self, h) -> bool:
        return h.num_levels == 2

    def block(self, max_window: int) -> int:
        return max_window

    def level_blocks(self, block: int) -> tuple[int, ...]:
        return ()

    def steps(self, block: int) -> int:
        return 1

    def init(self, batch: int, ring: int, capacity: int) -> BigramState:
        return BigramState(proposed_B=jnp.zeros((batch,), jnp.int32))

    def init_counters(self, num_layers: int) -> BigramCounters:
        zero = jnp.zeros((), jnp.int32)
        return BigramCounters(proposed=zero, accepted=zero)

    def ready(self, state, window_ready_B, pending_B):
        return pending_B > 0

    def draft(self, rnd, state, part_B):
        out, c, k = state.out, state.processed_BxK, self.k
        S = out.tokens_BxS.shape[1]
        remaining_B = rnd.req.max_new_B - out.num_new_B - (c[:, 0] + 1 - out.lengths_B)
        n_B = jnp.where(part_B, jnp.clip(jnp.minimum(state.windows.windows_BxK1[:, 0],
                                                     remaining_B), 1, k), 0)
        table = jnp.asarray(self.table, jnp.int32)
        token_B = gather_positions(out.tokens_BxS, c[:, :1])[:, 0]
        proposed = []
        for _ in range(k):
            token_B = table[token_B]
            proposed.append(token_B)
        j_K = jnp.arange(k)
        slots_BxK = jnp.where(j_K[None, :] < n_B[:, None], c[:, :1] + 1 + j_K[None, :], S)
        tokens_BxS = out.tokens_BxS.at[jnp.arange(c.shape[0])[:, None], slots_BxK].set(
            jnp.stack(proposed, axis=1), mode="drop")
        mine = state.counters.drafter
        counters = state.counters.replace(
            actions_K=state.counters.actions_K.at[0].add(1),
            drafter=mine.replace(proposed=mine.proposed + jnp.sum(n_B)))
        return state.replace(out=out.replace(tokens_BxS=tokens_BxS),
                             processed_BxK=c.at[:, 0].add(n_B), counters=counters,
                             draft_state=BigramState(proposed_B=jnp.where(
                                 part_B, n_B, state.draft_state.proposed_B)))

    def verify_input(self, rnd, state, positions_BxT, valid_BxT, write_cache):
        tokens_BxT = gather_positions(state.out.tokens_BxS, positions_BxT)
        return embed(rnd.params, tokens_BxT), state, 0, 0, 0

    def proposal_logq(self, rnd, state, proposed_pos_BxT, proposed_BxT):
        # deterministic proposals: q one-hot (the sampling rule reads it in greedy mode too)
        return lookup_lib.one_hot_logq(proposed_BxT, rnd.cfg.vocab_size)

    def record(self, rnd, state, part_B, accepted_B):
        looked_B = jnp.where(part_B, state.draft_state.proposed_B, 0)
        mine = state.counters.drafter
        return state.replace(counters=state.counters.replace(drafter=mine.replace(
            accepted=mine.accepted + jnp.sum(jnp.minimum(accepted_B, looked_B)))))

    def stats(self, h, total) -> dict:
        c = total.drafter
        return {"bigram": {"proposed": int(c.proposed), "accepted": int(c.accepted)}}

    def proposals(self, drafter_counters) -> tuple[Any, Any]:
        return drafter_counters.proposed, drafter_counters.accepted


@pytest.fixture(scope="module")
def model():
    return shipped_model_scanned()


@pytest.fixture(scope="module")
def ar(model):
    return hispec_jax.generate(model, PROMPTS, method="ar", max_new_tokens=NEW)


@pytest.fixture(scope="module")
def decoder(model, ar):
    """AR's own continuation of the first prompt as the bigram table (the rest: token 0)."""
    table = [0] * model.cfg.vocab_size
    ids = ar.prompt_token_ids[0] + ar.token_ids[0]
    for a, b in zip(ids, ids[1:]):
        table[a] = b
    # the greedy rule (the default); sampling engines verify it with token-wise rejection
    hierarchy = Hierarchy(exits=(0, model.cfg.num_layers), max_windows=(3,),
                          drafter=BigramDrafter(tuple(table)))
    return Decoder(hierarchy=hierarchy, windows=(3,))


def test_generate_with_a_drafter_of_the_test_file_is_ar(model, ar, decoder):
    r = hispec_jax.generate(model, PROMPTS, method=decoder, max_new_tokens=NEW)
    assert r.token_ids == ar.token_ids
    bigram = r.stats["bigram"]
    assert 0 < bigram["accepted"] < bigram["proposed"], bigram


def test_generate_stream_with_it_is_ar(model, ar, decoder):
    stream = hispec_jax.generate_stream(model, PROMPTS[0], method=decoder, max_new_tokens=NEW)
    assert "".join(stream) == ar.texts[0]
    assert stream.result.stats["bigram"]["accepted"] > 0


def test_served_with_it_answers_as_ar(model, ar, decoder):
    openai = pytest.importorskip("openai")
    from hispec_jax.serving import server as server_lib

    app = server_lib.build_app(model, decoder, slots=2, max_cache_len=128, warmup=False)
    with serving(app) as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0,
                               timeout=300)
        for prompt, text in zip(PROMPTS, ar.texts):
            r = client.completions.create(model="default_model", prompt=prompt,
                                          max_tokens=NEW, temperature=0)
            assert r.choices[0].text == text
        with urllib.request.urlopen(url + "/health", timeout=30) as h:
            health = json.loads(h.read().decode())
        assert health["plan"] == "custom + bigram k=3 exits 24"
        with urllib.request.urlopen(url + "/metrics", timeout=30) as m:
            metrics = m.read().decode()
    line = next(x for x in metrics.splitlines() if x.startswith(
        'hispec:spec_decode_num_accepted_tokens_total{drafter="bigram",engine="greedy"'))
    assert float(line.split()[-1]) > 0
