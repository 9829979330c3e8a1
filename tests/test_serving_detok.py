"""Incremental detokenization (serving/detok.py) and stop strings (serving_engine.OutputText)
against whole-text decoding, on the project's tokenizers: the shipped model's (byte-level
BPE, 2,048 tokens), SmolLM2's (byte-level BPE, 49,152 tokens, from its GGUF file) and a
Llama-2 style SentencePiece vocabulary with byte-fallback tokens (loaded from GGUF metadata
as a Llama GGUF file's tokenizer is)."""

from __future__ import annotations

import os

import gguf
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from transformers import AutoTokenizer

import gguf_files as gf
import hispec_jax
from hispec_jax.models import gguf_io
from hispec_jax.serving.detok import REPLACEMENT, TextDeltas
from hispec_jax.serving.serving_engine import OutputText

# Characters a byte-level token splits: accents, combining marks, CJK, emoji (with skin tone
# and zero-width-joiner sequences), plus the ASCII, spaces and punctuation around them.
ALPHABET = (list("abcdefghij XYZ.,!?'\n\t0123") + list("éöñß\u0301") + list("日本語中文字の")
            + ["🙂", "👍🏽", "👩\u200d💻", "🇫🇷", "€", "—"])


def _texts(min_size: int = 0, max_size: int = 40):
    return st.lists(st.sampled_from(ALPHABET), min_size=min_size, max_size=max_size).map("".join)


TEXT = _texts()
SETTINGS = settings(max_examples=60, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])


def _byte_fallback_tokenizer(path):
    """gf.sentencepiece_vocab (256 <0xNN> byte tokens and ASCII word pieces) written as GGUF
    tokenizer metadata and read back by `gguf_io.load_tokenizer`."""
    tokens, types, scores = gf.sentencepiece_vocab()
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_scores(scores)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return gguf_io.load_tokenizer(gguf.GGUFReader(str(path)))


@pytest.fixture(scope="module")
def tokenizers(request, tmp_path_factory):
    """{name: tokenizer}; byte_level: the ones whose decoder maps every token sequence
    locally (any ids, not only an encoder's)."""
    toks = {"shipped": AutoTokenizer.from_pretrained(hispec_jax.DEFAULT_MODEL_DIR),
            "byte_fallback": _byte_fallback_tokenizer(
                tmp_path_factory.mktemp("spm") / "spm.gguf")}
    smollm2 = request.getfixturevalue("smollm2_path")
    toks["smollm2"] = gguf_io.load_tokenizer(gguf.GGUFReader(str(smollm2)))
    return toks


NAMES = ["shipped", "smollm2", "byte_fallback"]
BYTE_LEVEL = ["shipped", "smollm2"]


def _decode(tok, ids):
    return tok.decode(ids, skip_special_tokens=True)


def _split(ids, sizes):
    """ids in consecutive pushes of the given sizes (cycled), as speculation rounds give them."""
    out, i, k = [], 0, 0
    while i < len(ids):
        n = sizes[k % len(sizes)]
        out.append(ids[i:i + n])
        i, k = i + n, k + 1
    return out


def _stream(tok, pushes):
    """Pushes each list in turn; returns (the deltas with finish's last, the text handed out
    after each push)."""
    deltas = TextDeltas(tok)
    pieces, texts = [], []
    for push in pushes:
        pieces.append(deltas.push(push))
        texts.append("".join(pieces))
    pieces.append(deltas.finish())
    return pieces, texts


def _common_prefix(a: str, b: str) -> int:
    return len(os.path.commonprefix([a, b]))


def _check_stream(tok, ids, sizes):
    """The deltas join to the whole decode; no delta is ever taken back; after each push
    everything is handed out but a trailing run of U+FFFD (bytes that may yet complete a
    character) and what later tokens still change."""
    pushes = _split(ids, sizes)
    pieces, texts = _stream(tok, pushes)
    whole = _decode(tok, ids)
    assert "".join(pieces) == whole
    n = 0
    for push, text in zip(pushes, texts):
        n += len(push)
        assert whole.startswith(text)
        assert len(text) >= _common_prefix(_decode(tok, ids[:n]).rstrip(REPLACEMENT), whole)


@pytest.mark.parametrize("name", NAMES)
@SETTINGS
@given(text=TEXT, sizes=st.lists(st.integers(1, 5), min_size=1, max_size=4))
def test_deltas_of_encoded_text_join_to_the_whole_decode(tokenizers, name, text, sizes):
    tok = tokenizers[name]
    _check_stream(tok, tok(text, add_special_tokens=False)["input_ids"], sizes)


