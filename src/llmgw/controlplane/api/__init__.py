"""The admin API (``/api``): one router per resource, typed by :mod:`llmgw.adminapi.schemas`.

Every route takes the one :class:`~llmgw.controlplane.api.state.AdminState`
through FastAPI's ``Depends`` and answers errors as
``{"error": {"message", "hint", "problems"?}}``; :mod:`llmgw.controlplane.admin.app`
puts the routers together into the app.
"""
