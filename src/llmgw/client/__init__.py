"""The client of the admin API, what ``ctl`` and the console speak through.

:mod:`~llmgw.client.admin` is the typed client (answers parsed into the
shapes of :mod:`llmgw.adminapi`); :mod:`~llmgw.client.targets` decides which
control plane it talks to and with which token; :mod:`~llmgw.client.config`
is the client config's named contexts; :mod:`~llmgw.client.paths` is where
llmgw's files are looked for on this machine. None of it loads the server:
not the store, the gateway nor the control plane.
"""
