"""Fuzzing every reader (tests/fuzz/README.md): a seeded campaign of PCD_FUZZ_SECONDS per reader, and a replay of
every input a campaign ever found (regressions/<reader>/)."""
import pytest

from tests.fuzz import runner
from tests.fuzz.harnesses import HARNESSES

READERS = sorted(HARNESSES)


def describe(findings, saved):
    lines = ["%d inputs escaped (%d distinct); saved under tests/fuzz/regressions:" % (len(findings), len(saved))]
    for key, path in saved.items():
        example = next(f for f in findings if runner.signature(f) == key.split(" #")[0])
        lines.append("  %s -> %s\n    %s" % (key, path, example["detail"]))
    return "\n".join(lines)


@pytest.mark.fuzz
@pytest.mark.parametrize("reader", READERS)
def test_fuzz(reader, capsys):
    result = runner.campaign(reader)
    with capsys.disabled():
        print("\nfuzz %s: %d inputs in %.1f s (seed %s), %d findings"
              % (reader, result["tried"], result["seconds"], runner.settings()["seed"], len(result["findings"])))
    assert result["tried"] > 0
    assert not result["findings"], describe(result["findings"], result["saved"])


@pytest.mark.parametrize("reader", READERS)
def test_regressions(reader):
    failed = runner.replay(reader)
    assert not failed, "\n".join("%s: %s %s (%s)\n%s" % (path.name, f["kind"], f["detail"], f["where"],
                                                          f.get("traceback", "")) for path, f in failed)


def test_every_regression_folder_is_a_reader():
    assert {p.name for p in runner.REGRESSIONS.iterdir() if p.is_dir()} <= set(READERS)
