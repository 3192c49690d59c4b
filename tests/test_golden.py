"""The golden run: the same seed and config give the same rewards, losses, predictions and final weights as
the run recorded on this machine kind (tests/golden.py), and a run repeats itself exactly."""
import pytest

from golden import differences, recorded, run, signature, unrecorded


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    return signature(run("smoke", tmp_path_factory.mktemp("golden")))


def test_smoke_is_the_recorded_golden_run(smoke):
    want = recorded("smoke")
    if want is None:
        pytest.skip(unrecorded("smoke") + " (the repeat test below still holds)")
    assert differences(want, smoke) == []


def test_a_run_repeats_itself_exactly(smoke, tmp_path):
    assert differences(smoke, signature(run("smoke", tmp_path))) == []
