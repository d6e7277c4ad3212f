"""The control plane pod's init step: server.yaml on the data volume, from the chart's Secrets.

On the first start it creates the cluster in ``$LLMGW_DIR`` (CA, certificate,
server.yaml, the store), as ``llmgw server init`` does. On every start it sets
the admin token (``$LLMGW_ADMIN_TOKEN``) and the store URL (``$LLMGW_STORE_URL``,
empty: SQLite on the volume) from the Secrets, so rotating either is a Secret
change and a restart. The CA stays on the volume: node certificates issued
before a restart stay good.
"""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

from llmgw.cli.server import ADMIN_TOKEN_FILE, initialise
from llmgw.controlplane.config import load_server_config, save_server_config
from llmgw.runtime.files import write_private


def configure(directory: Path, token: str, store_url: str, http_port: int, agent_port: int) -> Path:
    """Create or update ``directory/server.yaml``; its path."""
    path = directory / "server.yaml"
    if not path.exists():
        initialise(
            directory,
            name="cp1",
            http_host="0.0.0.0",
            http_port=http_port,
            agent_host="0.0.0.0",
            agent_port=agent_port,
            store_url=store_url,
        )
    config = load_server_config(path)
    config.admin_token_sha256 = hashlib.sha256(token.encode()).hexdigest()
    config.store.url = store_url
    config.http.host, config.http.port = "0.0.0.0", http_port
    config.agent_server.host, config.agent_server.port = "0.0.0.0", agent_port
    save_server_config(config, path)
    write_private(directory / ADMIN_TOKEN_FILE, (token + "\n").encode())
    return path


def main() -> int:
    token = os.environ.get("LLMGW_ADMIN_TOKEN", "").strip()
    if len(token) < 16:
        print(
            "LLMGW_ADMIN_TOKEN is missing or shorter than 16 characters: set adminToken.value "
            "or adminToken.existingSecret in the chart's values",
            file=sys.stderr,
        )
        return 2
    path = configure(
        Path(os.environ.get("LLMGW_DIR", "/var/lib/llmgw")),
        token,
        os.environ.get("LLMGW_STORE_URL", "").strip(),
        int(os.environ.get("LLMGW_HTTP_PORT", "8080")),
        int(os.environ.get("LLMGW_AGENT_PORT", "8443")),
    )
    print(f"configured {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
