"""PREHEAT_CPU_FLAGS narrows the detected CPU flags (spaces or commas), and never adds one."""

from preheat_server import hardware


def test_narrowing_accepts_spaces_and_commas(monkeypatch):
    detected = hardware.cpu_flags()
    wanted = sorted(detected)[:3]
    monkeypatch.setenv("PREHEAT_CPU_FLAGS", " ".join(wanted))
    spaced = hardware.cpu_flags()
    monkeypatch.setenv("PREHEAT_CPU_FLAGS", ",".join(wanted))
    assert hardware.cpu_flags() == spaced == frozenset(wanted)


def test_narrowing_never_adds_a_flag(monkeypatch):
    monkeypatch.setenv("PREHEAT_CPU_FLAGS", "avx2,not_a_real_flag_xyz")
    flags = hardware.cpu_flags()
    assert "not_a_real_flag_xyz" not in flags
    assert flags <= hardware.cpu_flags.__wrapped__() if hasattr(hardware.cpu_flags, "__wrapped__") else True
