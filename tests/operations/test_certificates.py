"""Whether a certificate on a machine can stay: CA, name, uses, addresses, time left."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

from llmgw.operations.certificates import problems
from llmgw.pki.authority import Authority


def issue(tmp_path: Path, authority: Authority, name: str, usage: str, sans: list[str]) -> bytes:
    authority.issue(name, sans=sans, usage=usage, directory=tmp_path, stem=name)  # type: ignore[arg-type]
    return (tmp_path / f"{name}.crt").read_bytes()


def test_a_current_certificate_of_the_cluster_stays(tmp_path: Path) -> None:
    ca = Authority.create(tmp_path / "ca")
    pem = issue(tmp_path, ca, "n1", "client", ["n1"])
    assert problems(pem, ca.certificate_pem, name="n1", usage="client", sans=["n1"]) == []


def test_what_a_control_plane_needs_now_is_named_when_its_older_certificate_lacks_it(tmp_path: Path) -> None:
    ca = Authority.create(tmp_path / "ca")
    old = issue(tmp_path, ca, "cp2", "server", ["cp2"])
    found = problems(old, ca.certificate_pem, name="cp2", usage="both", sans=["cp2", "10.0.0.2"])
    assert found == ["it lacks clientAuth", "it does not cover 10.0.0.2"]


def test_another_clusters_another_names_or_an_expiring_certificate_is_reissued(tmp_path: Path) -> None:
    ca, other = Authority.create(tmp_path / "ca"), Authority.create(tmp_path / "other")
    pem = issue(tmp_path, other, "n1", "client", ["n1"])
    assert problems(pem, ca.certificate_pem, name="n1", usage="client") == ["another CA signed it"]
    mine = issue(tmp_path, ca, "n2", "client", ["n2"])
    assert problems(mine, ca.certificate_pem, name="n1", usage="client") == ["it names n2, not n1"]
    later = datetime.now(UTC) + timedelta(days=720)
    assert problems(mine, ca.certificate_pem, name="n2", usage="client", now=later)[0].startswith(
        "it expires"
    )
    assert problems(b"junk", ca.certificate_pem, name="n2", usage="client") == ["it is not a PEM certificate"]
