"""`--method sv` works on any model: without a profile for the requested exits
`hispec_jax.generate` and `hispec generate` make a quick one (progress on stderr), cache it
per model, device and exits, use the cached one next time and say which in the stats;
greedy output still equals AR's. (The library used to raise FileNotFoundError here.)"""

import json

import pytest

from hispec_jax import cli, generate, load_model
from hispec_jax.planner import calibrate, sv_profile

PROMPT = "the cat sat on the mat"


@pytest.fixture
def quick(monkeypatch, tmp_path):
    """A tiny quick profile, cached under tmp_path; counts the profiles made."""
    monkeypatch.setattr("hispec_jax.planner.plan.cache_dir", lambda: tmp_path / "cache" / "plans")
    monkeypatch.setattr(calibrate.Settings, "quick", classmethod(lambda cls: cls(
        num_prompts=2, max_prompt_tokens=8, new_tokens=8, block_sizes=(1,), repeats=1,
        capacity=64)))
    made = []
    real = sv_profile.profile_sv
    monkeypatch.setattr(sv_profile, "profile_sv", lambda *a, **k: made.append(a[1:3]) or real(*a, **k))
    return made


def run(capsys, *argv) -> tuple[dict, str]:
    assert cli.main(["generate", *argv, "--max-new-tokens", "6", "--ignore-eos", "--json",
                     PROMPT]) == 0
    out, err = capsys.readouterr()
    return json.loads(out), err


def test_sv_without_a_profile_makes_caches_and_reuses_one(capsys, llama_dir, quick, tmp_path):
    model = ["--model", str(llama_dir)]
    ar, _ = run(capsys, *model)
    sv, err = run(capsys, *model, "--method", "sv", "--draft-exit", "1", "--verify-exits", "2")
    assert quick == [(1, 2)]
    assert "[sv] no SV profile of this model for exits (1, 2)" in err and "saved it to" in err
    cached = list((tmp_path / "cache" / "sv_profiles").glob("*-e1-2.json"))
    assert len(cached) == 1 and not (llama_dir / "sv_profile.json").exists()
    assert sv["outputs"][0]["token_ids"] == ar["outputs"][0]["token_ids"]
    assert sv["stats"]["method"] == "sv" and sv["stats"]["exits"] == [1, 2, 4]
    assert sv["stats"]["sv_profile"] == f"quick profile made now: {cached[0]}"

    again, err = run(capsys, *model, "--method", "sv", "--draft-exit", "1", "--verify-exits", "2")
    assert quick == [(1, 2)] and "[sv]" not in err  # the cached profile, silently
    assert again["outputs"] == sv["outputs"]
    assert again["stats"]["sv_profile"] == f"cached quick profile: {cached[0]}"
    assert sv_profile.cache_path(load_model(llama_dir), 1, 2) == cached[0]


def test_a_missing_sv_profile_file_is_a_usage_error(capsys, llama_dir, tmp_path):
    code = cli.main(["generate", "--model", str(llama_dir), "--method", "sv",
                     "--sv-profile", str(tmp_path / "none.json"), PROMPT])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1
    assert f"--sv-profile {tmp_path / 'none.json'}: no such file" in err


def test_library_sv_without_a_profile_makes_one_and_says_so(capsys, llama_dir, quick):
    """`hispec_jax.generate(model, method="sv")` itself (shapes as the CLI test's, so its
    compiled loops are reused)."""
    model = load_model(llama_dir)
    kw = dict(max_new_tokens=6, ignore_eos=True)
    ar = generate(model, [PROMPT], **kw)
    sv = generate(model, [PROMPT], method="sv", draft_exit=1, verify_exits=2, **kw)
    path = sv_profile.cache_path(model, 1, 2)
    assert quick == [(1, 2)] and path.is_file()
    assert sv.stats["sv_profile"] == f"quick profile made now: {path}"
    assert "[sv] no SV profile of this model for exits (1, 2)" in capsys.readouterr().err
    assert sv.token_ids == ar.token_ids
    again = generate(model, [PROMPT], method="sv", draft_exit=1, verify_exits=2, **kw)
    assert quick == [(1, 2)] and "[sv]" not in capsys.readouterr().err
    assert again.stats["sv_profile"] == f"cached quick profile: {path}"
    given = generate(model, [PROMPT], method="sv", draft_exit=1, verify_exits=2,
                     sv_profile=str(path), **kw)
    assert given.stats["sv_profile"] == f"given: {path}" and given.token_ids == ar.token_ids
