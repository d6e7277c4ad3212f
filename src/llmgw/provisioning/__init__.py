"""Setting up a cluster's machines: a new cluster, control planes and nodes, their certificates.

What ``llmgw server init``, ``server add``, ``node add``, ``server
node-cert`` and ``llmgw up`` do, and the console's setup with them, apart
from the commands that ask for it: :mod:`~llmgw.provisioning.clusters`
writes a cluster's files on this machine; :mod:`~llmgw.provisioning.nodes`
and :mod:`~llmgw.provisioning.controlplanes` set a machine up over SSH, with
:mod:`~llmgw.provisioning.machines` (the SSH target, the checked release,
the steps run); :mod:`~llmgw.provisioning.keepalived` writes the floating
address's configuration. Progress goes to a ``report`` callable and failures
are :class:`~llmgw.errors.LlmgwError`: the caller shows them.
"""
