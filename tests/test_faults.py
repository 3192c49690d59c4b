"""The fault rules that order events across processes: wait holds a rank until a path exists, touch creates it."""
import threading

import pytest

from searchr1 import faults


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
    monkeypatch.setattr(faults, "_fired", {})


def test_wait_holds_until_the_path_exists_and_touch_creates_it(tmp_path, monkeypatch):
    go = tmp_path / "go"
    monkeypatch.setenv(faults.ENV, f"rank=worker0,point=rollout,step=1,do=wait:{go};"
                                   f"rank=worker1,point=rollout,do=touch:{go}")
    faults.hit("rollout", "worker0", 0)  # another step: not held
    held = threading.Thread(target=faults.hit, args=("rollout", "worker0", 1), daemon=True)
    held.start()
    held.join(timeout=0.5)
    assert held.is_alive() and not go.exists()  # held while the path is missing (liveness, not time: still held)
    faults.hit("rollout", "worker1", 5)
    assert go.exists()
    held.join(timeout=30)  # bounded only against a hang: it is released by the path, polled every 50 ms
    assert not held.is_alive()


def test_an_unknown_action_names_its_rule(monkeypatch):
    monkeypatch.setenv(faults.ENV, "rank=0,point=train,do=explode:1")
    with pytest.raises(ValueError, match="explode"):
        faults.hit("train", 0, 0)


def test_after_fires_only_once_its_path_exists_as_in_a_restarted_process(tmp_path, monkeypatch):
    fired, back = tmp_path / "fired", tmp_path / "back"
    monkeypatch.setenv(faults.ENV, f"rank=worker1,point=rollout,after={fired},do=touch:{back}")
    faults.hit("rollout", "worker1", 0)
    assert not back.exists()  # the first process: the `once` rule it waits on has not fired
    fired.touch()
    faults.hit("rollout", "worker1", 1)
    assert back.exists()