@pytest.mark.parametrize("name", BYTE_LEVEL)
@SETTINGS
@given(data=st.data(), sizes=st.lists(st.integers(1, 5), min_size=1, max_size=4))
def test_deltas_of_any_token_ids_join_to_the_whole_decode(tokenizers, name, data, sizes):
    """Random ids: bytes that never complete a character, special tokens (skipped)."""
    tok = tokenizers[name]
    ids = data.draw(st.lists(st.integers(0, len(tok) - 1), max_size=40))
    _check_stream(tok, ids, sizes)


def test_multi_byte_characters_wait_for_their_last_byte(tokenizers):
    tok = tokenizers["shipped"]
    text = "héllo 日本語 🙂 wörld, it is . done ! ok  "
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert len(ids) > len(text.split())  # characters really are split over tokens
    pieces, _ = _stream(tok, [[t] for t in ids])
    assert all(REPLACEMENT not in p for p in pieces)
    assert "" in pieces  # some tokens only complete a character later: nothing yielded
    assert "".join(pieces) == text


class _Counting:
    """A tokenizer that counts the token ids it is asked to decode."""

    def __init__(self, tok):
        self.tok, self.decoded, self.longest = tok, 0, 0

    def decode(self, ids, skip_special_tokens=True):
        self.decoded += len(ids)
        self.longest = max(self.longest, len(ids))
        return self.tok.decode(ids, skip_special_tokens=skip_special_tokens)


def _cost(tok, text: str, push: int) -> tuple[int, int, int]:
    """Streams `text`'s tokens `push` at a time: (the most tokens one decode call took, the
    tokens all decode calls took, the number of tokens)."""
    counting = _Counting(tok)
    ids = tok(text, add_special_tokens=False)["input_ids"]
    pieces, _ = _stream(counting, _split(ids, [push]))
    assert "".join(pieces) == text
    return counting.longest, counting.decoded, len(ids)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("push", [1, 4])
def test_each_step_decodes_only_the_last_few_tokens(tokenizers, name, push):
    """Answers of 5 and 60 lines with multi-byte characters: the longest decode is the same
    for both (a few steps' tokens), and the tokens decoded in all are a small multiple of
    the answer's, so the whole answer costs time linear in its length."""
    line = "The café serves 日本語 and 🙂 emoji, naïve façades — ok.\n"
    short = _cost(tokenizers[name], line * 5, push)
    longest, decoded, n = _cost(tokenizers[name], line * 60, push)
    assert longest == short[0] <= 3 * push + 16, (longest, short)
    assert decoded <= 4 * n, (decoded, n)


class _CleanupTokenizer:
    """A decoder that rewrites across token boundaries (" ." -> "."), as
    transformers' clean_up_tokenization_spaces does."""

    clean_up_tokenization_spaces = True
    words = {1: "Hi", 2: " there", 3: " .", 4: " ok", 5: " ", 6: "."}

    def decode(self, ids, skip_special_tokens=True):
        return "".join(self.words[i] for i in ids).replace(" .", ".")


@pytest.mark.parametrize("ids", [(1, 2, 3, 4), (1, 5, 6, 4), (1, 5, 5, 6, 2)])
def test_deltas_never_take_back_text_a_later_token_rewrites(ids):
    tok = _CleanupTokenizer()
    pieces, _ = _stream(tok, [[t] for t in ids])
    assert "".join(pieces) == tok.decode(list(ids))


# ---- stop strings ----------------------------------------------------------------------
def _cut(text: str, stops: list[str]) -> str:
    """`text` cut before the stop string complete first (the earliest end, then start)."""
    found = [(i + len(s), i) for s in stops if (i := text.find(s)) >= 0]
    return text[:min(found)[1]] if found else text


@pytest.mark.parametrize("name", ["shipped", "byte_fallback"])
@SETTINGS
@given(data=st.data(), text=_texts(min_size=1),
       sizes=st.lists(st.integers(1, 4), min_size=1, max_size=4))
def test_stop_strings_cut_the_text_even_across_deltas(tokenizers, name, data, text, sizes):
    """Stops taken from the text (so they span token and delta boundaries, multi-byte
    characters included) or made up: the client's text is the whole text cut before the
    first match, and nothing after the match is ever handed out."""
    tok = tokenizers[name]
    ids = tok(text, add_special_tokens=False)["input_ids"]
    whole = _decode(tok, ids)
    stops = []
    for _ in range(data.draw(st.integers(0, 3)) if whole else 0):
        i = data.draw(st.integers(0, len(whole) - 1))
        stops.append(whole[i:i + data.draw(st.integers(1, 6))])
    stops += data.draw(st.lists(_texts(1, 3), max_size=1))
    want = _cut(whole, stops)
    out = OutputText(tok, stops)
    handed = ""
    for push in _split(ids, sizes):
        handed += out.push(push)
        assert want.startswith(handed)
        if out.stopped:
            break
    handed += out.finish()
    assert handed == want
    assert out.stopped == any(s in whole for s in stops)
