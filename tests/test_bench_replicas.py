"""``python -m pagedcy bench --serve --replicas 2`` end to end on a tiny workload: the store
rows really load pages from the store, and the cold-replica case gets its prefix from it."""
import re

import pytest

from pagedcy.tools.redis_local import BINARY


@pytest.mark.skipif(BINARY is None, reason="redis-server is not installed")
def test_bench_replicas_store_rows_and_cold_replica(capsys):
    pytest.importorskip("ray.serve")
    pytest.importorskip("redis")
    from pagedcy.tools.bench_replicas import main
    assert main(["--quick", "--rows", "a,d", "--prefixes", "2", "--per-prefix", "3",
                 "--prefix-len", "64", "--tail-len", "16", "--max-tokens", "2",
                 "--kv-prefixes", "1", "--concurrency", "2"]) == 0
    out = capsys.readouterr().out
    rows = {m.group(1): m.group(0) for m in re.finditer(r"^\| \((\w)\) .*$", out, re.M)}
    assert set(rows) == {"a", "d"}
    assert rows["a"].rstrip().endswith("| - |")                   # no store, no hit rate
    hit = re.search(r"\| (\d+)% of (\d+) \|$", rows["d"].rstrip())
    assert hit and int(hit.group(2)) > 0                          # the store was looked up
    computed = {k: int(re.search(r"\| (\d+) \(\d+% of", v).group(1)) for k, v in rows.items()}
    assert 0 < computed["d"] <= computed["a"]
    cold = re.search(r"TTFT (\d+) ms with the store, (\d+) ms without", out)
    assert cold and int(cold.group(1)) > 0 and int(cold.group(2)) > 0
