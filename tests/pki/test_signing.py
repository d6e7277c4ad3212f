import stat
from pathlib import Path

import pytest

from llmgw.errors import ConfigError, UntrustedRelease
from llmgw.pki.signing import generate_signing_key, sign, verify


@pytest.fixture
def keys(tmp_path: Path) -> tuple[Path, Path]:
    private, public = tmp_path / "release.key", tmp_path / "trusted.pub"
    generate_signing_key(private, public)
    return private, public


def test_generated_private_key_is_owner_only_and_public_is_pem(keys: tuple[Path, Path]) -> None:
    private, public = keys
    assert stat.S_IMODE(private.stat().st_mode) == 0o600
    assert public.read_bytes().startswith(b"-----BEGIN PUBLIC KEY-----")


def test_keygen_never_overwrites_a_key(keys: tuple[Path, Path]) -> None:
    private, public = keys
    before = private.read_bytes()
    with pytest.raises(ConfigError, match="already exists"):
        generate_signing_key(private, public)
    assert private.read_bytes() == before


def test_signature_verifies_with_the_public_key(keys: tuple[Path, Path]) -> None:
    private, public = keys
    signature = sign(b"sums", private)
    assert len(signature) == 64
    verify(b"sums", signature, public.read_bytes())


def test_altered_data_is_refused(keys: tuple[Path, Path]) -> None:
    private, public = keys
    signature = sign(b"sums", private)
    with pytest.raises(UntrustedRelease, match="does not match") as refused:
        verify(b"sumz", signature, public.read_bytes())
    assert refused.value.hint


def test_another_key_is_refused(keys: tuple[Path, Path], tmp_path: Path) -> None:
    private, _ = keys
    generate_signing_key(tmp_path / "other.key", tmp_path / "other.pub")
    with pytest.raises(UntrustedRelease, match="does not trust"):
        verify(b"sums", sign(b"sums", private), (tmp_path / "other.pub").read_bytes())


def test_missing_and_truncated_signatures_are_refused(keys: tuple[Path, Path]) -> None:
    private, public = keys
    with pytest.raises(UntrustedRelease, match="not signed"):
        verify(b"sums", b"", public.read_bytes())
    with pytest.raises(UntrustedRelease, match="63 bytes"):
        verify(b"sums", sign(b"sums", private)[:63], public.read_bytes())


def test_a_trusted_key_that_is_not_one_says_so(keys: tuple[Path, Path]) -> None:
    private, _ = keys
    with pytest.raises(ConfigError, match="not a PEM public key"):
        verify(b"sums", sign(b"sums", private), b"not a key")
