"""The golden run: the same seed and config give the same rewards, losses, predictions and final weights as
the run recorded before the architecture change (tests/golden.py), and a run repeats itself exactly."""
import pytest

from golden import differences, fingerprint, recorded, run, signature


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    return signature(run("smoke", tmp_path_factory.mktemp("golden")))


def test_smoke_is_the_recorded_golden_run(smoke):
    want = recorded("smoke")
    if want["fingerprint"] != fingerprint():
        pytest.skip(f"the golden signature was recorded on {want['fingerprint']}, this machine is {fingerprint()}: "
                    "float results differ between instruction sets (the repeat test below still holds)")
    assert differences(want, smoke) == []


def test_a_run_repeats_itself_exactly(smoke, tmp_path):
    assert differences(smoke, signature(run("smoke", tmp_path))) == []
