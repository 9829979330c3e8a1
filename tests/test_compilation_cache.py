"""Compilation caches are bounded between runs, with one directory listing
(`pull.prune_cache_dir`: the tests' cache in conftest, `hispec`'s in `cli.common`)."""

import os

from hispec_jax.models.pull import prune_cache_dir


def test_prune_keeps_the_newest_entries_under_the_bound(tmp_path):
    for i in range(10):  # 10 entries of 100 bytes, entry i written at time 1000 + i
        path = tmp_path / f"key{i}-cache"
        path.write_bytes(b"x" * 100)
        os.utime(path, (1000 + i, 1000 + i))
    assert prune_cache_dir(tmp_path, max_bytes=1000, keep_bytes=300) == 0  # not above
    assert prune_cache_dir(tmp_path, max_bytes=900, keep_bytes=300) == 700
    assert sorted(p.name for p in tmp_path.iterdir()) == ["key7-cache", "key8-cache", "key9-cache"]
    assert prune_cache_dir(tmp_path / "missing", 1, 0) == 0


def test_compile_log_counts_each_tests_programs(tmp_path):
    """`HISPEC_TESTS_COMPILE_LOG` (conftest) and tests/compile_log.py: a test that builds
    programs is logged with them, one that builds none with none, and the summary sums the
    file."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    tests = Path(__file__).resolve().parent
    log = tmp_path / "log"
    env = {**os.environ, "HISPEC_TESTS_COMPILE_LOG": str(log),
           "JAX_COMPILATION_CACHE_DIR": str(tmp_path / "jax")}
    env.pop("PYTEST_XDIST_WORKER", None)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "-p", "no:xdist", str(tests / "test_policies.py"), "-k",
                           "made_of_policies and ar-options0 or holds_no_drafter_code"],
                          capture_output=True, text=True, timeout=300, env=env, cwd=tests.parent)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    rows = {json.loads(line)["test"].split("::")[1]: json.loads(line)
            for line in (log / "main.jsonl").read_text().splitlines()}
    built = next(r for name, r in rows.items() if name.startswith("test_every_method"))
    assert built["programs"] > 0 and built["build_s"] > 0 and built["slowest"]
    assert rows["test_the_round_asks_the_drafter_and_holds_no_drafter_code"]["programs"] == 0
    summary = subprocess.run([sys.executable, str(tests / "compile_log.py"), str(log)],
                             capture_output=True, text=True, check=True).stdout
    line = next(x for x in summary.splitlines() if x.startswith("tests/test_policies.py"))
    assert line.split()[1] == str(len(rows)) and int(line.split()[3]) == built["programs"]
