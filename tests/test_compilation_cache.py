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
