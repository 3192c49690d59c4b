"""The golden runs (tests/golden.py): the portable one on every machine, within its stated tolerances; the
bf16 smoke run of this machine kind, exactly, where one is recorded; and a run that repeats itself exactly."""
import pytest

from golden import differences, portable_differences, recorded, run, signature


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
