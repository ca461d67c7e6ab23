"""benchmarks.checkpoint_f1 --merge: shards of one comparison pooled into one table, with a paired test.

The demo model's finding F1 is compared on more phantoms than one process asks in a few minutes, so the comparison
runs as shards (one checkpoint, one seed range each). Pooling must add the counts (not average the shards' F1s),
refuse shards that do not cover the same seeds for every checkpoint, and compare the checkpoints question by
question."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.checkpoint_f1 import exact_mcnemar, merge_shards

ROOT = Path(__file__).resolve().parents[1]


def shard(seeds: str, name: str, counts: dict[str, tuple[int, int, int, int]], wrong: list[tuple[str, str]]) -> dict:
    per_finding = {
        finding: {"tp": tp, "fp": fp, "fn": fn, "tn": tn, "unparsed": 0, "f1": 2 * tp / (2 * tp + fp + fn)}
        for finding, (tp, fp, fn, tn) in counts.items()
    }
    return {
        "command": f"python -m benchmarks.checkpoint_f1 --model {name}=x --start_seed {seeds.split('..')[0]}",
        "date_utc": "2026-12-04T03:30:00+00:00",
        "machine": {"device": "cuda"},
        "seeds": seeds,
        "checkpoints": {
            name: {
                "path": f"/ckpt/{name}",
                "macro_f1": 0.0,
                "per_finding": per_finding,
                "wrong_answers": [{"phantom": p, "finding": f} for p, f in wrong],
            }
        },
    }


def test_pooled_f1_comes_from_summed_counts_not_the_mean_of_shard_f1s():
    # Shard 1: nodule 1 tp, 1 fn (F1 0.667); shard 2: 9 tp (F1 1.0). The mean of the F1s is 0.833; pooled, 20/21.
    records = [
        shard("0..9", "a", {"nodule": (1, 0, 1, 8), "effusion": (5, 0, 0, 5)}, [("phantom-3", "nodule")]),
        shard("10..19", "a", {"nodule": (9, 0, 0, 1), "effusion": (5, 0, 0, 5)}, []),
    ]
    pooled = merge_shards(records)["checkpoints"]["a"]
    assert pooled["per_finding"]["nodule"]["tp"] == 10 and pooled["per_finding"]["nodule"]["fn"] == 1
    assert pooled["per_finding"]["nodule"]["f1"] == pytest.approx(20 / 21)
    assert pooled["macro_f1"] == pytest.approx((20 / 21 + 1.0) / 2)
    assert pooled["answers"] == 40
    assert pooled["wrong_answers"] == [{"phantom": "phantom-3", "finding": "nodule"}]


def test_checkpoints_are_compared_on_the_questions_each_got_wrong():
    counts = {"nodule": (5, 0, 0, 5)}
    records = [
        shard("0..9", "a", counts, [("p1", "nodule"), ("p2", "nodule"), ("p3", "nodule")]),
        shard("0..9", "b", counts, [("p3", "nodule"), ("p4", "nodule")]),
    ]
    (row,) = merge_shards(records)["paired"]
    assert (row["only_a_wrong"], row["only_b_wrong"], row["both_wrong"]) == (2, 1, 1)
    assert row["mcnemar_p"] == pytest.approx(1.0)  # 2 against 1 of 3 discordant: 2 * P(X <= 1) = 2 * 4/8, capped


def test_exact_mcnemar_matches_the_binomial_tail():
    assert exact_mcnemar(0, 0) == 1.0
    assert exact_mcnemar(0, 6) == pytest.approx(2 / 64)  # all six discordant one way: 2 * (1/2)^6
    assert exact_mcnemar(10, 8) == pytest.approx(exact_mcnemar(8, 10))
    assert exact_mcnemar(1, 9) == pytest.approx(2 * (1 + 10) / 1024)


def test_shards_that_cover_different_seeds_are_refused():
    counts = {"nodule": (5, 0, 0, 5)}
    with pytest.raises(ValueError, match="different seeds"):
        merge_shards([shard("0..9", "a", counts, []), shard("10..19", "b", counts, [])])
    with pytest.raises(ValueError, match="twice"):
        merge_shards([shard("0..9", "a", counts, []), shard("0..9", "a", counts, [])])


def test_the_merge_command_writes_the_pooled_record(tmp_path):
    counts = {"nodule": (5, 0, 1, 4)}
    paths = []
    for i, record in enumerate([shard("0..9", "a", counts, [("p1", "nodule")]), shard("0..9", "b", counts, [])]):
        paths.append(tmp_path / f"s{i}.json")
        paths[-1].write_text(json.dumps(record))
    output = tmp_path / "pooled.json"
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.checkpoint_f1", "--merge", *map(str, paths), "--output", str(output)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    pooled = json.loads(output.read_text())
    assert pooled["command"].startswith("python -m benchmarks.checkpoint_f1 --merge")
    assert len(pooled["shard_commands"]) == 2 and pooled["paired"][0]["only_a_wrong"] == 1
    assert "| a | b | 1 | 0 | 0 |" in done.stdout
