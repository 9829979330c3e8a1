"""Training data: truncated-ShareGPT recovery, the fixed split, the tokenizer, packing."""

import json
import math

import numpy as np
import pytest

from hispec_jax import datasets
from hispec_jax.train_heads import data


def _record(i, turns=2):
    roles = ["human", "gpt"]
    return {"id": f"r{i}", "conversations": [{"from": roles[t % 2], "value": f"turn {t} of {i} é"}
                                             for t in range(turns)]}


def _write_truncated(path, records, cut_inside_last=True):
    text = json.dumps(records, indent=2, ensure_ascii=False)
    if cut_inside_last:
        last = json.dumps(records[-1], indent=2, ensure_ascii=False)
        # Cut in the middle of the last record's text, like the packaged file.
        text = text[:text.rindex(last.splitlines()[2].strip()) + 10]
    path.write_text(text, encoding="utf-8")
    return path


def test_truncated_file_recovers_complete_records(tmp_path):
    records = [_record(i) for i in range(5)]
    path = _write_truncated(tmp_path / "cut.json", records)
    loaded = datasets.load_sharegpt(path)
    assert loaded.records == records[:4]
    assert loaded.dropped == 1


@pytest.mark.parametrize("text, n, dropped", [
    ("[]", 0, 0),
    ('[{"conversations": []}]', 1, 0),
    ('[{"conversations": []},', 1, 0),          # cut right after a complete record
    ('[{"conversations": []}, {"conver', 1, 1),
    ('[{"conversations": []}, 3, {"id": 1}]', 1, 2),  # items that are not records
    ('  [\n {"conversations": [{"from": "gpt", "value": "x"}]}\n ]\n', 1, 0),
])
def test_truncated_parser_edge_cases(tmp_path, text, n, dropped):
    path = tmp_path / "f.json"
    path.write_text(text)
    loaded = datasets.load_sharegpt(path)
    assert (len(loaded.records), loaded.dropped) == (n, dropped)


def test_not_an_array_raises(tmp_path):
    path = tmp_path / "f.json"
    path.write_text('{"a": 1}')
    with pytest.raises(ValueError, match="not a JSON array"):
        datasets.load_sharegpt(path)


@pytest.fixture(scope="module")
def sharegpt():
    return datasets.load_sharegpt()


def test_packaged_sharegpt(sharegpt):
    assert len(sharegpt.records) > 17000
    assert sharegpt.dropped >= 1  # the packaged file is cut in the middle of a record
    assert all(isinstance(r["conversations"], list) for r in sharegpt.records)


def test_split_is_fixed_disjoint_and_five_percent(sharegpt):
    n = len(sharegpt.records)
    train, evals = datasets.split_sharegpt(sharegpt.records)
    assert len(evals) == math.ceil(0.05 * n) and len(train) + len(evals) == n
    assert train == sharegpt.records[:len(train)] and evals == sharegpt.records[len(train):]
    assert not {id(r) for r in train} & {id(r) for r in evals}
    assert datasets.split_sharegpt(sharegpt.records) == (train, evals)
    idx_train, idx_eval = datasets.split_sharegpt(list(range(100)))
    assert idx_eval == list(range(95, 100)) and idx_train == list(range(95))


def test_conversation_text():
    record = {"conversations": [{"from": "human", "value": "Hi?"}, {"from": "gpt", "value": "Hello."},
                                {"from": "gpt", "value": ""}, {"from": "system", "value": "s"}]}
    assert datasets.conversation_text(record) == "User: Hi?\nAssistant: Hello.\nSystem: s\n"
    assert datasets.conversation_text({"conversations": []}) == ""


def test_humaneval_prompts():
    prompts = datasets.load_humaneval_prompts()
    assert len(prompts) == 164
    assert all("def " in p for p in prompts)


CORPUS = ["User: hello world, how are you?\nAssistant: I am fine, thank you.\n",
          "def add(a, b):\n    return a + b\n", "Ünïcödé — ok 🙂 ", "numbers 12345 67890"] * 20


