"""llmgw.store: the database behind the control plane (SQLite or PostgreSQL).

Open it with :meth:`Store.open`; its repositories (``store.models``,
``store.replicas``, ``store.nodes``, ``store.keys``, ``store.settings``,
``store.audit``, ``store.blobs``) return frozen records, never ORM objects.
"""

from llmgw.store.audit import AuditEntry, AuditLog
from llmgw.store.blobs import BlobRecord, Blobs
from llmgw.store.catalog import Catalog, ModelRecord
from llmgw.store.database import Store
from llmgw.store.keys import KeyRecord, Keys, hash_secret
from llmgw.store.leases import ControlPlaneRecord, Fence, Leases, LeaseState
from llmgw.store.nodes import NodeRecord, Nodes
from llmgw.store.replicas import ReplicaRecord, Replicas
from llmgw.store.settings import SettingChange, StoredSettings

__all__ = [
    "AuditEntry",
    "AuditLog",
    "BlobRecord",
    "Blobs",
    "Catalog",
    "ControlPlaneRecord",
    "Fence",
    "KeyRecord",
    "Keys",
    "LeaseState",
    "Leases",
    "ModelRecord",
    "NodeRecord",
    "Nodes",
    "ReplicaRecord",
    "Replicas",
    "SettingChange",
    "Store",
    "StoredSettings",
    "hash_secret",
]
