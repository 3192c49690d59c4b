"""The golden runs (tests/golden.py): the portable one on every machine, within its stated tolerances; the
bf16 smoke run of this machine kind, exactly, where one is recorded; and a run that repeats itself exactly."""
import pytest

from golden import ROOT, differences, portable_differences, recorded, run, signature


@pytest.fixture(scope="module")
def portable(tmp_path_factory):
    return signature(run("portable", tmp_path_factory.mktemp("golden")))


def test_the_portable_golden_run_holds_on_this_cpu(portable, tmp_path):
    """Never skipped: the recording is compared on any CPU. Where this machine kind also has a recorded bf16
    smoke run (the default compute dtype follows the CPU), that one is compared too, exactly."""
    assert portable_differences(recorded("portable"), portable) == []
    smoke = recorded("smoke")
    if smoke is not None:
        assert differences(smoke, signature(run("smoke", tmp_path))) == []


def test_a_run_repeats_itself_exactly(portable, tmp_path):
    assert differences(portable, signature(run("portable", tmp_path))) == []


def test_the_portable_tolerances_still_catch_a_learning_rate_off_by_a_thousandth(tmp_path):
    """The tolerances are loose enough for every CPU and no looser: lr x 1.001 moves the run past them (in the
    weight sums of most tensors and in every step's count of changed elements)."""
    import yaml

    lr = yaml.safe_load((ROOT / "conf" / "experiment" / "smoke.yaml").read_text())["optim"]["lr"]
    got = signature(run("portable", tmp_path, f"optim.lr={lr * 1.001!r}"))
    diff = portable_differences(recorded("portable"), got)
    assert any(d.startswith("final weights differ") for d in diff)
    assert sum("sync/changed" in d for d in diff) >= 3
