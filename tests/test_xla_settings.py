"""synkhronos.transport.comm.xla_settings: the buckets and buffer donation a fused step
takes from the environment."""

from __future__ import annotations

import pytest

from synkhronos.transport.comm.xla_settings import (
    BUCKET_MB,
    BUCKET_VAR,
    DONATE_VAR,
    bucket_bytes_from_env,
    donate_from_env,
)


def test_buckets_default_by_platform_and_read_megabytes(monkeypatch):
    monkeypatch.delenv(BUCKET_VAR, raising=False)
    assert bucket_bytes_from_env() == int(BUCKET_MB * 1e6)
    assert bucket_bytes_from_env("cpu") == 0
    monkeypatch.setenv(BUCKET_VAR, " 2.5 ")
    assert bucket_bytes_from_env("cpu") == bucket_bytes_from_env("gpu") == 2_500_000
    monkeypatch.setenv(BUCKET_VAR, "0")
    assert bucket_bytes_from_env() == 0
    for bad in ("-1", "nan"):
        monkeypatch.setenv(BUCKET_VAR, bad)
        with pytest.raises(ValueError, match=f"{BUCKET_VAR}='{bad}': a number of megabytes"):
            bucket_bytes_from_env()
    monkeypatch.setenv(BUCKET_VAR, "lots")
    with pytest.raises(ValueError):
        bucket_bytes_from_env()


def test_donation_defaults_by_platform_and_takes_0_or_1(monkeypatch):
    monkeypatch.delenv(DONATE_VAR, raising=False)
    assert donate_from_env() is True and donate_from_env("cpu") is None
    monkeypatch.setenv(DONATE_VAR, "0")
    assert donate_from_env() is False and donate_from_env("cpu") is False
    monkeypatch.setenv(DONATE_VAR, "1")
    assert donate_from_env("cpu") is True
    monkeypatch.setenv(DONATE_VAR, "yes")
    with pytest.raises(ValueError, match="1 \\(donate\\) or 0"):
        donate_from_env()