def test_tokenizer_round_trip(tmp_path):
    from transformers import AutoTokenizer

    data.train_tokenizer(CORPUS, vocab_size=320, out_dir=tmp_path)
    tok = AutoTokenizer.from_pretrained(str(tmp_path))
    assert (tok.unk_token_id, tok.bos_token_id, tok.eos_token_id) == (0, 1, 2)
    assert len(tok) <= 320
    for text in [*CORPUS[:4], "never seen: ж 漢字 \t tabs", ""]:
        ids = tok(text)["input_ids"]
        assert ids[0] == tok.bos_token_id
        assert tok.unk_token_id not in ids
        assert tok.decode(ids, skip_special_tokens=True) == text
    # Merges were learned: a frequent word is one token, shorter than its bytes.
    assert len(tok("hello world")["input_ids"]) < 1 + len("hello world")


def test_tokenize_docs_cache(tmp_path):
    tok = data.train_tokenizer(CORPUS, vocab_size=300)
    docs = data.tokenize_docs(tok, CORPUS[:4], cache_dir=tmp_path)
    assert len(list(tmp_path.glob("*.tokens.npy"))) == 1
    again = data.tokenize_docs(tok, CORPUS[:4], cache_dir=tmp_path)
    assert all(a.dtype == np.int32 and np.array_equal(a, b) for a, b in zip(docs, again))
    assert [list(d) for d in docs] == [tok(t)["input_ids"] for t in CORPUS[:4]]
    data.tokenize_docs(tok, CORPUS[:3], cache_dir=tmp_path)  # other texts: another entry
    assert len(list(tmp_path.glob("*.tokens.npy"))) == 2


def _docs(n=37, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.integers(3, 100, size=rng.integers(1, 40)).astype(np.int32) for _ in range(n)]


def test_packing_shapes_and_content():
    docs = _docs()
    packed = data.PackedBatches(docs, seq_len=16, batch_size=3, seed=0, eos_id=2)
    b = packed.batch(0)
    assert b.shape == (3, 17) and b.dtype == np.int32
    assert packed.num_tokens == sum(len(d) + 1 for d in docs)
    # Consecutive rows overlap by one token (stride seq_len); one epoch's stream holds every
    # document followed by </s>.
    assert np.array_equal(b[0, -1], b[1, 0])
    stream = packed._epoch_stream(0)
    assert len(stream) == packed.num_tokens and np.sum(stream == 2) == len(docs)
    pieces = np.split(stream, np.flatnonzero(stream == 2) + 1)[:-1]  # each ends with </s>
    assert sorted(tuple(p[:-1]) for p in pieces) == sorted(map(tuple, docs))


def test_packing_deterministic_and_resumable():
    docs = _docs()
    a = data.PackedBatches(docs, seq_len=16, batch_size=3, seed=7)
    b = data.PackedBatches(docs, seq_len=16, batch_size=3, seed=7)
    c = data.PackedBatches(docs, seq_len=16, batch_size=3, seed=8)
    n = 3 * a.batches_per_epoch + 2  # crosses epoch boundaries
    stream_a = [x for _, x in a.batches_from(0, n)]
    assert all(np.array_equal(x, y) for x, (_, y) in zip(stream_a, b.batches_from(0, n)))
    assert not all(np.array_equal(x, c.batch(i)) for i, x in enumerate(stream_a))
    for k in (0, 1, a.batches_per_epoch, n - 1):
        resumed = data.PackedBatches(docs, seq_len=16, batch_size=3, seed=7).batches_from(k)
        for (step, x), expected in zip(resumed, stream_a[k:]):
            assert np.array_equal(x, expected), step
    # Epochs are reshuffled: epoch 1 is not a copy of epoch 0.
    e = a.batches_per_epoch
    assert not all(np.array_equal(a.batch(i), a.batch(e + i)) for i in range(e))


def test_packing_too_little_data():
    with pytest.raises(ValueError, match="do not fill one batch"):
        data.PackedBatches([np.arange(3)], seq_len=16, batch_size=2, seed=0)
