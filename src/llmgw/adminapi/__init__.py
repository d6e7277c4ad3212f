"""The admin API's shapes (``/api``): one pydantic model per request and answer, shared by both ends.

The control plane declares them on its routes (:mod:`llmgw.controlplane.api`,
so ``/api/openapi.json`` describes every route); the client
(:mod:`llmgw.client`) parses answers into them, so ``ctl`` and the console
read attributes, not dictionary keys. They import only :mod:`llmgw.core` and
:mod:`llmgw.errors`: a client loads them without loading the server.
"""
